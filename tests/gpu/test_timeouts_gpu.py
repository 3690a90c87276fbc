"""Bounded device waits on one GPU: a wait nobody releases ends in DeviceTimeoutError with its
record; later waits give up at once; abort from a host thread ends a kernel without a limit;
close() never hangs; the wait record costs nothing when nothing hangs.

The programs are ``tests/planted_hangs.py``'s kernels on one rank (its "next" peer is itself).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

LIMIT = 0.5


def _spinning_kernel(comm):
    """Launch a kernel whose thread 0 waits for a flag nobody sets; return what to close."""
    from tests import planted_hangs

    buf = comm.alloc(8, np.uint64)
    buf[...] = 0
    win, dc = comm.register(buf), comm.device_communicator()
    planted_hangs.wait_for_next[1, 32](dc, win)
    return win, dc


def test_a_wait_nobody_releases_raises_with_its_record():
    import flowdsl

    comm = flowdsl.init(wait_timeout=LIMIT)
    try:
        start = time.monotonic()
        _spinning_kernel(comm)
        with pytest.raises(flowdsl.DeviceTimeoutError) as info:
            comm.synchronize()
        took = time.monotonic() - start
        err = info.value
        assert LIMIT <= err.waited_s < LIMIT + 1.0 and took < LIMIT + 5.0, (err.waited_s, took)
        assert (err.rank, err.block, err.thread, err.peer, err.index) == (0, 0, 0, 0, 0)
        assert (err.expected, err.seen) == (1, 0) and err.timeout_s == LIMIT
        assert err.primitive == "a kernel's own wait (flowdsl.wait.poll), index"
        assert str(err).startswith("Cannot synchronize: a device-side wait on rank 0 gave up after ")
        assert comm.device_error() is not None
        # The record stays, and a later wait of this communicator gives up at its first check.
        start = time.monotonic()
        _spinning_kernel(comm)
        with pytest.raises(flowdsl.DeviceTimeoutError):
            comm.synchronize()
        assert time.monotonic() - start < LIMIT, "a wait after the timeout did not give up at once"
    finally:
        comm.close()  # a wait gave up: close aborts instead of tearing down collectively
    assert comm.closed


def test_collectives_refuse_every_call_after_a_timeout():
    """A kernel that gave up ran on with garbage: the connections are out of step, so no further call
    (planned or new) may run and return stale data."""
    import flowdsl
    from flowdsl import collectives as coll

    comm = flowdsl.init(wait_timeout=LIMIT)
    try:
        x, y = comm.alloc(64, np.float32), comm.alloc(64, np.float32)
        x[...] = 1.0
        coll.all_reduce(comm, x, algorithm="ring")  # planned: the next same call takes the hot path
        comm.synchronize()
        _spinning_kernel(comm)
        with pytest.raises(flowdsl.DeviceTimeoutError):
            comm.synchronize()
        for call in (lambda: coll.all_reduce(comm, x, algorithm="ring"), lambda: coll.all_gather(comm, x, y),
                     lambda: coll.all_reduce(comm, x, algorithm="one_shot")):
            with pytest.raises(flowdsl.DeviceTimeoutError) as info:
                call()
            assert "flowdsl's collectives refuse every call after a timeout" in "\n".join(info.value.__notes__)
    finally:
        comm.close()


def test_abort_from_another_thread_ends_a_kernel_without_a_limit():
    import flowdsl

    comm = flowdsl.init(wait_timeout=0)
    _spinning_kernel(comm)
    aborting = threading.Timer(0.5, comm.abort)
    aborting.start()
    start = time.monotonic()
    with pytest.raises(flowdsl.ResourceClosedError, match="the communicator was aborted"):
        comm.synchronize()  # raises as soon as the abort begins
    assert time.monotonic() - start < 10.0
    aborting.join(10.0)  # the abort then releases the resources
    assert not aborting.is_alive() and comm.closed and comm.open_resources == []


def test_close_never_hangs_on_a_spinning_kernel():
    import flowdsl

    comm = flowdsl.init(wait_timeout=LIMIT)
    _spinning_kernel(comm)
    start = time.monotonic()
    comm.close()
    assert time.monotonic() - start < LIMIT + 10.0
    assert comm.closed


def test_the_limit_comes_from_the_environment_and_can_change(monkeypatch):
    import flowdsl

    monkeypatch.setenv("FLOWDSL_WAIT_TIMEOUT", "42")
    with flowdsl.init() as comm:
        assert comm.wait_timeout == 42.0
        comm.wait_timeout = 0
        assert comm.wait_timeout == 0.0
        with pytest.raises(flowdsl.UsageError, match="wait_timeout must be a number of seconds >= 0"):
            comm.wait_timeout = float("nan")


def test_collectives_are_unchanged_when_nothing_hangs():
    import flowdsl
    from flowdsl import collectives as coll

    with flowdsl.init(wait_timeout=LIMIT) as comm:
        rng = np.random.default_rng(5)
        data = rng.standard_normal(10_000).astype(np.float32)
        x = comm.alloc(data.size, np.float32)
        for algorithm in ("ring", "tree", "one_shot"):
            x.set(data)
            coll.all_reduce(comm, x, algorithm=algorithm)
            comm.synchronize()
            np.testing.assert_array_equal(x.get(), data)  # one rank: the sum is the input
        assert comm.device_error() is None
