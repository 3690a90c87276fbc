"""The GIN example programs (run on the simulator in tests/sim) also compile and link for the GPU."""

from __future__ import annotations

import numpy as np
import pytest

import flowdsl
from flowdsl.examples import alltoall_gin, alltoall_hybrid, gin_put, moe_gin, rmsnorm_gin, rmsnorm_hybrid

pytestmark = pytest.mark.compile

F, I32, I64 = ("window", np.float32), ("window", np.int32), ("window", np.int64)
CASES = {
    "alltoall_gin": (alltoall_gin.alltoall_gin, ("devcomm", F, F, 256, 4), False),
    "alltoall_hybrid": (alltoall_hybrid.alltoall_hybrid, ("devcomm", F, F, 256, 4), False),
    "rmsnorm_gin": (rmsnorm_gin.rmsnorm_gin, ("devcomm", F, F, 96, 1e-6), False),
    "rmsnorm_hybrid": (rmsnorm_hybrid.rmsnorm_hybrid, ("devcomm", F, F, 96, 1e-6), False),
    "gin_put": (gin_put.gin_put, ("devcomm", I64, I64, 1 << 20, 1), False),
    "moe_gin": (moe_gin.moe_gin, ("devcomm", F, I32, F, I32, I64, F, F, np.zeros(2, np.int64),
                                  np.zeros(2, np.int32), np.zeros(2, np.float32), 12, 32, 0), True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gin_example_compiles_for_nccl_2_32(name):
    kernel, args, strong = CASES[name]
    compiled = kernel.compile(flowdsl.FlowKernel.argtypes_for(*args, nccl="2.32.3"), arch="sm_90", nccl="2.32.3")
    assert not [s for s in compiled.function_symbols() if s.startswith("flowdsl_")]
    assert ("gin.strong_signals" in compiled.features) == strong
