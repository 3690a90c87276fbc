"""The element-arithmetic kernels of ``tests/gpu/test_element_arithmetic_gpu.py`` build without a GPU.

That GPU test holds ``flow.combine`` / ``flow.finish`` on the GPU to the simulator's bit for
bit; here the same kernels (one per operator and fp8 format, for every element type)
compile and link for sm_90 with NCCL 2.28.9, so a typing or lowering error in the
overloads shows up on any machine.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.compile

GPU_TEST = Path(__file__).resolve().parents[1] / "gpu" / "test_element_arithmetic_gpu.py"


@functools.cache
def _gpu_test():
    """The GPU test module (loaded by path: test modules are not importable by name here)."""
    spec = importlib.util.spec_from_file_location("element_arithmetic_gpu", GPU_TEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
                                  "float64", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_element_kernels_compile_for_sm90(name):
    from flowdsl._kernel import FlowKernel

    gpu = _gpu_test()
    dtype, fp8 = gpu.TYPES[name]
    sample = np.zeros(1, dtype)
    argtypes = FlowKernel.argtypes_for(sample, sample, np.int64(2), sample, sample, sample, nccl="2.28.9")
    for op in gpu.OPS:
        gpu.element_kernel(op, fp8).compile(argtypes, arch="sm_90", nccl="2.28.9")


@pytest.mark.parametrize("name,op,wanted,unwanted", [
    ("uint64", "AVG", "div.u64", "div.s64"),  # numba alone divides a uint64 by an int64 as signed
    ("uint32", "AVG", "div.u32", "div.s64"),
    ("uint32", "MIN", "min.u32", "min.s"),
    ("uint64", "MAX", "max.u64", "max.s64"),
    ("int8", "MAX", "max.s16", "max.u16"),  # widened with its sign
])
def test_integers_divide_and_compare_with_their_own_signedness(linked_ptx, name, op, wanted, unwanted):
    from flowdsl import RedOp
    from flowdsl._kernel import FlowKernel

    dtype, fp8 = _gpu_test().TYPES[name]
    sample = np.zeros(1, dtype)
    argtypes = FlowKernel.argtypes_for(sample, sample, np.int64(2), sample, sample, sample, nccl="2.28.9")
    ptx = linked_ptx(_gpu_test().element_kernel(RedOp[op], fp8), argtypes)
    kernel = ptx[ptx.index(".entry"):]
    assert wanted in kernel and unwanted not in kernel, (wanted, unwanted)


def test_every_element_type_is_covered():
    """The GPU test covers every element type of the collectives."""
    from flowdsl.collectives import DTYPES

    assert set(_gpu_test().TYPES) == set(DTYPES)
