"""The collectives' results bit for bit: NumPy that combines in each program's order and rounds where it rounds.

:func:`reference` gives what every rank's output must hold, in the storage dtype
(uint16 for bfloat16, uint8 for fp8), for a call of a program of
:data:`flowdsl.collectives.programs.PROGRAMS` launched with a given protocol and grid
(``flowdsl.collectives._host.launch_shape`` says which: the ring all-reduce's order
depends on its rounds, the tree's on its channels). :func:`mismatches` compares bit for
bit. The orders are written down in docs/collectives.md ("Reduction order: what the bits
are"); in short, ``c(a, b)`` being one combine of the received partial ``a`` with this
rank's ``b``:

- ring reduce-scatter, piece ``j``: a chain from rank ``j+1`` round to rank ``j``;
- ring reduce: a chain from ``root+1`` round to ``root``;
- ring all-reduce: the same chain per piece of each round, where a channel's share is cut
  in rounds of ``nranks`` chunks and each round in ``nranks`` pieces (16-element aligned);
- tree all-reduce: children before the node (``c(S(kid1), c(S(kid0), x))``), even channels
  tree 0 (heap over the ranks), odd channels tree 1 (mirrored);
- one-shot all-reduce: rank 0, then 1, ..., ``nranks-1``.

Element arithmetic is written here again, vectorised, from what the GPU does
(``flowdsl/lowering/flow.py``), not taken from :func:`flowdsl.flow.combine`: float16 is
combined in float32 and rounded back after every combine, bfloat16 and fp8 likewise
(bfloat16 to nearest even, fp8 to nearest even and saturating at the largest finite);
``avg`` sums and divides once where the program finishes (floats: in float64, rounded
once; integers: truncated toward zero after the wrapped sum). Integers wrap. An element
type or operator without a model here is refused, never guessed.
"""

from __future__ import annotations

import numpy as np

from .._flow_staging import protocol_slot_words
from .._flow_wire import part_elements
from ..enums import Protocol
from ..errors import UsageError

__all__ = ["reference", "mismatches", "elements", "ring_all_reduce_first_ranks", "chunk_elements", "channel_ranges",
           "REDUCING", "MODELLED_OPS"]

#: Collectives that combine (take ``op``).
REDUCING = ("all_reduce", "reduce_scatter", "reduce")
#: Operators this reference models; ``avg`` sums, and divides where the program finishes; ``premulsum``
#: multiplies each rank's input by its scalar (rounded once to the element type), then sums.
MODELLED_OPS = ("sum", "prod", "min", "max", "avg", "premulsum")
_ALIGN = 16  # elements a channel's share and a ring round's pieces are rounded to (programs._ALIGN)


def _quiet(method):
    """Run an arithmetic method with NumPy's floating-point warnings off: wrapping, overflow to
    infinity and NaN are part of the bits the reference computes."""
    def quiet(*args):
        with np.errstate(all="ignore"):
            return method(*args)

    quiet.__name__, quiet.__doc__ = method.__name__, method.__doc__
    return quiet


def _apply(op: str, a, b):
    """One combine in the arrays' own type: ``a`` the received partial, ``b`` this rank's value
    (the operand order decides which NaN or zero ``min``/``max`` keep, as on the GPU)."""
    if op in ("sum", "avg", "premulsum"):
        return a + b
    if op == "prod":
        return a * b
    if op == "min":
        return np.where(a < b, a, b)
    if op == "max":
        return np.where(a > b, a, b)
    raise UsageError(f"Cannot compute the exact reference of op={op!r}: the reference models "
                     f"{', '.join(MODELLED_OPS)} only. Fix: add its combine and finish to "
                     "flowdsl/collectives/exact.py (what the GPU's flow.combine/flow.finish do for it)")


class _Native:
    """float32, float64 and every integer type: combined in the type itself (integers wrap)."""

    def __init__(self, dtype):
        self.storage = np.dtype(dtype)

    def isnan(self, bits):
        return np.isnan(bits) if self.storage.kind == "f" else np.zeros(bits.shape, bool)

    @_quiet
    def combine(self, op, a, b):
        return _apply(op, a, b).astype(self.storage, copy=False)

    @_quiet
    def premul(self, x, scalar):
        """``x * scalar`` in the type (integers wrap, floats round once)."""
        return (x * self.storage.type(scalar)).astype(self.storage, copy=False)

    @_quiet
    def finish(self, op, acc, nranks):
        if op != "avg":
            return acc
        if self.storage.kind == "f":  # the GPU divides a float32 by an int64 in float64, then rounds once
            return (acc.astype(np.float64) / nranks).astype(self.storage)
        n = self.storage.type(nranks)
        q = acc // n  # floor; C truncates toward zero (the GPU's integer finish does the same fix-up)
        if self.storage.kind == "i":
            q = q + ((acc < 0) & (q * n != acc)).astype(self.storage)
        return q.astype(self.storage, copy=False)


class _Float16:
    """float16: widened to float32 for each combine, rounded back to half after it."""

    storage = np.dtype(np.float16)

    def isnan(self, bits):
        return np.isnan(bits)

    @_quiet
    def combine(self, op, a, b):
        return _apply(op, a.astype(np.float32), b.astype(np.float32)).astype(np.float16)

    @_quiet
    def premul(self, x, scalar):
        """The product in float32 (exact), rounded once to half."""
        return (x.astype(np.float32) * np.float32(scalar)).astype(np.float16)

    @_quiet
    def finish(self, op, acc, nranks):
        if op != "avg":
            return acc
        return (acc.astype(np.float64) / nranks).astype(np.float16)


def _bf16_decode(bits):
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _bf16_encode(x32):
    """float32 → bfloat16 bits, to nearest even; a NaN stays a quiet NaN (the GPU's bit arithmetic)."""
    bits = np.asarray(x32, np.float32).view(np.uint32).astype(np.uint64)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)


class _BFloat16:
    """bfloat16 (uint16 bits): widened to float32 for each combine, rounded to nearest even after it."""

    storage = np.dtype(np.uint16)

    def isnan(self, bits):
        return (bits & 0x7FFF) > 0x7F80

    @_quiet
    def combine(self, op, a, b):
        return _bf16_encode(_apply(op, _bf16_decode(a), _bf16_decode(b)))

    @_quiet
    def premul(self, x, scalar):
        """The product in float32 (exact), rounded once to bfloat16, to nearest even."""
        return _bf16_encode(_bf16_decode(x) * _bf16_decode(np.asarray([scalar], np.uint16))[0])

    @_quiet
    def finish(self, op, acc, nranks):
        if op != "avg":
            return acc
        return _bf16_encode((_bf16_decode(acc).astype(np.float64) / nranks).astype(np.float32))


class _Fp8:
    """fp8 (uint8 codes): decoded to float32 for each combine, rounded to the nearest code after it
    (ties to even, saturating at the largest finite value, NaN to 0x7F)."""

    storage = np.dtype(np.uint8)

    def __init__(self, ebits, mbits):
        self.mbits, self.bias = mbits, (1 << (ebits - 1)) - 1
        self.emin = 1 - self.bias
        self.emax_code = (1 << ebits) - 1
        self.e4m3 = ebits == 4  # e4m3fn: no infinities, 0x7F / 0xFF are NaN; e5m2: IEEE-like
        self.largest = 448.0 if self.e4m3 else 57344.0

    def isnan(self, codes):
        c = codes.astype(np.int64)
        if self.e4m3:
            return (c & 0x7F) == 0x7F
        return ((c >> 2) & 0x1F == 0x1F) & ((c & 3) != 0)

    def decode(self, codes):
        c = codes.astype(np.int64)
        e, m = (c >> self.mbits) & self.emax_code, c & ((1 << self.mbits) - 1)
        v = np.where(e == 0, np.ldexp(m.astype(np.float64), self.emin - self.mbits),
                     np.ldexp(((1 << self.mbits) + m).astype(np.float64), e - self.bias - self.mbits))
        if not self.e4m3:
            v = np.where(e == self.emax_code, np.where(m == 0, np.inf, np.nan), v)
        v = np.where(self.isnan(codes), np.nan, v)
        return np.where(c & 0x80, -v, v).astype(np.float32)

    @_quiet
    def encode(self, x32):
        x = np.asarray(x32, np.float32).astype(np.float64)
        nan = np.isnan(x)
        a = np.where(nan, 0.0, np.abs(x))
        exponent = np.maximum(np.frexp(a)[1] - 1, self.emin)  # subnormals share emin's spacing
        spacing = np.ldexp(1.0, exponent - self.mbits)
        r = np.minimum(np.round(a / spacing) * spacing, self.largest)  # a / spacing is exact; round: to even
        normal = r >= np.ldexp(1.0, self.emin)
        er = np.frexp(r)[1] - 1
        mant = np.where(normal, np.ldexp(r, self.mbits - er) - (1 << self.mbits),
                        np.ldexp(r, self.mbits - self.emin))
        code = np.where(normal, (er + self.bias) << self.mbits, 0) + mant.astype(np.int64)
        code = np.where(np.signbit(x), code | 0x80, code)
        return np.where(nan, 0x7F, code).astype(np.uint8)

    @_quiet
    def combine(self, op, a, b):
        return self.encode(_apply(op, self.decode(a), self.decode(b)))

    @_quiet
    def premul(self, x, scalar):
        """The product in float32 (exact), rounded once to the nearest code (saturating)."""
        return self.encode(self.decode(x) * self.decode(np.asarray([scalar], np.uint8))[0])

    @_quiet
    def finish(self, op, acc, nranks):
        if op != "avg":
            return acc
        return self.encode(self.decode(acc) / np.float32(nranks))  # float32 by float32, as the GPU


_FLOATS = {"float32": _Native, "float64": _Native, "float16": lambda d: _Float16(), "bfloat16": lambda d: _BFloat16(),
           "float8_e4m3fn": lambda d: _Fp8(4, 3), "float8_e5m2": lambda d: _Fp8(5, 2)}


def elements(dtype: str):
    """The arithmetic of a collectives element type: ``storage`` (NumPy dtype of its bits),
    ``combine(op, a, b)``, ``finish(op, acc, nranks)`` and ``isnan(bits)``, vectorised.

    Raises:
        UsageError: a type this reference has no model of (every integer type is modelled:
            they wrap and truncate; a float type must be listed).
    """
    make = _FLOATS.get(dtype)
    if make is not None:
        return make(dtype)
    try:
        kind = np.dtype(dtype).kind
    except TypeError:
        kind = None
    if kind in ("i", "u"):
        return _Native(dtype)
    raise UsageError(f"Cannot compute the exact reference of dtype {dtype!r}: the reference knows "
                     f"{', '.join(_FLOATS)} and integer types. Fix: add how the GPU combines and rounds it to "
                     "flowdsl/collectives/exact.py (_FLOATS)")


# ---- the programs' shapes ------------------------------------------------------------------------

def channel_ranges(count: int, grid: int):
    """``[(lo, hi)]`` of each channel (block) of ``grid``: equal shares rounded up to 16 elements
    (``programs.channel_range``)."""
    per = -(-count // grid)
    per = -(-per // _ALIGN) * _ALIGN
    out = []
    for channel in range(grid):
        lo = min(channel * per, count)
        out.append((lo, min(lo + per, count)))
    return out


def chunk_elements(protocol: Protocol, itemsize: int, slot_bytes: int, nslots: int) -> int:
    """Elements of a pipeline chunk (``programs.chunk_elements``): half the slots, each what Flow's
    wire format carries in a slot of the protocol (Flow's own sizing functions, run on the host:
    a launch parameter, like the grid, not part of the order this module models)."""
    words = protocol_slot_words(slot_bytes // 8, protocol)
    return part_elements(words, itemsize, protocol) * max(1, nslots // 2)


def ring_all_reduce_first_ranks(count: int, nranks: int, grid: int, chunk: int) -> np.ndarray:
    """For each element, the rank whose value the ring all-reduce's chain starts with: each channel's
    share goes in rounds of ``nranks * chunk`` elements, a round in ``nranks`` pieces of ``per``
    (rounded up to 16), and piece ``j``'s chain starts at rank ``j + 1``."""
    first = np.zeros(count, np.int64)
    for lo, hi in channel_ranges(count, grid):
        base = lo
        while base < hi:
            size = min(nranks * chunk, hi - base)
            per = -(-(-(-size // nranks)) // _ALIGN) * _ALIGN
            first[base:base + size] = (np.arange(size) // per + 1) % nranks
            base += size
    return first


def _chain(values, first, arith, op):
    """``c(...c(c(x[first], x[first+1]), x[first+2])..., x[first-1])``, per element (ranks mod n)."""
    n = values.shape[0]
    cols = np.arange(values.shape[1])
    acc = values[first % n, cols]
    for k in range(1, n):
        acc = arith.combine(op, acc, values[(first + k) % n, cols])
    return acc


def _tree(values, tree, arith, op, pos=0):
    """What heap position ``pos`` of tree ``tree`` sends up (the root: its unfinished result):
    ``c(S(kid0), x)``, then with a second child ``c(S(kid1), that)`` after the partial finish the
    program stores in between (``avg`` over one contribution: the identity but for NaN payloads)."""
    n = values.shape[0]
    x = values[pos if tree == 0 else n - 1 - pos]
    kids = max(0, min(2, n - (2 * pos + 1)))
    if kids == 0:
        return x
    acc = arith.combine(op, _tree(values, tree, arith, op, 2 * pos + 1), x)
    if kids == 2:
        acc = arith.finish(op, acc, 1)
        acc = arith.combine(op, _tree(values, tree, arith, op, 2 * pos + 2), acc)
    return acc


def _hierarchical_reduce_scatter(values, arith, op, lsa_size):
    """The hierarchical reduce-scatter's order: block ``(a, l)`` (node ``a``, LSA rank ``l``) is a chain along
    the rail from node ``a+1`` round to ``a``, of each node's sum ``S[b]``; ``S[b]`` is the chain inside node
    ``b`` from LSA rank ``l+1`` round to ``l``, stored unfinished (``avg`` over one contribution) in between."""
    n = values.shape[0]
    if not lsa_size or n % lsa_size:
        raise UsageError("Cannot compute the exact reference of the hierarchical reduce_scatter without its LSA "
                         "team size. Pass lsa_size= (ranks per node, dividing nranks)")
    L, nodes = lsa_size, n // lsa_size
    count = values.shape[1] // n
    out = []
    for r in range(n):
        a, l = divmod(r, L)
        blocks = values[:, r * count:(r + 1) * count]
        sums = [arith.finish(op, _chain(blocks[b * L:(b + 1) * L], np.full(count, l + 1), arith, op), 1)
                for b in range(nodes)]
        acc = sums[(a + 1) % nodes]
        for k in range(2, nodes + 1):
            acc = arith.combine(op, acc, sums[(a + k) % nodes])
        out.append(arith.finish(op, acc, n))
    return out


def _all_reduce(algorithm, values, arith, op, protocol, grid, config):
    n, count = values.shape
    if algorithm == "one_shot":
        return arith.finish(op, _chain(values, np.zeros(count, np.int64), arith, op), n)
    if algorithm == "ring":
        chunk = chunk_elements(protocol, arith.storage.itemsize, config.slot_bytes, config.nslots)
        return arith.finish(op, _chain(values, ring_all_reduce_first_ranks(count, n, grid, chunk), arith, op), n)
    if algorithm == "tree":
        out = np.empty(count, arith.storage)
        for channel, (lo, hi) in enumerate(channel_ranges(count, grid)):
            if hi > lo:
                out[lo:hi] = arith.finish(op, _tree(values[:, lo:hi], channel % 2, arith, op), n)
        return out
    raise UsageError(f"Cannot compute the exact reference of all_reduce with algorithm={algorithm!r}: only the "
                     "ring, tree and one_shot programs' orders are modelled (NCCL's host collective has its own). "
                     "Fix: compare it with flowdsl.collectives.check's tolerance, or model its order here")


def reference(collective: str, algorithm: str, inputs, dtype: str, op: str | None = None, root: int = 0, *,
              protocol: Protocol | None = None, grid: int = 1, config=None, scalars=None,
              lsa_size: int | None = None) -> list:
    """Each rank's output, bit for bit, in the storage dtype (``None``: a non-root rank of reduce,
    whose output stays as it was).

    Args:
        collective: ``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``, ``"broadcast"``, ``"reduce"`` or
            ``"all_to_all"``.
        algorithm: The program that ran (``launch_shape(...).algorithm``, never ``"auto"``).
        inputs: Every rank's ``src``, in the storage dtype (``nranks * count`` elements for reduce_scatter and
            all_to_all).
        dtype: A collectives element type (bfloat16 as uint16 bits, fp8 as uint8 codes).
        op: An operator name, for the reducing collectives.
        root: The root of broadcast and reduce.
        protocol: The launch's protocol (``launch_shape``): the ring all-reduce's rounds depend on it.
        grid: The launch's blocks (``launch_shape``): the ring all-reduce's rounds and the tree's
            channels depend on them.
        config: The call's :class:`~flowdsl.collectives.FlowConfig` (slot size and count: the
            ring all-reduce's chunk).
        lsa_size: Ranks per LSA team (node): the hierarchical reduce_scatter's order depends on it.
        scalars: ``premulsum``: each rank's scalar (storage dtype). Each rank's input is
            multiplied by its own before anything is combined, as the programs take ``src``.
    """
    arith = elements(dtype)
    values = np.stack([np.asarray(x, arith.storage) for x in inputs]) if len(inputs) else None
    n = len(inputs)
    if collective == "all_gather":
        return [values.reshape(-1).copy() for _ in range(n)]
    if collective == "broadcast":
        return [values[root].copy() for _ in range(n)]
    if collective == "all_to_all":  # rank r's output: block r of every rank's input, in rank order
        count = values.shape[1] // n
        return [values[:, r * count:(r + 1) * count].reshape(-1).copy() for r in range(n)]
    if collective not in REDUCING:
        raise UsageError(f"Cannot compute the exact reference of {collective!r}: it is not a collective. Use one of "
                         "all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all")
    if op not in MODELLED_OPS:
        _apply(op, None, None)  # raises, naming what is modelled
    if op == "premulsum":
        if scalars is None or len(scalars) != n:
            raise UsageError("Cannot compute the exact reference of premulsum without every rank's scalar. Pass "
                             "scalars=[one per rank]")
        values = np.stack([arith.premul(values[r], scalars[r]) for r in range(n)])
    if n == 1:  # one rank: every program is its local copy (no combine, no finish)
        return [values[0].copy()] if collective != "reduce" or root == 0 else [None]
    with np.errstate(all="ignore"):  # wrapping and infinities are part of the bits
        if collective == "all_reduce":
            out = _all_reduce(algorithm, values, arith, op, protocol, grid, config)
            return [out.copy() for _ in range(n)]
        if collective == "reduce_scatter" and algorithm == "hierarchical":
            return _hierarchical_reduce_scatter(values, arith, op, lsa_size)
        if algorithm != "ring":
            raise UsageError(f"Cannot compute the exact reference of {collective} with algorithm={algorithm!r}: "
                             "only its ring program's order is modelled (and the hierarchical reduce_scatter's)")
        if collective == "reduce":
            acc = _chain(values, np.full(values.shape[1], root + 1), arith, op)
            return [arith.finish(op, acc, n) if r == root else None for r in range(n)]
        count = values.shape[1] // n
        return [arith.finish(op, _chain(values[:, r * count:(r + 1) * count], np.full(count, r + 1), arith, op), n)
                for r in range(n)]


def mismatches(got, want, dtype: str, *, nan_ok=None, poison=None) -> np.ndarray:
    """Indices where ``got`` differs from ``want`` bit for bit.

    Where ``nan_ok`` (a mask, or True for all) and both are NaN, any payload matches (the GPU
    makes its canonical NaN, NumPy the CPU's), unless ``got`` holds ``poison``'s bits: an element
    left unwritten is never taken for a NaN result.
    """
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    if got.shape != want.shape:
        raise UsageError(f"Cannot compare an output of shape {got.shape} with a reference of shape {want.shape}. "
                         "Pass the output the reference was computed for")
    uint = np.dtype(f"u{got.dtype.itemsize}")
    g, w = got.view(uint), want.view(uint)
    bad = g != w
    if nan_ok is not None:
        arith = elements(dtype)
        nan_wanted = arith.isnan(want) & nan_ok
        bad &= ~(nan_wanted & arith.isnan(got))
        if poison is not None:  # even where the reference's NaN has the poison's bits
            bad |= nan_wanted & (g == np.asarray(poison, got.dtype).view(uint))
    return np.flatnonzero(bad)
