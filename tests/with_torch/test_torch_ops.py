"""flowdsl.torch on the simulator: the collectives as torch operators, eager and under
``torch.compile(fullgraph=True)`` (CPU backend ``aot_eager``), against NumPy; the fused RMSNorm + ReduceScatter
operator of ``flowdsl/examples/tp_mlp.py`` with ``torch.autograd.gradcheck`` in float64; the errors, at trace
time. Simulated ranks run on threads of their own (``host_threads=True``): torch keeps state per thread."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs PyTorch: pip install -e '.[test,torch]' (CI runs it in a venv "
                                            "of its own, see .ci/run)")

import flowdsl  # noqa: E402
import flowdsl.torch as ft  # noqa: E402
from flowdsl.testing import run_ranks  # noqa: E402

pytestmark = pytest.mark.sim

NRANKS = 3


def ranks(main, nranks=NRANKS, **kw):
    return run_ranks(main, nranks=nranks, host_threads=True, **kw)


def rank_input(rank, shape, dtype, seed=0):
    rng = np.random.default_rng(seed * 100 + rank)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-50, 50, shape).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "bfloat16"])
def test_functional_collectives_match_numpy(dtype):
    shape = (NRANKS * 4, 5)

    def as_torch(a):
        t = torch.from_numpy(a)
        return t.to(torch.bfloat16) if dtype == "bfloat16" else t

    def main(comm):
        x = as_torch(rank_input(comm.rank, shape, "float32" if dtype == "bfloat16" else dtype))
        g = ft.register(comm)
        outs = (ft.all_reduce(x, group=g), ft.all_reduce(x, "max", group=comm), ft.all_gather(x, group=g),
                ft.reduce_scatter(x, group=g), ft.broadcast(x, 1, group=g), ft.reduce(x, "min", 2, group=g),
                ft.all_to_all(x, group=g))
        return [o.double().numpy() for o in outs]

    results = ranks(main)
    xs = [as_torch(rank_input(r, shape, "float32" if dtype == "bfloat16" else dtype)).double().numpy()
          for r in range(NRANKS)]
    total = np.sum(xs, axis=0)
    tol = dict(rtol=2e-2, atol=5e-2) if dtype == "bfloat16" else dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(results[2][5], np.min(xs, axis=0))  # reduce's root
    for r, (ar, mx, ag, rs, bc, _, a2a) in enumerate(results):
        np.testing.assert_array_equal(a2a, np.concatenate([x[r * 4:(r + 1) * 4] for x in xs]))
        np.testing.assert_allclose(ar, total, **tol)
        np.testing.assert_array_equal(mx, np.max(xs, axis=0))
        np.testing.assert_array_equal(ag, np.concatenate(xs))
        np.testing.assert_allclose(rs, total[r * 4:(r + 1) * 4], **tol)
        np.testing.assert_array_equal(bc, xs[1])


def test_in_place_forms_write_their_tensor():
    def main(comm):
        x = torch.from_numpy(rank_input(comm.rank, (NRANKS * 2,), "float32"))
        out = torch.full((2,), float("nan"))
        gathered = torch.full((NRANKS * NRANKS * 2,), float("nan"))
        ft.reduce_scatter_into(out, x, group=comm)
        ft.all_gather_into(gathered, x, group=comm)
        assert ft.all_reduce_(x, group=comm) is x
        return out.numpy(), gathered.numpy(), x.numpy()

    xs = [rank_input(r, (NRANKS * 2,), "float32") for r in range(NRANKS)]
    for r, (out, gathered, x) in enumerate(ranks(main)):
        np.testing.assert_allclose(out, np.sum(xs, axis=0)[r * 2:(r + 1) * 2], rtol=1e-5)
        np.testing.assert_array_equal(gathered, np.concatenate(xs))
        np.testing.assert_allclose(x, np.sum(xs, axis=0), rtol=1e-5)


def test_compiled_fullgraph_equals_eager():
    def f(x, group):
        y = ft.all_reduce(x * 2, group=group)
        return (ft.reduce_scatter(torch.relu(y) + 1, group=group), ft.all_gather(y[:2].contiguous(), group=group),
                ft.all_to_all(y - 1, group=group))

    def main(comm):
        g = ft.register(comm)
        x = torch.from_numpy(rank_input(comm.rank, (NRANKS * 2, 3), "float32"))
        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
        return [t.numpy() for t in f(x, g)], [t.numpy() for t in compiled(x, g)]

    for eager, compiled in ranks(main):
        for a, b in zip(eager, compiled):
            np.testing.assert_array_equal(a, b)


def test_the_tensor_parallel_mlp_compiled_equals_eager_and_the_whole_layer():
    from flowdsl.examples import tp_mlp

    def main(comm):
        x, w1, w2, g = tp_mlp.inputs(NRANKS * 4, NRANKS * 8, torch.float32, "cpu", seed=3)
        layer = tp_mlp.TensorParallelMLP(comm, w1, w2, g)
        eager = layer(x)
        compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
        return eager.detach().numpy(), compiled.detach().numpy(), tp_mlp.reference(x, w1, w2, g).detach().numpy()

    for eager, compiled, ref in ranks(main):
        np.testing.assert_allclose(eager, ref, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(eager, compiled)


def test_the_layers_gradients_compiled_equal_eager_and_autograd_of_the_whole_layer():
    from flowdsl.examples import tp_mlp

    def main(comm):
        x, w1, w2, g = tp_mlp.inputs(NRANKS * 2, NRANKS * 4, torch.float64, "cpu", seed=4)
        grads = []
        for compile_it in (False, True):
            layer = tp_mlp.TensorParallelMLP(comm, w1, w2, g)
            run = torch.compile(layer, fullgraph=True, backend="aot_eager") if compile_it else layer
            xs = x.clone().requires_grad_()
            run(xs).square().sum().backward()
            grads.append((xs.grad.numpy(), layer.w1.grad.numpy(), layer.norm_weight.grad.numpy()))
        return grads, (layer.first, layer.last)

    x, w1, w2, g = tp_mlp.inputs(NRANKS * 2, NRANKS * 4, torch.float64, "cpu", seed=4)
    leaves = [t.clone().requires_grad_() for t in (x, w1, g)]
    # Every rank's loss is the whole output's: the sum of the ranks' losses is nranks times it.
    (NRANKS * tp_mlp.reference(leaves[0], leaves[1], w2, leaves[2]).square().sum()).backward()
    total_norm_grad = 0
    for (eager, compiled), (first, last) in ranks(main):
        for a, b in zip(eager, compiled):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(eager[1], leaves[1].grad[first:last].numpy(), rtol=1e-9, atol=1e-9)
        total_norm_grad = total_norm_grad + eager[2]  # each rank's rows' share of the replicated weight's gradient
    # x is replicated too: each rank's gradient is its share; the sum is the whole layer's.
    np.testing.assert_allclose(total_norm_grad, leaves[2].grad.numpy(), rtol=1e-9, atol=1e-9)


def test_gradcheck_of_the_fused_rmsnorm_reduce_scatter_in_float64():
    from flowdsl.examples import tp_mlp

    def main(comm):
        gen = torch.Generator().manual_seed(7)  # the same input on every rank: gradcheck perturbs them in step
        x = torch.randn(comm.nranks * 2, 6, generator=gen, dtype=torch.float64, requires_grad=True)
        w = (1 + 0.1 * torch.randn(6, generator=gen, dtype=torch.float64)).requires_grad_(comm.nranks == 1)

        def whole(x, w):  # every rank's rows, so that every rank's output is the same function of x
            return ft.all_gather(tp_mlp.rmsnorm_reduce_scatter(x, w, 1e-6, group=comm), group=comm)
        return torch.autograd.gradcheck(whole, (x, w), eps=1e-6, atol=1e-7, rtol=1e-5)

    assert ranks(main, nranks=1) == [True]  # x and the weight
    assert ranks(main, nranks=2) == [True, True]  # x, through the all-gather of the backward


def test_an_all_to_alls_gradient_is_the_all_to_all_of_its_outputs_gradient():
    """Each rank's loss weighs its output by its own w: the gradient of the sum of the losses with respect to a
    rank's input is the all-to-all of the ranks' w (part j of rank q's gradient is part q of rank j's w)."""
    def main(comm):
        x = torch.from_numpy(rank_input(comm.rank, (NRANKS * 2, 3), "float64")).requires_grad_()
        w = torch.from_numpy(rank_input(comm.rank, (NRANKS * 2, 3), "float64", seed=1))
        (ft.all_to_all(x, group=comm) * w).sum().backward()
        return x.grad.numpy()

    ws = [rank_input(r, (NRANKS * 2, 3), "float64", seed=1) for r in range(NRANKS)]
    for q, grad in enumerate(ranks(main)):
        np.testing.assert_array_equal(grad, np.concatenate([w[q * 2:(q + 1) * 2] for w in ws]))


# ---- errors ------------------------------------------------------------------------------------

def test_bad_tensors_are_refused_at_trace_time_naming_the_fix():
    def main(comm):
        g = ft.register(comm)
        errors = []
        for bad, call in [
            (r"input is not contiguous \(shape \(4, 2\).*Pass input.contiguous\(\)",
             lambda: ft.all_reduce(torch.ones(2, 4).t(), group=g)),
            (r"dimension 0 \(\(3,\)\) does not split over 2 ranks",
             lambda: ft.reduce_scatter(torch.ones(3, 2), group=g)),
            (r"input has dtype torch.complex64; the collectives take int8",
             lambda: ft.all_reduce(torch.ones(4, dtype=torch.complex64), group=g)),
            (r"op='median': the operators take 'sum', 'prod', 'min', 'max', 'avg'",
             lambda: ft.all_reduce(torch.ones(4), "median", group=g)),
            (r"Cannot reduce_scatter: output has shape \(3, 8\); it takes \(4, 8\) \(the input's dimension 0 over 2 "
             r"ranks\)", lambda: ft.reduce_scatter_into(torch.empty(3, 8), torch.ones(8, 8), group=g)),
            (r"Cannot all_gather: output has shape \(16,\); it takes \(8, 2\)",
             lambda: ft.all_gather_into(torch.empty(16), torch.ones(4, 2), group=g)),
        ]:
            compiled = torch.compile(lambda: call(), fullgraph=True, backend="aot_eager")
            with pytest.raises(Exception) as info:
                compiled()
            errors.append((bad, info.value))
        return errors

    for bad, error in ranks(main, nranks=2)[0]:
        chain = [error] + [getattr(error, a) for a in ("__cause__", "inner_exception") if getattr(error, a, None)]
        assert any(isinstance(e, flowdsl.UsageError) for e in chain) or isinstance(error, flowdsl.UsageError) \
            or "UsageError" in str(error), error
        import re
        assert re.search(bad, str(error)), str(error)


def test_an_unknown_name_and_ranks_sharing_a_thread_are_refused():
    def main(comm):
        with pytest.raises(flowdsl.UsageError, match="No flowdsl communicator is registered as 'nobody'"):
            ft.all_reduce(torch.ones(2), group="nobody")
        return True
    assert ranks(main, nranks=1) == [True]

    def interleaved(comm):
        ft.all_reduce(torch.ones(2), group=comm)
    with pytest.raises(flowdsl.UsageError, match=r"share one thread.*spawn\(\.\.\., host_threads=True\)"):
        run_ranks(interleaved, nranks=2)


def test_grad_mode_is_each_ranks_own_on_host_threads_and_leaks_between_greenlets():
    """Why the operators need host threads: rank 0 blocked under ``torch.no_grad()`` turned autograd off for
    rank 1 when both shared a thread (greenlets), in some interleavings; on threads of their own, never."""
    def main(comm):
        if comm.rank == 0:
            with torch.no_grad():
                comm.barrier()
            return None
        seen = torch.is_grad_enabled()
        comm.barrier()
        return seen

    on_threads = [run_ranks(main, nranks=2, seed=s, host_threads=True)[1] for s in range(4)]
    on_greenlets = [run_ranks(main, nranks=2, seed=s)[1] for s in range(4)]
    assert on_threads == [True] * 4
    assert False in on_greenlets


def test_the_mlp_example_checks_itself_on_the_simulator_without_a_gpu(capsys):
    """``python -m flowdsl.examples.tp_mlp`` without a GPU runs the layer on simulated ranks (it had ended in a
    NoDeviceError traceback)."""
    from flowdsl.examples import tp_mlp

    assert tp_mlp.check_on_simulator(nranks=2)
    assert capsys.readouterr().out.rstrip().startswith("tp_mlp: no GPU found: the layer on 2 simulated ranks")


def test_a_tensor_that_requires_grad_is_refused_at_the_launch_in_flowdsls_words():
    """The simulator and a GPU refuse it in one check (the launch's host arrays), not in PyTorch's words."""
    from numba import cuda

    @flowdsl.kernel
    def twice(x, y):
        i = cuda.grid(1)
        if i < x.size:
            y[i] = 2 * x[i]

    def main(comm):
        x, y = torch.randn(8, requires_grad=True), torch.zeros(8)
        with pytest.raises(flowdsl.UsageError, match=r"argument 0 is a PyTorch tensor that requires grad, .* Pass "
                                                     r"tensor\.detach\(\)"):
            twice[1, 8](x, y)
        twice[1, 8](x.detach(), y)
        comm.synchronize()
        return y.numpy().copy(), x.detach().numpy() * 2

    (got, want), = flowdsl.sim.spawn(main, nranks=1, host_threads=True)
    np.testing.assert_array_equal(got, want)
