"""The GPU runtime's objects keep the host contract the simulator's keep (:mod:`flowdsl.host.contract`):
as instances on a real GPU, with the host barrier and the refusals of ``free`` the simulator gives."""

from __future__ import annotations

import numpy as np
import pytest

from flowdsl.host import contract

pytestmark = pytest.mark.gpu


def test_gpu_objects_are_instances_of_the_contract_and_the_barrier_returns(comm):
    import flowdsl

    buf = comm.alloc(64, np.float32)
    with comm.register(buf) as win, comm.device_communicator(lsa_barrier_count=1) as dc:
        assert isinstance(comm, contract.Communicator) and isinstance(win, contract.Window)
        assert isinstance(dc, contract.DevComm) and win.communicator is comm and dc.communicator is comm
        with pytest.raises(flowdsl.UsageError, match="Cannot free this buffer: a window is still registered over "
                                                     "it. Close it first"):
            comm.free(buf)
    comm.barrier()  # one rank: NCCL's all-reduce of one element with itself
    comm.barrier()
    comm.free(buf)
    with pytest.raises(flowdsl.UsageError, match="Cannot create a device communicator: lsa_barrier_count must be "
                                                 ">= 0, got -1"):
        comm.device_communicator(lsa_barrier_count=-1)
