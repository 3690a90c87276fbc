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


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "bfloat16", "float16", "float32", "float64",
                                  "int32", "int64", "uint8"])
def test_element_kernels_compile_for_sm90(name):
    from flowdsl._kernel import FlowKernel

    gpu = _gpu_test()
    dtype, fp8 = gpu.TYPES[name]
    sample = np.zeros(1, dtype)
    argtypes = FlowKernel.argtypes_for(sample, sample, np.int64(2), sample, sample, nccl="2.28.9")
    for op in gpu.OPS:
        gpu.element_kernel(op, fp8).compile(argtypes, arch="sm_90", nccl="2.28.9")


def test_every_element_type_is_covered():
    """The GPU test covers every element type of the collectives."""
    from flowdsl.collectives import DTYPES

    assert set(_gpu_test().TYPES) == set(DTYPES)
