"""``flow.to_float`` and ``flow.from_float``: an element as float32 (bfloat16 bits in uint16, float16 widened)
and back, rounded to nearest even, on the simulator against NumPy bit for bit; the GPU runs the same probe
(tests/gpu/test_numba_features_gpu.py) and must give the same bits."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import flowdsl
from flowdsl import flow
from flowdsl.testing import run_ranks

pytestmark = pytest.mark.sim


@flowdsl.kernel
def conversion_probe(values, bf16_in, f16_in, bf16_out, f16_out, f32_out, widened):
    i = cuda.grid(1)
    if i < values.size:
        bf16_out[i] = flow.from_float(values[i], bf16_in[0])
        f16_out[i] = flow.from_float(values[i], f16_in[0])
        f32_out[i] = flow.from_float(values[i], values[0])
        widened[0, i] = flow.to_float(bf16_in[i])
        widened[1, i] = flow.to_float(f16_in[i])


def probe_inputs():
    """float32 values with bfloat16 and float16 ties, specials and out-of-range values; bfloat16 and float16
    bits, specials among them."""
    rng = np.random.default_rng(40)
    ties = (np.arange(64, dtype=np.uint32) << 16 | 0x8000).view(np.float32)  # exact bfloat16 halfway points
    f16_ties = (np.float32(1) + np.float32(2.0 ** -11) * np.arange(1, 64, 2, dtype=np.float32))
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 1e6, 6e-8, 1e-40, -3.5],
                        np.float32)
    values = np.concatenate([ties, f16_ties, specials, rng.standard_normal(128).astype(np.float32) * 100])
    n = values.size
    bf16 = rng.integers(0, 1 << 16, n).astype(np.uint16)
    bf16[:4] = [0x7F80, 0xFF80, 0x7FC0, 0x0001]  # inf, -inf, NaN, the smallest subnormal
    f16 = rng.integers(0, 1 << 16, n).astype(np.uint16).view(np.float16)
    return values, bf16, f16


def expected(values, bf16, f16):
    bits = values.view(np.uint32)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    to_bf16 = np.where(nan, (bits >> 16) | 0x40, (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    with np.errstate(over="ignore"):
        return (to_bf16, values.astype(np.float16), values.copy(),
                np.stack([(bf16.astype(np.uint32) << 16).view(np.float32), f16.astype(np.float32)]))


def _as_float(x):
    return (x.astype(np.uint32) << 16).view(np.float32) if x.dtype == np.uint16 else x


def check(got, want):
    for g, w in zip(got, want):
        nan = np.isnan(_as_float(w))
        assert (np.isnan(_as_float(g)) == nan).all()  # a NaN is a NaN: payloads are not specified
        np.testing.assert_array_equal(g[~nan].view(np.uint8), w[~nan].view(np.uint8))


def outputs(n):
    return (np.zeros(n, np.uint16), np.zeros(n, np.float16), np.zeros(n, np.float32), np.zeros((2, n), np.float32))


def test_conversions_round_to_nearest_even_as_numpy():
    values, bf16, f16 = probe_inputs()

    def main(comm):
        outs = outputs(values.size)
        conversion_probe[(values.size + 127) // 128, 128](values, bf16, f16, *outs)
        return outs
    check(run_ranks(main, nranks=1)[0], expected(values, bf16, f16))


def test_an_element_type_without_a_float32_form_is_refused_on_both_paths():
    from numba import types

    @flowdsl.kernel
    def ints(x):
        x[0] = flow.to_float(x[1])

    message = r"flowdsl.flow.to_float requires a float64, float32, float16 or bfloat16 \(uint16 bits\) element, got int32"
    with pytest.raises(flowdsl.KernelTypingError, match=message):
        ints.compile((types.int32[::1],), arch="sm_90", nccl="2.28.9")

    def main(comm):
        ints[1, 1](comm.alloc(2, np.int32))
        comm.synchronize()
    with pytest.raises(flowdsl.KernelTypingError, match=message):
        run_ranks(main, nranks=1)


def test_an_array_where_from_float_takes_a_number_is_refused_in_the_same_words():
    from numba import types

    @flowdsl.kernel
    def scaled(x, scale):
        x[0] = flow.from_float(flow.to_float(x[0]) * scale, x[0])

    message = r"flowdsl.flow.from_float requires value to be a number, got array\(float64, 1d, C\)"
    with pytest.raises(flowdsl.KernelTypingError, match=message):
        scaled.compile((types.uint16[::1], types.float64[::1]), arch="sm_90", nccl="2.28.9")

    def main(comm):
        scaled[1, 1](comm.alloc(2, np.uint16), np.array([1.5]))
        comm.synchronize()
    with pytest.raises(flowdsl.KernelTypingError, match=message):
        run_ranks(main, nranks=1)


@flowdsl.kernel
def float64_through(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = flow.from_float(flow.to_float(x[i]) * 3.0 + 0.1, y[i])


def test_float64_is_computed_in_float64_on_both_paths():
    """A float64 element stays float64 (``torch.autograd.gradcheck`` runs kernels in float64): the GPU's typing
    returns float64 from ``to_float`` and the simulator's result equals NumPy's float64 arithmetic bit for bit."""
    from numba import types

    assert float64_through.compile((types.float64[::1], types.float64[::1]), arch="sm_90", nccl="2.28.9").cubin
    x = np.random.default_rng(3).standard_normal(200)

    def main(comm):
        src, dst = comm.alloc(x.size, np.float64), comm.alloc(x.size, np.float64)
        src.set(x)
        float64_through[2, 128](src, dst)
        comm.synchronize()
        return dst.get()
    got = run_ranks(main, nranks=1)[0]
    assert np.array_equal(got, x * 3.0 + 0.1)
    assert not np.array_equal(got, (x.astype(np.float32) * np.float32(3.0) + np.float32(0.1)).astype(np.float64))
