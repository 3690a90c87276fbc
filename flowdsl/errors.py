"""flowdsl's exceptions. Messages read "Cannot {operation}: {reason}. {fix}".

Every exception flowdsl raises derives from :class:`FlowDSLError`; where another base is part of
its meaning (numba reports :class:`FeatureUnavailableError` as a typing error), it has both.
"""

from __future__ import annotations

import functools
import pickle
import re

__all__ = ["FlowDSLError", "UsageError", "AlreadySpecializedError", "NoDeviceError", "ResourceClosedError",
           "CollectiveMismatchError", "DeviceTimeoutError", "FeatureUnavailableError", "KernelTypingError", "DeviceOnlyError",
           "SupportLibraryError", "DriverError", "CacheWarning", "LaunchTypeError", "NotInspectableError",
           "CacheRefusedError"]


#: A terminal colour code (numba writes its messages with them).
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def without_colours(text: str) -> str:
    """``text`` without terminal colour codes (numba's messages carry them: noise in a log, a notebook or a
    test's match)."""
    return _ANSI.sub("", text)


class FlowDSLError(Exception):
    """Base class of flowdsl's own errors."""


class CacheWarning(UserWarning):
    """The kernel disk cache was damaged, cannot be written, or cannot key a kernel: it compiles instead."""


class UsageError(FlowDSLError, ValueError):
    """An argument is wrong: the message names it and says what to pass instead."""


class AlreadySpecializedError(UsageError, RuntimeError):
    """``specialize`` of a kernel that has its one signature already (numba-cuda raises a RuntimeError)."""


class NotInspectableError(UsageError, RuntimeError):
    """Code that has no such form to show (the SASS of a device function: it is linked into kernels only);
    a RuntimeError, as numba-cuda raises it."""


class CacheRefusedError(UsageError, RuntimeError, pickle.PicklingError):
    """``cache=True`` for a kernel numba-cuda's disk cache cannot hold (files linked beside it, device arrays it
    reaches, no source file): a RuntimeError and a PicklingError, as numba-cuda raises them."""


class LaunchTypeError(UsageError, TypeError):
    """A launch configuration of the wrong type (a grid of floats): a TypeError, as numba-cuda raises it."""


class NoDeviceError(FlowDSLError, RuntimeError):
    """No CUDA GPU (or driver) is available for an operation that needs one."""


class DeviceOnlyError(FlowDSLError, RuntimeError):
    """A device primitive was called from host code."""


class SupportLibraryError(FlowDSLError, RuntimeError):
    """flowdsl's support library (or its GIN or CFT build) is missing for a target, or cannot be built."""


class DriverError(FlowDSLError, RuntimeError):
    """A CUDA driver call failed."""


class ResourceClosedError(FlowDSLError, RuntimeError):
    """A window, device communicator or communicator was used after ``close()``."""


class CollectiveMismatchError(FlowDSLError, RuntimeError):
    """Ranks called a collective differently (another collective, count, dtype, op, root, algorithm or
    config), or one rank did not call it at all.

    Raised on every rank, before anything is launched: always on the simulator, and on GPUs with
    ``flowdsl.init(check_collectives=True)`` (or ``FLOWDSL_CHECK_COLLECTIVES=1``).

    Attributes:
        collective: The collective the ranks were calling (or the first rank's, when they called different ones).
        differences: ``{argument: {value: [ranks]}}`` for every argument that differs.
    """

    collective: str | None = None
    differences: dict | None = None


class DeviceTimeoutError(FlowDSLError, TimeoutError):
    """A bounded device-side wait gave up (:mod:`flowdsl.wait`): a peer never did what it waited for.

    Raised by ``comm.synchronize()`` from the communicator's wait record (and by the
    simulator for the same programs, as :class:`flowdsl.sim.WaitTimeoutError`). The
    message is made by :meth:`describe`, one format for both.

    Attributes:
        rank: The world rank that waited.
        block: The linear index of the block that waited.
        thread: The linear index of the thread that waited, in its block.
        primitive: What it waited on, e.g. ``"flow ready flag or signal ... on connection"``.
        index: Which connection, line, barrier, signal or counter.
        peer: The world rank expected to act, or -1 when the wait names none.
        expected: The value waited for.
        seen: The last value read.
        waited_s: How long it waited, in seconds (None on the simulator).
        timeout_s: The limit, in seconds (None on the simulator).
    """

    FIELDS = ("rank", "block", "thread", "primitive", "index", "peer", "expected", "seen", "waited_s", "timeout_s")

    def __init__(self, message: str, **fields):
        super().__init__(message)
        for name in self.FIELDS:
            setattr(self, name, fields.get(name))

    @classmethod
    def describe(cls, operation: str, *, rank, block, thread, primitive, index, peer, expected, seen,
                 waited_s=None, timeout_s=None, context: str = "", fix: bool = True) -> str:
        """The diagnosis: "Cannot {operation}: ... {what was waited for} ... {fix}" (without the fix
        when ``fix`` is false: further records of one report)."""
        if waited_s is not None:
            after = f"after {waited_s:.3g} s (limit {timeout_s:g} s)"
        else:
            after = "(the simulator found that nothing could release it)"
        source = f" from peer rank {peer}" if peer is not None and peer >= 0 else ""
        advice = (FIX if waited_s is not None else SIMULATED_FIX) if fix else ""
        if fix and waited_s is None and primitive.startswith("flow "):
            advice += FLOW_FIX
        return (f"Cannot {operation}: a device-side wait on rank {rank} gave up {after}: block {block} "
                f"thread {thread} waited for {primitive} {index}{source}: expected {expected}, last seen {seen}"
                f"{context}." + advice)


#: What to do about a wait that gave up (the end of every :class:`DeviceTimeoutError` message).
FIX = (" A peer never got there: make every rank launch the same kernels and collectives in the same order (a "
       "rank that skipped one, failed, or called another stops its peers here), or raise the limit "
       "(flowdsl.init(wait_timeout=seconds) or FLOWDSL_WAIT_TIMEOUT; 0 turns it off). This communicator's waits "
       "now give up at once: call comm.abort() and create a new one.")


#: The same on the simulator, which found that nothing will release the wait: no limit or abort helps.
SIMULATED_FIX = (" A peer never got there, and none will: make every rank launch the same kernels and collectives "
                 "in the same order (a rank that skipped one, failed, or called another stops its peers here).")
#: Added for a Flow wait on the simulator: the two ends of one connection that do not meet.
FLOW_FIX = (" For a Flow connection: the sender's remote_number must be this connection's number (a sender with "
            "another fills an inbox nobody reads), both ends on one channel, and as many slots sent as received.")


FeatureUnavailableError: type  # made at first use, by __getattr__ below


def numba_error_classes(name: str) -> tuple:
    """numba's error class ``name`` (``TypingError``, ``NumbaTypeError``) from each of its error modules:
    numba-cuda 0.30 raises its own copy (``numba.cuda.core.errors``) beside numba's, and its users catch
    either, so flowdsl's typing errors are both."""
    import numba.core.errors as numba_errors  # noqa: PLC0415 - numba only where a kernel is typed

    classes = [getattr(numba_errors, name)]
    try:
        import numba.cuda.core.errors as cuda_errors  # noqa: PLC0415
    except ImportError:  # an older numba-cuda: one class
        return tuple(classes)
    own = getattr(cuda_errors, name, None)
    if own is not None and own not in classes:
        classes.insert(0, own)
    return tuple(classes)


@functools.cache  # one class, whichever thread asks first
def _make_feature_unavailable_error() -> type:
    class FeatureUnavailableError(*numba_error_classes("NumbaTypeError"), FlowDSLError):
        """A primitive needs a newer NCCL, another arch or a newer CUDA than the target has."""

    FeatureUnavailableError.__module__ = __name__
    FeatureUnavailableError.__qualname__ = "FeatureUnavailableError"
    return FeatureUnavailableError


KernelTypingError: type  # made at first use, by __getattr__ below


@functools.cache
def _make_kernel_typing_error() -> type:
    class KernelTypingError(*numba_error_classes("TypingError"), UsageError):
        """A kernel passes a primitive (or numba) what it cannot take. Compiling for a GPU, numba's
        typing refused it: the message is numba's, then the kernel's name and where it is defined;
        numba's own error is the ``__cause__``. The simulator raises this class too (its
        :class:`flowdsl.sim.UsageError` subclass) for the same mistake, in the same words, before
        the primitive runs. Also numba's ``TypingError`` (numba's and numba-cuda's classes of that name)
        and a :class:`UsageError`."""

    def __str__(self):
        return without_colours(super(KernelTypingError, self).__str__())

    KernelTypingError.__str__ = __str__
    KernelTypingError.__module__ = __name__
    KernelTypingError.__qualname__ = "KernelTypingError"
    return KernelTypingError


@functools.cache
def kernel_feature_error() -> type:
    """The class of a kernel refused because its target lacks what it uses: a :class:`KernelTypingError`
    (how the compile path and the simulator refuse a kernel's call) that is a
    :class:`FeatureUnavailableError` (why), on both paths."""
    class KernelFeatureUnavailableError(_make_kernel_typing_error(), _make_feature_unavailable_error()):
        """A kernel uses what its target (NCCL release, arch, linking CUDA) lacks."""

    KernelFeatureUnavailableError.__module__ = __name__
    KernelFeatureUnavailableError.__qualname__ = "KernelFeatureUnavailableError"
    return KernelFeatureUnavailableError


_LAZY = {"FeatureUnavailableError": _make_feature_unavailable_error, "KernelTypingError": _make_kernel_typing_error}


def __getattr__(name: str):
    # numba typing errors (numba reports them from inside a kernel's typing), so their classes are
    # made when the name is first used: ``import flowdsl`` does not import numba.
    make = _LAZY.get(name)
    if make is not None:
        cls = globals()[name] = make()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
