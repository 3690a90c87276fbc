"""A GIN call kind's body is inlined or kept by what each kernel does with it, whatever kernel compiled
the same numba functions before in the process (they share their LLVM modules)."""

from __future__ import annotations

import numpy as np
import pytest

import flowdsl
from flowdsl import gin, team

pytestmark = pytest.mark.compile

F = ("window", np.float32)


@flowdsl.kernel
def one_put(comm, win):
    gin.put(gin.context(comm, 0), team.world(comm), 1, win, 0, win, 64, 64, remote=gin.signal_inc(0))


@flowdsl.kernel
def two_puts(comm, win):
    ctx = gin.context(comm, 0)
    gin.put(ctx, team.world(comm), 1, win, 0, win, 64, 64, remote=gin.signal_inc(0))
    gin.put(ctx, team.world(comm), 2, win, 0, win, 64, 64, remote=gin.signal_inc(0))


def _bodies(compiled):
    return [s.rsplit("$", 1)[-1] for s in compiled.function_symbols() if "out_of_line__" in s]


@pytest.mark.parametrize("order", [(one_put, two_puts, one_put), (two_puts, one_put, two_puts)])
def test_each_kernel_decides_for_itself(order):
    argtypes = flowdsl.FlowKernel.argtypes_for("devcomm", F, nccl="2.28.9")
    expected = {one_put: [], two_puts: ["out_of_line__flowdsl_gin_put__signal_inc__thread"]}
    for kernel in order:  # the same numba put function, so the same module holding the body, each time
        compiled = kernel.compile(argtypes, arch="sm_90", nccl="2.28.9", gin_backend="proxy")
        assert _bodies(compiled) == expected[kernel]
