"""16-byte vector values for the GPU: each ``flowdsl.mem.load_vector`` / ``store_vector`` (and relaxed form) is one
128-bit access of the vector type's lanes, the vector built and taken apart in registers; a value of another type is
refused in the words the simulator uses (``tests/sim/test_vectors.py``)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import flowdsl
from flowdsl import mem
from tests.vector_kernels import REFUSED, VECTOR_TYPES, built_from_halves, lanes_reversed, tuple_into_store_vector, \
    wrong_vector_type

pytestmark = pytest.mark.compile

#: PTX type of each element type's 128-bit access (flowdsl.lowering.mem: integers as bits).
_PTX = {"int32": "v4.b32", "uint32": "v4.b32", "float32": "v4.f32", "int64": "v2.b64", "uint64": "v2.b64",
        "float64": "v2.f64"}


def _accesses(ptx: str) -> list[str]:
    return re.findall(r"^\s*((?:ld|st)(?:\.\w+)*\.v[24]\.\w+)", ptx, re.M)


@pytest.mark.parametrize("dtype", list(VECTOR_TYPES), ids=[d.name for d in VECTOR_TYPES])
def test_each_vector_access_is_one_128_bit_instruction(linked_ptx, dtype):
    a = np.zeros(8, dtype)
    argtypes = flowdsl.FlowKernel.argtypes_for(a, a, True, nccl="2.28.9")
    got = sorted(_accesses(linked_ptx(lanes_reversed(dtype), argtypes)))
    want = _PTX[dtype.name]
    assert got == sorted([f"ld.{want}", f"st.{want}", f"ld.relaxed.gpu.{want}", f"st.relaxed.gpu.{want}"]), got


def test_a_vector_built_from_a_smaller_one_stores_in_one_instruction(linked_ptx):
    a = np.zeros(8, np.float32)
    ptx = linked_ptx(built_from_halves, flowdsl.FlowKernel.argtypes_for(a, a, nccl="2.28.9"))
    assert sorted(_accesses(ptx)) == ["ld.v4.f32", "st.v4.f32"]


@pytest.mark.parametrize("kernel, got", [(tuple_into_store_vector, "a tuple"), (wrong_vector_type, "int32x4")],
                         ids=["tuple", "int32x4"])
def test_store_vector_refuses_a_value_of_another_type(kernel, got):
    a = np.zeros(8, np.float32)
    with pytest.raises(flowdsl.KernelTypingError) as caught:
        kernel.compile(flowdsl.FlowKernel.argtypes_for(a, a, nccl="2.28.9"), arch="sm_90", nccl="2.28.9")
    assert mem.vector_refusal("store_vector", "float32", got) in str(caught.value)


@pytest.mark.parametrize("kernel, words", REFUSED, ids=[k.__name__ for k, _ in REFUSED])
def test_what_numba_cuda_refuses_of_a_vector_is_a_typing_error(kernel, words):
    a = np.zeros(2, np.float32)
    with pytest.raises(flowdsl.KernelTypingError) as caught:
        kernel.compile(flowdsl.FlowKernel.argtypes_for(a, nccl="2.28.9"), arch="sm_90", nccl="2.28.9")
    if kernel.__name__ == "lane_written":  # numba-cuda types it and has no code: flowdsl says what is wrong
        assert words in str(caught.value)
