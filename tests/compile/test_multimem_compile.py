"""Multimem compiles to PTX's multimem instructions, linked against both NCCL builds for sm_90 and sm_100;
what PTX lacks is refused at typing in the simulator's words (tests/sim/test_multimem.py runs the same
kernels there)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from numba import cuda

import flowdsl
from flowdsl import RedOp, ThreadScope, lsa, mem
from tests.sim import test_multimem as sim_kernels

pytestmark = pytest.mark.compile


@flowdsl.kernel
def every_multimem_form(comm, win, win16, winb, out, out16):
    mm = lsa.multimem_view(comm, win)
    i = cuda.threadIdx.x * 4
    s = mem.multimem_ld_reduce(mm, i, RedOp.SUM)
    mem.multimem_store(mm, i, s)
    mem.multimem_red(mm, i + 1, s, RedOp.SUM)
    v = mem.multimem_ld_reduce_vec(mm, i, RedOp.SUM)
    mem.multimem_store_vec(mm, i, v)
    mem.multimem_store_vec_relaxed(mm, i, v, ThreadScope.SYSTEM)
    mem.multimem_red_vec(mm, i, v, RedOp.SUM)
    out[0] = v[3]
    h = lsa.multimem_view(comm, win16)
    hv = mem.multimem_ld_reduce_vec(h, cuda.threadIdx.x * 8, RedOp.MAX)
    mem.multimem_store_vec(h, 0, hv)
    hs = mem.multimem_ld_reduce_vec(h, cuda.threadIdx.x * 8, RedOp.SUM)
    out16[0] = hs[7]
    b = lsa.multimem_view(comm, winb, 8, 64)
    bv = mem.multimem_ld_reduce_vec(b, 0, RedOp.SUM)
    mem.multimem_red_vec(b, 0, bv, RedOp.MIN)
    w = lsa.multimem_view(comm, win, dtype=np.int64)
    mem.multimem_red(w, 0, mem.multimem_ld_reduce(w, 0, RedOp.MIN), RedOp.SUM)


def _argtypes(nccl):
    return flowdsl.FlowKernel.argtypes_for("devcomm", ("window", np.float32), ("window", np.float16),
                                           ("window", np.uint16), np.zeros(1, np.float32), np.zeros(1, np.float16),
                                           nccl=nccl)


@pytest.mark.parametrize("nccl, arch", [("2.28.9", "sm_90"), ("2.32.3", "sm_90"), ("2.32.3", "sm_100")])
def test_every_form_is_its_ptx_instruction(linked_ptx, nccl, arch):
    ptx = linked_ptx(every_multimem_form, _argtypes(nccl), nccl=nccl, arch=arch)
    for instruction in ("multimem.ld_reduce.global.add.f32", "multimem.st.global.f32",
                        "multimem.red.relaxed.sys.global.add.f32", "multimem.ld_reduce.global.add.v4.f32",
                        "multimem.st.global.v4.f32", "multimem.st.relaxed.sys.global.v4.f32", "multimem.red.relaxed.sys.global.add.v4.f32",
                        "multimem.ld_reduce.global.max.v4.f16x2", "multimem.ld_reduce.global.add.acc::f32.v4.f16x2",
                        "multimem.ld_reduce.global.add.acc::f32.v4.bf16x2",
                        "multimem.red.relaxed.sys.global.min.v4.bf16x2", "multimem.ld_reduce.global.min.s64",
                        "multimem.red.relaxed.sys.global.add.u64"):
        assert instruction in ptx, instruction
    # A communicator without multimem prints the simulator's refusal and traps.
    strings = [line.split("= {", 1)[1] for line in ptx.splitlines() if "flowdsl_refusal_" in line and "= {" in line]
    assert lsa.MULTIMEM_MISSING + "\n" in {"".join(chr(int(b)) for b in re.findall(r"\d+", s)) for s in strings}


def test_multimem_needs_hopper():
    with pytest.raises(flowdsl.KernelTypingError, match=r"flowdsl\.lsa\.multimem_view.*sm_90"):
        every_multimem_form.compile(_argtypes("2.28.9"), arch="sm_80", nccl="2.28.9")


@pytest.mark.parametrize("kernel, dtype, message", [
    (sim_kernels.max_of_floats, np.float32, "flowdsl.mem.multimem_ld_reduce cannot reduce float32 elements with MAX: "
                                            "PTX's multimem.ld_reduce has SUM for them"),
    (sim_kernels.half_one_at_a_time, np.float16, "flowdsl.mem.multimem_ld_reduce cannot reduce float16 elements "
                                                 "this way: PTX's multimem.ld_reduce takes them 16 bytes at a time"),
])
def test_what_ptx_lacks_is_refused_at_typing_as_on_the_simulator(kernel, dtype, message):
    argtypes = flowdsl.FlowKernel.argtypes_for("devcomm", ("window", dtype), np.zeros(1, dtype), nccl="2.28.9")
    with pytest.raises(flowdsl.KernelTypingError) as caught:
        kernel.compile(argtypes, arch="sm_90", nccl="2.28.9")
    assert message in str(caught.value)


def test_a_multimem_view_cannot_be_indexed():
    argtypes = flowdsl.FlowKernel.argtypes_for("devcomm", ("window", np.int32), np.zeros(1, np.int32), nccl="2.28.9")
    with pytest.raises(flowdsl.KernelTypingError, match=r"getitem\(MultimemView\(int32\)"):
        sim_kernels.indexed.compile(argtypes, arch="sm_90", nccl="2.28.9")


# ---- the multimem all-reduce (flowdsl.collectives.programs.multimem_all_reduce) -------------------------

@pytest.mark.parametrize("nccl", ["2.28.9", "2.32.3"])
@pytest.mark.parametrize("dtype, op, instructions", [
    ("float32", RedOp.SUM, ("multimem.ld_reduce.global.add.v4.f32", "multimem.st.global.v4.f32")),
    ("bfloat16", RedOp.AVG, ("multimem.ld_reduce.global.add.acc::f32.v4.bf16x2", "multimem.st.global.v4.f32")),
    ("float16", RedOp.MAX, ("multimem.ld_reduce.global.max.v4.f16x2", "multimem.st.global.v4.f32")),
    ("int64", RedOp.MIN, ("multimem.ld_reduce.global.min.s64", "multimem.st.global.s64")),
    ("uint32", RedOp.SUM, ("multimem.ld_reduce.global.add.u32", "multimem.st.global.u32")),
])
def test_the_multimem_all_reduce_links_for_hopper(linked_ptx, nccl, dtype, op, instructions):
    """The library's multimem kernels link for sm_90 against both NCCL builds, each with its form's instructions:
    16 bytes at a time where PTX has it, else one element; never the other form (numba types only the one)."""
    from flowdsl.collectives import _library

    kernel = _library.kernel_for("multimem", "all_reduce", op, dtype=dtype)
    ptx = linked_ptx(kernel, _library._argtypes(dtype, nccl, "multimem"), nccl=nccl, arch="sm_90")
    for instruction in instructions:
        assert instruction in ptx, instruction
    vector = _library.storage(dtype)[0] in ("float32", "float16", "uint16")
    assert (".v4." in ptx.split("multimem.ld_reduce", 1)[1].split("\n", 1)[0]) == vector


def test_the_multimem_all_reduce_has_no_kernel_for_what_ptx_lacks():
    from flowdsl.collectives import _library

    with pytest.raises(flowdsl.UsageError, match=r"Cannot make the multimem all_reduce kernel for int8 and SUM: PTX's "
                                                 "multimem has no form"):
        _library.kernel_for("multimem", "all_reduce", RedOp.SUM, dtype="int8")
    with pytest.raises(flowdsl.UsageError, match="for float32 and MAX"):
        _library.kernel_for("multimem", "all_reduce", RedOp.MAX, dtype="float32")
