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


def test_the_gin_context_count_is_the_device_communicators_on_host_and_in_kernels(comm):
    """NCCL's ginContextCount, read from the struct on the host and by comm.gin_context_count in a kernel."""
    import flowdsl

    @flowdsl.kernel
    def read_count(dc, out):
        out[0] = dc.gin_context_count

    out = comm.alloc(1, np.int32)
    with comm.device_communicator(gin_context_count=2) as dc:
        read_count[1, 1](dc, out)
        comm.synchronize()
        assert int(out.get()[0]) == dc.gin_context_count >= 0


def test_exchange_gathers_every_ranks_words_on_a_stream_and_a_checked_collective_runs_through_it(comm):
    """``comm.exchange`` is NCCL's all-gather read back (one row per rank); with ``check_collectives`` on,
    a collective's arguments go through it before the kernel runs, and the result is unchanged."""
    import cupy

    import flowdsl

    rng = np.random.default_rng(27)
    words = rng.integers(-2**62, 2**62, size=5, dtype=np.int64)
    rows = comm.exchange(words)
    assert rows.shape == (comm.nranks, 5) and (rows[comm.rank] == words).all()
    stream = cupy.cuda.Stream(non_blocking=True)
    assert (comm.exchange(words[:3], stream.ptr)[comm.rank] == words[:3]).all()

    x = rng.standard_normal(4096).astype(np.float32)
    buf = comm.alloc(x.size, np.float32)
    out = comm.alloc(x.size, np.float32)
    buf.set(x)
    out.fill(np.nan)
    was = comm.check_collectives
    comm.check_collectives = True
    try:
        flowdsl.collectives.all_reduce(comm, buf, out, op="sum")
        comm.synchronize()
    finally:
        comm.check_collectives = was
    np.testing.assert_allclose(out.get(), x * comm.nranks, rtol=1e-6)
    comm.free(buf)
    comm.free(out)
