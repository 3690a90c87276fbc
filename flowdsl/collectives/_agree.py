"""Do the ranks call a collective the same way? Call signatures, compared across ranks.

A collective call's signature is what must agree on every rank: the collective, the count,
the element type, the operator, the root, the algorithm and the :class:`FlowConfig`. Streams,
arrays, whether a rank works in place and premulsum's scalar (its value, and whether it lives
on the host or the device) are each rank's own (NCCL lets ranks mix in-place
and out-of-place calls, and so do the programs: in place only skips a rank's local copy).
Before anything is launched the ranks exchange their signatures and, where they differ, every rank raises the same
:class:`~flowdsl.errors.CollectiveMismatchError` naming the argument and the ranks:

- through the host contract's ``comm.exchange`` (:class:`Agreement`, one class for both), a 128-byte encoded
  signature per rank;
- on the simulator always (a host rendezvous of the simulated ranks);
- on GPUs when the communicator was made with ``flowdsl.init(check_collectives=True)`` (or
  ``FLOWDSL_CHECK_COLLECTIVES=1``): all-gathered with NCCL on the call's stream. It waits for the
  stream, so it costs a round trip per call: a debugging aid, off by default.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..enums import Protocol, RedOp
from ..errors import CollectiveMismatchError, UsageError

__all__ = ["COLLECTIVES", "Signature", "encode", "decode", "compare", "agreement", "Agreement"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")
#: The arguments compared, in the order a message lists them.
FIELDS = ("collective", "count", "dtype", "op", "root", "algorithm", "config")
WORDS = 16
_MAGIC = 0x464C4F57_0001  # "FLOW", version 1: a word no other NCCL payload is likely to start with


class Signature(NamedTuple):
    """One rank's call. ``refused``: the rank refused its own arguments (a UsageError it raises itself)."""

    collective: str
    count: int = 0
    dtype: str = ""
    op: str | None = None
    root: int | None = None
    algorithm: str = "auto"
    config: object = None
    refused: bool = False


def signature(collective, count, dtype, redop, root, algorithm, config) -> Signature:
    """The signature of a checked call (``config`` None: the default shape)."""
    from ._config import DEFAULT_CONFIG  # noqa: PLC0415

    return Signature(collective, int(count), str(dtype), None if redop is None else RedOp(redop).name.lower(),
                     None if root is None else int(root), str(algorithm), config or DEFAULT_CONFIG)


def refused(collective: str) -> Signature:
    return Signature(collective, refused=True)


# ---- the fixed-size encoding (GPUs) --------------------------------------------------------------

def _codes():
    from ._config import ALGORITHMS, DTYPES  # noqa: PLC0415

    return DTYPES, ALGORITHMS


def encode(sig: Signature, call: int) -> np.ndarray:
    """``sig`` (and the communicator's collective call number) as ``WORDS`` int64."""
    dtypes, algorithms = _codes()
    words = np.zeros(WORDS, np.int64)
    words[0], words[1], words[2] = _MAGIC, int(sig.refused), call
    words[3] = COLLECTIVES.index(sig.collective)
    if not sig.refused:
        cfg = sig.config
        words[4:9] = (sig.count, dtypes.index(sig.dtype), -1 if sig.op is None else RedOp[sig.op.upper()],
                      -1 if sig.root is None else sig.root, algorithms.index(sig.algorithm))
        words[10:15] = (cfg.channels, cfg.nslots, cfg.slot_bytes, cfg.threads,
                        -1 if cfg.protocol is None else int(cfg.protocol))
    return words


def decode(words) -> tuple[Signature | None, int]:
    """``(signature, call)`` from :func:`encode`'s words; ``(None, -1)`` if they are not a signature."""
    from ._config import FlowConfig  # noqa: PLC0415

    dtypes, algorithms = _codes()
    w = [int(x) for x in words]
    if w[0] != _MAGIC or not 0 <= w[3] < len(COLLECTIVES):
        return None, -1
    if w[1]:
        return refused(COLLECTIVES[w[3]]), w[2]
    config = FlowConfig(channels=w[10], nslots=w[11], slot_bytes=w[12], threads=w[13],
                        protocol=None if w[14] < 0 else Protocol(w[14]))
    return Signature(COLLECTIVES[w[3]], w[4], dtypes[w[5]], None if w[6] < 0 else RedOp(w[6]).name.lower(),
                     None if w[7] < 0 else w[7], algorithms[w[8]], config), w[2]


# ---- the comparison (both host sides) ------------------------------------------------------------

def _ranks(ranks) -> str:
    """"rank 1", "ranks 0, 2", "ranks 0-3, 7"."""
    ranks, runs = sorted(ranks), []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    text = ", ".join(str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}" for a, b in runs)
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


def _spread(values: dict) -> str:
    """``{value: ranks}`` as "4099 on ranks 0, 2 and 4100 on rank 1"."""
    parts = [f"{v} on {_ranks(r)}" for v, r in values.items()]
    return ", ".join(parts[:-1]) + f" and {parts[-1]}"


def compare(signatures: list, call: int | None = None) -> CollectiveMismatchError | None:
    """The error every rank raises when the ranks' ``signatures`` (by rank) differ, or None.

    ``None`` in ``signatures``: that rank sent no signature (it is in another NCCL call)."""
    where = f" (collective call #{call} on this communicator)" if call is not None else ""
    strangers = [r for r, s in enumerate(signatures) if s is None]
    if strangers:
        return _error(None, {}, f"Cannot run a collective{where}: {_ranks(strangers)} sent no flowdsl call "
                      "signature: they are in another NCCL call on this communicator (algorithm='nccl', or another "
                      "library's collective). Call the same collectives in the same order on every rank")
    refusing = [r for r, s in enumerate(signatures) if s.refused]
    if refusing:
        name = signatures[refusing[0]].collective
        error = _error(name, {}, f"Cannot {name}{where}: {_ranks(refusing)} refused "
                       f"{'their' if len(refusing) > 1 else 'its'} arguments (the UsageError raised there says why), "
                       "so no rank runs this call. Fix the call there")
        error.refused_by = refusing
        return error
    differences = {}
    for field in FIELDS:
        values: dict = {}
        for r, s in enumerate(signatures):
            values.setdefault(getattr(s, field), []).append(r)
        if len(values) > 1:
            differences[field] = values
            if field == "collective":
                break  # the other arguments of different collectives need not match
    if not differences:
        return None
    if "collective" in differences:
        return _error(signatures[0].collective, differences,
                      f"Cannot run a collective{where}: the ranks called different collectives: "
                      f"{_spread(differences['collective'])}. Call the same collectives in the same order on "
                      "every rank")
    name = signatures[0].collective
    spread = "; ".join(f"{field} is {_spread(values)}" for field, values in differences.items())
    return _error(name, differences, f"Cannot {name}{where}: {name} called differently across ranks: {spread}. "
                  f"Pass the same {', '.join(differences)} on every rank")


def _error(collective, differences, message) -> CollectiveMismatchError:
    e = CollectiveMismatchError(message)
    e.collective, e.differences = collective, differences
    return e


# ---- the exchange ---------------------------------------------------------------------------------

def agreement(comm):
    """The communicator's check of collective calls across ranks (:class:`Agreement`), or None where its
    calls are not compared (a GPU communicator made without ``check_collectives``)."""
    found = comm.__dict__.get("_flowdsl_agreement", False)
    if found is False:
        found = comm.__dict__["_flowdsl_agreement"] = Agreement(comm) if comm.check_collectives else None
    return found


class Agreement:
    """The ranks exchange each call's encoded signature (``comm.exchange``, the host contract's all-gather:
    NCCL's on the call's stream on GPUs, a host rendezvous on the simulator) and compare them; every rank
    raises the same :class:`~flowdsl.errors.CollectiveMismatchError` where they differ.

    On GPUs the exchange waits for the stream: during CUDA-graph capture a call whose arrays were checked
    before (a planned call) is not checked again, and a first call is refused.
    """

    def __init__(self, comm):
        self.comm, self.calls = comm, 0

    def _capturing(self, stream) -> bool:
        if not self.comm.cuda_graphs:  # the host contract's: False on the simulator, which has no CUDA streams
            return False
        from ..host.streams import is_capturing  # noqa: PLC0415

        return is_capturing(stream or 0)

    def _exchange(self, sig: Signature, call: int, stream) -> list:
        rows = self.comm.exchange(encode(sig, call), stream, label=f"flowdsl.collectives.{sig.collective}")
        return [decode(row)[0] for row in rows]

    def __call__(self, sig: Signature, stream=None, planned=False) -> None:
        if self._capturing(stream):
            if planned:
                return  # checked when it was first called (the warm-up before a capture)
            raise UsageError(f"Cannot check {sig.collective}'s arguments across ranks during CUDA-graph capture: "
                             "the check reads the ranks' signatures back on the host. Call it once before "
                             "capturing (that call is checked), or create the communicator with "
                             "check_collectives=False")
        call, self.calls = self.calls, self.calls + 1
        error = compare(self._exchange(sig, call, stream), call)
        if error is not None:
            raise error

    def refused(self, collective: str, stream=None) -> None:
        """Tell the other ranks this rank refused its arguments, so that they raise instead of waiting."""
        if self._capturing(stream):
            return
        call, self.calls = self.calls, self.calls + 1
        self._exchange(refused(collective), call, stream)
