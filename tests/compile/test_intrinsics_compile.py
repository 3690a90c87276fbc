"""The simulator's intrinsics probe (tests/sim/test_intrinsics.py) compiles for the GPU too: one program
both paths accept, each intrinsic its PTX instruction."""

from __future__ import annotations

import numpy as np
import pytest

import flowdsl
from tests.sim.test_intrinsics import intrinsic_probe

pytestmark = pytest.mark.compile


def test_the_intrinsics_probe_compiles_to_their_instructions(linked_ptx):
    argtypes = flowdsl.FlowKernel.argtypes_for(np.zeros(32, np.int32), np.zeros(32), np.zeros((32, 5), np.int64),
                                               np.zeros((32, 2), np.uint64), np.zeros((32, 3)), np.zeros(3),
                                               nccl="2.28.9")
    ptx = linked_ptx(intrinsic_probe, argtypes)
    for instruction in ("popc.b32", "clz.b32", "brev.b32", "fma.rn.f64", "match.any.sync", "match.all.sync",
                        "%lanemask_lt", "nanosleep"):
        assert instruction in ptx, instruction
