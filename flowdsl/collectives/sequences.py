"""Long seeded sequences of collective calls on one communicator, checked bit for bit.

A long run of calls on one communicator (nccl-tests' ``-c``, a training loop) finds what one
call at a time cannot: state a call leaves in the staging or one-shot windows that a later
call with another grid, count or protocol misreads. :func:`generate` makes, from a seed,
the same list of :class:`Call` s on every rank (they are collective calls): a random
program or ``"auto"``, protocol, ``FlowConfig`` (one small shape per sequence, its protocol
drawn per call, so the calls share staging and one-shot windows), count (0, 1, primes, counts around channel, chunk, round and
one-shot block boundaries, a few larger ones), element type, operator, root, in place or
not, and arrays that are views at a random offset inside a larger allocation. Some calls
repeat the previous one on the same arrays (the planned fast path).

:func:`run_sequence` makes the calls on one rank: every allocation is guard bytes around
the views, the outputs are poisoned (``flowdsl.collectives.check.poison``), and after
each call the whole allocation is compared bit for bit with what it must hold, the output
from :func:`flowdsl.collectives.exact.reference` (each program's own order of combines).
The simulator, one GPU and several GPUs all run this function.

On the simulator :func:`simulate` runs a list on ``nranks`` ranks, :func:`shrink` drops
calls while the run still fails, and :func:`check_seed` does both and writes the report
(seed, failing call, minimal failing sequence, the command that reruns it)::

    python -m flowdsl.collectives.sequences --seed 7 --ranks 3 --calls 200
    python -m flowdsl.collectives.sequences --seed 7 --ranks 3 --calls 200 --only 4,17,52
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from typing import NamedTuple

import numpy as np

from ..enums import Protocol
from ..errors import UsageError
from . import check, exact
from ._config import DTYPES, OPS, FlowConfig

__all__ = ["Call", "Failure", "SequenceRun", "generate", "call_inputs", "run_sequence", "simulate", "shrink",
           "check_seed", "report", "parse_protocols", "CI_SEED", "DEFAULT_CALLS", "PROTOCOLS", "GPU_PROTOCOLS",
           "LARGE", "main"]

#: The seed CI runs (any other from the command line: ``--seed``, or ``pytest --seq-seed``).
CI_SEED = 20261203
#: Calls per sequence.
DEFAULT_CALLS = 200
#: Protocols a call's ``FlowConfig`` names (``None``: the cost model's choice per call).
PROTOCOLS = (None, Protocol.SIMPLE, Protocol.LL, Protocol.LL128)
#: On GPUs: no LL128. The library is precompiled without its code, and each (program, dtype, op) a
#: call asks LL128 of compiles at first use (about 5 s each, hundreds in a sequence).
GPU_PROTOCOLS = (None, Protocol.SIMPLE, Protocol.LL)
#: The largest count on the simulator (each program's own time bounds it further: :func:`generate`).
LARGE = 2100
_ROOTED = ("broadcast", "reduce")
_APART = ("all_to_all",)  # src and dst apart: never in place
_REPEAT = 0.12  # share of calls that repeat the previous call on its arrays, with new inputs
_SHAPES = 1  # FlowConfig shapes per sequence (x protocols): its calls share staging and one-shot windows
_FP8 = ("float8_e4m3fn", "float8_e5m2")
_SMALL_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61)


@dataclasses.dataclass(frozen=True)
class Call:
    """One collective call of a sequence (the same on every rank; the layout is each rank's own).

    Attributes:
        index: Place in the generated sequence (kept when a shrunk list leaves calls out).
        algorithm: A program's algorithm (``"ring"``, ``"tree"``, ``"one_shot"``) or ``"auto"``.
        collective: ``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``, ``"broadcast"``, ``"reduce"``.
        dtype: A name in :data:`flowdsl.collectives.DTYPES`.
        op: An operator name for the reducing collectives, else ``None``.
        count: Elements per rank (NCCL's ``count``).
        root: The root of broadcast and reduce (0 for the others).
        placement: ``"out-of-place"``, ``"in-place"`` (NCCL's layouts, as in
            ``flowdsl.collectives.check.run_case``) or ``"mixed"`` (each rank picks).
        config: The call's ``FlowConfig`` (its protocol: ``None`` for the cost model's).
        seed: Seeds the inputs (the same on every rank).
        layout_seed: Seeds each rank's offsets and guard bytes (with its rank) and, for
            ``"mixed"``, whether it works in place.
        repeat: The previous call again on its arrays (the planned fast path), new inputs.
    """

    index: int
    algorithm: str
    collective: str
    dtype: str
    op: str | None
    count: int
    root: int
    placement: str
    config: FlowConfig
    seed: int
    layout_seed: int
    repeat: bool = False

    @property
    def label(self) -> str:
        """What a report names: enough to read the call back."""
        c = self.config
        parts = [f"#{self.index}", self.algorithm, self.collective, self.dtype]
        if self.op is not None:
            parts.append(self.op)
        parts.append(f"count={self.count}")
        if self.collective in _ROOTED:
            parts.append(f"root={self.root}")
        parts += [self.placement, f"protocol={c.protocol.name if c.protocol is not None else 'auto'}",
                  f"channels={c.channels} nslots={c.nslots} slot_bytes={c.slot_bytes} threads={c.threads}"]
        if self.repeat:
            parts.append("(the previous call's arrays)")
        return " ".join(parts)

    def kwargs(self) -> dict:
        """The call's keyword arguments."""
        return check.call_kwargs(self.collective, self.dtype, self.op, self.root, self.algorithm, self.config)

    def arrays_key(self) -> tuple:
        """Calls with the same key can run on the same arrays."""
        return (self.collective, self.dtype, self.count, self.placement, self.layout_seed)


# ---- the generator -------------------------------------------------------------------------------

def _programs(nranks: int, lsa_size: int, cft: bool = True) -> list[tuple[str, str]]:
    from .programs import PROGRAMS  # noqa: PLC0415 (compiling programs needs numba-cuda)

    collectives = list(dict.fromkeys(c for (_, c) in PROGRAMS))
    across = 1 < lsa_size < nranks and nranks % lsa_size == 0  # several nodes of several ranks
    out = [key for key in PROGRAMS if not (key[0] == "one_shot" and lsa_size < nranks)  # one LSA team only
           and key[0] != "multimem"  # the simulated worlds here have no NVLink SHARP (exact models no switch)
           and not (key[0] in ("hierarchical", "hierarchical_cft") and not across)
           and not (key[0] == "hierarchical_cft" and not cft)]  # a communicator that can run CFT kernels
    return out + [("auto", c) for c in collectives]


def _shape(rng: random.Random) -> FlowConfig:
    """A small staging shape: the simulator runs every thread in Python."""
    return FlowConfig(channels=rng.randint(1, 4), nslots=rng.randint(2, 4), slot_bytes=128 * rng.randint(1, 8),
                      threads=32 * rng.choice((1, 1, 2, 2, 3, 4)))


def _count(rng: random.Random, config: FlowConfig, itemsize: int, nranks: int, large: int, one_shot: bool) -> int:
    """0, 1, primes, and counts either side of the boundaries where programs cut a message: 16-element
    channel alignment, a pipeline chunk, a ring round (``nranks`` chunks), a one-shot block (1024,
    for ``one_shot``: the all-reduces)."""
    kind = rng.random()
    if kind < 0.10:
        return rng.choice((0, 1))
    if kind < 0.35:
        return rng.choice(_SMALL_PRIMES)
    if kind < 0.60:
        return min(large, _prime_near(rng.randint(62, 400)))
    if kind < 0.90:
        protocol = config.protocol if config.protocol is not None else Protocol.LL
        chunk = exact.chunk_elements(protocol, itemsize, config.slot_bytes, config.nslots)
        units = (16, 16 * config.channels, chunk, chunk * config.channels, nranks * chunk)
        units += (1024,) if one_shot else ()
        return max(0, min(large, rng.choice(units) * rng.randint(1, 3) + rng.choice((-1, 0, 1))))
    return rng.randint(large // 2, large)


def _largest(collective: str, config: FlowConfig, nranks: int, large: int) -> int:
    """The largest count of a call: ``large``, less where the simulator's time grows faster than the
    message. all_gather's output and reduce_scatter's input are ``nranks`` times the count; a
    Flow program pays each slot with every thread of its block (small slots, many threads)."""
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        large = large * 2 // nranks
    return max(64, int(large * min(1.0, config.slot_bytes / (8 * config.threads))))


def _prime_near(x: int) -> int:
    while any(x % p == 0 for p in range(2, int(x ** 0.5) + 1)):
        x += 1
    return x


def generate(seed: int, ncalls: int = DEFAULT_CALLS, nranks: int = 2, lsa_size: int | None = None, *,
             dtypes=None, ops=None, protocols=PROTOCOLS, large: int = LARGE, cft: bool = True) -> list[Call]:
    """The calls of sequence ``seed`` for a communicator of ``nranks`` ranks (``lsa_size`` per LSA
    team: the one-shot program is left out across teams, and where a count exceeds its window).
    ``cft``: the communicator can run CFT kernels (``comm.cft_missing is None``; the simulator's can), so
    the all_gather with its far phase over CFT is drawn across nodes too; pass False on GPUs without it.

    Element types and operators default to :data:`flowdsl.collectives.DTYPES` and
    :data:`~flowdsl.collectives.OPS` as they are when called, so new ones are drawn as soon as
    they are listed (a type :mod:`flowdsl.collectives.exact` cannot model is refused here, an
    operator at the first call that draws it, naming it). ``large``: the largest count (all_gather
    and reduce_scatter: ``2 * large / nranks``, as they move ``nranks`` times more).
    """
    from .programs import one_shot_fits  # noqa: PLC0415

    lsa_size = nranks if lsa_size is None else lsa_size
    rng = random.Random(f"{seed}/{nranks}/{lsa_size}")  # another topology, another sequence
    dtypes = tuple(DTYPES if dtypes is None else dtypes)
    ops = tuple(OPS if ops is None else ops)
    protocols = tuple(protocols)
    if not dtypes or not ops or not protocols:
        raise UsageError("Cannot generate a call sequence: give at least one dtype, op and protocol (None for the "
                         "cost model's choice)")
    programs = _programs(nranks, lsa_size, cft)
    shapes = [_shape(rng) for _ in range(_SHAPES)]
    calls: list[Call] = []
    while len(calls) < ncalls:
        if calls and rng.random() < _REPEAT:
            calls.append(dataclasses.replace(calls[-1], index=len(calls), seed=rng.getrandbits(32), repeat=True))
            continue
        algorithm, collective = rng.choice(programs)
        dtype = rng.choice(dtypes)
        op = rng.choice(ops) if collective in exact.REDUCING else None
        config = dataclasses.replace(rng.choice(shapes), protocol=rng.choice(protocols))
        itemsize = exact.elements(dtype).storage.itemsize  # a type the reference cannot model: refused here
        # The one-shot program has no slots: up to large (and past its 1024-element blocks).
        one_shot = collective == "all_reduce" and (algorithm == "one_shot" or (algorithm == "auto" and
                                                                                lsa_size == nranks))
        largest = large if one_shot else _largest(collective, config, nranks, large)
        count = _count(rng, config, itemsize, nranks, largest, collective == "all_reduce")
        if algorithm == "one_shot" and not one_shot_fits(count, itemsize):
            count = rng.choice(_SMALL_PRIMES)
        if algorithm == "hierarchical" and collective == "all_to_all":  # two rounds a channel at most
            config = dataclasses.replace(config, channels=max(config.channels, -(-(nranks - 1) // 2)))
        root = rng.randrange(nranks) if collective in _ROOTED else 0
        placement = rng.choices(("out-of-place", "in-place", "mixed"), weights=(45, 45, 10))[0]
        if collective in _APART:  # no in-place form
            placement = "out-of-place"
        calls.append(Call(len(calls), algorithm, collective, dtype, op, count, root, placement, config,
                          rng.getrandbits(32), rng.getrandbits(32)))
    return calls


# ---- inputs and layouts --------------------------------------------------------------------------

def parse_protocols(text: str) -> tuple:
    """``"auto,SIMPLE,LL"`` → ``(None, Protocol.SIMPLE, Protocol.LL)`` (``auto``: the cost model's choice)."""
    out = []
    for name in (t.strip() for t in text.split(",") if t.strip()):
        if name.lower() == "auto":
            out.append(None)
        elif name.upper() in Protocol.__members__:
            out.append(Protocol[name.upper()])
        else:
            raise UsageError(f"Cannot use protocol {name!r}: give auto, {', '.join(Protocol.__members__)}")
    return tuple(out)


def _finite_fp8_codes(dtype: str) -> np.ndarray:
    arith = exact.elements(dtype)
    codes = np.arange(256, dtype=np.uint8)
    return codes[np.isfinite(arith.decode(codes))]


def _random_elements(rng: np.random.Generator, dtype: str, op: str, size: int) -> np.ndarray:
    """``size`` elements of ``dtype`` (storage bits) whose sums round differently in different orders:
    magnitudes over several binades, a few zeros of both signs, subnormals, extremes and infinities."""
    arith = exact.elements(dtype)  # refuses a type it cannot model, before anything is made
    store = arith.storage
    if dtype in _FP8:
        return rng.choice(_finite_fp8_codes(dtype), size).astype(np.uint8)
    if store.kind in "iu" and dtype != "bfloat16":
        info = np.iinfo(store)
        x = rng.integers(info.min, info.max, size, dtype=store, endpoint=True)
        if op == "prod":  # wrapped products of full-range values are mostly 0: keep half small
            small = rng.integers(max(info.min, -3), 4, size).astype(store)
            x = np.where(rng.random(size) < 0.5, small, x)
        return x
    if op == "prod":
        x = rng.choice((-1.0, 1.0), size) * rng.uniform(0.5, 2.0, size)
    else:
        x = rng.standard_normal(size) * np.ldexp(1.0, rng.integers(-6, 7, size))
    with np.errstate(over="ignore"):
        bits = exact._bf16_encode(x.astype(np.float32)) if dtype == "bfloat16" else x.astype(store)
    specials = _specials(dtype)
    return np.where(rng.random(size) < 0.02, rng.choice(specials, size), bits).astype(store)


def _specials(dtype: str) -> np.ndarray:
    """Zeros of both signs, the smallest subnormals, the largest finite values and infinities, as bits."""
    if dtype == "bfloat16":
        return np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80], np.uint16)
    finfo = np.finfo(dtype)
    return np.array([0.0, -0.0, finfo.smallest_subnormal, -finfo.smallest_subnormal, finfo.max, -finfo.max, np.inf,
                     -np.inf], dtype)


def call_scalars(call: Call, nranks: int) -> list | None:
    """``premulsum``: every rank's scalar (storage dtype), from ``call.seed``; else None."""
    if call.op != "premulsum":
        return None
    return check.scalars(np.random.default_rng(call.seed ^ 0x5CA1A5), call.dtype, nranks)


def call_residence(call: Call) -> str:
    """Where a ``premulsum`` call's scalar lives: the host (frozen at the call) or a device array."""
    return ("host", "device")[call.layout_seed & 1]


def call_inputs(call: Call, nranks: int) -> list[np.ndarray]:
    """Every rank's input (``nranks * count`` elements for reduce_scatter and all_to_all), from ``call.seed``."""
    rng = np.random.default_rng(call.seed)
    size = call.count * (nranks if call.collective in ("reduce_scatter", "all_to_all") else 1)
    op = "sum" if call.op in (None, "premulsum") else call.op
    return [_random_elements(rng, call.dtype, op, size) for _ in range(nranks)]


class _Layout(NamedTuple):
    """One rank's placement of a call's arrays: in place or not, guard elements before and after."""

    inplace: bool
    src_guards: tuple[int, int]
    dst_guards: tuple[int, int]


def _layout(call: Call, rank: int, itemsize: int) -> _Layout:
    rng = random.Random(f"{call.layout_seed}/{rank}")
    lanes = max(1, 16 // itemsize)

    def guards():
        # Half the time the view starts 16-byte aligned (the programs' vector paths), else anywhere.
        before = lanes * rng.randint(1, 2) if rng.random() < 0.5 else rng.randint(1, 2 * lanes)
        return before, rng.randint(1, lanes + 3)

    inplace = call.placement == "in-place" or (call.placement == "mixed" and rng.random() < 0.5)
    return _Layout(inplace, guards(), guards())


class _Arrays:
    """A call's allocations on one rank, the views it passes, and where its output lies.

    ``images[i]`` is what allocation ``i`` holds before the call (guard bytes, inputs, poison);
    ``output`` is ``(allocation, slice)`` of the output.
    """

    def __init__(self, comm, call: Call, store: np.dtype, layout: _Layout):
        n, r, count = comm.nranks, comm.rank, call.count
        self.key = call.arrays_key()
        self.comm, self.store, self.layout = comm, store, layout
        size_in = count * (n if call.collective in ("reduce_scatter", "all_to_all") else 1)
        size_out = count * (n if call.collective in ("all_gather", "all_to_all") else 1)
        mine = slice(r * count, (r + 1) * count)
        self.allocs = []

        def alloc(size, guards):
            buf = comm.alloc(guards[0] + size + guards[1], store)
            self.allocs.append(buf)
            return len(self.allocs) - 1, slice(guards[0], guards[0] + size)

        if not layout.inplace:
            self.src_at, self.dst_at = alloc(size_in, layout.src_guards), alloc(size_out, layout.dst_guards)
            self.output = self.dst_at
        elif call.collective == "all_gather":  # src is this rank's slice of dst
            self.dst_at = alloc(size_out, layout.dst_guards)
            base = self.dst_at[1].start
            self.src_at = (self.dst_at[0], slice(base + mine.start, base + mine.stop))
            self.output = self.dst_at
        elif call.collective == "reduce_scatter":  # dst is this rank's slice of src
            self.src_at = alloc(size_in, layout.src_guards)
            base = self.src_at[1].start
            self.dst_at = self.output = (self.src_at[0], slice(base + mine.start, base + mine.stop))
        else:  # dst=None: src is the output
            self.src_at = self.output = alloc(size_in, layout.src_guards)
            self.dst_at = None
        self.src = self.allocs[self.src_at[0]][self.src_at[1]]
        self.dst = None if self.dst_at is None else self.allocs[self.dst_at[0]][self.dst_at[1]]

    def images(self, call: Call, mine: np.ndarray, guard_seed: int) -> list[np.ndarray]:
        """Each allocation before the call: random guard bytes, poison where the output goes, the input."""
        rng = np.random.default_rng(guard_seed)
        out = []
        for buf in self.allocs:
            out.append(rng.integers(0, 256, buf.size * self.store.itemsize, dtype=np.uint8).view(self.store))
        o, where = self.output
        out[o][where] = check.poison(call.dtype)
        s, where = self.src_at
        out[s][where] = mine
        return out

    def free(self):
        for buf in self.allocs:
            self.comm.free(buf)
        self.allocs = []


# ---- one rank's run ------------------------------------------------------------------------------

class Failure(NamedTuple):
    """A call whose result was wrong on one rank (``str()``: the message)."""

    index: int
    rank: int
    message: str

    def __str__(self):
        return self.message


def _bits(value, store) -> str:
    return f"0x{int(np.asarray(value, store).view(f'u{store.itemsize}')):0{2 * store.itemsize}x}"


def _describe(call, arrays, alloc, bad, got, want, store) -> str:
    """What the wrong elements of allocation ``alloc`` are: output, input (which must stay as it
    was), or guard elements before or after the views."""
    o, out = arrays.output
    s, src = arrays.src_at
    views = [where for (i, where) in (arrays.output, arrays.src_at) + ((arrays.dst_at,) if arrays.dst_at else ())
             if i == alloc]
    lo, hi = min(v.start for v in views), max(v.stop for v in views)
    in_out = (bad >= out.start) & (bad < out.stop) if alloc == o else np.zeros(bad.shape, bool)
    in_src = (bad >= src.start) & (bad < src.stop) & ~in_out if alloc == s else np.zeros(bad.shape, bool)
    parts = []
    for name, idx, base in (("output", bad[in_out], out.start), ("input (it must stay as it was)", bad[in_src],
                                                                  src.start)):
        if idx.size:
            i = int(idx[0])
            parts.append(f"{idx.size} {name} elements differ; first at element {i - base}: got {_bits(got[i], store)} "
                         f"({_value(got[i], call.dtype)}), expected {_bits(want[i], store)} "
                         f"({_value(want[i], call.dtype)})")
    before, after = bad[bad < lo], bad[bad >= hi]
    if before.size:
        parts.append(f"{before.size} guard elements before the arrays written (the nearest {lo - int(before[-1])} "
                     "before)")
    if after.size:
        parts.append(f"{after.size} guard elements after the arrays written (the first at +{int(after[0]) - hi})")
    return "; ".join(parts)


def _value(bits, dtype):
    arith = exact.elements(dtype)
    if dtype == "bfloat16":
        return float(exact._bf16_decode(np.asarray([bits], np.uint16))[0])
    if dtype in _FP8:
        return float(arith.decode(np.asarray([bits], np.uint8))[0])
    return np.asarray(bits).item()


def _expected_output(comm, call, ins, shape):
    """(this rank's output bits or None where it stays as it was, whether only within a tolerance).

    NCCL's host collective (``"auto"`` may pick it on GPUs) has its own order: its copies and
    integer reductions (wrapping sums are associative) are exact in any order, its float
    reductions are compared within a tolerance (:func:`_close`)."""
    algorithm, protocol, grid = shape.algorithm, shape.protocol, shape.grid
    tolerant = False
    if algorithm == "nccl":
        tolerant = call.collective in exact.REDUCING and exact.elements(call.dtype).storage.kind == "f"
        algorithm, protocol, grid = "ring", Protocol.SIMPLE, 1  # an order, for the bits it cannot change
    out = exact.reference(call.collective, algorithm, ins, call.dtype, call.op, call.root, protocol=protocol,
                          grid=grid, config=call.config, scalars=call_scalars(call, comm.nranks),
                          lsa_size=getattr(comm, "lsa_size", comm.nranks))[comm.rank]
    return out, tolerant


_EPS = {"float16": 2.0 ** -11, "float32": 2.0 ** -24, "float64": 2.0 ** -53}


def _close(call, got, want, ins, rank) -> str | None:
    """NCCL's float reductions against the ring order's: within one rounding per rank of the sum of
    magnitudes, non-finite results alike; elements whose magnitudes near overflow are not compared
    (whether a sum overflows depends on its order)."""
    store = got.dtype
    values = np.stack(ins).astype(np.float64)
    if call.collective == "reduce_scatter":
        values = values[:, rank * call.count:(rank + 1) * call.count]
    n = values.shape[0]
    with np.errstate(all="ignore"):
        scale = np.abs(values).sum(0) if call.op != "prod" else np.abs(values).prod(0)
        g, w = got.astype(np.float64), want.astype(np.float64)
        near_overflow = ~(scale < np.finfo(store).max / 2)
        finite = np.isfinite(w) & np.isfinite(g)
        bad = finite & ~(np.abs(g - w) <= (n + 1) * _EPS[store.name] * np.maximum(scale, np.finfo(store).tiny))
        bad |= ~finite & ~((g == w) | (np.isnan(g) & np.isnan(w)))
        bad &= ~near_overflow
    if not bad.any():
        return None
    i = int(np.flatnonzero(bad)[0])
    return (f"{int(bad.sum())} output elements beyond NCCL's tolerance; first at element {i}: got {float(g[i])!r}, "
            f"the ring order gives {float(w[i])!r}")


def _run_call(comm, call: Call, kept: _Arrays | None):
    """Make ``call`` on this rank; return (Failure or None, the arrays, kept for a repeat)."""
    from .. import collectives  # noqa: PLC0415
    from ._host import launch_shape  # noqa: PLC0415

    n, r = comm.nranks, comm.rank
    store = exact.elements(call.dtype).storage
    ins = call_inputs(call, n)
    layout = _layout(call, r, store.itemsize)
    if kept is not None and kept.key == call.arrays_key():
        arrays = kept
    else:
        if kept is not None:
            kept.free()
        arrays = _Arrays(comm, call, store, layout)
    before = arrays.images(call, ins[r], call.seed ^ (r + 1) * 0x9E3779B1)
    for buf, image in zip(arrays.allocs, before):
        buf.set(image)
    comm.synchronize()  # inputs, guards and poison in place, whatever stream the call uses
    kwargs, scalar_buffers = call.kwargs(), []
    scalars = call_scalars(call, n)
    if scalars is not None:  # this rank's own scalar, on the host or in a device array

        def alloc(size):
            scalar_buffers.append(comm.alloc(size, store))
            return scalar_buffers[-1]
        kwargs["op"] = check.premul_op(scalars[r], call.dtype, call_residence(call), alloc)
    comm.synchronize()
    getattr(collectives, call.collective)(comm, arrays.src, arrays.dst, **kwargs)
    comm.synchronize()
    for buf in scalar_buffers:
        comm.free(buf)
    after = [buf.get() for buf in arrays.allocs]
    shape = launch_shape(call.collective, comm, call.count, call.dtype, call.algorithm, call.config)
    expected, tolerant = _expected_output(comm, call, ins, shape)
    o, out = arrays.output
    problems = []
    for i, (got, want) in enumerate(zip(after, before)):
        want = want.copy()
        nan_ok = np.zeros(want.shape, bool)
        if i == o and expected is not None:
            if tolerant:  # NCCL's own order: the output within a tolerance, the rest bit for bit
                problem = _close(call, got[out], expected, ins, r)
                if problem is not None:
                    problems.append(problem)
                expected = got[out]
            want[out] = expected
            nan_ok[out] = call.collective in exact.REDUCING
        bad = exact.mismatches(got, want, call.dtype, nan_ok=nan_ok, poison=check.poison(call.dtype))
        if bad.size:
            problems.append(_describe(call, arrays, i, bad, got, want, store))
    protocol = f" {shape.protocol.name}" if shape.protocol is not None else ""  # none: a program without Flow (CFT)
    ran = f" (ran {shape.algorithm}" + (f"{protocol} grid={shape.grid})" if shape.grid else ")")
    failure = None
    if problems:
        failure = Failure(call.index, r, f"call {call.label}{ran} rank {r}: " + "; ".join(problems))
    return failure, arrays


def run_sequence(comm, calls, *, on_call=None) -> list[Failure]:
    """Make ``calls`` in order on this rank (every rank runs the same list); return the wrong results.

    ``on_call(call)`` is called before each call (a progress hook). An exception (a refused call,
    a device error) propagates with a note naming the call and the rank.
    """
    failures, kept = [], None
    try:
        for call in calls:
            if on_call is not None:
                on_call(call)
            try:
                failure, kept = _run_call(comm, call, kept)
            except Exception as exc:
                exc.add_note(f"in call {call.label} on rank {comm.rank}")
                raise
            if failure is not None:
                failures.append(failure)
    finally:
        if kept is not None:
            kept.free()
    return failures


# ---- on the simulator: run, shrink, report -------------------------------------------------------

class SequenceRun(NamedTuple):
    """One simulated run of a list of calls: every rank's failures, an exception a rank raised
    (``error``), the position in the list of the first failing call (``first``: None if none) and
    that call (``first_call``)."""

    failures: list[Failure]
    error: BaseException | None
    first: int | None
    first_call: Call | None
    seconds: float

    @property
    def failed(self) -> bool:
        return self.first is not None


def simulate(calls, nranks: int, nodes: int = 1, *, sim_seed: int = 0) -> SequenceRun:
    """Run ``calls`` on ``nranks`` simulated ranks (``nodes`` LSA teams, GIN between them, delivered
    reordered); ``sim_seed`` is the scheduler's."""
    from ..sim import spawn  # noqa: PLC0415

    calls = list(calls)
    position = {call.index: i for i, call in enumerate(calls)}
    progress = [0] * nranks

    def main(comm):
        return run_sequence(comm, calls, on_call=lambda call: progress.__setitem__(comm.rank, position[call.index]))

    start = time.monotonic()
    error, failures = None, []
    try:
        for rank_failures in spawn(main, nranks=nranks, nodes=nodes, seed=sim_seed,
                                   gin_delivery="reordered" if nodes > 1 else "ordered"):
            failures += rank_failures
    except Exception as exc:  # noqa: BLE001 - a rank raised (or the simulator did): that call failed
        error = exc
    first = min([position[f.index] for f in failures] + ([min(progress)] if error is not None else []), default=None)
    failures.sort(key=lambda f: (position[f.index], f.rank))
    return SequenceRun(failures, error, first, None if first is None else calls[first], time.monotonic() - start)


def shrink(calls, nranks: int, nodes: int = 1, *, sim_seed: int = 0, seconds: float = 60.0,
           run: SequenceRun | None = None) -> tuple[list[Call], SequenceRun]:
    """A short list of ``calls`` that still fails: the prefix up to the first failing call, then calls
    dropped (halves, quarters, ... single calls; never the failing one) while the run still fails,
    until nothing more can be dropped or ``seconds`` have passed. Returns it and its run."""
    calls = list(calls)
    run = run if run is not None else simulate(calls, nranks, nodes, sim_seed=sim_seed)
    if not run.failed:
        return calls, run
    best = calls[:run.first + 1]
    deadline = time.monotonic() + seconds
    step = max(1, len(best) // 2)
    while time.monotonic() < deadline:
        at, dropped = 0, False
        while at < len(best) - 1 and time.monotonic() < deadline:
            end = min(at + step, len(best) - 1)
            candidate = best[:at] + best[end:]
            attempt = simulate(candidate, nranks, nodes, sim_seed=sim_seed)
            if attempt.failed:
                best, run, dropped = candidate[:attempt.first + 1], attempt, True
            else:
                at = end
        if step == 1 and not dropped:
            break  # no single call can go
        step = max(1, step // 2)
    return best, run


def report(seed, ncalls, nranks, nodes, run: SequenceRun, minimal=None, shrink_run=None, shrink_seconds=None,
           only=None, flags: str = "") -> str:
    """The failure report: seed, failing call, minimal failing sequence and the command that reruns it."""
    where = f"{nranks} ranks ({nodes} node{'s' if nodes > 1 else ''})"
    lines = [f"Call sequence seed {seed} on {where}: {len(run.failures)} wrong results"
             f"{', and a call raised' if run.error is not None else ''} "
             f"(first at call #{run.first_call.index} of {ncalls})"]
    for failure in run.failures[:4]:
        lines.append(f"  {failure.message}")
    if run.error is not None:
        first_line = str(run.error).splitlines()[0] if str(run.error) else ""
        lines.append(f"  raised: {type(run.error).__name__}: {first_line}")
        lines += [f"    {note}" for note in getattr(run.error, "__notes__", [])[:3]]
    base = (f"python -m flowdsl.collectives.sequences --seed {seed} --ranks {nranks} --nodes {nodes} --calls {ncalls}"
            + flags)
    if minimal is not None:
        lines.append(f"Minimal failing sequence: {len(minimal)} calls (shrunk in {shrink_seconds:.0f} s):")
        lines += [f"  {call.label}" for call in minimal]
        if shrink_run is not None and shrink_run.failures:
            lines.append(f"  fails with: {shrink_run.failures[0].message}")
        elif shrink_run is not None and shrink_run.error is not None:
            lines.append(f"  fails with: {type(shrink_run.error).__name__}: {str(shrink_run.error).splitlines()[0]}")
        only = [c.index for c in minimal]
    lines.append("Rerun: " + base + (f" --only {','.join(map(str, only))}" if only else ""))
    return "\n".join(lines)


def check_seed(seed: int, nranks: int, nodes: int = 1, ncalls: int = DEFAULT_CALLS, *, shrink_seconds: float = 60.0,
               only=None, sim_seed: int | None = None, **generate_options) -> tuple[str | None, SequenceRun]:
    """Run sequence ``seed`` on the simulator; on failure shrink it and return the report (else None)."""
    calls = generate(seed, ncalls, nranks, nranks // nodes, **generate_options)
    if only is not None:
        wanted = set(only)
        calls = [c for c in calls if c.index in wanted]
    sim_seed = seed if sim_seed is None else sim_seed
    run = simulate(calls, nranks, nodes, sim_seed=sim_seed)
    if not run.failed:
        return None, run
    minimal, shrink_run, took = None, None, 0.0
    if shrink_seconds > 0:
        start = time.monotonic()
        minimal, shrink_run = shrink(calls, nranks, nodes, sim_seed=sim_seed, seconds=shrink_seconds, run=run)
        took = time.monotonic() - start
    return report(seed, ncalls, nranks, nodes, run, minimal, shrink_run, took,
                  only=None if only is None else sorted(set(only)), flags=_flags(**generate_options)), run


def _flags(protocols=PROTOCOLS, large=LARGE, **others) -> str:
    """The command line's flags for generate options other than the defaults."""
    text = f" (and generate options {others}, which the command line does not take)" if others else ""
    if tuple(protocols) != PROTOCOLS:
        text += " --protocols " + ",".join("auto" if p is None else p.name for p in protocols)
    if large != LARGE:
        text += f" --large {large}"
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flowdsl.collectives.sequences",
                                     description="Run a seeded sequence of collective calls on the simulator, "
                                                 "checked bit for bit; on failure print the minimal failing sequence.")
    parser.add_argument("--seed", type=int, default=None, help="sequence seed (default: a random one, printed)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=1, help="LSA teams (GIN between them, delivered reordered)")
    parser.add_argument("--calls", type=int, default=DEFAULT_CALLS)
    parser.add_argument("--only", default=None, help="comma-separated call numbers: run only these (a shrunk list)")
    parser.add_argument("--shrink-seconds", type=float, default=120.0, help="time for shrinking a failure (0: none)")
    parser.add_argument("--sim-seed", type=int, default=None, help="scheduler seed (default: the sequence seed)")
    parser.add_argument("--protocols", default="auto,SIMPLE,LL,LL128",
                        help="comma-separated protocols the calls draw from (auto: the cost model's); the GPU runs "
                             "leave LL128 out")
    parser.add_argument("--large", type=int, default=LARGE, help="the largest count (the GPU runs: tests/multigpu/"
                                                                  "sequences_worker.py's --large)")
    parser.add_argument("--list", action="store_true", help="print the calls and exit")
    args = parser.parse_args(argv)
    if args.ranks < 1 or args.nodes < 1 or args.ranks % args.nodes:
        parser.error(f"Cannot run {args.ranks} ranks on {args.nodes} nodes: give nodes that divide the ranks")
    seed = random.SystemRandom().randrange(1 << 31) if args.seed is None else args.seed
    only = None if args.only is None else [int(i) for i in args.only.split(",") if i]
    options = {"protocols": parse_protocols(args.protocols), "large": args.large}
    if args.list:
        calls = generate(seed, args.calls, args.ranks, args.ranks // args.nodes, **options)
        for call in calls:
            if only is None or call.index in only:
                print(call.label)
        return 0
    text, run = check_seed(seed, args.ranks, args.nodes, args.calls, shrink_seconds=args.shrink_seconds, only=only,
                           sim_seed=args.sim_seed, **options)
    ran = len(only) if only is not None else args.calls
    if text is None:
        print(f"Call sequence seed {seed} on {args.ranks} ranks ({args.nodes} node{'s' if args.nodes > 1 else ''}): "
              f"{ran} calls, all bit-exact "
              f"({run.seconds:.1f} s)")
        return 0
    print(text)
    return 1


if __name__ == "__main__":
    sys.exit(main())
