"""The multimem RMSNorm example (run on the simulator in tests/sim/test_examples.py) compiles and links for sm_90
against both NCCL ABIs: its reduce-scatter is one multimem.ld_reduce per 16 bytes, its all-gather one multimem.st."""

from __future__ import annotations

import re

import numpy as np
import pytest

import flowdsl
from flowdsl.examples import rmsnorm_multimem

pytestmark = pytest.mark.compile

#: The window's NumPy dtype -> the 16-byte ld_reduce of its elements (bfloat16 travels as uint16 bits).
LOADS = {np.float32: "multimem.ld_reduce.global.add.v4.f32",
         np.float16: "multimem.ld_reduce.global.add.acc::f32.v4.f16x2",
         np.uint16: "multimem.ld_reduce.global.add.acc::f32.v4.bf16x2"}


@pytest.mark.parametrize("nccl", ["2.28.9", "2.32.3"])
@pytest.mark.parametrize("dtype", list(LOADS))
def test_rmsnorm_multimem_links_for_hopper(linked_ptx, dtype, nccl):
    args = flowdsl.FlowKernel.argtypes_for("devcomm", ("window", dtype), 512, np.float32(1e-6), nccl=nccl)
    ptx = linked_ptx(rmsnorm_multimem.rmsnorm_multimem, args, nccl=nccl, arch="sm_90")
    assert set(re.findall(r"multimem\.[\w.:]+", ptx)) == {LOADS[dtype], "multimem.st.global.v4.f32"}


def test_rmsnorm_multimem_needs_hopper():
    args = flowdsl.FlowKernel.argtypes_for("devcomm", ("window", np.float32), 512, np.float32(1e-6), nccl="2.28.9")
    with pytest.raises(flowdsl.KernelTypingError, match=r"flowdsl\.lsa\.multimem_view.*sm_90"):
        rmsnorm_multimem.rmsnorm_multimem.compile(args, arch="sm_80", nccl="2.28.9")
