"""``numba.cuda.bf16`` on the simulator (flowdsl/sim/bf16.py): a probe kernel of its arithmetic, comparisons and
conversions on random and special bfloat16 values, against NumPy bit for bit (float64 arithmetic rounded once to
bfloat16: exact or innocuously double-rounded for these operations). tests/gpu/test_numba_features_gpu.py runs
the same probe on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from numba.cuda import bf16

import flowdsl
from flowdsl.testing import run_ranks

pytestmark = pytest.mark.sim

N = 512


@flowdsl.kernel
def bf16_probe(a_bits, b_bits, c_bits, floats, out_bits, flags, ints):
    i = cuda.grid(1)
    if i < a_bits.size:
        a = bf16.int16_as_bfloat16(a_bits[i])
        b = bf16.int16_as_bfloat16(b_bits[i])
        c = bf16.int16_as_bfloat16(c_bits[i])
        out_bits[0, i] = bf16.bfloat16_as_int16(bf16.hadd(a, b))
        out_bits[1, i] = bf16.bfloat16_as_int16(bf16.hsub(a, b))
        out_bits[2, i] = bf16.bfloat16_as_int16(bf16.hmul(a, b))
        out_bits[3, i] = bf16.bfloat16_as_int16(bf16.hdiv(a, b))
        out_bits[4, i] = bf16.bfloat16_as_int16(bf16.hfma(a, b, c))
        # Operators: two roundings (__hdiv, __hsub). Not a * b + c: NVVM fuses that into one fma on a GPU.
        out_bits[5, i] = bf16.bfloat16_as_int16(a / b - c)
        out_bits[6, i] = bf16.bfloat16_as_int16(bf16.hmax(a, b))
        out_bits[7, i] = bf16.bfloat16_as_int16(bf16.hmin(a, b))
        out_bits[8, i] = bf16.bfloat16_as_int16(bf16.float32_to_bfloat16_rn(floats[i]))
        out_bits[9, i] = bf16.bfloat16_as_int16(bf16.float32_to_bfloat16_rz(floats[i]))
        out_bits[10, i] = bf16.bfloat16_as_int16(bf16.float32_to_bfloat16_rd(floats[i]))
        out_bits[11, i] = bf16.bfloat16_as_int16(bf16.float32_to_bfloat16_ru(floats[i]))
        flags[0, i] = 1 if bf16.hlt(a, b) else 0
        flags[1, i] = 1 if bf16.heq(a, b) else 0
        flags[2, i] = 1 if bf16.hneu(a, b) else 0
        flags[3, i] = 1 if bf16.hisnan(a) else 0
        ints[i] = bf16.bfloat16_to_int32_rn(a)


def probe_inputs():
    rng = np.random.default_rng(21)
    floats = (rng.standard_normal(N) * 10.0 ** rng.integers(-3, 4, N)).astype(np.float32)
    floats[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.4e38, 1e-40, 2.5]
    ties = (np.arange(16, dtype=np.uint32) << 16 | 0x8000).view(np.float32)  # exact halfway points
    floats[8:24] = ties
    bits = [_to_bf16_bits(rng.standard_normal(N).astype(np.float32) * 4) for _ in range(3)]
    specials = np.array([0x7FC0, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x3F80, 0x0001, 0x7F7F], np.uint16)
    for b in bits:
        b[-8:] = specials.view(np.int16)
    bits[1][-16:-8] = bits[0][-16:-8]  # equal pairs
    return (*bits, floats)


def _to_bf16_bits(x: np.ndarray, mode: str = "rn") -> np.ndarray:
    """float32 ``x`` to bfloat16 bits (int16) by ``mode``, NaN to the canonical NaN."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    low = u & 0xFFFF
    sign = (u >> 31) & 1
    if mode == "rn":
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    elif mode == "rz":
        r = u >> 16
    else:  # away from zero when the value's sign asks for it
        up = (sign == 0) if mode == "ru" else (sign == 1)
        r = np.where(up & (low != 0), (u >> 16) + 1, u >> 16)
    r = np.where(np.isnan(x), 0x7FFF, r)
    return r.astype(np.uint16).view(np.int16)


def _f32(bits: np.ndarray) -> np.ndarray:
    return (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def expected(a_bits, b_bits, c_bits, floats):
    a, b, c = (_f32(x).astype(np.float64) for x in (a_bits, b_bits, c_bits))
    with np.errstate(all="ignore"):
        quotient = _f32(_to_bf16_bits((a / b).astype(np.float32))).astype(np.float64)  # the operator rounds it
        rounded = [_to_bf16_bits(v.astype(np.float32)) for v in (a + b, a - b, a * b, a / b, a * b + c, quotient - c)]
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        mx = np.where(nan_a & nan_b, np.nan, np.where(nan_a, b, np.where(nan_b, a, np.maximum(a, b))))
        mn = np.where(nan_a & nan_b, np.nan, np.where(nan_a, b, np.where(nan_b, a, np.minimum(a, b))))
        out = np.stack(rounded + [_to_bf16_bits(mx.astype(np.float32)), _to_bf16_bits(mn.astype(np.float32))]
                       + [_to_bf16_bits(floats, m) for m in ("rn", "rz", "rd", "ru")])
        flags = np.stack([a < b, a == b, ~(a == b), nan_a]).astype(np.uint8)
        ints = np.where(nan_a, 0, np.clip(np.rint(np.nan_to_num(a, posinf=2**31 - 1, neginf=-2**31)), -2**31, 2**31 - 1))
    return out, flags, ints.astype(np.int32)


def outputs():
    return np.zeros((12, N), np.int16), np.zeros((4, N), np.uint8), np.zeros(N, np.int32)


def check(got, want, a_bits, b_bits):
    out, flags, ints = got
    w_out, w_flags, w_ints = want
    nan = np.isnan(_f32(w_out))
    assert (np.isnan(_f32(out)) == nan).all(), np.argwhere(np.isnan(_f32(out)) != nan)[:5]
    # hmax/hmin of +0 and -0: either zero (the sign of the result is not the probe's point)
    zeros = (_f32(w_out[6:8]) == 0) & (_f32(out[6:8]) == 0)
    mask = ~nan
    mask[6:8] &= ~zeros
    np.testing.assert_array_equal(out[mask], w_out[mask])
    np.testing.assert_array_equal(flags, w_flags)
    np.testing.assert_array_equal(ints, w_ints)


def test_bf16_probe_matches_numpy_bit_for_bit():
    a, b, c, floats = probe_inputs()

    def main(comm):
        outs = outputs()
        bf16_probe[(N + 127) // 128, 128](a, b, c, floats, *outs)
        return outs
    check(run_ranks(main, nranks=1)[0], expected(a, b, c, floats), a, b)
