"""lsa.multimem_reduce_sum, multimem_copy and multimem_reduce_sum_copy compile to the multimem instructions their
element type has, and only those (the other loop is dropped when the kernel is typed), linked for sm_90; what has
no multimem form is refused at typing in the simulator's words (tests/sim/test_multimem_reduce_copy.py runs the
same kernels there)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import flowdsl
from tests.sim import test_multimem_reduce_copy as sim_kernels

pytestmark = pytest.mark.compile

_LD = "multimem.ld_reduce.global.add."
_ST = "multimem.st.global."
#: element type -> the multimem instructions of (multimem_reduce_sum, multimem_copy, multimem_reduce_sum_copy), as
#: PTX spells them: a 16-byte loop where the type has a 16-byte form, a one-element loop where it has that.
FORMS = {
    np.float32: ({_LD + "f32", _LD + "v4.f32"}, {_ST + "f32", _ST + "v4.f32"},
                 {_LD + "f32", _LD + "v4.f32", _ST + "f32", _ST + "v4.f32"}),
    np.float16: ({_LD + "acc::f32.v4.f16x2"}, {_ST + "v4.f32"}, {_LD + "acc::f32.v4.f16x2", _ST + "v4.f32"}),
    np.uint16: ({_LD + "acc::f32.v4.bf16x2"}, {_ST + "v4.f32"}, {_LD + "acc::f32.v4.bf16x2", _ST + "v4.f32"}),
    np.int64: ({_LD + "u64"}, {_ST + "s64", _ST + "v4.f32"}, {_LD + "u64", _ST + "s64"}),
    np.float64: ({_LD + "f64"}, {_ST + "f64", _ST + "v4.f32"}, {_LD + "f64", _ST + "f64"}),
}


def _instructions(ptx):
    return set(re.findall(r"multimem\.(?:ld_reduce|st|red)[\w.:]*", ptx))


@pytest.mark.parametrize("dtype", list(FORMS))
def test_each_helper_is_the_multimem_instructions_of_its_element_type(linked_ptx, dtype):
    reduce_sum, copy, reduce_sum_copy = FORMS[dtype]
    args = flowdsl.FlowKernel.argtypes_for("devcomm", ("window", dtype), np.zeros(1, dtype), 0, 8, nccl="2.28.9")
    assert _instructions(linked_ptx(sim_kernels.reduce_sum_kernel, args)) == reduce_sum
    args = flowdsl.FlowKernel.argtypes_for("devcomm", np.zeros(1, dtype), ("window", dtype), 0, 8, 0, nccl="2.28.9")
    assert _instructions(linked_ptx(sim_kernels.copy_kernel, args)) == copy
    args = flowdsl.FlowKernel.argtypes_for("devcomm", ("window", dtype), ("window", dtype), 8, nccl="2.28.9")
    assert _instructions(linked_ptx(sim_kernels.all_reduce_kernel, args)) == reduce_sum_copy


@pytest.mark.parametrize("kernel, win_dtype, arg, message", [
    (sim_kernels.reduce_int8, np.int8, np.zeros(1, np.int8),
     "Cannot run flowdsl.lsa.multimem_reduce_sum on int8 elements, which no multimem form takes: "
     "flowdsl.mem.multimem_ld_reduce cannot reduce int8 elements: PTX's multimem.ld_reduce reduces"),
    (sim_kernels.copy_mixed, np.float32, np.zeros(1, np.float64),
     "Cannot run flowdsl.lsa.multimem_copy from float64 to float32 elements: it moves one element type"),
])
def test_what_has_no_multimem_form_is_refused_at_typing_as_on_the_simulator(kernel, win_dtype, arg, message):
    args = (("devcomm", arg, ("window", win_dtype)) if kernel is sim_kernels.copy_mixed
            else ("devcomm", ("window", win_dtype), arg))
    with pytest.raises(flowdsl.KernelTypingError) as caught:
        kernel.compile(flowdsl.FlowKernel.argtypes_for(*args, nccl="2.28.9"), arch="sm_90", nccl="2.28.9")
    assert message in str(caught.value)


def test_the_helpers_need_hopper():
    args = flowdsl.FlowKernel.argtypes_for("devcomm", ("window", np.float32), np.zeros(1, np.float32), 0, 8,
                                           nccl="2.28.9")
    with pytest.raises(flowdsl.KernelTypingError, match=r"flowdsl\.lsa\.multimem_\w+.*sm_90"):
        sim_kernels.reduce_sum_kernel.compile(args, arch="sm_80", nccl="2.28.9")
