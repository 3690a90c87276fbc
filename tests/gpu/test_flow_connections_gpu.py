"""Flow connections across launches on one GPU, and its staging window (real NCCL).

The same program as the simulator's test (tests/sim/test_flow_connections.py): three blocks
on one channel of a rank sending to itself, every step kind relaunched on one staging
window, outputs poisoned before each launch and compared with NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

from flowdsl import Protocol

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("nothing_left_open")]


@pytest.mark.parametrize("protocol", ["SIMPLE", "LL", "LL128"])
def test_every_step_kind_relaunched_on_one_channel(comm, protocol):
    from tests.sim.test_flow_connections import chain_main

    assert chain_main(Protocol[protocol], seed=5)(comm)


def test_staging_is_zeroed_and_a_plain_window_is_refused(comm):
    from numba.core.errors import TypingError

    from flowdsl import flow
    from tests.sim.test_flow_connections import CFG, chain_kernel

    with flow.staging(comm, CFG) as stage:
        assert stage._numba_type_.staging and not stage.flow_staging.with_outbox
        assert (stage.flow_staging.buffer.get() == 0).all()
    buf = comm.alloc(flow.staging_words(CFG.channels, CFG.nslots, CFG.slot_bytes // 8, False), np.uint64)
    x = comm.alloc(64, np.float32)
    with comm.register(buf) as win, comm.device_communicator() as dcomm, \
            pytest.raises(TypingError, match=r"Cannot build a Flow processor over Window\(uint64\): its staging "
                                             r"window must come from flowdsl.flow.staging\(comm, config\)"):
        chain_kernel(False)[3, CFG.threads](dcomm, win, x, x, x, x, x, x, 0, 64, 0, 0, 0, 0, 0, 0, 2, 2, 16, 0)
