"""Planted bugs are reported with their cause, and the same seed reproduces the report."""

import numpy as np
import pytest
from numba import cuda

import flowdsl
import flowdsl.sim as sim
from flowdsl import coop, lsa, mem
from flowdsl.enums import MemoryOrder, ThreadScope
from flowdsl.testing import run_ranks
from tests.launching import launch_refused

pytestmark = pytest.mark.sim


def _program(kern, grid=2, block=32, nbar=2, n=64, extra=()):
    def main(comm):
        buf = comm.alloc(n, np.int32)
        buf.set(np.zeros(n, np.int32))
        with comm.register(buf) as win, comm.device_communicator(lsa_barrier_count=nbar) as dc:
            kern[grid, block](dc, win, *extra)
            comm.synchronize()
        return buf.get()
    return main


@flowdsl.kernel
def skip_barrier_on_rank1(comm, win):
    bar = lsa.barrier(comm, coop.cta(), cuda.blockIdx.x)
    if comm.rank != 1:
        bar.sync(MemoryOrder.ACQUIRE)


def test_deadlock_names_barrier_and_missing_peer():
    with pytest.raises(sim.DeadlockError) as ei:
        run_ranks(_program(skip_barrier_on_rank1), nranks=3, seed=5)
    msg = str(ei.value)
    assert "deadlock" in msg and "seed=5" in msg
    assert "lsa barrier 0 wait" in msg and "lsa barrier 1 wait" in msg
    assert "rank 0 kernel 'skip_barrier_on_rank1' block 0 threads 0-31" in msg
    assert "peer rank 1 has not arrived" in msg
    assert "kernel 'skip_barrier_on_rank1' (launch #0) finished" in msg  # what rank 1 did instead
    assert "peer rank 2" not in msg.split("rank 0 kernel")[1].split("rank 2 kernel")[0]


def test_same_seed_same_report_different_seed_runs_too():
    reports = []
    for seed in (3, 3, 4):
        with pytest.raises(sim.DeadlockError) as ei:
            run_ranks(_program(skip_barrier_on_rank1), nranks=4, seed=seed)
        reports.append(str(ei.value))
    assert reports[0] == reports[1]
    assert "seed=4" in reports[2]


@flowdsl.kernel
def divergent_syncthreads(comm, win):
    if cuda.threadIdx.x < 16:
        cuda.syncthreads()


def test_deadlock_divergent_syncthreads_names_exited_threads():
    with pytest.raises(sim.DeadlockError) as ei:
        run_ranks(_program(divergent_syncthreads, grid=1), nranks=1, seed=0)
    msg = str(ei.value)
    assert "cuda.syncthreads()" in msg and "threads 0-15" in msg
    assert "threads 16-31 of the block have not arrived: finished (exited the kernel)" in msg
    assert "test_diagnostics.py" in msg  # points at the user's line


@flowdsl.kernel
def spin_on_unset_flag(comm, win):
    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
        flag = lsa.lsa_view(win, (comm.lsa_rank + 1) % comm.lsa_size, 7, 1)
        while mem.load_acquire(flag, 0, ThreadScope.SYSTEM) != 1:
            pass


def test_livelock_spin_reports_flag_and_value():
    with pytest.raises(sim.LivelockError) as ei:
        run_ranks(_program(spin_on_unset_flag, grid=1, block=1), nranks=2, seed=9, livelock_rounds=50)
    msg = str(ei.value)
    assert "livelock" in msg and "seed=9" in msg
    assert "reading window #0 of rank 1, element 7 (int32) == 0" in msg
    assert "never written by a flowdsl.mem store/atomic" in msg


@flowdsl.kernel
def flag_handshake(comm, win):
    # rank 0 thread 0 releases the flag on rank 1; rank 1 waits for it.
    if cuda.threadIdx.x == 0:
        if comm.rank == 0:
            mem.store_release(lsa.lsa_view(win, 1, 0, 1), 0, 1, ThreadScope.SYSTEM)
        else:
            while mem.load_acquire(lsa.local_view(win, 0, 1), 0, ThreadScope.SYSTEM) != 1:
                pass


def test_flag_handshake_is_not_a_livelock():
    out = run_ranks(_program(flag_handshake, grid=1, block=4), nranks=2, seed=1)
    assert out[1][0] == 1


@flowdsl.kernel
def view_past_end(comm, win, n):
    v = lsa.local_view(win, n - 8, 16)  # 8 elements too many


def test_view_past_end_reports_rank_block_thread_window_offset_size():
    with pytest.raises(sim.WindowAccessError) as ei:
        run_ranks(_program(view_past_end, grid=1, block=2, extra=(64,)), nranks=2, seed=2)
    msg = str(ei.value)
    assert msg.startswith("Cannot make a local view of window #0 on rank ")
    assert "elements 56..71" in msg and "byte offset 224" in msg
    assert "window of 64 elements (256 bytes)" in msg
    assert "block 0 thread " in msg and "seed=2" in msg


@flowdsl.kernel
def index_past_peer_view(comm, win):
    if comm.rank == 2 and cuda.blockIdx.x == 1 and cuda.threadIdx.x == 5:
        v = lsa.lsa_view(win, 0, 32, 4)
        v[4] = 1


def test_index_past_view_on_one_rank():
    with pytest.raises(sim.WindowAccessError) as ei:
        run_ranks(_program(index_past_peer_view), nranks=3, seed=0)
    msg = str(ei.value)
    assert "Cannot write element 4 of a view of window #0 on rank 0" in msg
    assert "the view has 4 elements (window elements 32..35)" in msg
    assert "window element 36 (byte offset 144)" in msg and "64 int32 elements (256 bytes)" in msg
    assert "[rank 2 block 1 thread 5]" in msg


@flowdsl.kernel
def barrier_index_too_big(comm, win):
    lsa.barrier(comm, coop.cta(), cuda.blockIdx.x + 1)


def test_barrier_index_beyond_count():
    with pytest.raises(sim.BarrierIndexError) as ei:
        run_ranks(_program(barrier_index_too_big, nbar=2), nranks=2, seed=4)
    msg = str(ei.value)
    assert "Cannot open LSA barrier 2: the device communicator has lsa_barrier_count=2" in msg
    assert "block 1" in msg and "seed=4" in msg


@flowdsl.kernel
def same_barrier_two_blocks(comm, win):
    bar = lsa.barrier(comm, coop.cta(), 0)
    bar.sync(MemoryOrder.ACQUIRE)


def test_barrier_index_shared_by_two_blocks():
    with pytest.raises((sim.BarrierIndexError, sim.DeadlockError)) as ei:
        run_ranks(_program(same_barrier_two_blocks), nranks=2, seed=0)
    assert "barrier 0" in str(ei.value)


def test_host_exception_names_rank_and_seed():
    def main(comm):
        if comm.rank == 2:
            raise ValueError("boom")
        comm.barrier()
    with pytest.raises(ValueError) as ei:
        run_ranks(main, nranks=3, seed=11)
    notes = "\n".join(getattr(ei.value, "__notes__", []))
    assert "rank 2" in notes and "seed=11" in notes


def test_kernel_exception_names_thread_and_seed():
    @flowdsl.kernel(debug=True, opt=False)  # numba's Python error model: a division by zero raises
    def divide(comm, win):
        x = 1 // (cuda.threadIdx.x - 3)

    with pytest.raises(ZeroDivisionError) as ei:
        run_ranks(_program(divide, grid=1, block=8), nranks=2, seed=6)
    notes = "\n".join(ei.value.__notes__)
    assert "block 0 thread 3" in notes and "seed=6" in notes


def test_collective_mismatch_and_host_deadlock():
    def mismatch(comm):
        if comm.rank == 0:
            comm.barrier()
        else:
            comm.register(comm.alloc(4, np.float32))
    with pytest.raises(sim.CollectiveMismatchError) as ei:
        run_ranks(mismatch, nranks=2)
    assert "called comm.barrier() there" in str(ei.value) or "called comm.register() there" in str(ei.value)

    def missing(comm):
        if comm.rank == 0:
            comm.barrier()
    with pytest.raises(sim.CollectiveMismatchError) as ei:
        run_ranks(missing, nranks=2, seed=1)
    assert ("rank 0 waits in comm.barrier() (host collective #0), and rank 1 returned from main without calling "
            "it") in str(ei.value)


@flowdsl.kernel
def _spins_on_a_plain_load(flags):
    while flags[0] == 0:  # a plain load: the simulator never gets to switch threads
        pass


def test_a_spin_on_a_plain_load_is_stopped_naming_the_thread_and_the_fix(capsys):
    """It ran at 100 % CPU for ever (max_steps and the livelock check count switches, and there are none). A
    notice on stderr says so before the limit."""
    import time

    def main(comm):
        flags = comm.alloc(1, np.int32)
        flags.set(np.zeros(1, np.int32))
        _spins_on_a_plain_load[1, 1](flags)
        comm.synchronize()

    start = time.monotonic()
    with pytest.raises(sim.StalledError) as err:
        run_ranks(main, nranks=1, stall_seconds=1)
    assert time.monotonic() - start < 10
    assert isinstance(err.value, sim.LivelockError)
    assert "rank 0 block 0 thread 0 of kernel '_spins_on_a_plain_load' ran 1 s without reaching" in str(err.value)
    assert "read the flag with flowdsl.mem.load_acquire" in str(err.value)
    assert any("test_diagnostics.py:" in note for note in err.value.__notes__), err.value.__notes__
    assert "flowdsl.sim: rank 0 block 0 thread 0 of kernel '_spins_on_a_plain_load' has run " in \
        capsys.readouterr().err


@flowdsl.kernel
def reads_the_communicators_lsa_size(comm, win, out):
    out[0] = comm.lsa_size


def test_arguments_passed_in_another_order_are_a_typing_error_naming_the_argument_and_the_order():
    """A window passed where the kernel reads a device communicator: the GPU's typing refuses the kernel
    (unknown attribute); the simulator says the same, as a KernelTypingError naming the argument, its
    parameter and the kernel's parameter order, not a bare AttributeError."""
    def main(comm):
        buf, out = comm.alloc(4, np.float32), comm.alloc(4, np.float32)
        with comm.register(buf) as win, comm.device_communicator() as dc:
            reads_the_communicators_lsa_size[1, 32](win, dc, out)
            comm.synchronize()

    with pytest.raises(flowdsl.KernelTypingError) as err:
        sim.spawn(main, nranks=1)
    assert str(err.value).startswith("Unknown attribute 'lsa_size' of type Window: argument 0 (comm) of kernel "
                                     "'reads_the_communicators_lsa_size' is a Window") and \
        "in the order of the kernel's parameters (comm, win, out)" in str(err.value), str(err.value)


@flowdsl.kernel
def _allocates_with_numpy(out):
    tmp = np.zeros(4, np.float32)  # a GPU kernel cannot allocate: compiling for a GPU refuses it
    out[0] = tmp[0] + np.float32(np.sqrt(4.0))  # NumPy's scalar functions are fine


def test_a_kernel_that_allocates_with_numpy_is_refused_as_the_gpus_typing_refuses_it():
    def main(comm):
        out = comm.alloc(4, np.float32)
        _allocates_with_numpy[1, 1](out)
        comm.synchronize()

    with pytest.raises(flowdsl.KernelTypingError, match=r"Cannot type the call of zeros in a kernel: numpy.zeros makes "
                                                        r"a new array.*Use cuda.local.array\(shape, dtype\)"):
        sim.spawn(main, nranks=1)


@flowdsl.kernel
def _indexes_its_first_argument(src, out):
    i = cuda.threadIdx.x
    out[i] = src[i]


def test_a_window_indexed_as_an_array_is_refused_on_both_paths_naming_the_view():
    def main(comm):
        buf, out = comm.alloc(8, np.float32), comm.alloc(8, np.float32)
        with comm.register(buf) as win:
            _indexes_its_first_argument[1, 8](win, out)
            comm.synchronize()

    with pytest.raises(flowdsl.KernelTypingError, match=r"Cannot index argument 0 \(src\) of kernel "
                                                        r"'_indexes_its_first_argument': it is a Window, which a kernel "
                                                        r"reads through a view \(lsa.local_view\(win\)"):
        sim.spawn(main, nranks=1)
    with pytest.raises(flowdsl.KernelTypingError, match=r"^Cannot index a window in a kernel: a kernel reads and "
                                                        r"writes a window through a view \(lsa.local_view\(win\)"):
        _indexes_its_first_argument.compile(flowdsl.FlowKernel.argtypes_for(("window", np.float32),
                                                                            np.zeros(8, np.float32), nccl="2.32.3"),
                                            arch="sm_90", nccl="2.32.3")


@flowdsl.kernel
def _a_barrier_per_block(comm):
    lsa.barrier(comm, coop.cta(), cuda.blockIdx.x).sync(MemoryOrder.ACQ_REL)


def test_a_barrier_index_per_block_beyond_the_count_is_told_the_launchs_block_count():
    """Grid and block swapped (32 blocks, each its own barrier): the fix names 32, not the index seen first."""
    launch_refused(_a_barrier_per_block, 32, 10, sim.BarrierIndexError,
                   r"Create it with comm.device_communicator\(lsa_barrier_count=32\) or more \(this launch has 32 "
                   r"blocks: one barrier each needs 32\)", lsa_barrier_count=4)


def test_with_numbas_runtime_on_a_kernel_that_allocates_runs_as_on_the_gpu(monkeypatch):
    """NUMBA_CUDA_ENABLE_NRT=1: the GPU links numba's runtime for such a kernel (tests/compile/
    test_numba_linking_compile.py), so the simulator runs it too instead of refusing it."""
    from numba.cuda.core import config

    monkeypatch.setattr(config, "CUDA_ENABLE_NRT", True)

    def main(comm):
        out = comm.alloc(4, np.float32)
        out.fill(np.nan)
        _allocates_with_numpy[1, 1](out)
        comm.synchronize()
        return out.get()[0]

    assert sim.spawn(main, nranks=1) == [2.0]
