"""``spawn(..., host_threads=True)``: each rank's host code on an OS thread of its own, one task at a time, so
that the same programs give the same results, the same reports and the same interleaving for a seed as with
greenlets, and no thread outlives the run."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import flowdsl
from flowdsl import collectives
from flowdsl.sim import DeadlockError
from flowdsl.testing import run_ranks

pytestmark = pytest.mark.sim


def _all_reduce_program(comm):
    x = comm.alloc(1000, np.float32)
    x.set(np.random.default_rng(comm.rank).standard_normal(1000).astype(np.float32))
    out = comm.alloc(1000, np.float32)
    collectives.all_reduce(comm, x, out, algorithm="ring")
    comm.synchronize()
    return out.get(), comm.own_thread, threading.get_ident()


def test_collectives_give_the_same_values_on_host_threads():
    before = threading.active_count()
    on_threads = run_ranks(_all_reduce_program, nranks=3, seed=5, host_threads=True)
    on_greenlets = run_ranks(_all_reduce_program, nranks=3, seed=5)
    expected = sum(np.random.default_rng(r).standard_normal(1000).astype(np.float64) for r in range(3))
    for (a, threads, ident), (b, greenlets, main_ident) in zip(on_threads, on_greenlets):
        np.testing.assert_allclose(a, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(a, b)  # the same programs, the same order of sums
        assert threads and not greenlets
        assert ident != main_ident == threading.get_ident()
    assert len({ident for _, _, ident in on_threads}) == 3  # a thread per rank
    assert threading.active_count() == before  # each returned


def test_a_seed_replays_the_same_interleaving_on_host_threads():
    from flowdsl.sim import host

    steps = []
    for _ in range(2):
        run_ranks(_all_reduce_program, nranks=2, seed=11, host_threads=True)
        steps.append(host.last_run["steps"])
    assert steps[0] == steps[1]


def test_a_deadlock_is_reported_at_the_host_line_and_every_thread_ends():
    before = threading.active_count()

    def main(comm):
        if comm.rank == 0:
            comm.barrier()  # rank 1 never comes
        return comm.rank

    with pytest.raises((DeadlockError, flowdsl.FlowDSLError), match=r"test_host_threads.py:\d+"):
        run_ranks(main, nranks=2, host_threads=True)
    assert threading.active_count() == before


def test_an_exception_on_one_rank_ends_the_run_and_the_other_ranks_threads():
    before = threading.active_count()

    def main(comm):
        if comm.rank == 1:
            raise ValueError("rank 1 gives up")
        comm.barrier()

    with pytest.raises(ValueError, match="rank 1 gives up"):
        run_ranks(main, nranks=3, host_threads=True)
    assert threading.active_count() == before
