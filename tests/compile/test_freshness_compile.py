"""Freshness on the GPU's side: the one-shot all-reduce counts its calls once per window, and
``flowdsl.wait.accepted`` (the simulator's freshness check) costs no code."""

from __future__ import annotations

import re

import numpy as np
import pytest
from numba import cuda, uint64

import flowdsl
from flowdsl import RedOp, ThreadScope, flow, mem, wait
from flowdsl.collectives import _library

pytestmark = pytest.mark.compile


def test_the_one_shot_all_reduce_counts_its_blocks_with_one_atomic(linked_ptx):
    ptx = linked_ptx(_library.kernel_for("one_shot", "all_reduce", RedOp.SUM), _library._argtypes("float32", "2.28.9",
                                                                                                    "one_shot"))
    atomics = re.findall(r"atom\.[a-z_.]*add\.u64", ptx)
    assert atomics == ["atom.acq_rel.gpu.global.add.u64"] or atomics == ["atom.acq_rel.gpu.add.u64"], atomics


@flowdsl.kernel
def _take_line(comm, words, out):
    out[0] = flow.ll_read(comm, words, cuda.threadIdx.x, uint64(7), 0)


@flowdsl.kernel
def _take_line_unchecked(comm, words, out):
    w = mem.load_relaxed(words, cuda.threadIdx.x, ThreadScope.SYSTEM)
    state = uint64(0)
    while (w >> uint64(32)) != uint64(7):
        state = wait.poll(comm, state, wait.LL_LINE, 0, cuda.threadIdx.x, uint64(7), w >> uint64(32))
        if state == wait.GAVE_UP:
            break
        w = mem.load_relaxed(words, cuda.threadIdx.x, ThreadScope.SYSTEM)
    out[0] = w & uint64(0xFFFFFFFF)


def test_accepted_costs_no_code(linked_ptx):
    """``flow.ll_read`` ends with ``wait.accepted``: its code is that of the same loop without it."""
    argtypes = flowdsl.FlowKernel.argtypes_for("devcomm", np.zeros(4, np.uint64), np.zeros(1, np.uint64),
                                               nccl="2.28.9")
    checked = linked_ptx(_take_line, argtypes)
    unchecked = linked_ptx(_take_line_unchecked, argtypes)

    def body(ptx):  # the instructions, without the kernel's own name
        return [ln.strip() for ln in ptx.splitlines() if ln.strip() and not ln.strip().startswith(("//", ".visible",
                                                                                                  ".entry"))
                and "_take_line" not in ln]
    assert body(checked) == body(unchecked)
