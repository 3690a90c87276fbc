"""fp8 converts by the GPU's instructions from sm_89 and by bit arithmetic before.

The form is picked by NVVM from the target (``__nvvm_reflect``), not when numba types the
function (numba reuses a device function's code for every target of a process), so one
process compiling for several archs gets each its own. ``tests/gpu/test_fp8_gpu.py`` runs
the instructions against the table; ``test_collectives_compile.py`` the bit arithmetic.
"""

from __future__ import annotations

import numpy as np
import pytest

from flowdsl._kernel import FlowKernel
from tests.fp8_kernels import fp8_combine

pytestmark = pytest.mark.compile


def test_each_target_gets_its_own_conversions_in_one_process(linked_ptx):
    u8 = np.zeros(1, np.uint8)
    argtypes = FlowKernel.argtypes_for(u8, u8, u8, 0, 0, nccl="2.28.9")
    for arch, instructions in (("sm_90", True), ("sm_80", False), ("sm_100", True), ("sm_80", False)):
        ptx = linked_ptx(fp8_combine, argtypes, arch=arch)
        for instruction in ("cvt.rn.satfinite.e4m3x2.f32", "cvt.rn.satfinite.e5m2x2.f32", "cvt.rn.f16x2.e4m3x2"):
            assert (instruction in ptx) == instructions, (arch, instruction)
