"""NCCL's three multimem all-reduce kernels (run on the simulator in tests/sim/test_examples.py) compile and link
for sm_90 against both NCCL ABIs: each line is one multimem.ld_reduce of 16 bytes, the two-shot kernels store it
with one multimem.st (the poison kernel's relaxed at system scope, so that the peers' polls of its .w are no data
race), and the poison kernel polls with ld.relaxed.sys and re-poisons with st.relaxed.sys."""

from __future__ import annotations

import re

import numpy as np
import pytest

import flowdsl
from flowdsl.examples import allreduce_multimem

pytestmark = pytest.mark.compile

LOAD = "multimem.ld_reduce.global.add.v4.f32"
WINDOW = ("window", np.float32)
#: kernel -> (its arguments after the device communicator, the multimem instructions in its linked PTX)
KERNELS = {
    "oneshot_mc_allreduce": ((np.zeros(64, np.float32), WINDOW, 16), {LOAD}),
    "twoshot_mc_allreduce": ((WINDOW, WINDOW, 16), {LOAD, "multimem.st.global.v4.f32"}),
    "twoshot_mc_poison_allreduce": ((WINDOW, WINDOW, WINDOW, 16, True),
                                    {LOAD, "multimem.st.relaxed.sys.global.v4.f32"}),
}


@pytest.mark.parametrize("nccl", ["2.28.9", "2.32.3"])
@pytest.mark.parametrize("name", list(KERNELS))
def test_allreduce_multimem_links_for_hopper(linked_ptx, name, nccl):
    args, instructions = KERNELS[name]
    argtypes = flowdsl.FlowKernel.argtypes_for("devcomm", *args, nccl=nccl)
    ptx = linked_ptx(getattr(allreduce_multimem, name), argtypes, nccl=nccl, arch="sm_90")
    assert set(re.findall(r"multimem\.[\w.:]+", ptx)) == instructions
    if name == "twoshot_mc_poison_allreduce":
        assert re.search(r"ld\.relaxed\.sys(\.global)?\.(u32|b32)", ptx), "the poll of .w"
        assert re.search(r"st\.relaxed\.sys(\.global)?\.(u32|b32)", ptx), "the re-poison of .w"


def test_allreduce_multimem_needs_hopper():
    args = flowdsl.FlowKernel.argtypes_for("devcomm", WINDOW, WINDOW, 16, nccl="2.28.9")
    with pytest.raises(flowdsl.KernelTypingError, match=r"flowdsl\.lsa\.multimem_view.*sm_90"):
        allreduce_multimem.twoshot_mc_allreduce.compile(args, arch="sm_80", nccl="2.28.9")
