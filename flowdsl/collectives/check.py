"""The collectives' correctness matrix, one for every backend: cases, the call, inputs, references.

:func:`cases` lists the calls (every program in
:data:`flowdsl.collectives.programs.PROGRAMS` x dtype x op x placement, counts,
roots and protocols rotating over the calls); :func:`run_case` makes one call on
a communicator (the simulator's, or a real one with CuPy arrays or PyTorch
tensors) with its outputs poisoned and returns an :class:`Outcome`;
:func:`run_matrix` runs a list of cases and returns the failures. The simulator
tests, the one-GPU tests and the several-GPU tests all go through
:func:`run_case`, so they make exactly the same calls (a copy of the matrix per
backend drifted once: fp8 codes were summed as uint8 on the GPUs only).

Inputs are random but kept where the operator cannot overflow the element type
(so that wrapping or infinities do not make the comparison meaningless), and
bfloat16 is carried as uint16 bits and fp8 as uint8 codes (``flowdsl/_fp8.py``).
:func:`reference` computes each collective
with NumPy in float64 for the floating types and in the element type itself for
integers (wrapping, and integer ``avg`` truncated toward zero after the wrapping sum, as
NCCL's); :func:`compare` applies a tolerance that depends only on the element type and the
number of ranks, and none to integers.
"""

from __future__ import annotations

import dataclasses
import random
from typing import NamedTuple

import numpy as np

from .. import _fp8
from ..enums import Protocol
from ..errors import UsageError
from ._config import DTYPES, OPS, FlowConfig

__all__ = ["Case", "Outcome", "cases", "run_case", "run_matrix", "PROTOCOLS", "REDUCING", "RESIDENCES", "inputs",
           "scalars", "premul_op", "reference", "compare", "storage_dtype", "poison", "bf16_bits", "bf16_values"]


_FP8 = {"float8_e4m3fn": _fp8.E4M3, "float8_e5m2": _fp8.E5M2}


def storage_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype that holds ``dtype`` (uint16 for bfloat16, uint8 for fp8)."""
    if dtype == "bfloat16":
        return np.dtype(np.uint16)
    return np.dtype(np.uint8) if dtype in _FP8 else np.dtype(dtype)


def poison(dtype: str):
    """A value no input holds, in the storage dtype: NaN for floats (fp8 too), 0xA5... for integers."""
    if dtype in _FP8:
        return np.uint8(0x7F)
    st = storage_dtype(dtype)
    if dtype == "bfloat16":
        return np.uint16(0x7FC0)
    return st.type(np.nan) if st.kind == "f" else np.frombuffer(b"\xa5" * st.itemsize, st)[0]


def bf16_bits(values) -> np.ndarray:
    """float values → bfloat16 bits (round to nearest even)."""
    bits = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(bits) -> np.ndarray:
    """bfloat16 bits → float32 values."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def _integer_range(dtype: str, op: str, nranks: int) -> tuple[int, int]:
    """``[lo, hi)`` of integer inputs: ``op`` over ``nranks`` of them stays inside the element type,
    and no input is the poison (0xA5 bytes: -91 for int8, 165 for uint8)."""
    info = np.iinfo(dtype)
    if op == "prod":  # |x| <= 3 keeps 8 ranks' product within 32 bits; 8-bit types take 0 and 1 (and -1)
        lo, hi = (-3, 4) if info.bits >= 32 else (-1, 2)
    else:
        limit = 1000 if info.bits >= 32 else (64 if info.min else 160) // nranks
        if op == "premulsum":  # times a scalar of at most 3 (:func:`scalars`)
            limit //= 3
        lo, hi = -limit, limit
    return (max(lo, 0) if not info.min else lo), hi


def scalars(rng, dtype: str, nranks: int) -> list:
    """One premulsum scalar per rank, in the storage dtype (bfloat16 bits, fp8 codes): floats of
    magnitude 0.5 to 1 and either sign; integers from -3 to 3 (unsigned 0 to 3)."""
    if dtype in ("float32", "float64", "float16", "bfloat16") or dtype in _FP8:
        x = rng.uniform(0.5, 1.0, nranks) * rng.choice((-1.0, 1.0), nranks)
        if dtype in _FP8:
            stored = _fp8.to_fp8(x, _FP8[dtype])
        else:
            stored = bf16_bits(x) if dtype == "bfloat16" else x.astype(dtype)
    else:
        stored = rng.integers(-3 if np.iinfo(dtype).min else 0, 4, nranks).astype(dtype)
    return list(stored)


def inputs(rng, dtype: str, op: str, nranks: int, size: int) -> list[np.ndarray]:
    """One input array per rank, in the storage dtype, safe for ``op`` over ``nranks``."""
    out = []
    for _ in range(nranks):
        if dtype in ("float32", "float64", "float16", "bfloat16") or dtype in _FP8:
            x = rng.uniform(0.5, 1.5, size) if op == "prod" else rng.uniform(-2.0, 2.0, size)
            if dtype in _FP8:
                out.append(_fp8.to_fp8(x, _FP8[dtype]))
            else:
                out.append(bf16_bits(x) if dtype == "bfloat16" else x.astype(dtype))
        else:
            lo, hi = _integer_range(dtype, op, nranks)
            out.append(rng.integers(lo, hi, size).astype(dtype))
    return out


def _values(x, dtype):
    """Values to compare: float64 for the floating types; integers keep their own type (the reference
    wraps in it, as the GPU does)."""
    x = np.asarray(x)
    if dtype == "bfloat16":
        return bf16_values(x).astype(np.float64)
    if dtype in _FP8:
        return _fp8.from_fp8(x, _FP8[dtype])
    return x.astype(np.float64) if x.dtype.kind == "f" else x


def _truncating_divide(s: np.ndarray, n: int) -> np.ndarray:
    """``s / n`` truncated toward zero in ``s``'s integer type, as NCCL's SumPostDiv: the magnitude
    as unsigned (INT_MIN's too), divided, the sign put back."""
    if s.dtype.kind == "u":
        return s // s.dtype.type(n)
    wide = s.astype(np.int64)
    negative = wide < 0
    magnitude = np.where(negative, -wide, wide).astype(np.uint64)  # -INT64_MIN wraps to 2**63: right
    q = (magnitude // np.uint64(n)).astype(np.int64)
    return np.where(negative, -q, q).astype(s.dtype)


def _reduce(arrays, dtype, op, scalars=None):
    v = np.stack([_values(a, dtype) for a in arrays])
    if op == "premulsum":  # floats: exact products (float64) summed; integers wrap in their type
        s = _values(np.asarray(scalars, storage_dtype(dtype)), dtype)
        return (v * s[:, None].astype(v.dtype)).sum(0, dtype=v.dtype)
    if op == "sum":
        return v.sum(0, dtype=v.dtype)  # integers wrap in their own type
    if op == "prod":
        return v.prod(0, dtype=v.dtype)
    if op == "min":
        return v.min(0)
    if op == "max":
        return v.max(0)
    if v.dtype.kind == "f":  # avg
        return v.sum(0) / len(arrays)
    return _truncating_divide(v.sum(0, dtype=v.dtype), len(arrays))  # NCCL: sum (wrapping), then divide


def reference(collective: str, ins: list[np.ndarray], dtype: str, op: str | None, root: int = 0,
              scalars=None) -> list:
    """What each rank's ``dst`` must hold (``None``: unwritten, on non-root ranks of ``reduce``);
    ``scalars``: premulsum's, one per rank (:func:`scalars`)."""
    n = len(ins)
    if op == "premulsum" and (scalars is None or len(scalars) != n):
        raise UsageError(f"Cannot compute the reference of {collective} premulsum: give one scalar per rank "
                         f"(scalars=, {n} of them)")
    if collective == "all_reduce":
        return [_reduce(ins, dtype, op, scalars)] * n
    if collective == "all_gather":
        return [np.concatenate([_values(a, dtype) for a in ins])] * n
    if collective == "reduce_scatter":
        full = _reduce(ins, dtype, op, scalars)
        count = full.size // n
        return [full[r * count:(r + 1) * count] for r in range(n)]
    if collective == "broadcast":
        return [_values(ins[root], dtype)] * n
    if collective == "reduce":
        return [_reduce(ins, dtype, op, scalars) if r == root else None for r in range(n)]
    if collective == "all_to_all":  # block r of rank i's input, for every i
        count = ins[0].size // n
        return [np.concatenate([_values(a[r * count:(r + 1) * count], dtype) for a in ins]) for r in range(n)]
    raise UsageError(f"Cannot compute the reference of {collective!r}: it is not a collective. Use one of "
                     "all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all")


# Per rank: one rounding per combine at most (fp8: half the spacing of 3 or 2 mantissa bits).
_RTOL = {"float64": 1e-12, "float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2, "float8_e4m3fn": 0.0625,
         "float8_e5m2": 0.125}


def compare(result, expected, dtype: str, nranks: int, what: str = "") -> None:
    """Raise AssertionError naming the first mismatch; floats within a tolerance, integers exact."""
    got = _values(result, dtype)
    exp = np.asarray(expected)
    if got.shape != exp.shape:
        raise AssertionError(f"{what}: shape {got.shape}, expected {exp.shape}")
    if dtype in _RTOL:
        scale = max(1.0, float(np.abs(exp).max(initial=0)))
        tol = _RTOL[dtype] * nranks * scale
        bad = ~(np.abs(got - exp) <= tol)
    else:
        bad = got != exp
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} elements differ; first at {i}: "
                             f"got {got.reshape(-1)[i]!r}, expected {exp.reshape(-1)[i]!r}")


# ---- the matrix --------------------------------------------------------------------------------

#: Protocols the matrix rotates over by default: ``None`` is the cost model's choice per call.
PROTOCOLS = (None, Protocol.SIMPLE, Protocol.LL, Protocol.LL128)
#: Collectives that take an ``op``.
REDUCING = ("all_reduce", "reduce_scatter", "reduce")
_ROOTED = ("broadcast", "reduce")
_APART = ("all_to_all",)  # no in-place form


def call_kwargs(collective, dtype, op, root, algorithm, config, *, torch=False) -> dict:
    """A collective call's keyword arguments: ``dtype=`` where uint8 arrays carry fp8 codes (a torch tensor
    says it itself), ``op=`` where given, ``root=`` for the rooted collectives."""
    kwargs = {"algorithm": algorithm, "config": config}
    if dtype in _FP8 and not torch:
        kwargs["dtype"] = dtype
    if op is not None:
        kwargs["op"] = op
    if collective in _ROOTED:
        kwargs["root"] = root
    return kwargs
_TORCH_VIEWS = ("bfloat16", *_FP8)  # stored as uint16 / uint8, passed to torch as its own dtype
#: Where premulsum's scalars live, rotating over its calls: a host immediate on every rank, a device
#: array on every rank, or mixed (even ranks host, odd ranks device: NCCL lets each rank choose).
RESIDENCES = ("host", "device", "mixed")


@dataclasses.dataclass(frozen=True)
class Case:
    """One call of the matrix: which program, on what, and how.

    Attributes:
        algorithm: ``"ring"``, ``"tree"``, ... (with ``collective``, a key of ``PROGRAMS``).
        collective: ``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``, ``"broadcast"``,
            ``"reduce"`` or ``"all_to_all"`` (never in place).
        dtype: A name in :data:`flowdsl.collectives.DTYPES`.
        op: An operator name (``"sum"``, ...) for the reducing collectives, else ``None``.
        inplace: In place: ``dst=None`` for all_reduce, broadcast and reduce; for all_gather
            ``src`` is this rank's slice of ``dst``; for reduce_scatter ``dst`` is this rank's
            slice of ``src`` (NCCL's in-place layouts).
        count: Elements per rank (NCCL's ``count``).
        root: The root of broadcast and reduce (0 for the others).
        config: The ``config=`` of the call (``None``: the defaults, protocol by the cost model).
        seed: Seeds the inputs (the same on every rank).
        like: ``"torch"`` passes PyTorch tensors of the element type itself (no ``dtype=``);
            ``None`` the arrays ``comm.alloc`` returns (CuPy, or the simulator's buffers).
        residence: premulsum only: where each rank's scalar lives (:data:`RESIDENCES`).
    """

    algorithm: str
    collective: str
    dtype: str
    op: str | None
    inplace: bool
    count: int
    root: int = 0
    config: FlowConfig | None = None
    seed: int = 0
    like: str | None = None
    residence: str | None = None

    @property
    def protocol(self) -> Protocol | None:
        """The forced protocol, or ``None`` when the cost model picks it."""
        return None if self.config is None else self.config.protocol

    @property
    def label(self) -> str:
        """What a failure report names: enough to make the same call again."""
        parts = [self.algorithm, self.collective, self.dtype]
        if self.op is not None:
            parts.append(self.op if self.residence is None else f"{self.op}({self.residence} scalars)")
        parts += ["in-place" if self.inplace else "out-of-place", f"count={self.count}"]
        if self.collective in _ROOTED:
            parts.append(f"root={self.root}")
        parts.append(f"protocol={self.protocol.name if self.protocol is not None else 'auto'}")
        if self.like:
            parts.append(self.like)
        return " ".join(parts)

    def call_kwargs(self) -> dict:
        """The keyword arguments of the call (``dtype=`` where uint8 arrays carry fp8 codes; for premulsum
        ``op="premulsum"``, which :func:`run_case` replaces by this rank's :func:`premul_op`)."""
        return call_kwargs(self.collective, self.dtype, self.op, self.root, self.algorithm, self.config,
                           torch=self.like == "torch")


def cases(nranks: int, *, counts, dtypes=DTYPES, algorithms=None, collectives=None, ops=tuple(OPS),
          inplace=(False, True), protocols=PROTOCOLS, config: FlowConfig | None = None, like: str | None = None,
          start: int = 0, lsa_size: int | None = None, multimem: bool = False, cft: bool = False) -> list[Case]:
    """The matrix: every program x dtype x placement (x op for the reducing collectives).

    Counts and protocols rotate over the calls (together they take every pairing within
    ``len(counts) * len(protocols)`` consecutive calls), roots vary pseudo-randomly; all
    three are derived from the call's number, so every rank lists the same cases.

    Args:
        nranks: Ranks of the communicator (the range of roots).
        counts: Elements per rank to rotate over.
        dtypes: Element types (names in :data:`flowdsl.collectives.DTYPES`).
        algorithms: Keep these programs: algorithm names (``"ring"``) or ``PROGRAMS`` keys
            (``("ring", "all_reduce")``). Default: every program in ``PROGRAMS``.
        collectives: Keep the programs of these collectives (default: all).
        ops: Operators of the reducing collectives.
        inplace: Placements: ``False`` out of place, ``True`` in place.
        protocols: Protocols to rotate over; ``None`` leaves the choice to the cost model.
        config: The staging and launch shape (default: :class:`FlowConfig`'s defaults); its
            protocol is replaced by the rotating one.
        like: ``"torch"`` for PyTorch tensors (see :class:`Case`).
        start: Number of the first call (the calls' seeds are ``start, start + 1, ...``).
        lsa_size: Ranks per LSA team (default: all): programs that store into every peer's
            memory (one-shot) are left out across teams, and wherever a count exceeds their window.
            The hierarchical programs are listed only across several teams of several ranks each
            (:func:`hierarchical_fits`); their all_to_all gets the channels it needs.
        multimem: The communicator has NVLink SHARP (``comm.supports_multimem``): the multimem all-reduce
            is listed, for the types and operators it has (one LSA team only); without, it is left out.
        cft: The communicator can run CFT kernels (``comm.cft_missing is None``): the all_gather with its far
            phase over CFT (``"hierarchical_cft"``) is listed where the hierarchical programs are; without, it
            is left out.
    """
    from .programs import HIERARCHICAL_ROUNDS_PER_CHANNEL, PROGRAMS, multimem_form, one_shot_fits  # noqa: PLC0415

    counts, protocols = tuple(counts), tuple(protocols)
    if not counts or not protocols:
        raise UsageError("Cannot list the cases: give at least one count and one protocol (None for the "
                         "cost model's choice)")
    out = []
    i = start
    for (algorithm, collective) in PROGRAMS:
        if algorithms is not None and algorithm not in algorithms and (algorithm, collective) not in algorithms:
            continue
        if collectives is not None and collective not in collectives:
            continue
        for dtype in dtypes:
            for place in (p for p in inplace if not (p and collective in _APART)):
                for op in (ops if collective in REDUCING else (None,)):
                    protocol = protocols[(i // len(counts)) % len(protocols)]
                    if protocol is None and config is None:
                        call_config = None
                    else:
                        call_config = dataclasses.replace(config or FlowConfig(), protocol=protocol)
                    root = random.Random(i).randrange(nranks) if collective in _ROOTED else 0
                    count = int(counts[i % len(counts)])
                    i += 1
                    if algorithm == "one_shot" and ((lsa_size or nranks) < nranks or not one_shot_fits(
                            count, storage_dtype(dtype).itemsize)):
                        continue
                    if algorithm in ("hierarchical", "hierarchical_cft") and not hierarchical_fits(
                            nranks, lsa_size or nranks):
                        continue
                    if algorithm == "hierarchical_cft" and not cft:
                        continue
                    if algorithm == "hierarchical" and collective in _APART and call_config is not None:
                        call_config = dataclasses.replace(call_config, channels=max(
                            call_config.channels, -(-(nranks - 1) // HIERARCHICAL_ROUNDS_PER_CHANNEL)))
                    if algorithm == "multimem" and (not multimem or (lsa_size or nranks) < nranks or op is None
                                                    or multimem_form(storage_dtype(dtype).name, OPS[op]) is None):
                        continue
                    residence = RESIDENCES[(i - 1) % len(RESIDENCES)] if op == "premulsum" else None
                    out.append(Case(algorithm, collective, dtype, op, bool(place), count, root, call_config, i - 1,
                                    like, residence))
    return out


def hierarchical_fits(nranks: int, lsa_size: int) -> bool:
    """Whether the hierarchical programs run on ``nranks`` ranks in LSA teams of ``lsa_size``: several teams,
    of several ranks each, all the same size (what the host refuses otherwise)."""
    return 1 < lsa_size < nranks and nranks % lsa_size == 0


class Outcome(NamedTuple):
    """What one rank's call left, and what it should have left.

    Attributes:
        label: The case's label and the rank.
        result: The output as stored (uint16 for bfloat16, uint8 for fp8).
        expected: The reference values (float64; integers in their own type), or with ``untouched`` the stored
            bits the output must still hold (a non-root rank of reduce).
        dtype: The element type.
        nranks: Ranks of the communicator (the tolerance grows with them: one rounding per rank;
            premulsum rounds each rank's product too, and gives twice as many).
        untouched: The output must be bit-for-bit unchanged.
    """

    label: str
    result: np.ndarray
    expected: np.ndarray
    dtype: str
    nranks: int
    untouched: bool = False

    def failure(self) -> str | None:
        """``None`` if the result is right, else a message naming the case and the first mismatch."""
        if self.untouched:
            got, want = np.ascontiguousarray(self.result), np.ascontiguousarray(self.expected)
            if got.shape != want.shape:
                return f"{self.label}: shape {got.shape}, expected {want.shape}"
            size = got.dtype.itemsize  # by bits: NaN poison must stay the same NaN
            bad = np.flatnonzero((got.view(np.uint8).reshape(-1, size) != want.view(np.uint8).reshape(-1, size))
                                 .any(axis=1))
            if bad.size == 0:
                return None
            return (f"{self.label}: {bad.size} of {got.size} elements of a non-root rank's output were written "
                    f"(it must stay untouched); first at {int(bad[0])}: {got[bad[0]]!r}, was {want[bad[0]]!r}")
        try:
            compare(self.result, self.expected, self.dtype, self.nranks, self.label)
        except AssertionError as exc:
            return str(exc)
        return None


def _put(array, values) -> None:
    if array.size:
        array.set(values)


def _host_copy(array) -> np.ndarray:
    """The array's contents as NumPy (CuPy's ``get``, which the simulator's buffers have too)."""
    get = getattr(array, "get", None)
    return get() if get is not None else np.asarray(array)


def _as_torch(array, dtype: str):
    import torch  # noqa: PLC0415

    t = torch.from_dlpack(array)
    return t.view(getattr(torch, dtype)) if dtype in _TORCH_VIEWS else t


def premul_op(scalar, dtype: str, residence: str, alloc, like: str | None = None):
    """The ``op=`` of a premulsum call: ``premul_sum`` of ``scalar`` (in the storage dtype, from
    :func:`scalars`) as a host number, or with ``residence="device"`` as a one-element array from
    ``alloc(1)`` (a PyTorch tensor of the element type with ``like="torch"``)."""
    from . import premul_sum  # noqa: PLC0415

    if residence == "host":
        value = _values(np.asarray([scalar], storage_dtype(dtype)), dtype)[0]
        return premul_sum(float(value) if np.asarray(value).dtype.kind == "f" else int(value))
    if residence != "device":
        raise UsageError(f"Cannot make premulsum's op with residence={residence!r}: use 'host' or 'device'")
    buf = alloc(1)
    _put(buf, np.asarray([scalar], storage_dtype(dtype)))
    return premul_sum(_as_torch(buf, dtype) if like == "torch" else buf)


def run_case(comm, case: Case) -> Outcome:
    """Make ``case``'s call once on this rank and read back its output.

    Allocates with ``comm.alloc``, writes this rank's inputs (premulsum: and its scalar, random
    per rank, where ``case.residence`` says), poisons the rest of the
    output (:func:`poison`: a value no input holds, NaN for fp8 too), makes the call,
    synchronizes, reads the output back and frees the buffers. Every rank of ``comm``
    must run the same cases in the same order (they are collective calls).

    Args:
        comm: A flowdsl communicator: the simulator's (inside :func:`flowdsl.sim.spawn`) or
            one from :func:`flowdsl.init` (CuPy arrays, or PyTorch tensors for ``like="torch"``).
        case: The call (see :func:`cases`).

    Returns:
        The :class:`Outcome`; ``outcome.failure()`` compares it.
    """
    from .. import collectives  # noqa: PLC0415

    n, r = comm.nranks, comm.rank
    on_sim = comm.memory_device == "cpu"
    if case.like == "torch" and on_sim:
        raise UsageError(f"Cannot run {case.label} on the simulator: its buffers are NumPy arrays, not torch "
                         "tensors. Use like=None there")
    if case.like not in (None, "torch"):
        raise UsageError(f"Cannot run {case.label}: like must be None or 'torch', got {case.like!r}")
    count, store = case.count, storage_dtype(case.dtype)
    rng = np.random.default_rng(case.seed)  # the same inputs on every rank
    size_in = count * (n if case.collective in ("reduce_scatter", "all_to_all") else 1)
    size_out = count * (n if case.collective in ("all_gather", "all_to_all") else 1)
    ins = inputs(rng, case.dtype, case.op or "sum", n, size_in)
    factors = scalars(rng, case.dtype, n) if case.op == "premulsum" else None
    mine = slice(r * count, (r + 1) * count)
    buffers = []

    def alloc(size):
        buf = comm.alloc(size, store)
        buffers.append(buf)
        return buf

    kwargs = case.call_kwargs()
    if factors is not None:
        residence = case.residence or "host"
        if residence == "mixed":
            residence = "device" if r % 2 else "host"
        kwargs["op"] = premul_op(factors[r], case.dtype, residence, alloc, case.like)

    if not case.inplace:
        src, dst = alloc(size_in), alloc(size_out)
        _put(src, ins[r])
        dst.fill(poison(case.dtype))
        out = dst
    elif case.collective == "all_gather":  # src is this rank's slice of dst
        dst = alloc(size_out)
        dst.fill(poison(case.dtype))
        src = dst[mine]
        _put(src, ins[r])
        out = dst
    elif case.collective == "reduce_scatter":  # dst is this rank's slice of src
        src = alloc(size_in)
        _put(src, ins[r])
        dst = out = src[mine]
    else:
        src, dst = alloc(size_in), None
        _put(src, ins[r])
        out = src
    try:
        # Inputs and poison went in on the arrays' stream: wait, whatever stream the call runs on.
        comm.synchronize()
        args = (src, dst)
        if case.like == "torch":
            args = tuple(None if a is None else _as_torch(a, case.dtype) for a in args)
        getattr(collectives, case.collective)(comm, *args, **kwargs)
        comm.synchronize()
        result = _host_copy(out)
    finally:
        for buf in buffers:
            if buf.size:  # an empty CuPy array has no address: it stays until the communicator closes
                comm.free(buf)
    label = f"{case.label} rank={r}"
    if case.collective == "reduce" and r != case.root:  # dst is the root's only
        before = ins[r] if case.inplace else np.full(size_out, poison(case.dtype), store)
        return Outcome(label, result, before, case.dtype, n, untouched=True)
    expected = reference(case.collective, ins, case.dtype, case.op, case.root, factors)[r]
    return Outcome(label, result, expected, case.dtype, 2 * n if factors is not None else n)


def run_matrix(comm, matrix) -> list[str]:
    """Run every case on this rank (collective: every rank runs the same list); return the failures.

    An exception (a refused call, a device error) propagates with the case's label as a note:
    the other ranks may be inside the collective, and only the launcher can end them.
    """
    failures = []
    for case in matrix:
        try:
            outcome = run_case(comm, case)
        except Exception as exc:
            exc.add_note(f"in {case.label} on rank {comm.rank}")
            raise
        failure = outcome.failure()
        if failure is not None:
            failures.append(failure)
    return failures
