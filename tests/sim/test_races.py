"""Data-race detection: planted races of each kind are reported with both accesses and the seed;
accesses ordered by barriers, release/acquire, fences, signals and Flow's protocols are not."""

from __future__ import annotations

import re

import numpy as np
import pytest
from numba import cuda, int32

import flowdsl
import flowdsl.sim as sim
from flowdsl import MemoryOrder, Protocol, ThreadScope, coop, flow, gin, lsa, mem, team
from flowdsl import collectives as coll
from flowdsl.examples import flow_loopback

pytestmark = pytest.mark.sim

SYS = ThreadScope.SYSTEM
# Line numbers of the accesses the reports must name, found by their markers ("# <name>").
with open(__file__) as _f:
    LINE = {m: n for n, text in enumerate(_f, 1) for m in re.findall(r"# <(\w+)>", text)}


def at(marker):
    return f"test_races.py:{LINE[marker]}"


def _zeros(comm, n, dtype):
    """A symmetric buffer of ``n`` zeros."""
    buf = comm.alloc(n, dtype)
    buf.set(np.zeros(n, dtype))
    return buf


def _race(main, nranks=2, seed=0, **options):
    with pytest.raises(sim.DataRaceError) as info:
        sim.spawn(main, nranks=nranks, seed=seed, races=True, **options)
    return str(info.value), info.value


# ---------------------------------------------------------------- the case: LSA, no barrier
@flowdsl.kernel
def write_then_read_peer(comm, win, out, ordered):
    i = cuda.threadIdx.x
    mine = lsa.local_view(win)
    mine[i] = comm.rank * 100 + i  # <own_write>
    if ordered:
        lsa.barrier(comm, coop.cta(), 0).sync(MemoryOrder.ACQ_REL)
    peer = lsa.lsa_view(win, (comm.lsa_rank + 1) % comm.lsa_size)
    out[i] = peer[i]  # <peer_read>


def _peer_program(ordered, n=8):
    def main(comm):
        buf = comm.alloc(n, np.int32)
        buf.set(np.full(n, -1, np.int32))
        out = comm.alloc(n, np.int32)
        with comm.register(buf) as win, comm.device_communicator(lsa_barrier_count=1) as dc:
            write_then_read_peer[1, n](dc, win, out, ordered)
            comm.synchronize()
        return out.get()
    return main


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_reading_a_peers_window_without_a_barrier_is_reported(seed):
    msg, err = _race(_peer_program(ordered=False), nranks=2, seed=seed)
    assert msg.startswith("Cannot ")
    assert "data race" in msg and "of window #0 on rank" in msg and "(int32, byte offset" in msg
    # Both accesses, whichever came first in this interleaving: rank, block, thread, kernel, file:line.
    assert f"write by rank" in msg and f"read by rank" in msg
    assert at("own_write") in msg and at("peer_read") in msg
    assert "block 0 thread" in msg and "of kernel 'write_then_read_peer' (launch #0)" in msg
    assert "rank 0" in msg and "rank 1" in msg
    assert "Fix: order the accesses across ranks: an LSA barrier" in msg
    assert f"seed={seed}" in msg and err.seed == seed
    assert len(err.accesses) == 2 and all("test_races.py:" in a for a in err.accesses)


def test_an_lsa_barrier_between_orders_them():
    for seed in range(3):
        out = sim.spawn(_peer_program(ordered=True), nranks=3, seed=seed, races=True)
        for rank, got in enumerate(out):
            np.testing.assert_array_equal(got, ((rank + 1) % 3) * 100 + np.arange(8))


def test_same_seed_same_report_and_the_option_turns_it_off(monkeypatch):
    first, _ = _race(_peer_program(ordered=False), seed=5)
    again, _ = _race(_peer_program(ordered=False), seed=5)
    assert first == again
    sim.spawn(_peer_program(ordered=False), nranks=2, seed=5, races=False)  # runs, silently racy
    monkeypatch.setenv("FLOWDSL_SIM_RACES", "0")
    sim.spawn(_peer_program(ordered=False), nranks=2, seed=5)
    monkeypatch.setenv("FLOWDSL_SIM_RACES", "1")
    with pytest.raises(sim.DataRaceError):
        sim.spawn(_peer_program(ordered=False), nranks=2, seed=5)


# ---------------------------------------------------------------- two threads of a block, one element
@flowdsl.kernel
def one_element(comm, win, out, synced, shared):
    s = cuda.shared.array(1, int32)
    w = lsa.local_view(win)
    t = cuda.threadIdx.x
    if not synced or t == 0:
        if shared:
            s[0] = t  # <shared_write>
        else:
            w[0] = t  # <window_write>
    cuda.syncthreads()
    out[t] = s[0] if shared else w[0]


def _block_program(synced, shared):
    def main(comm):
        buf = _zeros(comm, 4, np.int32)
        out = comm.alloc(32, np.int32)
        with comm.register(buf) as win, comm.device_communicator() as dc:
            one_element[1, 32](dc, win, out, synced, shared)
            comm.synchronize()
        return out.get()
    return main


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "window"])
def test_two_threads_of_a_block_writing_one_element(shared):
    msg, err = _race(_block_program(synced=False, shared=shared), nranks=1, seed=4)
    where = "shared array #0 of rank 0 block 0" if shared else "window #0 on rank 0"
    assert f"Cannot write element 0 (int32" in msg and where in msg
    assert "both write" in msg
    line = at("shared_write" if shared else "window_write")
    assert re.search(rf"this access: +write by rank 0 block 0 thread \d+ of kernel 'one_element' \(launch #0\) "
                     rf"at {line}", msg)
    assert re.search(rf"earlier access: write by rank 0 block 0 thread \d+ .* at {line}", msg)
    assert "both threads are in one block: put a barrier between the two accesses (cuda.syncthreads()" in msg
    assert "seed=4" in msg and err.rank == 0


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "window"])
def test_one_writer_then_syncthreads_is_ordered(shared):
    out = sim.spawn(_block_program(synced=True, shared=shared), nranks=1, seed=4, races=True)[0]
    np.testing.assert_array_equal(out, np.zeros(32, np.int32))


# ---------------------------------------------------------------- flags: release / acquire / relaxed / fences
RELEASE_ACQUIRE, RELAXED_STORE, RELAXED_LOAD, RELAXED_LOAD_FENCE, FENCES_AROUND_RELAXED = range(5)


@flowdsl.kernel
def handoff(comm, data, flags, out, mode):
    if comm.rank == 0:
        d = lsa.lsa_view(data, 1)
        d[0] = 42  # <data_write>
        f = lsa.lsa_view(flags, 1)
        if mode == RELEASE_ACQUIRE or mode == RELAXED_LOAD or mode == RELAXED_LOAD_FENCE:
            mem.store_release(f, 0, 1, SYS)
        elif mode == FENCES_AROUND_RELAXED:
            mem.fence(MemoryOrder.RELEASE, SYS)
            mem.store_relaxed(f, 0, 1, SYS)
        else:
            mem.store_relaxed(f, 0, 1, SYS)
    else:
        f = lsa.local_view(flags)
        if mode == RELEASE_ACQUIRE or mode == RELAXED_STORE:
            while mem.load_acquire(f, 0, SYS) == 0:
                pass
        else:
            while mem.load_relaxed(f, 0, SYS) == 0:
                pass
            if mode != RELAXED_LOAD:
                mem.fence(MemoryOrder.ACQUIRE, SYS)
        out[0] = lsa.local_view(data)[0]  # <data_read>


def _handoff_program(mode):
    def main(comm):
        data = _zeros(comm, 2, np.int64)
        flags = _zeros(comm, 2, np.uint64)
        out = _zeros(comm, 1, np.int64)
        with comm.register(data) as dw, comm.register(flags) as fw, comm.device_communicator() as dc:
            handoff[1, 1](dc, dw, fw, out, mode)
            comm.synchronize()
        return int(out.get()[0])
    return main


@pytest.mark.parametrize("mode", [RELEASE_ACQUIRE, RELAXED_LOAD_FENCE, FENCES_AROUND_RELAXED],
                         ids=["store_release-load_acquire", "relaxed-load-then-acquire-fence",
                              "release-fence-relaxed-store"])
def test_a_flag_with_release_and_acquire_orders_the_data(mode):
    for seed in range(4):
        assert sim.spawn(_handoff_program(mode), nranks=2, seed=seed, races=True)[1] == 42


def test_a_relaxed_flag_store_does_not_publish_the_data():
    msg, _ = _race(_handoff_program(RELAXED_STORE), seed=2)
    assert "Cannot read element 0 (int64, byte offset 0) of window #0 on rank 1" in msg
    assert re.search(rf"this access: +read by rank 1 block 0 thread 0 .* at {at('data_read')}", msg)
    assert re.search(rf"earlier access: write by rank 0 block 0 thread 0 .* at {at('data_write')}", msg)
    assert "Fix: order the accesses across ranks" in msg and "flowdsl.mem.store_release" in msg


def test_a_relaxed_flag_load_is_named_as_the_missing_acquire():
    msg, _ = _race(_handoff_program(RELAXED_LOAD), seed=2)
    assert at("data_read") in msg and at("data_write") in msg
    assert "this thread did read what the other published, but without acquiring it" in msg
    assert "flowdsl.mem.load_acquire" in msg and "flowdsl.mem.fence(MemoryOrder.ACQUIRE" in msg


# ---------------------------------------------------------------- atomics
@flowdsl.kernel
def count_up(comm, win, out, plain_read):
    v = lsa.lsa_view(win, 0, 0, 2)
    mem.atomic_add(v, 0, 1, MemoryOrder.RELAXED, SYS)  # <atomic_add>
    if plain_read and comm.rank == 1 and cuda.threadIdx.x == 0:
        out[0] = v[0]  # <plain_read>


def _count_program(plain_read):
    def main(comm):
        buf = _zeros(comm, 2, np.int32)
        out = comm.alloc(1, np.int32)
        with comm.register(buf) as win, comm.device_communicator() as dc:
            count_up[2, 16](dc, win, out, plain_read)
            comm.synchronize()
        comm.barrier()
        return int(buf.get()[0])
    return main


def test_atomics_do_not_race_with_each_other():
    assert sim.spawn(_count_program(False), nranks=3, seed=1, races=True)[0] == 3 * 2 * 16


def test_a_plain_read_of_an_atomic_counter_races():
    msg, _ = _race(_count_program(True), nranks=3, seed=1)
    assert "atomic" in msg and "one of them is a plain (non-atomic) access" in msg
    assert at("atomic_add") in msg and at("plain_read") in msg


# ---------------------------------------------------------------- GIN: signals with their orders, sources
@flowdsl.kernel
def gin_handoff(comm, src, dst, out, wait_order, reuse_source, flush_first):
    ctx = gin.context(comm, 0)
    if comm.rank == 0:
        gin.put(ctx, team.world(comm), 1, dst, 0, src, 0, 32, remote=gin.signal_inc(0),  # <put>
                coop=coop.thread())
        if reuse_source:
            if flush_first:
                gin.flush(ctx, coop.thread())
            lsa.local_view(src)[0] = -1  # <source_write>
    else:
        if wait_order == 0:
            gin.wait_signal(ctx, coop.thread(), 0, 1, order=MemoryOrder.RELAXED)
        else:
            gin.wait_signal(ctx, coop.thread(), 0, 1)
        d = lsa.local_view(dst)
        for i in range(8):
            out[i] = d[i]  # <landed_read>


def _gin_program(wait_order=1, reuse_source=False, flush_first=False):
    def main(comm):
        src = comm.alloc(8, np.int32)
        src.set(np.arange(8, dtype=np.int32) + 10)
        dst = _zeros(comm, 8, np.int32)
        out = comm.alloc(8, np.int32)
        with comm.register(src) as sw, comm.register(dst) as dw, \
                comm.device_communicator(gin_signal_count=1) as dc:
            gin_handoff[1, 1](dc, sw, dw, out, wait_order, reuse_source, flush_first)
            comm.synchronize()
        return out.get()
    return main


def test_a_signal_waited_for_with_acquire_orders_the_landed_data():
    for seed in range(3):
        got = sim.spawn(_gin_program(), nranks=2, seed=seed, races=True, gin_delivery="reordered")[1]
        np.testing.assert_array_equal(got, np.arange(8) + 10)


def test_a_signal_waited_for_with_relaxed_order_does_not():
    msg, _ = _race(_gin_program(wait_order=0), seed=3)
    assert "Cannot read element 0 (int32, byte offset 0) of window #1 on rank 1" in msg
    assert re.search(rf"this access: +read by rank 1 block 0 thread 0 .* at {at('landed_read')}", msg)
    assert re.search(r"earlier access: write by the network \(GIN context 0 of device communicator #0, "
                     rf"rank 0 -> rank 1\), landing put #0 \(issued by rank 0 block 0 thread 0 at {at('put')} "
                     r"\(gin_handoff\)\)", msg)
    assert "this thread did read what the other published, but without acquiring it" in msg


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_overwriting_a_put_source_before_flush_races_with_the_network(seed):
    msg, _ = _race(_gin_program(reuse_source=True), seed=seed)
    assert "of window #0 on rank 0" in msg
    assert at("source_write") in msg
    assert f"reading the source of put #0 (issued by rank 0 block 0 thread 0 at {at('put')} (gin_handoff))" in msg
    assert "Fix: a put's source must not change until the network has read it" in msg


def test_flush_before_reusing_the_source_orders_it():
    for seed in range(5):
        got = sim.spawn(_gin_program(reuse_source=True, flush_first=True), nranks=2, seed=seed, races=True)[1]
        np.testing.assert_array_equal(got, np.arange(8) + 10)


# ---------------------------------------------------------------- kernels and hosts
@flowdsl.kernel
def poke(comm, win, out, phase):
    if phase == 0 and comm.rank == 0:
        lsa.lsa_view(win, 1)[0] = 7  # <poke_write>
    if phase == 1 and comm.rank == 1:
        out[0] = lsa.local_view(win)[0]  # <poke_read>


def _poke_program(host_barrier):
    def main(comm):
        buf = _zeros(comm, 2, np.int32)
        out = comm.alloc(1, np.int32)
        with comm.register(buf) as win, comm.device_communicator() as dc:
            poke[1, 1](dc, win, out, 0)
            comm.synchronize()
            if host_barrier:
                comm.barrier()
            poke[1, 1](dc, win, out, 1)
            comm.synchronize()
        return int(out.get()[0])
    return main


def test_kernels_of_other_ranks_are_ordered_by_host_synchronisation_only():
    assert sim.spawn(_poke_program(True), nranks=2, seed=0, races=True)[1] == 7
    msg, _ = _race(_poke_program(False), seed=0)
    assert at("poke_write") in msg and at("poke_read") in msg
    assert "(launch #0)" in msg and "(launch #1)" in msg


# ---------------------------------------------------------------- Flow staging used correctly
@pytest.mark.parametrize("protocol", [Protocol.SIMPLE, Protocol.LL, Protocol.LL128])
def test_flow_staging_used_correctly_is_race_free(protocol):
    for seed in (0, 1):
        result, expected = sim.spawn(
            lambda comm: flow_loopback.run(comm, protocol=protocol, n=301, nslots=2, slot_bytes=128, threads=64),
            nranks=1, seed=seed, races=True)[0]
        np.testing.assert_allclose(result, expected, rtol=1e-6)


# ---------------------------------------------------------------- every example is race-free
def _examples():
    from flowdsl.examples import (allgather_direct, allgather_lsa, allreduce_bias_gelu, allreduce_lsa, alltoall_cft,
                                  alltoall_gin, alltoall_hybrid, alltoall_lsa, gin_put, moe_gin, rmsnorm_gin, rmsnorm_hybrid,
                                  rmsnorm_lsa)
    return {
        "rmsnorm_lsa": (lambda c: rmsnorm_lsa.run(c, tokens_per_rank=2, hidden=64), 3, 1),
        "allgather_lsa": (lambda c: allgather_lsa.run(c, count=300, blocks=2), 3, 1),
        "allreduce_lsa": (lambda c: allreduce_lsa.run(c, count=300, blocks=2, threads=32), 3, 1),
        "alltoall_lsa": (lambda c: alltoall_lsa.run(c, count=37, blocks=2, threads=64)[-1], 3, 1),
        "alltoall_lsa_poison": (lambda c: alltoall_lsa.run_poison(c, count=37, blocks=2, threads=64)[-1], 3, 1),
        "allgather_direct": (lambda c: allgather_direct.run(c, count=301), 4, 2),
        "allreduce_bias_gelu_simple": (lambda c: allreduce_bias_gelu.run(c, count=301), 4, 2),
        "allreduce_bias_gelu_ll": (lambda c: allreduce_bias_gelu.run(c, count=301, protocol=Protocol.LL), 3, 1),
        "allreduce_bias_gelu_ll128": (lambda c: allreduce_bias_gelu.run(c, count=301, protocol=Protocol.LL128), 4, 2),
        "alltoall_gin": (lambda c: alltoall_gin.run(c, count=64), 4, 2),
        "gin_put": (lambda c: gin_put.run(c, count=64, dst=3, calls=2)[-1], 4, 2),
        "rmsnorm_gin": (lambda c: rmsnorm_gin.run(c, tokens=2, hidden=40), 4, 2),
        "rmsnorm_hybrid": (lambda c: rmsnorm_hybrid.run(c, tokens=2, hidden=40), 4, 2),
        "alltoall_hybrid": (lambda c: alltoall_hybrid.run(c, count=64), 4, 2),
        "alltoall_cft_wait_counted": (lambda c: alltoall_cft.run(c, count=64), 4, 2),
        "alltoall_cft_read_and_fence": (lambda c: alltoall_cft.run(c, count=64, mode=alltoall_cft.READ_AND_FENCE), 4, 2),
        "moe_gin_strong": (lambda c: moe_gin.run(c), 4, 2),
        "moe_gin_weak_per_put": (lambda c: moe_gin.run(c, mode=moe_gin.WEAK_PER_PUT), 4, 2),
    }


@pytest.mark.parametrize("name", list(_examples()))
def test_every_example_is_race_free(name):
    run, nranks, nodes = _examples()[name]
    for seed in (0, 1):
        for result, reference in sim.spawn(run, nranks=nranks, nodes=nodes, seed=seed, races=True,
                                           gin_delivery="reordered"):
            np.testing.assert_allclose(result, reference, rtol=1e-5, atol=1e-5)


def test_the_report_in_the_docs_is_the_simulators(capsys):
    """docs/simulator.md shows a program and what it prints: run it, get that report."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "simulator.md").read_text()
    code, report = re.search(r"\*\*A report\.\*\*.*?```python\n(.*?)```\n\nprints[^\n]*\n\n```\n(.*?)```",
                             text, re.S).groups()
    exec(compile(code, "example.py", "exec"), {"__name__": "__docs__"})  # noqa: S102 - our own docs
    printed = capsys.readouterr().out
    assert "data race" in printed and " ".join(report.split()) == " ".join(printed.split())


@flowdsl.kernel
def two_senders_on_one_connection(comm, stage, src, dst, n, nslots, slot_words, protocol):
    proc = flow.processor(comm, stage, None, 1, nslots, slot_words, protocol, 0)
    conn = flow.connect(proc, comm.rank, 1, 1)
    if cuda.blockIdx.x < 2:
        flow.send(proc, conn, src, 0, n)  # the misuse: blocks 0 and 1 both send on one connection
    else:
        flow.recv(proc, conn, dst, 0, n)


def test_a_race_inside_flowdsl_names_the_users_call_and_the_misuse():
    def main(comm):
        config = coll.FlowConfig(channels=1, nslots=4, slot_bytes=256, threads=32)
        with flow.staging(comm, config, gin=False) as stage, comm.device_communicator() as dc:
            src, dst = comm.alloc(64, np.float32), comm.alloc(64, np.float32)
            two_senders_on_one_connection[3, 32](dc, stage, src, dst, 64, 4, 32, int(Protocol.SIMPLE))
            comm.synchronize()

    with pytest.raises(sim.DataRaceError) as err:
        sim.spawn(main, nranks=1)
    msg = str(err.value)
    assert re.search(r"at _flow_wire\.py:\d+ \(\w+\), inside flowdsl, called from your code at "
                     r"test_races\.py:\d+ \(two_senders_on_one_connection\)", msg), msg
    # the earlier access too (its thread still waits in the step that made it)
    assert msg.count("inside flowdsl, called from your code at test_races.py:") == 2, msg
    assert "Fix: both accesses are flowdsl's own code" in msg and "two blocks on the same side of one Flow " \
        "connection" in msg, msg


# ---------------------------------------------------------------- NumPy's functions on device arrays
@flowdsl.kernel
def sum_into_own_input(x, out, write_back):
    i = cuda.grid(1)
    if i < x.size:
        total = np.sum(x)  # <np_sum>
        if write_back:
            x[i] = total  # <np_sum_write>
        else:
            out[i] = x[i] * 2 + np.sum(x[0:4])


def test_numpy_functions_on_a_device_array_read_every_element_for_the_race_detector():
    """``np.sum(x)`` (NumPy's own loops, not element accesses) reads all of ``x``: another block writing ``x``
    then races with it, as it would with a loop of loads; reading alone races with nothing, and gives NumPy's
    values."""
    def main(comm, write_back):
        x = comm.alloc(64, np.float32)
        x.set(np.arange(64, dtype=np.float32))
        out = comm.alloc(64, np.float32)
        out.set(np.full(64, np.nan, np.float32))
        sum_into_own_input[2, 32](x, out, write_back)
        comm.synchronize()
        return out.get()

    got = sim.spawn(lambda comm: main(comm, False), nranks=1, races=True)[0]
    np.testing.assert_array_equal(got, np.arange(64, dtype=np.float32) * 2 + 6)
    msg, _ = _race(lambda comm: main(comm, True), nranks=1)
    assert "data race" in msg and "buffer (64,)" in msg and "block 0" in msg and "block 1" in msg, msg
    assert at("np_sum") in msg and at("np_sum_write") in msg, msg


@flowdsl.kernel
def exchange_rows_across_blocks(comm, win, out):
    """Block b writes row b of its own window, then syncs on barrier b and reads row 1 - b of the peer's: the
    row another block wrote, which barrier b does not order."""
    b, i = cuda.blockIdx.x, cuda.threadIdx.x
    mine = lsa.local_view(win)
    mine[b * 8 + i] = comm.rank * 100 + b * 8 + i  # <row_write>
    lsa.barrier(comm, coop.cta(), b).sync(MemoryOrder.ACQ_REL)
    peer = lsa.lsa_view(win, (comm.lsa_rank + 1) % comm.lsa_size)
    out[b * 8 + i] = peer[(1 - b) * 8 + i]  # <row_read>


def _lsa_race(kernel, blocks, threads=8):
    """The race report of ``kernel[blocks, threads](dcomm, window, out)`` on 2 ranks (one barrier per block)."""
    def main(comm):
        n = blocks * threads
        buf, out = _zeros(comm, n, np.int32), _zeros(comm, n, np.int32)
        with comm.register(buf) as win, comm.device_communicator(lsa_barrier_count=blocks) as dc:
            kernel[blocks, threads](dc, win, out)
            comm.synchronize()

    return _race(main, nranks=2)[0]


def test_a_race_between_blocks_that_sync_on_different_lsa_barriers_says_so():
    msg = _lsa_race(exchange_rows_across_blocks, 2)
    assert at("row_write") in msg and at("row_read") in msg, msg
    assert "Fix: both blocks sync on LSA barriers, but on different ones (block " in msg and \
        "a barrier orders only the threads that sync on the same index" in msg, msg


@flowdsl.kernel
def write_then_read_peer_after_a_releasing_barrier(comm, win, out):
    i = cuda.threadIdx.x
    lsa.local_view(win)[i] = comm.rank * 100 + i
    lsa.barrier(comm, coop.cta(), 0).sync(MemoryOrder.RELEASE)  # the mistake: nothing acquires
    out[i] = lsa.lsa_view(win, (comm.lsa_rank + 1) % comm.lsa_size)[i]  # <peer_read_after_release>


def test_a_barrier_that_only_releases_is_named_in_the_fix():
    msg = _lsa_race(write_then_read_peer_after_a_releasing_barrier, 1)
    assert at("peer_read_after_release") in msg, msg
    assert "a barrier's sync or wait with MemoryOrder.ACQ_REL or ACQUIRE" in msg, msg
