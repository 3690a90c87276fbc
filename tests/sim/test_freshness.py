"""Freshness: a wait that takes data by its flag takes only what was written for its own call.

The one-shot all-reduce across calls of other grids, counts and dtypes; the one-shot window's
call count and Flow's LL step counters carried across the end of the flag cycle (where a flag
comes round again, and where a 32-bit flag counted as ``step + 1`` would become 0, the flag of
zeroed memory); and the simulator catching the class: a planted one-shot whose flag is counted
per block (``tests/planted_stale.py``) and Flow with the old flag raise
:class:`flowdsl.sim.StaleDataError`, where the bits matched and a GPU returned stale data.
"""

from __future__ import annotations

import importlib
import pathlib
import sys

import numpy as np
import pytest
from numba import cuda, uint64

import flowdsl
from flowdsl import Protocol, ThreadScope, flow, lsa, mem, wait
from flowdsl import _flow_staging as staging
from flowdsl import collectives as coll
from flowdsl.collectives import check, programs
from flowdsl.sim import StaleDataError, spawn

pytestmark = pytest.mark.sim

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
planted_stale = importlib.import_module("planted_stale")

C = flow.LL_FLAG_CYCLE


def _one_shot_calls(comm, calls, config=None):
    failures = []
    for k, (dtype, op, count, inplace) in enumerate(calls):
        case = check.Case("one_shot", "all_reduce", dtype, op, inplace, count, config=config, seed=k)
        failure = check.run_case(comm, case).failure()
        if failure is not None:
            failures.append(failure)
    return failures


# Grids of 1, 2, 1, 2, 5 blocks (one per 1024 elements), 8-byte elements (two lines each) between.
SEQUENCE = [("float32", "sum", 1024, False), ("float32", "sum", 1025, False), ("int64", "sum", 129, True),
            ("float16", "min", 4099, False), ("float32", "max", 1025, True), ("float32", "sum", 2048, False)]


@pytest.mark.parametrize("nranks", [2, 3])
def test_one_shot_calls_of_other_grids_counts_and_dtypes(nranks):
    for failures in spawn(lambda comm: _one_shot_calls(comm, SEQUENCE), nranks=nranks, seed=nranks):
        assert not failures, failures


def test_a_flag_counted_per_block_is_caught():
    with pytest.raises(StaleDataError) as err:
        spawn(planted_stale.run, nranks=2, seed=0)
    msg = str(err.value)
    assert "as fresh data from rank 0" in msg and "(launch #0 of rank 0)" in msg, msg
    assert "kernel 'per_block_epoch_all_reduce', launch #1 of rank 1" in msg, msg
    assert "Fix: derive the flag from a count both ends keep for the whole connection or window" in msg, msg


def _set_one_shot_calls(comm, calls):
    """Start the communicator's one-shot window at ``calls`` finished calls (on every rank alike)."""
    state = next(iter(comm.__dict__["_flowdsl_collectives"].values()))
    buffer, _ = state._one_shot
    comm.synchronize()
    buffer[programs._CALLS] = calls
    comm.synchronize()


def _one_shot_across(start):
    """Call 0 leaves 300 lines (flag 1) in buffer 0; then calls ``start ..`` (every rank alike), short
    ones, then long ones again: from ``C - 3`` on, call ``C`` is flag 1 in buffer 0 once more."""
    def main(comm):
        failures = _one_shot_calls(comm, [("float32", "sum", 300, False)])  # makes the window
        _set_one_shot_calls(comm, start)
        calls = [("float32", "sum", 7, False), ("int64", "max", 3, False), ("float32", "sum", 7, True),
                 ("float32", "sum", 300, False), ("float16", "min", 300, False), ("int32", "sum", 299, False)]
        return failures + _one_shot_calls(comm, calls)
    return main


@pytest.mark.parametrize("start", [C // 2 - 3, C - 3], ids=["half-cycle", "cycle-end"])
def test_one_shot_across_the_flag_cycle(monkeypatch, start):
    """Through the two calls of each half cycle that rewrite every line of their buffer, and at the
    cycle's end past where ``call + 1`` would have reached 2**32."""
    monkeypatch.setattr(programs, "ONE_SHOT_LINES", 512)  # cleaning writes every line: keep them few
    for failures in spawn(_one_shot_across(start), nranks=2, seed=1):
        assert not failures, failures


def test_one_shot_without_cleaning_is_caught(monkeypatch):
    """Without the cleaning calls, call ``C`` (flag 1 again) finds call 0's lines carrying its flag."""
    monkeypatch.setattr(programs, "ONE_SHOT_LINES", 512)
    monkeypatch.setattr(flow, "ll_cleans", lambda step, nslots: False)
    with pytest.raises(StaleDataError) as err:
        spawn(_one_shot_across(C - 3), nranks=2, seed=1)
    assert "(launch #0 of rank" in str(err.value) and "launch #4 of rank" in str(err.value), str(err.value)


@flowdsl.kernel
def _loopback(comm, stage, src, dst, n, channels, nslots, slot_words, protocol):
    """Block 0 sends ``src`` to this rank on connection 1 of channel 0; block 1 receives it into ``dst``
    (LL128 compiled in)."""
    proc = flow.processor(comm, stage, None, channels, nslots, slot_words, protocol, 0, 1)
    conn = flow.connect(proc, comm.rank, 1, 1)
    if cuda.blockIdx.x == 0:
        flow.send(proc, conn, src, 0, n)
    else:
        flow.recv(proc, conn, dst, 0, n)


def _set_counters(words, channel, number, start):
    """Both ends of connection ``number`` of ``channel`` at ``start`` slots: its counters and every
    part's ready and credit flag."""
    for which in (staging.SENT, staging.RECEIVED):
        words[staging.counter_word(channel, number, which)] = start
    for part in range(flow.MAX_PARTS):
        for which in (staging.READY, staging.CREDIT):
            words[staging.flag_word(channel, number, which, part)] = start


def _loopback_calls(calls, nslots=3, slot_bytes=256, threads=32):
    """Flow through one connection (channel 0, connection 1, a rank sending to itself), a launch per
    call ``(start, protocol, n)``: ``start`` (or None) sets its counters and flags, at both ends, to
    that many slots first; then ``n`` random int32 go through. An LL slot of 256 bytes carries 32
    elements (16 lines), a SIMPLE slot 64, an LL128 slot (at least 2 KiB) 480."""
    def main(comm):
        config = coll.FlowConfig(channels=1, nslots=nslots, slot_bytes=slot_bytes, threads=threads)
        rng = np.random.default_rng(len(calls))
        with flow.staging(comm, config, gin=False) as stage, comm.device_communicator() as dcomm:
            words = stage.flow_staging.buffer
            results = []
            for start, protocol, n in calls:
                if start is not None:
                    _set_counters(words, 0, 1, start)
                x = rng.integers(-2**31, 2**31 - 1, n).astype(np.int32)
                src, dst = comm.alloc(n, np.int32), comm.alloc(n, np.int32)
                src[:] = x
                dst.fill(-1)
                _loopback[2, threads](dcomm, stage, src, dst, n, 1, nslots, slot_bytes // 8, int(protocol))
                comm.synchronize()
                results.append((np.array(dst), x))
            return results
    return main


def _ll_loopback(start):
    """Two LL calls of 300 elements (10 slots each) from ``start``: every slot crossed several times."""
    return _loopback_calls([(start, Protocol.LL, 300), (None, Protocol.LL, 300)])


@pytest.mark.parametrize("start", [0, C // 2 - 7, C - 7, 2**32 - 1], ids=["zero", "half-cycle", "cycle-end", "2**32"])
def test_flow_ll_across_the_flag_cycle(start):
    """Steps ``start ..``: through the slots each half cycle cleans, past the cycle's end and past 2**32."""
    for results in spawn(_ll_loopback(start), nranks=1, seed=2):
        for got, want in results:
            np.testing.assert_array_equal(got, want)


# Step 1 leaves LL lines with flag 2 in slot 1; steps C-2 and C-1 (the cycle's last, which clean) run
# SIMPLE; step C+1 is LL in slot 1 again with flag 2.
ACROSS_PROTOCOLS = [(1, Protocol.LL, 32), (C - 2, Protocol.SIMPLE, 128), (None, Protocol.LL, 64)]


def test_flow_ll_after_a_half_cycle_of_simple_steps():
    """The cleaning steps ran SIMPLE: they clean the LL slots all the same."""
    for results in spawn(_loopback_calls(ACROSS_PROTOCOLS, nslots=2), nranks=1, seed=3):
        for got, want in results:
            np.testing.assert_array_equal(got, want)


def _caught(main, nranks, seeds=range(16)):
    """The first StaleDataError of ``main`` over ``seeds``: the stale read happens in the interleavings
    where the reader looks before the writer's store of this call (whether it does is the scheduler's)."""
    for seed in seeds:
        try:
            spawn(main, nranks=nranks, seed=seed)
        except StaleDataError as err:
            return str(err)
    raise AssertionError(f"no StaleDataError in seeds {list(seeds)}")


def test_flow_ll_without_cleaning_across_protocols_is_caught(monkeypatch):
    monkeypatch.setattr(flow, "ll_cleans", lambda step, nslots: False)
    msg = _caught(_loopback_calls(ACROSS_PROTOCOLS, nslots=2), 1, seeds=range(64))  # about 1 interleaving in 9
    assert "(launch #0 of rank 0)" in msg and "launch #2 of rank 0" in msg, msg


def test_flow_ll_with_a_flag_that_wraps_to_zero_is_caught(monkeypatch):
    """The flag as it was, ``(step + 1) & 0xFFFFFFFF``, and no cleaning: at step 2**32 - 1 (here the
    connection's first) it is 0, the flag of zeroed memory, and the receiver takes lines nobody wrote."""
    monkeypatch.setattr(flow, "ll_flag", lambda step: uint64((step + 1) & 0xFFFFFFFF))
    monkeypatch.setattr(flow, "ll_cleans", lambda step, nslots: False)
    msg = _caught(_ll_loopback(2**32 - 1), 1)
    assert "as fresh data from rank 0: no kernel of this run wrote it" in msg, msg
    assert "of rank 0) waited for what rank 0's launch #0 writes" in msg, msg


def test_an_ll128_flag_stored_before_its_line_is_caught(monkeypatch):
    """LL128 relies on a warp filling each 128-byte line, flag and data, in one store
    (``mem.warp_store_vec``). Planted: the flag lanes store first, then the others, with a warp barrier
    between (where the simulator lets the reader run): the reader sees every flag of the pass while
    data words still hold what an earlier call (or nobody) left, and the simulator catches the torn
    line."""
    from flowdsl import mem
    from flowdsl.sim.cudashim import cuda as sim_cuda

    calls = [(None, Protocol.LL128, 480), (None, Protocol.LL128, 480), (None, Protocol.LL128, 480)]
    for results in spawn(_loopback_calls(calls), nranks=1, seed=4):  # one store a line: right
        for got, want in results:
            np.testing.assert_array_equal(got, want)

    def flag_first(array, index, values, scope):
        flagger = sim_cuda.laneid % 8 == 7
        if flagger:
            mem.store_vec_relaxed(array, index, values, scope)
        sim_cuda.syncwarp()
        if not flagger:  # the data lands late: the reader gets to run (each load lets it)
            for _ in range(64):
                mem.load_relaxed(array, index, scope)
            mem.store_vec_relaxed(array, index, values, scope)

    monkeypatch.setattr(mem, "warp_store_vec", flag_first)
    msg = _caught(_loopback_calls(calls), 1)
    assert "as fresh data from rank 0" in msg and "line" in msg, msg


@flowdsl.kernel
def _take_after_overwrite(comm, stage, out, call):
    """Call 0: block 1 stores word 0 (an old line). Call 1: block 0 loads word 0 and only then lets block
    1 store this call's value over it; block 0 then takes what it had loaded as fresh: the old line."""
    words = lsa.local_view(stage)
    if cuda.threadIdx.x != 0:
        return
    if cuda.blockIdx.x == 1:
        if call == 1:
            while mem.load_acquire(words, 1, ThreadScope.SYSTEM) != 1:  # block 0 has loaded word 0
                pass
        mem.store_relaxed(words, 0, uint64(10 + call), ThreadScope.SYSTEM)
        mem.store_release(words, 2, uint64(call), ThreadScope.SYSTEM)
    elif call == 1:
        v = mem.load_relaxed(words, 0, ThreadScope.SYSTEM)
        mem.store_release(words, 1, uint64(1), ThreadScope.SYSTEM)
        while mem.load_acquire(words, 2, ThreadScope.SYSTEM) != 1:  # block 1 has stored over it
            pass
        wait.accepted(words, 0, 1, comm.rank)
        out[0] = v


def test_accepted_judges_the_value_loaded_not_what_memory_holds_later():
    """The simulator caught a stale line only while memory still held it at ``accepted``: a reader that
    loaded several lines before taking the first (LL's four packs) let the writer store this call's data
    over a stale line in between, and the stale value went through unreported."""
    def main(comm):
        config = coll.FlowConfig(channels=1, nslots=2, slot_bytes=256, threads=32)
        with flow.staging(comm, config, gin=False) as stage, comm.device_communicator() as dcomm:
            out = comm.alloc(1, np.uint64)
            for call in (0, 1):
                _take_after_overwrite[2, 32](dcomm, stage, out, call)
                comm.synchronize()

    with pytest.raises(StaleDataError) as err:
        spawn(main, nranks=1, seed=0)
    msg = str(err.value)
    assert "as fresh data from rank 0" in msg and "(launch #0 of rank 0)" in msg, msg
    assert "launch #1 of rank 0) waited for what rank 0's launch #1 writes" in msg, msg
