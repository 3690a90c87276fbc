"""numba-cuda's intrinsics on the simulator give what the GPU gives: the bit intrinsics at the argument's
width, ``fma`` rounded once, ``cuda.atomic.max``/``min`` and ``nanmax``/``nanmin`` with CUDA's NaN rules,
the warp's ``lanemask_lt`` and ``match_*_sync``; references from NumPy and exact arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda, float64, int32, uint32

import flowdsl
from flowdsl.sim import intrinsics
from flowdsl.testing import run_ranks

pytestmark = pytest.mark.sim

RNG = np.random.default_rng(11)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                                   np.uint64])
def test_bit_intrinsics_at_the_arguments_width(dtype):
    info = np.iinfo(dtype)
    values = np.concatenate([RNG.integers(info.min, info.max, 200, dtype=dtype, endpoint=True),
                             np.array([0, 1, info.max, info.min], dtype)])
    width = np.dtype(dtype).itemsize * 8
    for x in values:
        bits = np.unpackbits(np.array([x]).view(np.uint8)[::-1])  # most significant bit first
        assert intrinsics.popc(x) == bits.sum() and intrinsics.popc(x).dtype == dtype
        ones = np.flatnonzero(bits)
        assert intrinsics.clz(x) == (ones[0] if len(ones) else width)
        assert intrinsics.ffs(x) == (width - ones[-1] if len(ones) else 0) and intrinsics.ffs(x).dtype == np.uint32
        rev = intrinsics.brev(x)
        wide = max(width, 32)
        assert rev.dtype == np.dtype(f"u{wide // 8}")
        assert int(rev) == int("".join(map(str, np.concatenate([np.zeros(wide - width, int), bits])))[::-1], 2)


def test_a_python_int_is_int64_as_numba_types_it():
    assert intrinsics.popc(-1) == 64 and intrinsics.clz(1) == 63 and intrinsics.ffs(-(2**40)) == 41


def test_fma_rounds_once():
    one = 1.0 + 2.0**-30
    assert float(intrinsics.fma(one, one, -(1.0 + 2.0**-29))) == 2.0**-60  # unfused: a * b rounds to c: 0.0
    assert one * one - (1.0 + 2.0**-29) == 0.0
    f = np.float32(1.0 + 2.0**-12)
    got = intrinsics.fma(f, f, np.float32(-(1.0 + 2.0**-11)))
    assert got.dtype == np.float32 and got == np.float32(2.0**-24) and f * f - np.float32(1.0 + 2.0**-11) == 0
    # Operands of 12 significant bits: the exact result fits a float64, so one rounding of it is the answer.
    a, b, c = (np.ldexp(RNG.integers(2**11, 2**12, 500), RNG.integers(-14, -8, 500)).astype(np.float32)
               * RNG.choice([-1, 1], 500).astype(np.float32) for _ in range(3))
    want = (a.astype(np.float64) * b + c).astype(np.float32)
    got = np.array([intrinsics.fma(x, y, z) for x, y, z in zip(a, b, c)])
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert np.isnan(intrinsics.fma(np.inf, 0.0, 1.0)) and intrinsics.fma(np.inf, 1.0, 1.0) == np.inf


def test_cbrt_and_selp_keep_their_types():
    x = RNG.standard_normal(100).astype(np.float32)
    assert all(intrinsics.cbrt(v) == np.cbrt(v) and intrinsics.cbrt(v).dtype == np.float32 for v in x)
    assert intrinsics.cbrt(-27.0) == -3.0 and intrinsics.selp(True, 1, 2) == 1 and intrinsics.selp(0, 1, 2) == 2


def test_atomic_max_and_min_follow_cuda_on_nan():
    nan = np.float32(np.nan)
    one, two = np.float32(1), np.float32(2)
    assert intrinsics.atomic_max(one, two) == 2 and intrinsics.atomic_min(two, one) == 1
    assert np.isnan(intrinsics.atomic_max(nan, one)) and intrinsics.atomic_max(one, nan) == 1  # memory kept
    assert np.isnan(intrinsics.atomic_min(nan, one)) and intrinsics.atomic_min(one, nan) == 1
    assert intrinsics.atomic_nanmax(nan, one) == 1 and intrinsics.atomic_nanmax(one, nan) == 1  # NaN missing
    assert intrinsics.atomic_nanmin(nan, two) == 2 and intrinsics.atomic_nanmin(two, nan) == 2
    assert intrinsics.atomic_max(3, 5) == 5 and intrinsics.atomic_nanmin(3, 5) == 3


@flowdsl.kernel
def intrinsic_probe(ints, floats, out_i, out_u, out_f, extremes):
    tid = cuda.threadIdx.x
    x = ints[tid]
    out_i[tid, 0] = cuda.popc(x)
    out_i[tid, 1] = cuda.clz(x)
    out_i[tid, 2] = cuda.ffs(x)
    out_i[tid, 3] = cuda.match_any_sync(0xFFFFFFFF, x % 4)
    mask, same = cuda.match_all_sync(0xFFFFFFFF, int32(7))
    out_i[tid, 4] = mask if same else -1
    out_u[tid, 0] = cuda.brev(uint32(x))
    out_u[tid, 1] = cuda.lanemask_lt()
    f = floats[tid]
    out_f[tid, 0] = cuda.fma(f, f, float64(-1.0))
    out_f[tid, 1] = cuda.cbrt(f)
    out_f[tid, 2] = cuda.selp(x > 0, f, float64(0.0))
    cuda.nanosleep(uint32(10))
    cuda.atomic.nanmax(extremes, 0, f)
    cuda.atomic.max(extremes, 1, f)
    cuda.atomic.nanmin(extremes, 2, f)


def probe_inputs():
    """32 random int32 and float64 (one NaN) for :func:`intrinsic_probe`."""
    rng = np.random.default_rng(5)
    floats = rng.standard_normal(32)
    floats[5] = np.nan
    return rng.integers(-2**31, 2**31 - 1, 32).astype(np.int32), floats


def probe_outputs():
    return (np.zeros((32, 5), np.int64), np.zeros((32, 2), np.uint64), np.zeros((32, 3), np.float64),
            np.array([np.nan, np.nan, np.nan], np.float64))


def check_probe(ints, floats, out_i, out_u, out_f, extremes):
    """What the GPU computes for :func:`intrinsic_probe` (the GPU test checks its run with this too)."""
    bits = [format(int(x) & 0xFFFFFFFF, "032b") for x in ints]
    assert list(out_i[:, 0]) == [b.count("1") for b in bits]
    assert list(out_i[:, 1]) == [len(b) - len(b.lstrip("0")) for b in bits]
    assert list(out_i[:, 2]) == [0 if "1" not in b else 32 - b.rindex("1") for b in bits]
    groups = ints % 4
    assert [int(np.uint32(m & 0xFFFFFFFF)) for m in out_i[:, 3]] == [
        sum(1 << j for j in range(32) if groups[j] == groups[i]) for i in range(32)]
    assert (out_i[:, 4] == np.int64(np.uint32(0xFFFFFFFF).view(np.int32))).all()
    assert list(out_u[:, 0]) == [int(b[::-1], 2) for b in bits]
    assert list(out_u[:, 1]) == [(1 << lane) - 1 for lane in range(32)]
    ok = ~np.isnan(floats)
    np.testing.assert_allclose(out_f[ok, 1], np.cbrt(floats[ok]), rtol=1e-15)  # libdevice: within 1 ulp
    np.testing.assert_array_equal(out_f[ok, 2], np.where(ints > 0, floats, 0.0)[ok])
    assert extremes[0] == floats[ok].max() and extremes[2] == floats[ok].min()
    assert np.isnan(extremes[1])  # max leaves a NaN in memory where it is


def test_the_intrinsics_in_a_simulated_kernel():
    ints, floats = probe_inputs()

    def main(comm):
        outputs = probe_outputs()
        intrinsic_probe[1, 32](ints, floats, *outputs)
        comm.synchronize()
        return outputs

    outputs = run_ranks(main, nranks=1)[0]
    check_probe(ints, floats, *outputs)
    fused = [intrinsics.fma(f, f, -1.0) for f in floats]
    np.testing.assert_array_equal(outputs[2][:, 0], fused)


@flowdsl.kernel
def fp16_probe(a, b, c, out, flags):
    i = cuda.grid(1)
    if i < a.size:
        x, y, z = a[i], b[i], c[i]
        out[i, 0] = cuda.fp16.hadd(x, y)
        out[i, 1] = cuda.fp16.hsub(x, y)
        out[i, 2] = cuda.fp16.hmul(x, y)
        out[i, 3] = cuda.fp16.hdiv(x, y)
        out[i, 4] = cuda.fp16.hfma(x, y, z)
        out[i, 5] = cuda.fp16.hmax(x, y)
        out[i, 6] = cuda.fp16.hmin(x, y)
        out[i, 7] = cuda.fp16.hsqrt(x)
        out[i, 8] = cuda.fp16.hneg(x)
        out[i, 9] = cuda.fp16.habs(x)
        flags[i, 0] = cuda.fp16.heq(x, y)
        flags[i, 1] = cuda.fp16.hne(x, y)
        flags[i, 2] = cuda.fp16.hlt(x, y)
        flags[i, 3] = cuda.fp16.hge(x, y)


def fp16_inputs():
    """Random halves over their range, with NaN, signed zeros, infinities and equal pairs among them."""
    rng = np.random.default_rng(16)
    a, b, c = (rng.standard_normal(256).astype(np.float16) * np.float16(rng.choice([1, 8, 300], 256)) for _ in "abc")
    special = np.array([np.nan, 0.0, -0.0, np.inf, -np.inf, 1.0], np.float16)
    a[:6], b[:6], b[6:12] = special, special[::-1], a[6:12]
    return a, b, c


def fp16_expected(a, b, c):
    """What the simulator's cuda.fp16 gives for :func:`fp16_probe` (the GPU test compares the device's bits)."""
    h = intrinsics.Fp16
    out = np.array([[h.hadd(x, y), h.hsub(x, y), h.hmul(x, y), h.hdiv(x, y), h.hfma(x, y, z), h.hmax(x, y),
                     h.hmin(x, y), h.hsqrt(x), h.hneg(x), h.habs(x)] for x, y, z in zip(a, b, c)], np.float16)
    flags = np.array([[h.heq(x, y), h.hne(x, y), h.hlt(x, y), h.hge(x, y)] for x, y in zip(a, b)], np.uint8)
    return out, flags


def test_fp16_in_a_simulated_kernel_against_float64():
    a, b, c = fp16_inputs()

    def main(comm):
        out, flags = np.zeros((256, 10), np.float16), np.zeros((256, 4), np.uint8)
        fp16_probe[2, 128](a, b, c, out, flags)
        comm.synchronize()
        return out, flags
    out, flags = run_ranks(main, nranks=1)[0]
    want, want_flags = fp16_expected(a, b, c)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(flags, want_flags)
    with np.errstate(all="ignore"):  # the arithmetic, independently: float64 then one rounding
        x, y = a.astype(np.float64), b.astype(np.float64)
        np.testing.assert_array_equal(out[:, 0], (x + y).astype(np.float16))
        np.testing.assert_array_equal(out[:, 2], (x * y).astype(np.float16))
        np.testing.assert_array_equal(out[:, 3], (x / y).astype(np.float16))
    ordered = ~(np.isnan(a) | np.isnan(b))
    assert (flags[:, 1] == (ordered & (a != b))).all() and not flags[0, 1]  # hne(NaN, x) is false


@flowdsl.kernel
def round_probe(x32, x64, digits, out32, out64, whole):
    i = cuda.grid(1)
    if i < x32.size:
        out32[i] = round(x32[i], digits[i])
        out64[i] = round(x64[i], digits[i])
        whole[i] = round(x32[i] * 8)


def test_round_is_numba_cudas_not_numpys():
    """``round(x, n)`` of a float32 is computed in double on the GPU (numba-cuda's lowering), where NumPy's
    float32 ``round`` rounds ``x * 10**n`` in float32: 0.3425f to 3 digits is 0.343 on a GPU, 0.342 in NumPy
    (the simulator gave NumPy's). Reference: Python's correctly rounded ``round`` of the value as a double."""
    rng = np.random.default_rng(7)
    x32 = np.concatenate([[0.3425, 2.5, -1.5, 0.125], rng.random(60) * 100 - 50]).astype(np.float32)
    x64 = x32.astype(np.float64) + rng.random(x32.size) * 1e-9
    digits = np.concatenate([[3, 0, 0, 2], rng.integers(-2, 6, 60)]).astype(np.int32)

    def main(comm):
        out32, out64, whole = np.zeros_like(x32), np.zeros_like(x64), np.zeros(x32.size, np.int64)
        round_probe[1, 64](x32, x64, digits, out32, out64, whole)
        comm.synchronize()
        return out32, out64, whole

    out32, out64, whole = run_ranks(main, nranks=1)[0]
    np.testing.assert_array_equal(out32, [np.float32(round(float(x), int(n))) for x, n in zip(x32, digits)])
    np.testing.assert_array_equal(out64, [round(float(x), int(n)) for x, n in zip(x64, digits)])
    np.testing.assert_array_equal(whole, [round(float(x) * 8) for x in x32])  # halves to even
    assert out32[0] == np.float32(0.343) and round(np.float32(0.3425), 3) == np.float32(0.342)
