"""Planted hangs on the simulator end with the GPU's timeout diagnosis (:mod:`flowdsl.wait`).

The programs are ``tests/planted_hangs.py``'s, the ones the 2-GPU test runs under
torchrun: a rank that skips a collective's kernel (a ring step on Flow), one that
never arrives at a barrier, and ranks that all wait for each other. The simulator raises
:class:`flowdsl.sim.WaitTimeoutError`, a :class:`flowdsl.DeviceTimeoutError` whose
message starts with :meth:`flowdsl.DeviceTimeoutError.describe` of the stuck wait
(one format for both), and names the waiting rank, block, thread, primitive, the
expected and last seen value and the peer.
"""

from __future__ import annotations

import numpy as np
import pytest

import flowdsl
from flowdsl import Protocol, sim
from flowdsl import collectives as coll
from flowdsl.errors import DeviceTimeoutError, ResourceClosedError
from tests import planted_hangs as planted

pytestmark = pytest.mark.sim


def _timeout(main, nranks=2, seed=3, **options) -> sim.WaitTimeoutError:
    with pytest.raises(sim.WaitTimeoutError) as info:
        sim.spawn(main, nranks=nranks, seed=seed, **options)
    err = info.value
    assert isinstance(err, DeviceTimeoutError) and isinstance(err, sim.DeadlockError)
    return err


def _same_format(err, operation="finish the simulation"):
    """The message starts with the GPU's diagnosis of the same fields."""
    fields = {name: getattr(err, name) for name in ("rank", "block", "thread", "primitive", "index", "peer",
                                                     "expected", "seen")}
    head = DeviceTimeoutError.describe(operation, **fields, context=f" (seed={err.seed}")
    assert str(err).startswith(head.split(f" (seed={err.seed}")[0]), str(err)[:600]


_CREDIT = "flow credit (the receiver freeing a slot) on connection"
_READY = "flow ready flag or signal (the sender posting a slot) on connection"


@pytest.mark.parametrize("protocol,primitives", [
    (Protocol.SIMPLE, (_CREDIT, _READY)),
    (Protocol.LL, (_CREDIT, "LL line flag, line")),
    (Protocol.LL128, (_CREDIT, "LL128 line flag, line")),
])
def test_a_rank_that_skips_a_collective_step_leaves_its_peer_with_the_diagnosis(monkeypatch, protocol, primitives):
    monkeypatch.setattr(planted, "CONFIG", coll.FlowConfig(channels=1, nslots=2, slot_bytes=1024, threads=64,
                                                           protocol=protocol))
    err = _timeout(planted.skip_flow_step(skipper=1))
    assert (err.rank, err.peer) == (0, 1)
    assert err.primitive in primitives, err.primitive
    assert err.seen != err.expected
    assert err.waited_s is None and err.seed == 3
    _same_format(err)
    assert "rank 0 block " in str(err) and "from peer rank 1" in str(err)
    assert "The simulator's report:" in str(err) and "livelock" in str(err)
    assert "rank 1 gave up" not in str(err)  # the rank that skipped waited for nobody


def test_a_rank_that_skips_a_collective_call_is_caught_on_the_host_first():
    """The simulator compares every collective call across ranks before launching (on GPUs
    only with check_collectives): the device never waits."""
    with pytest.raises(flowdsl.CollectiveMismatchError, match="rank 1 returned from main without calling it"):
        sim.spawn(planted.skip_collective(skipper=1), nranks=2, seed=3)


def test_a_rank_that_never_arrives_at_a_barrier_leaves_every_other_rank_with_the_diagnosis():
    err = _timeout(planted.skip_barrier(absent=1), nranks=3)
    assert (err.rank, err.peer, err.index) == (0, 1, 0)
    assert err.primitive == "lsa barrier wait, barrier" and (err.expected, err.seen) == (1, 0)
    _same_format(err)
    msg = str(err)
    assert "a device-side wait on rank 2 gave up" in msg and "from peer rank 1: expected 1, last seen 0" in msg
    assert "rank 1 gave up" not in msg  # the absent rank waited for nobody
    assert "deadlock" in msg  # the simulator's own report follows


def test_a_cycle_of_full_inboxes_is_reported_as_a_cycle_not_a_missing_peer():
    """Each rank sends more than the next one's slots hold before receiving: every rank is present, so
    the report names the cycle and its fix instead of an absent peer and a longer limit."""
    err = _timeout(planted.credit_cycle(), nranks=3, seed=2)
    msg = str(err)
    assert err.primitive == _CREDIT and err.peer == (err.rank + 1) % 3
    assert ("These waits form a cycle of full inboxes (rank 0 -> rank 1 -> rank 2 -> rank 0: each rank waits for "
            "the next to free a slot" in msg), msg[:2000]
    assert "Send in chunks of at most nslots // 2 slots and receive between them" in msg
    assert "A peer never got there" not in msg and "raise the limit" not in msg


def test_ranks_waiting_for_each_other_all_get_the_diagnosis():
    err = _timeout(planted.everyone_waits(), nranks=3, seed=5)
    msg = str(err)
    for rank in range(3):
        assert (f"a device-side wait on rank {rank} gave up" in msg
                and f"waited for a kernel's own wait (flowdsl.wait.poll), index 0 from peer rank {(rank + 1) % 3}: "
                    "expected 1, last seen 0" in msg), msg[:1500]
    assert msg.count("A peer never got there") == 1  # the fix once, after the first record


def test_without_a_hang_nothing_changes():
    def main(comm):
        x = comm.alloc(1000, np.float32)
        x[...] = np.arange(1000, dtype=np.float32) * (comm.rank + 1)
        coll.all_reduce(comm, x, algorithm="ring", config=planted.CONFIG)
        comm.synchronize()
        return np.asarray(x).copy()

    for out in sim.spawn(main, nranks=2, seed=1):
        np.testing.assert_array_equal(out, np.arange(1000, dtype=np.float32) * 3)


def test_abort_makes_polling_waits_give_up_and_synchronize_says_so():
    def main(comm):
        buf = comm.alloc(8, np.uint64)
        buf[...] = 0
        win, dc = comm.register(buf), comm.device_communicator()
        planted.wait_for_next[1, 32](dc, win)
        comm.abort()
        with pytest.raises(ResourceClosedError, match="the communicator was aborted"):
            comm.synchronize()
        return "aborted"

    assert sim.spawn(main, nranks=2, seed=2) == ["aborted", "aborted"]


def test_abort_from_another_thread_ends_the_run_with_resource_closed():
    """A watchdog thread's comm.abort() (the GPU's use of it): the waits give up on the simulation's own thread
    and the host code's next call raises ResourceClosedError, never a UsageError about where abort was called."""
    import threading

    def main(comm):
        buf = comm.alloc(8, np.uint64)
        buf[...] = 0
        win, dc = comm.register(buf), comm.device_communicator()
        planted.wait_for_next[1, 32](dc, win)
        watchdog = threading.Thread(target=comm.abort)
        watchdog.start()
        watchdog.join()
        with pytest.raises(ResourceClosedError, match="the communicator was aborted"):
            comm.synchronize()
        return "aborted"

    assert sim.spawn(main, nranks=2, seed=2) == ["aborted", "aborted"]


def test_wait_timeout_is_validated_like_on_gpus(monkeypatch):
    def main(comm):
        comm.wait_timeout = 5
        assert comm.wait_timeout == 5.0 and comm.device_error() is None
        with pytest.raises(flowdsl.UsageError, match="wait_timeout must be a number of seconds >= 0"):
            comm.wait_timeout = -1
        return True

    assert sim.spawn(main, nranks=1) == [True]
    monkeypatch.setenv("FLOWDSL_WAIT_TIMEOUT", "soon")
    with pytest.raises(flowdsl.UsageError, match="FLOWDSL_WAIT_TIMEOUT must be a number"):
        sim.spawn(lambda comm: comm.wait_timeout, nranks=1)


def test_poll_needs_a_device_communicator():
    @flowdsl.kernel
    def bad(flags):
        flowdsl.wait.poll(flags, 0, flowdsl.wait.USER, -1, 0, 1, 0)

    def main(comm):
        bad[1, 1](np.zeros(1, np.uint64))
        comm.synchronize()

    with pytest.raises(TypeError, match="flowdsl.wait.poll requires a device communicator"):
        sim.spawn(main, nranks=1)


@pytest.mark.parametrize("hybrid,primitive", [(False, "gin rail barrier sync, barrier"),
                                              (True, "gin hybrid barrier sync, barrier")])
def test_a_rank_absent_at_a_gin_barrier_leaves_its_rail_peers_with_the_diagnosis(hybrid, primitive):
    # 2 nodes of 2: rank 1's rail peer is rank 3 (node 1); rank 0's LSA peer (rank 1) is absent too,
    # so on the hybrid barrier rank 0 waits at the LSA stage, rank 2 at the rail stage
    err = _timeout(planted.skip_gin_barrier(absent=1, hybrid=hybrid), nranks=4, nodes=2)
    msg = str(err)
    assert "a device-side wait on rank 3 gave up" in msg and "from peer rank 1: expected 1, last seen 0" in msg
    assert f"waited for {primitive} 0 from peer rank 1" in msg, msg[:1500]
    assert "rank 1 gave up" not in msg
    if hybrid:
        assert "a device-side wait on rank 0 gave up" in msg and "waited for lsa barrier wait, barrier 0" in msg
    _same_format(err)


def test_a_rank_absent_at_a_cft_barrier_leaves_every_other_rank_with_the_diagnosis():
    err = _timeout(planted.skip_cft_barrier(absent=1), nranks=3, nodes=3)
    assert (err.rank, err.peer, err.index) == (0, 1, 0)
    assert err.primitive == "cft barrier wait, barrier" and (err.expected, err.seen) == (1, 0)
    _same_format(err)
    msg = str(err)
    assert "a device-side wait on rank 2 gave up" in msg and "from peer rank 1: expected 1, last seen 0" in msg
    assert "rank 1 gave up" not in msg


def test_a_counted_write_that_never_comes_leaves_the_waiter_with_the_diagnosis():
    err = _timeout(planted.never_counted(waiter=1), nranks=2, nodes=2)
    assert (err.rank, err.peer, err.index) == (1, -1, 8)
    assert err.primitive == "cft.wait_counted, counter at byte offset" and (err.expected, err.seen) == (64, 0)
    _same_format(err)
    assert "waited for cft.wait_counted, counter at byte offset 8: expected 64, last seen 0" in str(err)


@pytest.mark.parametrize("program,kw", [
    (planted.skip_gin_barrier, dict(absent=1)),
    (planted.skip_gin_barrier, dict(absent=1, hybrid=True)),
    (planted.skip_cft_barrier, dict(absent=1)),
    (planted.never_counted, dict(waiter=1)),
], ids=["gin_barrier", "hybrid_barrier", "cft_barrier", "cft_wait_counted"])
def test_abort_ends_blocked_gin_and_cft_waits(monkeypatch, program, kw):
    ended = _count_aborted_waits(monkeypatch)
    assert sim.spawn(program(**kw, abort=True), nranks=4, nodes=2, seed=3) == ["aborted"] * 4
    assert sum(ended) > 0  # some waits were blocked when abort() came, and it ended them


def test_abort_ends_a_blocked_lsa_barrier_wait(monkeypatch):
    ended = _count_aborted_waits(monkeypatch)

    def main(comm):
        with comm.device_communicator(lsa_barrier_count=1) as dc:
            planted.absent_at_barrier[1, 32](dc, 1)
            return planted._end(comm, abort=True)

    assert sim.spawn(main, nranks=3, seed=3) == ["aborted"] * 3
    assert sum(ended) > 0


def _count_aborted_waits(monkeypatch) -> list:
    """Patches flowdsl.sim.timeouts.abort to record how many blocked waits each call ended."""
    from flowdsl.sim import timeouts

    ended, real = [], timeouts.abort

    def counting(host_comm):
        ended.append(real(host_comm))
    monkeypatch.setattr(timeouts, "abort", counting)
    return ended


def test_a_gpu_timeout_names_the_communicator_s_rank():
    """The GPU's record (no GPU needed to read one): the device check gets the record's address alone
    (``lowering.intrinsics.wait_record_ptr``) and writes no rank; the host names its communicator's."""
    import ctypes

    from flowdsl.runtime import wait_record

    record = object.__new__(wait_record.WaitRecord)  # the words without pinned memory
    record.rank, record._words = 3, (ctypes.c_uint64 * wait_record.WORDS)()
    record._words[wait_record.DONE] = 1
    record._words[wait_record.TIMEOUT_NS] = 10**9
    err = record.error("synchronize")
    assert isinstance(err, DeviceTimeoutError) and err.rank == 3
    assert "on rank 3 " in str(err)
