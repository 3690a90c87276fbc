"""A GIN kernel is linked at its first launch for the GIN backend of its device communicator (real NCCL).

One rank puts a random array into its own window over GIN and waits for the signal; the output
is poisoned first and compared with NumPy. The second test first loads the kernel as linked for
another backend (what a launch on a communicator of that backend would have loaded), then
launches on this one: the launch must load the kernel linked for this communicator's backend
(a kernel linked for one backend has no device code for the others).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from numba import cuda

import flowdsl
from flowdsl import coop, gin, team

pytestmark = pytest.mark.gpu

N = 4096


@flowdsl.kernel
def put_to_self(comm, src, dst, n):
    ctx = gin.context(comm, 0)
    world = team.world(comm)
    if cuda.threadIdx.x == 0:
        gin.put(ctx, world, world.rank, dst, 0, src, 0, n * 4, remote=gin.signal_inc(0))
    gin.wait_signal(ctx, coop.cta(), 0, 1)
    gin.flush(ctx, coop.cta())


#: Why GIN is unavailable on this machine, once the first device communicator with GIN failed.
_NO_GIN: list[str] = []


def _run(comm, before_launch=None):
    """Put a random array to this rank over GIN; return (result, expected, device communicator's backend)."""
    x = np.random.default_rng(7).standard_normal(N).astype(np.float32)
    src, dst = comm.alloc(N, np.float32), comm.alloc(N, np.float32)
    src.set(x)
    dst.set(np.full(N, np.nan, np.float32))
    from flowdsl.runtime.nccl import NcclError

    if _NO_GIN:  # NCCL 2.28.9 crashes when asked again on a communicator where GIN failed
        pytest.skip(_NO_GIN[0])
    try:
        gin_dcomm = comm.device_communicator(gin_signal_count=1, gin_force_enable=1)
    except NcclError as exc:  # NCCL refuses GIN without a network it can use (one GPU, no NIC)
        _NO_GIN.append(f"NCCL enables no GIN here (no GIN-capable network): {exc}")
        pytest.skip(_NO_GIN[0])
    with comm.register(src) as src_win, comm.register(dst) as dst_win, gin_dcomm as dcomm:
        if dcomm.gin_backend is None:
            pytest.skip("NCCL created no GIN connection of one backend for this device communicator "
                        "(no GIN-capable network here): nothing to link a backend for")
        if before_launch is not None:
            before_launch(dcomm, src_win, dst_win)
        put_to_self[1, 128](dcomm, src_win, dst_win, N)
        comm.synchronize()
        return dst.get(), x, dcomm.gin_backend


def test_the_first_launch_links_the_backend_of_the_device_communicator(comm):
    from flowdsl.lowering.gin import linked_backend

    result, expected, backend = _run(comm)
    np.testing.assert_array_equal(result, expected)
    (loaded,) = [v for k, v in put_to_self._loaded.items()]
    assert linked_backend(loaded.features) == backend


def test_a_kernel_linked_for_another_backend_is_not_launched(comm):
    from flowdsl._argtypes import argument_type
    from flowdsl._launch import _Loaded
    from flowdsl._targets import device_target
    from flowdsl.lowering.gin import linked_backend
    from flowdsl.runtime.support import gin_backends

    def load_for_another_backend(dcomm, src_win, dst_win):
        target = device_target()
        others = [b for b in gin_backends(target.nccl) if b != dcomm.gin_backend]
        argtypes = tuple(argument_type("put_to_self", i, a) for i, a in enumerate((dcomm, src_win, dst_win, N)))
        put_to_self._loaded.clear()
        put_to_self._loaded_by_ids.clear()
        put_to_self._loaded_for_backends.clear()
        put_to_self._loaded[argtypes] = _Loaded(put_to_self._load_or_compile(
            argtypes, replace(target, gin_backend=others[0])), argtypes)

    result, expected, backend = _run(comm, load_for_another_backend)
    np.testing.assert_array_equal(result, expected)
    ((_, chosen), loaded), = put_to_self._loaded_for_backends.items()
    assert chosen == backend and linked_backend(loaded.features) == backend
