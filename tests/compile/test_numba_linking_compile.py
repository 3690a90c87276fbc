"""What numba-cuda links beside a kernel goes through flowdsl's link step, beside its support build: the C++
shims of half-precision arithmetic (``a + b`` on float16, ``cuda.fp16``, ``numba.cuda.bf16``), a kernel's
``link=`` files with ``cuda.declare_device``; a kernel that uses none of it links nothing more. Compile only
(sm_90, NCCL 2.28.9's support build); tests/gpu/test_numba_features_gpu.py runs them."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda, types
from numba.cuda import bf16
from numba.cuda.misc.special import literal_unroll

import flowdsl

pytestmark = pytest.mark.compile

TRIPLE_CU = """
extern "C" __device__ int triple(int *result, int x) {  // numba's ABI: the result through a pointer
  *result = 3 * x + 1;
  return 0;
}
"""
triple = cuda.declare_device("triple", "int32(int32)")


def half_arithmetic(a, b, out):
    i = cuda.grid(1)
    if i < out.size:
        # No multiply feeding an add outside hfma: NVVM would fuse them on the GPU (one rounding, not two).
        out[i] = cuda.fp16.hfma(a[i], b[i], a[i] + b[i]) if a[i] < b[i] else a[i] * b[i]


def bf16_arithmetic(a, b, out):
    i = cuda.grid(1)
    if i < out.size:
        x, y = bf16.float32_to_bfloat16(a[i]), bf16.float32_to_bfloat16(b[i])
        out[i] = bf16.bfloat16_to_float32(bf16.hfma(x, y, x))


def linked_triple(out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = triple(i)


def _compile(kernel, *args):
    return kernel.compile(flowdsl.FlowKernel.argtypes_for(*args, nccl="2.28.9"), arch="sm_90", nccl="2.28.9")


def test_half_precision_arithmetic_links_numba_cudas_shims_inline():
    h = np.zeros(4, np.float16)
    compiled = _compile(flowdsl.kernel(half_arithmetic), h, h, h)
    assert len(compiled.function_symbols()) == 1  # the shims inlined into the kernel: no call left


def test_bfloat16_intrinsics_link():
    f = np.zeros(4, np.float32)
    assert len(_compile(flowdsl.kernel(bf16_arithmetic), f, f, f).function_symbols()) == 1


def test_a_link_file_with_declare_device_links_and_its_contents_key_the_cache(tmp_path):
    from flowdsl import _cache
    from flowdsl.lowering.target import Target
    from flowdsl.runtime.support import support_build_for

    source = tmp_path / "triple.cu"
    source.write_text(TRIPLE_CU)
    kernel = flowdsl.kernel(linked_triple, link=[str(source)])
    out = np.zeros(4, np.int32)
    assert len(_compile(kernel, out).function_symbols()) == 1
    argtypes = flowdsl.FlowKernel.argtypes_for(out, nccl="2.28.9")
    target = Target((2, 28, 9), "sm_90")
    key = _cache.kernel_key(kernel, argtypes, target, support_build_for((2, 28, 9), "sm_90"))
    source.write_text(TRIPLE_CU.replace("3 * x", "5 * x"))
    assert _cache.kernel_key(kernel, argtypes, target, support_build_for((2, 28, 9), "sm_90")) != key


def test_without_a_link_file_the_declared_function_is_a_link_error_naming_it():
    with pytest.raises(Exception, match="triple"):
        _compile(flowdsl.kernel(linked_triple), np.zeros(4, np.int32))


def test_a_kernel_using_none_of_it_links_nothing_more(monkeypatch):
    from flowdsl.lowering import backend

    seen = []
    real = backend.Lowered.linked_code

    def spy(self, cc, extra=()):
        seen.append(real(self, cc, extra))
        return seen[-1]
    monkeypatch.setattr(backend.Lowered, "linked_code", spy)

    def plain(out):
        out[cuda.grid(1)] = 1.0

    _compile(flowdsl.kernel(plain), np.zeros(4, np.float32))
    assert seen == [[]]


def test_a_device_function_returning_a_new_array_is_refused_by_numba_cudas_typing():
    """What the simulator refuses alike (tests/sim/test_numba_conventions.py): numba-cuda compiles without NRT."""
    from flowdsl._kernel import FlowKernel

    @flowdsl.device
    def tail_of(a):
        return a[1:]

    @flowdsl.kernel
    def first(a, out):
        out[0] = tail_of(a)[0]

    sample = np.zeros(4)
    with pytest.raises(flowdsl.errors.KernelTypingError, match="Only accept returning of array passed into the function as argument"):
        first.compile(FlowKernel.argtypes_for(sample, sample, nccl="2.28.9"), arch="sm_90", nccl="2.28.9")


_CASES = (np.float64([1.0, 0.0, np.inf, np.nan]), np.float64([[1.0, 1.5], [1.5, 1.0]]))


def _reductions(out):
    i = 0
    for case in literal_unroll(_CASES):
        out[i] = np.all(case)
        i += 1


def test_numbas_runtime_links_where_the_kernel_calls_it(monkeypatch):
    """NUMBA_CUDA_ENABLE_NRT (numba-cuda's test_array_reductions): a kernel that calls numba's runtime links
    numba-cuda's NRT source beside it, as numba-cuda's dispatcher does; without the runtime nothing more."""
    from numba.cuda.core import config

    args = (types.boolean[::1],)
    monkeypatch.setattr(config, "CUDA_ENABLE_NRT", True)
    compiled = flowdsl.kernel(args)(_reductions).compile(args, arch="sm_90", nccl="2.28.9")
    assert compiled.cubin


def reshaped_copy(result, arr):
    for _ in range(1):
        arr = arr.reshape(3 * 2)  # numba-cuda's lowering calls its C helper numba_attempt_nocopy_reshape
        arr = arr.reshape(3, 2)
    for i in range(arr.shape[0]):
        for j in range(arr.shape[1]):
            result[i, j] = arr[i, j]


def test_an_arrays_reshape_links_numba_cudas_reshape_helpers():
    """numba-cuda's dispatcher links reshape_funcs.cu where the code calls it (test_ssa's test_issue3931)."""
    matrix = types.Array(types.float64, 2, "C")
    compiled = flowdsl.kernel(reshaped_copy).compile((matrix, matrix), arch="sm_90", nccl="2.28.9")
    assert compiled.cubin.startswith(b"\x7fELF")


def test_an_array_of_ml_dtypes_bfloat16_is_numba_cudas_bfloat16():
    """CuPy and NumPy arrays of ml_dtypes' bfloat16 (typestr ``|V2``) type as numba-cuda types them, by their dtype
    (test_cupy_bfloat16_interop's kernel)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from numba.cuda import types as cuda_types

    def bf16_sum(arr_in, arr_in2, arr_out):
        tid = cuda.grid(1)
        if tid < arr_in.size:
            arr_out[tid] = 2 * arr_in[tid] + 4 * arr_in2[tid] + ml_dtypes.bfloat16(3.0)

    b = np.zeros(5, ml_dtypes.bfloat16)
    argtypes = flowdsl.FlowKernel.argtypes_for(b, np.arange(5), b, nccl="2.28.9")
    assert argtypes[0].dtype == cuda_types.bfloat16 and argtypes[2] == argtypes[0]
    assert _compile(flowdsl.kernel(bf16_sum), b, np.arange(5), b).cubin.startswith(b"\x7fELF")
