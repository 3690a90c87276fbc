"""Errors raised by the CPU simulator.

Every message reads "Cannot {operation}: {reason}. {fix}" and, when raised
inside a simulation, names the rank (block, thread) and the seed that replays it.
"""

from __future__ import annotations

from ..errors import CollectiveMismatchError as _CollectiveMismatchError
from ..errors import DeviceTimeoutError, FlowDSLError
from ..errors import UsageError as _UsageError
from . import _state

__all__ = [
    "SimulationError", "UnsupportedFeatureError", "DeadlockError", "LivelockError",
    "WindowAccessError", "IndexAccessError", "BarrierIndexError", "CollectiveMismatchError", "UsageError",
    "GinCoverageError", "GinResourceError", "GinBackendError", "CftCoverageError", "DataRaceError",
    "WaitTimeoutError", "StaleDataError", "KernelTypingError", "FeatureUnavailableError",
]


class SimulationError(FlowDSLError, RuntimeError):
    """Base class of every problem the simulator detects in a simulated program.

    Attributes:
        seed: The scheduler seed of the run (``None`` outside a run).
        rank: The simulated rank that hit the problem, when there is one.
    """

    seed: int | None = None
    rank: int | None = None


def sim_error(cls, text) -> SimulationError:
    """An exception of class ``cls`` whose message names the running task and the seed that replays it."""
    t, s = _state.cur, _state.sched
    who = f" [{t.name()}]" if t is not None else ""
    seed = f" (seed={s.seed})" if s is not None else ""
    e = cls(text + who + seed)
    e.seed = s.seed if s is not None else None
    e.rank = t.rank if t is not None else None
    return e


class UnsupportedFeatureError(SimulationError, NotImplementedError):
    """A primitive or ``numba.cuda`` feature the simulator does not model."""


class DeadlockError(SimulationError):
    """Every remaining simulated thread (and host rank) waits; nothing can release them."""


class LivelockError(DeadlockError):
    """Threads keep spinning (``flowdsl.mem`` loads/atomics) without any progress."""


class StalledError(LivelockError):
    """A simulated kernel thread ran ``stall_seconds`` (a :func:`flowdsl.sim.spawn` option) without reaching a
    point where the simulator switches threads: a loop spinning on a plain load (``flowdsl.sim.watchdog``)."""

    #: The message of the next one raised (an exception raised asynchronously is made without arguments).
    text = ""

    def __init__(self, *args):
        super().__init__(*(args or (StalledError.text,)))


class WaitTimeoutError(LivelockError, DeviceTimeoutError):
    """Threads are stuck in bounded waits (:mod:`flowdsl.wait`): on a GPU they would time out.

    The message starts with the diagnosis ``comm.synchronize()`` gives on a GPU (one
    record per stuck rank), then the simulator's deadlock or livelock report; the
    attributes are those of :class:`flowdsl.DeviceTimeoutError` (the first stuck rank's).
    """

    def __init__(self, message: str, **fields):
        DeviceTimeoutError.__init__(self, message, **fields)


class WindowAccessError(SimulationError, IndexError):
    """A view or an element access past the end (or before the start) of a window or view."""


class IndexAccessError(SimulationError, IndexError):
    """An element index outside an array a kernel reaches (a buffer argument, a shared or dynamic shared array)."""


class BarrierIndexError(SimulationError, IndexError):
    """An LSA barrier index outside ``0 .. lsa_barrier_count-1``, or a barrier misuse."""


class CollectiveMismatchError(SimulationError, _CollectiveMismatchError):
    """Ranks called host collectives differently at the same position (``comm.register`` on one rank,
    ``comm.barrier`` on another), or a rank returned from its program while the others wait in one. A
    :class:`flowdsl.CollectiveMismatchError`; a collective called with other arguments on some rank raises
    that class itself, as on GPUs (the collectives' one check, through ``comm.exchange``)."""


class UsageError(SimulationError, _UsageError, TypeError):
    """A simulated object was used in a way the real runtime rejects."""


def _kernel_typing_error():
    from ..errors import KernelTypingError  # noqa: PLC0415 - numba's TypingError, made at first use

    class KernelTypingError(UsageError, KernelTypingError):
        """A primitive was passed what the GPU's typing refuses (``tests/spec_refusals.py``): the
        simulator refuses it before the primitive runs, in the same words, as a
        :class:`flowdsl.KernelTypingError` (what compiling for a GPU raises)."""

    KernelTypingError.__module__ = __name__
    KernelTypingError.__qualname__ = "KernelTypingError"
    return KernelTypingError


KernelTypingError = _kernel_typing_error()  # the simulator runs numba.cuda kernels: numba is loaded


def _feature_unavailable_error():
    from ..errors import kernel_feature_error  # noqa: PLC0415 - numba's TypingError, made at first use

    class FeatureUnavailableError(KernelTypingError, kernel_feature_error()):
        """A kernel used what the NCCL release it is simulated for lacks (``spawn(nccl=...)``): refused
        in the words compiling it for that release refuses it with, as a
        :class:`flowdsl.FeatureUnavailableError` and a :class:`flowdsl.KernelTypingError`, as there."""

    FeatureUnavailableError.__module__ = __name__
    FeatureUnavailableError.__qualname__ = "FeatureUnavailableError"
    return FeatureUnavailableError


FeatureUnavailableError = _feature_unavailable_error()


class GinCoverageError(SimulationError):
    """A thread read data of a GIN put before its rank observed a signal that covers the put."""


class GinResourceError(UsageError, IndexError):
    """A GIN context, signal or counter index beyond what the device communicator was created with."""


class GinBackendError(UnsupportedFeatureError):
    """The kernel needs something the chosen GIN backend does not offer (e.g. strong signals on EFA GDA)."""


class CftCoverageError(SimulationError):
    """A thread read data of a CFT counted write without reading a counter that covers it and then fencing."""


class DataRaceError(SimulationError):
    """Two accesses to one element, at least one a write and not both atomic, that nothing orders.

    Attributes:
        accesses: ``(this access, the earlier access)``, each as text: the kind of access, who made
            it (rank, block, thread, kernel, or the network for a GIN/CFT operation) and where.
    """

    accesses: tuple = ()


class StaleDataError(SimulationError):
    """A wait took data by its flag (an LL or LL128 line, a one-shot line: ``flowdsl.wait.accepted``)
    that was not written for the reader's call: by an earlier (or later) call of the writer, by
    another rank, or never. On a GPU the bits matched and the result was silently wrong.

    Attributes:
        writer: Who wrote the word (rank, block, thread, kernel and launch number), or None.
        reader: The thread that took it.
    """

    writer: str | None = None
    reader: str | None = None
