"""The GPU's element arithmetic held to the simulator's, bit for bit: ``flow.combine``, ``flow.finish``
and ``flow.premul`` (PREMULSUM's product).

The simulator runs the Python bodies in ``flowdsl/flow.py`` (fp8 by the table in
``flowdsl/_fp8.py``); the GPU runs their overloads in
``flowdsl/lowering/flow.py`` (bit arithmetic for fp8 and bfloat16). A
collective that passes on the simulator can only be trusted on the GPU if the two
agree on every element, so a kernel per (operator, fp8 format), both compile-time
constants captured by a factory as the collectives' programs capture them, applies
both functions to arrays of operands, and every result must have the bits the Python
body gives (any NaN matches any NaN: payloads and signs of NaNs are not specified).

Operands: every pair of the 256 fp8 codes (e4m3fn and e5m2) and of int8 and uint8 values;
bfloat16 random bits with specials and exact ties; float16, float32, float64 and the 32- and
64-bit integers (signed and unsigned) random bits, random values and edge values (extremes,
zeros, infinities, NaN, subnormals). ``tests/compile/test_element_arithmetic_compile.py`` builds the
same kernels without a GPU.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from numba import cuda

import flowdsl
from flowdsl import _fp8, flow
from flowdsl.enums import RedOp

pytestmark = pytest.mark.gpu

OPS = tuple(RedOp)
#: Rank counts ``finish`` divides by (``AVG``): exact halves, thirds, a prime, a power of two.
NRANKS = (1, 2, 3, 7, 8)
#: Element type → (storage dtype, fp8 format of the uint8 codes or 0).
TYPES = {
    "int8": (np.int8, 0),
    "uint8": (np.uint8, 0),
    "int32": (np.int32, 0),
    "uint32": (np.uint32, 0),
    "int64": (np.int64, 0),
    "uint64": (np.uint64, 0),
    "float16": (np.float16, 0),
    "float32": (np.float32, 0),
    "float64": (np.float64, 0),
    "bfloat16": (np.uint16, 0),
    "float8_e4m3fn": (np.uint8, flow.E4M3),
    "float8_e5m2": (np.uint8, flow.E5M2),
}
_RANDOM = 4096  # random operand pairs per kind of randomness


@functools.cache
def element_kernel(op, fp8):
    """The kernel applying ``flow.combine``, ``flow.finish`` and ``flow.premul`` (``b`` the scale) for
    ``op`` and ``fp8`` (constants)."""

    @flowdsl.kernel
    def element_arithmetic(a, b, nranks, combined, finished, premultiplied):
        i = cuda.grid(1)
        if i < a.size:
            combined[i] = flow.combine(op, a[i], b[i], fp8)
            finished[i] = flow.finish(op, a[i], nranks, fp8)
            premultiplied[i] = flow.premul(flow.reduction(op, nranks, fp8, b[i]), a[i])

    return element_arithmetic


def _all_pairs(dtype):
    codes = np.arange(256).astype(np.uint8).view(dtype)  # every byte: int8 from 0 to 127, then -128 to -1
    return np.repeat(codes, 256), np.tile(codes, 256)


def _with_edges(edges, random_a, random_b):
    """Every pair of edge values, then the random pairs."""
    edges = np.asarray(edges)
    return (np.concatenate([np.repeat(edges, edges.size), random_a]),
            np.concatenate([np.tile(edges, edges.size), random_b]))


def _bfloat16(rng):
    specials = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x3F80, 0xBF80, 0x3F81, 0x3F7F, 0x3B80,
                         0x4000, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0x7FFF], np.uint16)
    bits = rng.integers(0, 1 << 16, (2, _RANDOM), dtype=np.uint16)
    # Exact ties of a sum: b is half a unit in the last place of a, so a + b (exact in float32)
    # lies halfway between two bfloat16 values and must round to the even one.
    exponent = rng.integers(16, 240, _RANDOM).astype(np.uint16)
    a = (rng.integers(0, 2, _RANDOM).astype(np.uint16) << 15) | (exponent << 7) | \
        rng.integers(0, 128, _RANDOM).astype(np.uint16)
    b = (a & 0x8000) | ((exponent - 8) << 7)
    return _with_edges(specials, np.concatenate([bits[0], a]), np.concatenate([bits[1], b]))


def _floating(dtype, rng):
    info = np.finfo(dtype)
    edges = np.array([0.0, -0.0, 1.0, -1.0, 0.5, 3.0, info.max, -info.max, info.tiny, -info.tiny,
                      info.smallest_subnormal, -info.smallest_subnormal, 1 + info.eps, np.inf, -np.inf, np.nan],
                     dtype)
    unsigned = np.dtype(f"u{np.dtype(dtype).itemsize}")
    bits = rng.integers(0, np.iinfo(unsigned).max, (2, _RANDOM), dtype=unsigned, endpoint=True).view(dtype)
    values = rng.standard_normal((2, _RANDOM)).astype(dtype)
    return _with_edges(edges, np.concatenate([bits[0], values[0]]), np.concatenate([bits[1], values[1]]))


def _integer(dtype, rng):
    info = np.iinfo(dtype)
    edges = [0, 1, 2, 7, info.max, info.max - 1, info.max // 2 + 1]
    edges += [-1, -2, -7, info.min, info.min + 1] if info.min else [info.max // 3]
    edges = np.array(edges, dtype)
    wide = rng.integers(info.min, info.max, (2, _RANDOM), dtype=dtype, endpoint=True)
    small = rng.integers(-1000 if info.min else 0, 1000, (2, _RANDOM)).astype(dtype)
    return _with_edges(edges, np.concatenate([wide[0], small[0]]), np.concatenate([wide[1], small[1]]))


@functools.cache
def operands(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The operand pairs ``(a, b)`` of an element type, in its storage dtype (the same every run)."""
    dtype = TYPES[name][0]
    rng = np.random.default_rng(sum(map(ord, name)))
    if np.dtype(dtype).itemsize == 1:
        return _all_pairs(dtype)
    if name == "bfloat16":
        return _bfloat16(rng)
    if np.dtype(dtype).kind == "f":
        return _floating(dtype, rng)
    return _integer(dtype, rng)


def python_combine(op, a, b, fp8):
    """``flow.combine`` as the simulator runs it, element by element."""
    with np.errstate(all="ignore"):  # NaN and infinity operands are the point here
        return np.array([flow.combine(op, x, y, fp8) for x, y in zip(a, b)], a.dtype)


def python_premul(op, a, b, fp8):
    """``flow.premul`` as the simulator runs it (``b`` each element's scale)."""
    with np.errstate(all="ignore"):
        return np.array([flow.premul(flow.Reduction(op, 2, fp8, y), x) for x, y in zip(a, b)], a.dtype)


def python_finish(op, values, nranks, fp8):
    """``flow.finish`` as the simulator runs it, element by element (once per distinct value)."""
    distinct, where = np.unique(values.view(f"u{values.itemsize}"), return_inverse=True)
    distinct = distinct.view(values.dtype)
    with np.errstate(all="ignore"):  # signalling NaNs divided
        finished = np.array([flow.finish(op, x, nranks, fp8) for x in distinct], values.dtype)
    return finished[where.reshape(-1)]


def _nan(x, name):
    dtype, fp8 = TYPES[name]
    if fp8:
        return np.isnan(_fp8.values(fp8)[x])
    if name == "bfloat16":
        return (x & 0x7FFF) > 0x7F80
    return np.isnan(x) if np.dtype(dtype).kind == "f" else np.zeros(x.shape, bool)


def mismatches(got, want, name) -> np.ndarray:
    """Indices where ``got`` and ``want`` differ in bits (a NaN matches any NaN)."""
    bits = f"u{got.itemsize}"
    same = got.view(bits) == want.view(bits)
    return np.flatnonzero(~(same | (_nan(got, name) & _nan(want, name))))


def report(what, name, bad, got, want, *operands_) -> str:
    """The first distinct mismatches: operands and results, with their bits in hex."""
    def hexed(x, i):
        return hex(int(x.view(f"u{x.itemsize}")[i]))
    lines = [f"{what} {name}: {bad.size} of {got.size} differ from the simulator's (flow.py) results"]
    seen = set()
    for i in bad:
        key = tuple(hexed(x, i) for x in operands_)
        if key in seen:  # edge values recur in many pairs
            continue
        seen.add(key)
        args = ", ".join(f"{x[i]!r} ({hexed(x, i)})" for x in operands_)
        lines.append(f"  ({args}): GPU {got[i]!r} ({hexed(got, i)}), simulator {want[i]!r} ({hexed(want, i)})")
        if len(seen) == 8:
            break
    return "\n".join(lines)


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("op", OPS, ids=[op.name.lower() for op in OPS])
def test_combine_and_finish_match_the_simulator(op, name):
    import cupy

    dtype, fp8 = TYPES[name]
    a, b = operands(name)
    kernel = element_kernel(op, fp8)
    dev_a, dev_b = cupy.asarray(a), cupy.asarray(b)
    combined, finished, premultiplied = cupy.empty_like(dev_a), cupy.empty_like(dev_a), cupy.empty_like(dev_a)
    failures = []
    for k, nranks in enumerate(NRANKS):
        kernel[(a.size + 255) // 256, 256](dev_a, dev_b, np.int64(nranks), combined, finished, premultiplied)
        cupy.cuda.Device().synchronize()
        if k == 0:
            got, want = combined.get(), python_combine(op, a, b, fp8)
            bad = mismatches(got, want, name)
            if bad.size:
                failures.append(report(f"combine {op.name}", name, bad, got, want, a, b))
            got, want = premultiplied.get(), python_premul(op, a, b, fp8)
            bad = mismatches(got, want, name)
            if bad.size:
                failures.append(report(f"premul {op.name}", name, bad, got, want, a, b))
        got, want = finished.get(), python_finish(op, a, nranks, fp8)
        bad = mismatches(got, want, name)
        if bad.size:
            failures.append(report(f"finish {op.name} nranks={nranks}", name, bad, got, want, a))
    assert not failures, "\n".join(failures)
