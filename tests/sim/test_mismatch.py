"""Collectives called differently across ranks, and reports whose advice fits the kind of wait.

The simulator sees every rank's call: a difference in the collective, count, dtype, op, root,
algorithm or config raises :class:`flowdsl.CollectiveMismatchError` on the ranks, naming the
argument, its values and the ranks, before any kernel is launched; a rank that skips the call
is named too. Deadlock and livelock reports end with a hint for the kind of wait (GIN signal or
counter, LSA or block barrier, Flow ready or credit, LL line, host collective).
"""

import numpy as np
import pytest
from numba import cuda

import flowdsl
import flowdsl.sim as sim
from flowdsl import Protocol, coop, flow, gin, lsa, team
from flowdsl import collectives as coll
from flowdsl.collectives import FlowConfig
from flowdsl.testing import run_ranks

pytestmark = pytest.mark.sim

CFG = coll.FlowConfig(channels=2, nslots=2, slot_bytes=1024, threads=64)


def _launched(comms) -> int:
    """Kernels launched on any rank (the simulator's record)."""
    return sum(len(c.world.launches[c.rank]) for c in comms)


def _mismatch(main, nranks=2, seed=0):
    """Run ``main`` expecting a mismatch; return the error and how many kernels ran before it."""
    comms = []

    def wrapped(comm):
        comms.append(comm)
        return main(comm)
    with pytest.raises(flowdsl.CollectiveMismatchError) as ei:
        run_ranks(wrapped, nranks=nranks, seed=seed)
    return ei.value, _launched(comms)


def test_count_differs_names_the_ranks_and_values_before_any_launch():
    def main(comm):
        n = 4100 if comm.rank == 1 else 4099
        x = comm.alloc(n, np.float32)
        x.set(np.ones(n, np.float32))
        coll.all_reduce(comm, x, config=CFG)
    for seed in (0, 1):
        err, launched = _mismatch(main, nranks=3, seed=seed)
        assert "all_reduce called differently across ranks: count is 4099 on ranks 0, 2 and 4100 on rank 1" \
            in str(err)
        assert "Pass the same count on every rank" in str(err)
        assert err.collective == "all_reduce" and err.differences == {"count": {4099: [0, 2], 4100: [1]}}
        # The GPU's class (one check, comm.exchange, on both); the simulator notes the rank and the seed
        assert type(err) is flowdsl.CollectiveMismatchError and f"seed={seed}" in " ".join(err.__notes__)
        assert launched == 0


def _x(comm, n=64, dtype=np.float32):
    x = comm.alloc(n, dtype)
    x.set(np.arange(n, dtype=dtype))
    return x


def _different_op(comm):
    coll.all_reduce(comm, _x(comm), op="max" if comm.rank == 1 else "sum", config=CFG)


def _different_dtype(comm):
    coll.all_reduce(comm, _x(comm, dtype=np.int32 if comm.rank == 1 else np.float32), config=CFG)


def _each_its_own_root(comm):
    coll.broadcast(comm, _x(comm), root=comm.rank, config=CFG)


def _different_algorithm(comm):
    coll.all_reduce(comm, _x(comm), algorithm="tree" if comm.rank == 1 else "ring", config=CFG)


def _different_config(comm):
    config = coll.FlowConfig(channels=1, nslots=2, slot_bytes=1024, threads=64) if comm.rank == 1 else CFG
    coll.all_reduce(comm, _x(comm), config=config)


def _different_op_and_root(comm):
    coll.reduce(comm, _x(comm), op="min" if comm.rank == 1 else "sum", root=comm.rank, config=CFG)


def _premulsum_and_sum(comm):
    op = coll.premul_sum(2.0) if comm.rank == 1 else "sum"
    coll.all_reduce(comm, _x(comm), op=op, config=CFG)


def _different_collectives(comm):
    if comm.rank == 1:
        coll.all_gather(comm, _x(comm), comm.alloc(64 * comm.nranks, np.float32), config=CFG)
    else:
        coll.all_reduce(comm, _x(comm), config=CFG)


@pytest.mark.parametrize("main,expected,argument", [
    (_different_op, "all_reduce called differently across ranks: op is sum on rank 0 and max on rank 1", "op"),
    (_different_dtype, "dtype is float32 on rank 0 and int32 on rank 1", "dtype"),
    (_each_its_own_root, "broadcast called differently across ranks: root is 0 on rank 0 and 1 on rank 1", "root"),
    (_different_algorithm, "algorithm is ring on rank 0 and tree on rank 1", "algorithm"),
    (_different_config, "config is FlowConfig(channels=2, nslots=2, slot_bytes=1024, threads=64, protocol=None) "
                        "on rank 0 and FlowConfig(channels=1,", "config"),
    (_different_op_and_root, "op is sum on rank 0 and min on rank 1; root is 0 on rank 0 and 1 on rank 1", "op"),
    (_premulsum_and_sum, "op is sum on rank 0 and premulsum on rank 1", "op"),
    (_different_collectives, "the ranks called different collectives: all_reduce on rank 0 and all_gather on "
                             "rank 1", "collective"),
], ids=["op", "dtype", "root", "algorithm", "config", "op-and-root", "premulsum", "collective"])
def test_each_argument_that_differs_is_named(main, expected, argument):
    err, launched = _mismatch(main)
    assert expected in str(err)
    assert argument in err.differences and launched == 0


def test_premulsum_agrees_in_its_kind_not_in_its_scalar():
    """NCCL lets every rank bring its own scalar, host or device: only the operator is compared."""
    def main(comm):
        x = _x(comm)
        if comm.rank == 0:
            op = coll.premul_sum(0.5)
        else:
            scalar = comm.alloc(1, np.float32)
            scalar.set(np.array([3.0], np.float32))
            op = coll.premul_sum(scalar)
        coll.all_reduce(comm, x, op=op, config=CFG)
        comm.synchronize()
        return x.get()
    for got in run_ranks(main, nranks=2):
        np.testing.assert_array_equal(got, np.arange(64, dtype=np.float32) * 3.5)


def test_a_later_call_that_differs_is_caught_after_matching_ones():
    def main(comm):
        x = _x(comm)
        coll.all_reduce(comm, x, config=CFG)  # agrees: planned on every rank
        coll.all_reduce(comm, x, config=CFG)  # the plan's fast path agrees too
        coll.all_reduce(comm, x, op="max" if comm.rank == 0 else "sum", config=CFG)
    err, _ = _mismatch(main)
    assert "collective call #2 on this communicator" in str(err)
    assert "op is max on rank 0 and sum on rank 1" in str(err)


def test_planned_and_first_calls_with_one_signature_agree_and_compute():
    """Rank 0 repeats a call on the same arrays (its plan), rank 1 passes new arrays (a first call):
    the signatures agree and the sums are right."""
    rng = np.random.default_rng(7)
    inputs = rng.standard_normal((2, 3, 301)).astype(np.float32)

    def main(comm):
        src, dst = comm.alloc(301, np.float32), comm.alloc(301, np.float32)
        out = []
        for i in range(3):
            if comm.rank == 1 and i:
                src, dst = comm.alloc(301, np.float32), comm.alloc(301, np.float32)  # poisoned
            src.set(inputs[comm.rank, i])
            coll.all_reduce(comm, src, dst, config=CFG)
            out.append(dst.get())
        return out
    for result in run_ranks(main, nranks=2, seed=3):
        for i in range(3):
            np.testing.assert_allclose(result[i], inputs[0, i] + inputs[1, i], rtol=1e-6)


def test_a_rank_that_returns_without_the_call_is_named():
    def main(comm):
        x = _x(comm)
        coll.all_reduce(comm, x, config=CFG)
        if comm.rank != 1:
            coll.all_reduce(comm, x, config=CFG)
    for seed in range(3):
        err, _ = _mismatch(main, nranks=3, seed=seed)
        msg = str(err)
        assert "in flowdsl.collectives.all_reduce (host collective #" in msg
        assert "rank 1 returned from main without calling it" in msg and err.collective == "all_reduce"


def test_a_rank_in_another_host_collective_is_named():
    def main(comm):
        x = _x(comm)
        if comm.rank == 1:
            comm.barrier()
        else:
            coll.all_reduce(comm, x, config=CFG)
    for seed in range(3):
        msg = str(_mismatch(main, seed=seed)[0])
        assert ("Cannot call comm.barrier() on rank 1" in msg and "rank 0 called flowdsl.collectives.all_reduce "
                "there" in msg) or ("Cannot call flowdsl.collectives.all_reduce on rank 0" in msg and
                                    "rank 1 called comm.barrier() there" in msg), msg


@flowdsl.kernel
def _wait_for_signal_nobody_sends(comm, out):
    gin.wait_signal(gin.context(comm, 0), coop.thread(), 0, 1)
    out[0] = 1


def test_a_rank_waiting_elsewhere_gives_a_deadlock_naming_the_collective():
    def main(comm):
        x, out = _x(comm), comm.alloc(1, np.int64)
        dc = comm.device_communicator(gin_signal_count=1)
        if comm.rank == 1:
            _wait_for_signal_nobody_sends[1, 1](dc, out)
            comm.synchronize()
        coll.all_reduce(comm, x, config=CFG)
    with pytest.raises(sim.DeadlockError) as ei:
        run_ranks(main, nranks=2)
    msg = str(ei.value)
    assert "rank 0 host wait in flowdsl.collectives.all_reduce (host collective #1)" in msg
    assert "rank 1 has not called flowdsl.collectives.all_reduce (host collective #1): host waits in " \
           "comm.synchronize()" in msg
    assert "Call the same host collectives" in msg and "GIN signal: no rank sends enough signals" in msg
    assert "barrier index" not in msg


# ---- hints by kind of wait ------------------------------------------------------------------------

def _deadlock(kernel, nranks=1, grid=1, block=1, **reqs):
    def main(comm):
        out = comm.alloc(8, np.int64)
        with comm.register(out) as win, comm.device_communicator(**reqs) as dc:
            kernel[grid, block](dc, win)
            comm.synchronize()
    with pytest.raises(sim.DeadlockError) as ei:
        run_ranks(main, nranks=nranks, livelock_rounds=20)
    return str(ei.value)


@flowdsl.kernel
def _signal_wait(comm, win):
    gin.wait_signal(gin.context(comm, 0), coop.thread(), 0, 1)


@flowdsl.kernel
def _counter_wait(comm, win):
    gin.wait_counter(gin.context(comm, 0), coop.thread(), 0, 1)


@flowdsl.kernel
def _barrier_on_rank_0_only(comm, win):
    if comm.rank == 0:
        lsa.barrier(comm, coop.cta(), 0).sync(flowdsl.MemoryOrder.ACQUIRE)


@flowdsl.kernel
def _half_the_block_syncs(comm, win):
    if cuda.threadIdx.x < 16:
        cuda.syncthreads()


@pytest.mark.parametrize("kernel,kwargs,hint", [
    (_signal_wait, {"gin_signal_count": 1}, "GIN signal: no rank sends enough signals to this one"),
    (_counter_wait, {"gin_counter_count": 1}, "GIN counter: a counter rises when this rank's own puts"),
    (_barrier_on_rank_0_only, {"nranks": 2, "lsa_barrier_count": 1}, "LSA barrier: every rank of the LSA team "
                                                                      "must arrive at the same barrier index"),
    (_half_the_block_syncs, {"block": 32}, "Block or warp barrier: every thread of the coop"),
], ids=["gin-signal", "gin-counter", "lsa-barrier", "block-barrier"])
def test_deadlock_hint_fits_the_wait(kernel, kwargs, hint):
    msg = _deadlock(kernel, **kwargs)
    assert hint in msg.splitlines()[-1]  # the report ends with it
    others = {"GIN signal:", "GIN counter:", "LSA barrier:", "Block or warp barrier:"} - {hint.split(": ")[0] + ":"}
    assert not any(o in msg for o in others), msg


@flowdsl.kernel
def _one_end(comm, stage, buf, n, sender, nslots, slot_words, protocol):
    proc = flow.processor(comm, stage, None, 1, nslots, slot_words, protocol, 0)
    conn = flow.connect(proc, comm.rank, 1, 1)
    if sender:
        flow.send(proc, conn, buf, 0, n)
    else:
        flow.recv(proc, conn, buf, 0, n)


def _flow_livelock(sender, protocol):
    """One end of a loopback connection, the other end never launched."""
    nslots, slot_bytes, n = 2, 1024, 4096

    def main(comm):
        buf = _x(comm, n)
        config = FlowConfig(channels=1, nslots=nslots, slot_bytes=slot_bytes, threads=64)
        with flow.staging(comm, config) as win, comm.device_communicator() as dc:
            _one_end[1, 64](dc, win, buf, n, sender, nslots, slot_bytes // 8, int(protocol))
            comm.synchronize()
    with pytest.raises(sim.LivelockError) as ei:
        run_ranks(main, nranks=1, livelock_rounds=20)
    return str(ei.value)


@pytest.mark.parametrize("sender,protocol,where,hint", [
    (False, Protocol.SIMPLE, "(_wait_ready)", "Flow (ready): a receive step waits for its sender to post"),
    (True, Protocol.SIMPLE, "(_wait_credit)", "Flow (credit): a send step waits for the receiver to free a slot"),
    (False, Protocol.LL, "flow.py:", "LL line: the reader spins until the line carries this step's flag"),
], ids=["ready", "credit", "ll-line"])
def test_livelock_hint_fits_the_flow_wait(sender, protocol, where, hint):
    msg = _flow_livelock(sender, protocol)
    spinning = msg.split("Spinning:")[1]
    assert where in spinning and hint in msg
    assert "store_release" not in msg  # the generic spin advice is for the user's own flags
    assert ", called from your code at test_mismatch.py:" in spinning, spinning  # not only flowdsl's lines


def test_hints_by_spin_location_and_key():
    from flowdsl.sim.hints import describe_spin, livelock_hints

    assert livelock_hints([("flow.py:371 (_wait_ready)", None)])[0].startswith("Flow (ready)")
    assert livelock_hints([("my.py:3 (k)", ("gin-signal", 0, 1, 2, 0))])[0].startswith("GIN signal")
    assert livelock_hints([("my.py:3 (k)", (7, None, 0, 0))])[0].startswith("Make sure some thread stores")
    assert describe_spin(("gin-counter", 0, 1, 2, 5)) == "GIN counter 2 of rank 1 == 5"
    assert describe_spin(("cft-counter", 3, 0, 64, 0)) == "the CFT counter at byte 64 of window #3 on rank 0 == 0"


@flowdsl.kernel
def _spin_on_signal(comm, out):
    ctx = gin.context(comm, 0)
    while gin.read_signal(ctx, 0) < 1:
        pass
    out[0] = team.world(comm).nranks


def test_livelock_spinning_on_a_gin_signal_is_reported_with_its_hint():
    def main(comm):
        out = comm.alloc(1, np.int64)
        _spin_on_signal[1, 1](comm.device_communicator(gin_signal_count=1), out)
        comm.synchronize()
    with pytest.raises(sim.LivelockError) as ei:
        run_ranks(main, nranks=1, livelock_rounds=20)
    msg = str(ei.value)
    assert "reading GIN signal 0 of rank 0 == 0" in msg and "GIN signal: no rank sends" in msg


# ---- the GPU check's encoding: what the ranks all-gather over NCCL --------------------------------

def test_encoded_signatures_compare_as_the_simulator_compares_them():
    from flowdsl.collectives import _agree

    cfg = coll.FlowConfig(channels=3, nslots=4, slot_bytes=2048, threads=96, protocol=Protocol.LL128)
    sigs = [_agree.signature("reduce", 4099, "bfloat16", flowdsl.RedOp.AVG, 1, "ring", cfg),
            _agree.signature("reduce", 4100, "bfloat16", flowdsl.RedOp.MAX, 1, "ring", cfg),
            _agree.signature("reduce", 4099, "bfloat16", flowdsl.RedOp.AVG, 0, "ring", None)]
    for i, sig in enumerate(sigs):
        words = _agree.encode(sig, 7)
        assert words.dtype == np.int64 and words.shape == (_agree.WORDS,)
        assert _agree.decode(words) == (sig, 7)
    decoded = [_agree.decode(_agree.encode(s, 7))[0] for s in sigs]
    direct, gathered = _agree.compare(sigs, 7), _agree.compare(decoded, 7)
    assert str(direct) == str(gathered)
    assert ("reduce called differently across ranks: count is 4099 on ranks 0, 2 and 4100 on rank 1; op is avg on "
            "ranks 0, 2 and max on rank 1; root is 1 on ranks 0, 1 and 0 on rank 2; config is") in str(direct)
    assert _agree.compare(decoded[:1] * 3, 7) is None


def test_encoded_refusals_and_strangers_are_named():
    from flowdsl.collectives import _agree

    ok = _agree.signature("all_gather", 8, "float32", None, None, "auto", None)
    refused = _agree.decode(_agree.encode(_agree.refused("all_gather"), 0))[0]
    assert "Cannot all_gather (collective call #0 on this communicator): rank 1 refused its arguments" in \
        str(_agree.compare([ok, refused], 0))
    stranger = _agree.decode(np.arange(_agree.WORDS, dtype=np.int64))[0]  # another NCCL call's bytes
    assert stranger is None
    assert "rank 1 sent no flowdsl call signature" in str(_agree.compare([ok, stranger, ok], 0))


def test_a_mismatch_report_names_the_line_that_called():
    """Like every other host error of the simulator, a collective mismatch names the user's line that raised
    it (its notes name the rank and the seed)."""
    def main(comm):
        x = comm.alloc(8, np.float32)
        x.set(np.ones(8, np.float32))
        coll.all_reduce(comm, x, op="sum" if comm.rank == 0 else "max")

    with pytest.raises(flowdsl.CollectiveMismatchError) as err:
        run_ranks(main, nranks=2)
    assert any("test_mismatch.py:" in note for note in err.value.__notes__), err.value.__notes__


def test_a_failed_check_in_main_names_the_users_line_not_numpys():
    def main(comm):
        np.testing.assert_allclose(np.zeros(2), np.ones(2))

    with pytest.raises(AssertionError) as err:
        run_ranks(main, nranks=1)
    notes = " ".join(err.value.__notes__)
    assert "test_mismatch.py:" in notes and "utils.py" not in notes, notes


@pytest.mark.parametrize("seed", range(4))
def test_a_rank_that_refuses_its_arguments_tells_the_others_and_its_own_error_is_the_report(seed):
    """One check on both paths (comm.exchange): the refusing rank tells the others, which raise
    CollectiveMismatchError instead of waiting (as on GPUs); the simulator reports the refusing rank's own
    UsageError, which says what is wrong, not another rank's pointer to it."""
    seen = {}

    def main(comm):
        x = comm.alloc(8, np.float32)
        x.set(np.ones(8, np.float32))
        try:
            coll.all_reduce(comm, x, op="median" if comm.rank == 1 else "sum")
        except flowdsl.CollectiveMismatchError as e:
            seen[comm.rank] = (str(e), e.refused_by)
            raise

    with pytest.raises(flowdsl.UsageError, match="unknown op 'median'"):
        run_ranks(main, nranks=3, seed=seed)
    assert set(seen) <= {0, 2}, seen  # those the scheduler ran before rank 1 raised
    assert all("rank 1 refused its arguments" in text and refused == [1] for text, refused in seen.values())
