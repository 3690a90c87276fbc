"""flowdsl.torch on a GPU (one rank): the collectives and the fused RMSNorm + ReduceScatter operator of
``flowdsl/examples/tp_mlp.py`` under ``torch.compile(fullgraph=True)`` (Inductor), in a CUDA graph replayed 100
times, and the layer's gradients against autograd of an unfused torch reference. At one rank the collectives
are local copies; the simulator's tests (tests/with_torch) run several ranks, the multi-GPU ones several GPUs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def device(comm):
    return torch.device("cuda", comm.device)


def test_collectives_compiled_with_inductor_equal_eager(comm, device):
    import flowdsl.torch as ft

    g = ft.register(comm)

    def f(x):
        y = ft.all_reduce(x * 2, group=g)
        return ft.reduce_scatter(torch.relu(y) + 1, group=g), ft.all_gather(y, group=g), ft.broadcast(y, 0, group=g)

    x = torch.randn(64, 33, device=device)
    eager = f(x)
    compiled = torch.compile(f, fullgraph=True)(x)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(eager[0], torch.relu(x * 2) + 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_layer_compiled_and_in_a_cuda_graph_equals_eager_and_the_reference(comm, device, dtype):
    from flowdsl.examples import tp_mlp

    x, w1, w2, gamma = tp_mlp.inputs(128, 256, dtype, device, seed=1)
    layer = tp_mlp.TensorParallelMLP(comm, w1, w2, gamma)
    eager = layer(x)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(eager.double(), tp_mlp.reference(x, w1, w2, gamma), **tol)
    compiled = torch.compile(layer, fullgraph=True)
    torch.testing.assert_close(compiled(x), eager, **tol)  # Inductor fuses the pointwise parts differently

    static_x = x.clone()
    with torch.no_grad():
        layer(static_x)  # warm-up on a side stream, as torch.cuda.graph's docs advise (windows made here)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = layer(static_x)
        gen = torch.Generator(device=device).manual_seed(2)
        for replay in range(100):
            if replay % 10 == 0:
                static_x.copy_(torch.randn(x.shape, generator=gen, device=device).to(dtype))
            static_out.fill_(float("nan"))
            graph.replay()
            if replay % 10 == 9:
                torch.testing.assert_close(static_out, layer(static_x), rtol=0, atol=0)


def test_the_layers_gradients_equal_autograd_of_the_unfused_reference(comm, device):
    from flowdsl.examples import tp_mlp

    x, w1, w2, gamma = tp_mlp.inputs(64, 128, torch.float32, device, seed=3)
    layer = tp_mlp.TensorParallelMLP(comm, w1, w2, gamma)
    xs = x.clone().requires_grad_()
    torch.compile(layer, fullgraph=True)(xs).square().sum().backward()
    leaves = [t.clone().double().requires_grad_() for t in (x, w1, gamma)]
    tp_mlp.reference(leaves[0], leaves[1], w2, leaves[2]).square().sum().backward()
    for got, want in ((xs.grad, leaves[0].grad), (layer.w1.grad, leaves[1].grad),
                      (layer.norm_weight.grad, leaves[2].grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-3)


def test_a_tensor_on_the_cpu_is_refused_naming_the_device(comm):
    import flowdsl
    import flowdsl.torch as ft

    with pytest.raises(flowdsl.UsageError, match=r"input is on cpu; the communicator's ranks use CUDA device"):
        ft.all_reduce(torch.ones(4), group=comm)


def test_a_capture_without_warm_up_is_refused_naming_the_warm_up(comm, device):
    import flowdsl
    from flowdsl.examples import tp_mlp

    x, w1, w2, gamma = tp_mlp.inputs(96, 64, torch.float32, device, seed=5)  # a shape no other test used
    layer = tp_mlp.TensorParallelMLP(comm, w1, w2, gamma)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(flowdsl.UsageError, match="while a CUDA graph is being captured.*warm-up"):
        with torch.no_grad(), torch.cuda.graph(graph):
            layer(x)
    torch.testing.assert_close(layer(x).double(), tp_mlp.reference(x, w1, w2, gamma), rtol=1e-4, atol=1e-4)


def test_a_kernel_launched_on_tensor_views_reads_and_writes_them_as_numpy_would(comm, device):
    """Strided views of PyTorch tensors as kernel arguments (typed and packed from their
    ``__cuda_array_interface__``), and a tensor that requires grad refused with flowdsl's message."""
    from numba import cuda

    import flowdsl

    @flowdsl.kernel
    def twice(x, y):
        i = cuda.grid(1)
        if i < x.size:
            y[i] = 2 * x[i]

    x = torch.randn(1000, device=device)
    y = torch.full_like(x, float("nan"))
    twice[4, 256](x[::2], y[:500])
    torch.cuda.synchronize(device)
    torch.testing.assert_close(y[:500], 2 * x[::2], rtol=0, atol=0)
    with pytest.raises(flowdsl.UsageError, match="requires grad|cannot be passed to a kernel"):
        twice[4, 256](x.clone().requires_grad_(), y)
