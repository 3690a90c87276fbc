"""``flowdsl.sim.spawn`` frees its simulated world: repeated spawns do not grow memory.

A rank's buffers are viewed by the world (windows, plans); a view's reference to its base
array is invisible to Python's garbage collector, so a buffer that referred back to its
communicator made a cycle that was never freed (about 1.1 GB a spawn of 4 ranks with the
default ``FlowConfig``). Each spawn here runs a collective and checks it against NumPy.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from flowdsl import collectives as coll
from flowdsl.sim import spawn

pytestmark = pytest.mark.sim

COUNT = 1000


def _inputs(rank: int) -> np.ndarray:
    return np.random.default_rng(100 + rank).standard_normal(COUNT).astype(np.float32)


def _all_reduce_main(config, alive: list):
    def main(comm):
        src = comm.alloc(COUNT, np.float32)
        src.set(_inputs(comm.rank))
        dst = comm.alloc(COUNT, np.float32)  # poisoned (NaN) until written
        coll.all_reduce(comm, src, dst, config=config)
        alive.extend((weakref.ref(comm), weakref.ref(comm.world)))
        return dst.get()
    return main


def _check(results, nranks):
    expected = np.sum([_inputs(r) for r in range(nranks)], axis=0, dtype=np.float64)
    for got in results:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    pytest.skip("needs /proc/self/status (Linux) to read the resident set size")


def test_repeated_spawns_with_the_default_config_keep_memory_flat():
    """4 ranks, default FlowConfig (121 MiB of staging a rank): RSS flat, worlds gone, no gc.collect here."""
    nranks, rss, alive = 4, [], []
    for _ in range(4):
        _check(spawn(_all_reduce_main(None, alive), nranks=nranks), nranks)
        rss.append(_rss_mib())
        assert not [ref for ref in alive if ref() is not None], "a finished spawn's world is still alive"
    # One world is about half a GiB; what a spawn leaves behind (caches, allocator slack) is far less.
    assert max(rss[1:]) - rss[0] < 150, f"resident set grew over spawns: {[round(r) for r in rss]} MiB"


def test_small_world_is_freed_by_the_garbage_collector():
    """A small world (left to the collector's own passes) has no cycle the collector cannot see."""
    alive = []
    config = coll.FlowConfig(channels=2, nslots=2, slot_bytes=128, threads=64)
    _check(spawn(_all_reduce_main(config, alive), nranks=3), 3)
    gc.collect()
    assert alive and not [ref for ref in alive if ref() is not None], "the world survived a full collection"


@pytest.mark.parametrize("races", [True, False], ids=["races", "no-races"])
def test_world_is_freed_after_a_kernel_sliced_a_buffer(races):
    """all_gather slices its output in the kernel (``dst[j*count:...]``); under race detection the
    slice was tracked with a plain view whose base was the slice itself, a cycle through ``.base``
    the collector cannot see, which held the whole world (about 250 MB a 200-call sequence)."""
    alive = []
    config = coll.FlowConfig(channels=1, nslots=2, slot_bytes=256, threads=32)

    def main(comm):
        src = comm.alloc(13, np.float32)
        src.set(np.full(13, comm.rank, np.float32))
        dst = comm.alloc(13 * comm.nranks, np.float32)
        coll.all_gather(comm, src, dst, algorithm="ring", config=config)
        alive.extend((weakref.ref(comm), weakref.ref(comm.world)))
        return dst.get()

    for got in spawn(main, nranks=2, races=races):
        np.testing.assert_array_equal(got, np.repeat(np.arange(2, dtype=np.float32), 13))
    gc.collect()
    assert alive and not [ref for ref in alive if ref() is not None], "the world survived a full collection"


def test_buffers_returned_from_a_spawn_stay_usable():
    """Buffers hold their communicator weakly: one returned from ``main`` still reads back after spawn."""
    config = coll.FlowConfig(channels=2, nslots=2, slot_bytes=128, threads=64)

    def main(comm):
        src = comm.alloc(COUNT, np.float32)
        src.set(_inputs(comm.rank))
        dst = comm.alloc(COUNT, np.float32)
        coll.all_reduce(comm, src, dst, config=config)
        return dst  # read after the spawn: get() waits for the rank's kernels only while it runs

    buffers = spawn(main, nranks=2)
    gc.collect()
    _check([b.get() for b in buffers], 2)
