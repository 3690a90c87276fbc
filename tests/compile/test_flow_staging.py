"""Flow's processors take only a staging window made by flowdsl.flow.staging (CPU, no GPU needed).

Such a window has its own kernel type (``StagingWindow``): a processor over any other window
is refused when the kernel is typed, with the message the simulator gives when the processor
is built (tests/sim/test_flow_connections.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from numba.core.errors import TypingError

import flowdsl
from flowdsl import Protocol, flow

pytestmark = pytest.mark.compile


@flowdsl.kernel
def _send_to_myself(comm, stage, x, n):
    proc = flow.processor(comm, stage, None, 1, 2, 16, Protocol.SIMPLE)
    flow.send(proc, flow.connect(proc, comm.rank, 0, 0), x, 0, n)


def _compile(stage):
    argtypes = flowdsl.FlowKernel.argtypes_for("devcomm", stage, np.zeros(1, np.float32), 1, nccl="2.28.9")
    return _send_to_myself.compile(argtypes, arch="sm_90", nccl="2.28.9")


def test_a_processor_over_a_registered_window_is_refused_when_typed():
    with pytest.raises(TypingError, match=r"Cannot build a Flow processor over Window\(uint64\): its staging window "
                                          r"must come from flowdsl.flow.staging\(comm, config\)\..* comm.alloc does "
                                          r"not zero memory.* Make it with stage = flowdsl.flow.staging\(comm, config\)"):
        _compile(("window", np.uint64))


def test_a_processor_over_a_staging_window_compiles():
    assert _compile(("staging", np.uint64)).cubin
