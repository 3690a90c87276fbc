"""Inputs and NumPy references for checking the collectives (simulator tests, GPU script, examples).

Inputs are random but kept where the operator cannot overflow the element type
(so that wrapping or infinities do not make the comparison meaningless), and
bfloat16 is carried as uint16 bits and fp8 as uint8 codes (``flowdsl/_fp8.py``).
:func:`reference` computes each collective
with NumPy in float64/int64; :func:`compare` applies a tolerance that depends
only on the element type and the number of ranks.

Contents: :func:`inputs`, :func:`reference`, :func:`compare`, :func:`storage_dtype`,
:func:`poison`, :func:`bf16_bits`, :func:`bf16_values`.
"""

from __future__ import annotations

import numpy as np

from .. import _fp8

__all__ = ["inputs", "reference", "compare", "storage_dtype", "poison", "bf16_bits", "bf16_values"]


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
        elif dtype == "uint8":
            hi = 2 if op == "prod" else 256 // nranks
            out.append(rng.integers(0, hi, size).astype(np.uint8))
        else:
            lo, hi = (-3, 4) if op == "prod" else (-1000, 1000)
            out.append(rng.integers(lo, hi, size).astype(dtype))
    return out


def _values(x, dtype):
    x = np.asarray(x)
    if dtype == "bfloat16":
        return bf16_values(x).astype(np.float64)
    if dtype in _FP8:
        return _fp8.from_fp8(x, _FP8[dtype])
    return x.astype(np.float64 if x.dtype.kind == "f" else np.int64)


def _reduce(arrays, dtype, op):
    v = np.stack([_values(a, dtype) for a in arrays])
    if op == "sum":
        return v.sum(0)
    if op == "prod":
        return v.prod(0)
    if op == "min":
        return v.min(0)
    if op == "max":
        return v.max(0)
    s = v.sum(0)  # avg
    if v.dtype.kind == "f":
        return s / len(arrays)
    return np.trunc(s / len(arrays)).astype(np.int64) if np.abs(s).max(initial=0) < 2**52 else \
        np.sign(s) * (np.abs(s) // len(arrays))


def reference(collective: str, ins: list[np.ndarray], dtype: str, op: str | None, root: int = 0) -> list:
    """What each rank's ``dst`` must hold (``None``: unwritten, on non-root ranks of ``reduce``)."""
    n = len(ins)
    if collective == "all_reduce":
        return [_reduce(ins, dtype, op)] * n
    if collective == "all_gather":
        return [np.concatenate([_values(a, dtype) for a in ins])] * n
    if collective == "reduce_scatter":
        full = _reduce(ins, dtype, op)
        count = full.size // n
        return [full[r * count:(r + 1) * count] for r in range(n)]
    if collective == "broadcast":
        return [_values(ins[root], dtype)] * n
    if collective == "reduce":
        return [_reduce(ins, dtype, op) if r == root else None for r in range(n)]
    raise ValueError(collective)


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
