"""A direct launch repeated with the same arguments replays a prepared launch (a CUDA graph):
on a real GPU its results are those of a fresh launch, whatever changed in between."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import flowdsl
from flowdsl.errors import ResourceClosedError
from tests.gpu.kernels import random_values, scale_shift

pytestmark = pytest.mark.gpu


@flowdsl.kernel
def through_window(dcomm, window, y, n):
    i = cuda.grid(1)
    if i < n:
        y[i] = y[i] + 1.0


def test_replayed_launches_see_new_contents_scalars_and_arrays(comm):
    import cupy

    n = 3001
    x, y = cupy.asarray(random_values(0, n)), cupy.full(n, np.nan, np.float32)
    launch = scale_shift[(n + 255) // 256, 256]
    for round_ in range(5):  # the fourth and later launches are replays
        x[...] = cupy.asarray(random_values(round_, n))
        y.fill(np.nan)
        launch(x, y, np.float32(2.0), np.float32(0.5))
        np.testing.assert_allclose(y.get(), 2.0 * random_values(round_, n) + 0.5, rtol=1e-6, atol=1e-6)
    assert launch.replays.prepared

    launch(x, y, np.float32(-3.0), np.float32(0.5))  # another scalar: launched, not replayed
    np.testing.assert_allclose(y.get(), -3.0 * random_values(4, n) + 0.5, rtol=1e-6, atol=1e-6)
    other = cupy.full(n, np.nan, np.float32)
    launch(x, other, np.float32(2.0), np.float32(0.5))  # another output array
    np.testing.assert_allclose(other.get(), 2.0 * random_values(4, n) + 0.5, rtol=1e-6, atol=1e-6)
    y.fill(np.nan)
    y.shape = (1, n)  # set in place: the launch packs another shape
    y.shape = (n,)
    launch(x, y, np.float32(2.0), np.float32(0.5))
    np.testing.assert_allclose(y.get(), 2.0 * random_values(4, n) + 0.5, rtol=1e-6, atol=1e-6)
    cupy.cuda.runtime.deviceSynchronize()


def test_a_repointed_torch_tensor_is_launched_at_its_new_memory(comm):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    n = 2048
    x = torch.from_numpy(random_values(5, n)).cuda()
    y = torch.full((n,), float("nan"), device="cuda")
    launch = scale_shift[n // 256, 256]
    for _ in range(4):
        launch(x, y, 1.5, 0.0)
    fresh = torch.full((n,), float("nan"), device="cuda")
    y.set_(fresh)  # y now points at fresh's memory
    launch(x, y, 1.5, 0.0)
    np.testing.assert_allclose(fresh.cpu().numpy(), 1.5 * random_values(5, n), rtol=1e-6, atol=1e-6)


def test_replays_go_into_a_graph_capture_and_refuse_closed_windows(comm):
    import cupy

    n = 1024
    buffer = comm.alloc(n, np.float32)
    y = cupy.zeros(n, np.float32)
    with comm.register(buffer) as window, comm.device_communicator() as dcomm:
        stream = cupy.cuda.Stream(non_blocking=True)
        launch = through_window[n // 256, 256, stream]
        for _ in range(4):
            launch(dcomm, window, y, n)
        assert launch.replays.prepared
        stream.begin_capture()
        launch(dcomm, window, y, n)  # a replay while capturing: launched into the capture
        graph = stream.end_capture()
        stream.synchronize()
        np.testing.assert_array_equal(y.get(), np.full(n, 4, np.float32))
        for _ in range(2):
            graph.launch(stream)
        stream.synchronize()
        np.testing.assert_array_equal(y.get(), np.full(n, 6, np.float32))
    with pytest.raises(ResourceClosedError, match="was closed"):
        launch(dcomm, window, y, n)
