"""Streams and CUDA-graph capture on a real GPU (one rank: a collective is a local copy kernel).

A collective or kernel launch on a capturing stream is captured and runs at every replay;
the first call, which allocates, registers or loads, is refused during capture with the fix,
and the capture stays usable.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from numba import cuda

import flowdsl
from tests.gpu.kernels import random_values, scale_shift

pytestmark = pytest.mark.gpu

N = 4099


@flowdsl.kernel
def never_launched_before_capture(y):
    i = cuda.grid(1)
    if i < y.size:
        y[i] = 0


def _values(seed, n=N):
    return random_values(seed, n)


def _replay(graph, stream, inputs, outputs):
    """Set each ``(array, values)`` of ``inputs`` and poison ``outputs`` (NaN), then launch CuPy
    ``graph`` on ``stream`` and wait for it; return the outputs' values."""
    import cupy

    for array, values in inputs:
        array.set(values)
    for array in outputs:
        array.fill(np.nan)
    cupy.cuda.Device().synchronize()
    graph.launch(stream)
    stream.synchronize()
    return [array.get() for array in outputs]


def test_real_framework_streams_resolve_to_their_handles(comm):
    import cupy

    from flowdsl.host.streams import stream_handle

    s = cupy.cuda.Stream(non_blocking=True)
    assert stream_handle(s) == s.ptr
    x = comm.alloc(4, np.float32)
    assert stream_handle(None, (x,)) == cupy.cuda.get_current_stream().ptr
    with s:
        assert stream_handle(None, (x,)) == s.ptr
    numba_stream = cuda.stream()
    assert stream_handle(numba_stream) == int(numba_stream.handle)
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    t = comm.alloc(4, np.float32, like="torch")
    ts = torch.cuda.Stream(device=t.device)
    assert stream_handle(ts) == ts.cuda_stream
    with torch.cuda.stream(ts):
        assert stream_handle(None, (t,)) == ts.cuda_stream


def test_torch_graph_captures_a_collective(comm):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    from flowdsl import collectives as coll

    x = comm.alloc(N, np.float32, like="torch")
    y = comm.alloc(N, np.float32, like="torch")
    x.copy_(torch.from_numpy(_values(0)).to(x.device))
    # Warm up on a side stream, as torch.cuda.graph's docs advise: the first call creates the
    # staging window and loads the kernel, which cannot be captured.
    side = torch.cuda.Stream(device=x.device)
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(side):
        coll.all_reduce(comm, x, y)
    torch.cuda.current_stream(x.device).wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.cuda.graph(graph):
            coll.all_reduce(comm, x, y)  # stream=None: torch's current stream, the capture stream
    assert not [w for w in caught if "empty" in str(w.message)], [str(w.message) for w in caught]

    for seed in (1, 2):
        values = _values(seed)
        x.copy_(torch.from_numpy(values).to(x.device))
        y.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        np.testing.assert_array_equal(y.cpu().numpy(), values)  # one rank: the sum over ranks is x


def test_cupy_graph_captures_collectives_on_an_explicit_and_the_current_stream(comm):
    import cupy

    from flowdsl import collectives as coll

    x, y, x2, y2 = (comm.alloc(N, np.float32) for _ in range(4))
    stream = cupy.cuda.Stream(non_blocking=True)
    coll.all_reduce(comm, x, y, stream=stream)  # warm-up
    with stream:
        coll.all_reduce(comm, x2, y2)
    stream.synchronize()

    stream.begin_capture()
    try:
        coll.all_reduce(comm, x, y, stream=stream)
        with stream:
            coll.all_reduce(comm, x2, y2)  # stream=None: CuPy's current stream
    finally:
        graph = stream.end_capture()

    for seed in (1, 2):
        a, b = _values(seed), _values(seed + 10)
        got, got2 = _replay(graph, stream, [(x, a), (x2, b)], [y, y2])
        np.testing.assert_array_equal(got, a)  # one rank: the sum over ranks is x
        np.testing.assert_array_equal(got2, b)


def test_a_kernel_launch_is_captured(comm):
    import cupy

    x, y, x2, y2 = (comm.alloc(N, np.float32) for _ in range(4))
    stream = cupy.cuda.Stream(non_blocking=True)
    blocks = (N + 255) // 256
    scale_shift[blocks, 256, stream](x, y, 2.0, 1.0)  # warm-up: compiles or loads the kernel
    stream.synchronize()

    stream.begin_capture()
    try:
        scale_shift[blocks, 256, stream](x, y, 2.0, 1.0)
        with stream:
            scale_shift[blocks, 256](x2, y2, 3.0, 0.5)  # no stream: CuPy's current stream
    finally:
        graph = stream.end_capture()

    for seed in (1, 2):
        a, b = _values(seed), _values(seed + 10)
        got, got2 = _replay(graph, stream, [(x, a), (x2, b)], [y, y2])
        np.testing.assert_allclose(got, 2.0 * a.astype(np.float64) + 1.0, rtol=1e-6)
        np.testing.assert_allclose(got2, 3.0 * b.astype(np.float64) + 0.5, rtol=1e-6)


def test_first_calls_during_capture_are_refused_and_the_capture_stays_usable(comm):
    import cupy

    from flowdsl import collectives as coll

    x, y = comm.alloc(N, np.float32), comm.alloc(N, np.float32)
    fresh = coll.FlowConfig(channels=2)  # no call used it yet: its staging window does not exist
    stream = cupy.cuda.Stream(non_blocking=True)
    coll.all_reduce(comm, x, y, stream=stream)  # warm-up of the default config
    stream.synchronize()

    stream.begin_capture()
    try:
        with pytest.raises(flowdsl.UsageError, match=r"Cannot all_reduce during CUDA-graph capture: the first call "
                                                     r"on this communicator \(and config\) allocates and registers "
                                                     r"its staging window .*\(not capturable\)\. Call it once before "
                                                     r"capturing \(a warm-up"):
            coll.all_reduce(comm, x, y, stream=stream, config=fresh)
        with pytest.raises(flowdsl.UsageError, match=r"Cannot launch never_launched_before_capture during CUDA-graph "
                                                     r"capture: its first launch .* compiles or loads the kernel's "
                                                     r"module \(not capturable\)\. Call it once before capturing"):
            never_launched_before_capture[1, 32, stream](y)
        with stream, pytest.raises(flowdsl.UsageError, match=r"Cannot synchronize during CUDA-graph capture: "
                                                             r"waiting for the whole device is illegal"):
            comm.synchronize()
        assert stream.is_capturing()  # the refusals left the capture valid (CuPy raises if invalidated)
        coll.all_reduce(comm, x, y, stream=stream)
    finally:
        graph = stream.end_capture()
    assert not stream.is_capturing()

    values = _values(3)
    got, = _replay(graph, stream, [(x, values)], [y])
    np.testing.assert_array_equal(got, values)

    # Outside capture the refused calls run (this is the warm-up they asked for).
    y.fill(np.nan)
    cupy.cuda.Device().synchronize()
    coll.all_reduce(comm, x, y, stream=stream, config=fresh)
    stream.synchronize()
    np.testing.assert_array_equal(y.get(), values)
    never_launched_before_capture[1, 32, stream](y)
    stream.synchronize()
    np.testing.assert_array_equal(y.get()[:32], np.zeros(32, np.float32))


def test_a_prepared_launch_replays_a_graph_outside_capture_and_is_captured_inside(comm):
    """Repeated calls replay a one-node graph (cheaper on the host); on a capturing stream the
    launch itself goes into the user's graph. Both read the arrays' current contents."""
    import cupy

    x, y = comm.alloc(N, np.float32), comm.alloc(N, np.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    launch = scale_shift[(N + 127) // 128, 128, stream].prepare(x, y, np.float32(2.0), np.float32(-1.0))
    for seed in (5, 6):
        values = _values(seed)
        x.set(values)
        y.fill(np.nan)
        launch()
        stream.synchronize()
        np.testing.assert_allclose(y.get(), 2.0 * values - 1.0, rtol=1e-6, atol=1e-6)  # FMA or not
    assert launch.graph_exec not in (None, False)
    stream.begin_capture()
    try:
        launch()
    finally:
        graph = stream.end_capture()
    values = _values(7)
    got, = _replay(graph, stream, [(x, values)], [y])
    np.testing.assert_allclose(got, 2.0 * values - 1.0, rtol=1e-6, atol=1e-6)
