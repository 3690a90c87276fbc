"""A fused RMSNorm + ReduceScatter kernel as a PyTorch operator, with autograd, in a tensor-parallel MLP.

The forward kernel (:func:`rmsnorm_reduce_scatter_kernel`, LSA) sums each of this rank's rows over every
rank's window (the reduce-scatter), normalises it by its root mean square and scales it by the norm's weight,
in one pass. Its backward is the RMSNorm backward of those rows (:func:`rmsnorm_backward_kernel`, a local
flowdsl kernel) followed by an all-gather (``flowdsl.torch.all_gather``): every rank's input rows feed every
rank's sum. :func:`flowdsl.torch.custom_op` makes each kernel an operator with a fake implementation, so
``torch.compile(fullgraph=True)`` traces through it and a CUDA graph captures it.

:class:`TensorParallelMLP` is linear -> fused RMSNorm + ReduceScatter -> linear -> GELU -> AllGather:
the first linear is row-parallel (each rank multiplies its slice of the features, the partial sums are
reduced by the fused operator), the rows are then split over the ranks (sequence parallel), and the
all-gather makes the output whole again on every rank. ``backend="torch"`` runs the same layer with
``torch.distributed.nn``'s collectives (which have autograd) and ``torch.nn.functional.rms_norm``, for
comparison.

Run it on GPUs with ``torchrun --nproc-per-node N python -m flowdsl.examples.tp_mlp`` (or one process),
on the simulator with ``flowdsl.sim.spawn(main, N, host_threads=True)`` and CPU tensors.

The operator's input must be in a registered window, which torch's allocator does not give: each call
copies it into a window the communicator keeps per shape and dtype (made at the first call, which is
collective: every rank makes the same calls in the same order, as for any collective). That first call
allocates and registers, so a CUDA graph captures the calls after a warm-up call.
"""

from __future__ import annotations

import math
import time

import torch
from numba import cuda, float64

import flowdsl
import flowdsl.torch
from flowdsl import MemoryOrder, coop, flow, lsa
from flowdsl.examples._block import block_sum

#: Threads of a block at most (a power of two: the blocks' sums halve it), and blocks at most (one LSA
#: barrier each; a block takes rows r, r + blocks, ...): enough to keep an H100's or H200's 132 SMs
#: streaming (at 32 the kernels left three quarters of them idle).
THREADS = 256
BLOCKS = 264


@flowdsl.kernel
def rmsnorm_reduce_scatter_kernel(comm, win, weight, out, summed, rstd, rows, hidden, eps):
    partial = cuda.shared.array(THREADS, float64)
    bar = lsa.barrier(comm, coop.cta(), cuda.blockIdx.x)
    bar.sync(MemoryOrder.ACQ_REL)  # every rank's input is in its window
    for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
        token = comm.rank * rows + r
        mine = lsa.local_view(win, token * hidden, hidden)
        sq = float64(0.0)
        for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
            acc = flow.to_float(mine[i])
            for peer in range(comm.lsa_size):
                if peer != comm.lsa_rank:
                    acc += flow.to_float(lsa.lsa_view(win, peer, token * hidden, hidden)[i])
            summed[r, i] = flow.from_float(acc, summed[r, i])  # rounded once, as a reduce-scatter returns it
            x = flow.to_float(summed[r, i])
            sq += x * x
        scale = 1.0 / math.sqrt(block_sum(partial, sq) / hidden + eps)
        if cuda.threadIdx.x == 0:
            rstd[r] = flow.from_float(scale, rstd[r])
        for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
            out[r, i] = flow.from_float(flow.to_float(summed[r, i]) * scale * flow.to_float(weight[i]), out[r, i])
    bar.sync(MemoryOrder.ACQ_REL)  # every peer has read this window before its next input lands


@flowdsl.kernel
def rmsnorm_backward_kernel(grad_out, summed, rstd, weight, grad_summed, rows, hidden):
    """``d loss / d summed`` of ``out = summed * rstd * weight``: ``rstd * (g - xhat * mean(g * xhat))`` with
    ``g = grad_out * weight`` and ``xhat = summed * rstd``."""
    partial = cuda.shared.array(THREADS, float64)
    for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
        s = flow.to_float(rstd[r])
        dot = float64(0.0)
        for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
            dot += flow.to_float(grad_out[r, i]) * flow.to_float(weight[i]) * flow.to_float(summed[r, i]) * s
        mean = block_sum(partial, dot) / hidden
        for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
            g = flow.to_float(grad_out[r, i]) * flow.to_float(weight[i])
            grad_summed[r, i] = flow.from_float(s * (g - flow.to_float(summed[r, i]) * s * mean), grad_summed[r, i])


# ---- the operators -----------------------------------------------------------------------------

def _bits(t):
    """bfloat16 as its uint16 bits, as flowdsl's kernels take it."""
    return t.view(torch.uint16) if t.dtype == torch.bfloat16 else t


def _rstd_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _shape(rows, hidden):
    threads = min(THREADS, 1 << max(0, (hidden - 1).bit_length()))  # a power of two, no idle warps for small rows
    return min(BLOCKS, max(rows, 1)), max(threads, 32)


def _window(comm, x):
    """The window this communicator keeps for inputs of ``x``'s shape and dtype: (tensor, window, device
    communicator), made at the first call (collective)."""
    windows = comm.__dict__.setdefault("_tp_mlp_windows", {})
    key = (tuple(x.shape), x.dtype)
    if key not in windows:
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            raise flowdsl.UsageError(f"Cannot make rmsnorm_reduce_scatter's window for {tuple(x.shape)} {x.dtype} "
                                     "while a CUDA graph is being captured: it allocates and registers memory. Call "
                                     "the layer once with this shape before capturing (a warm-up)")
        import numpy as np  # noqa: PLC0415

        storage = {torch.bfloat16: np.uint16, torch.float16: np.float16, torch.float32: np.float32,
                   torch.float64: np.float64}[x.dtype]
        buf = comm.alloc(tuple(x.shape), storage, like="torch")
        win = comm.register(buf)
        windows[key] = (buf.view(x.dtype), win, comm.device_communicator(lsa_barrier_count=BLOCKS))
    return windows[key]


def _check(comm, x, weight):
    flowdsl.torch.check_tensor("rmsnorm_reduce_scatter", "x", x, comm)
    flowdsl.torch.check_tensor("rmsnorm_reduce_scatter", "weight", weight, comm)
    if x.dim() != 2 or weight.shape != x.shape[1:] or weight.dtype != x.dtype:
        raise flowdsl.UsageError(f"Cannot rmsnorm_reduce_scatter x {tuple(x.shape)} {x.dtype} with weight "
                                 f"{tuple(weight.shape)} {weight.dtype}: pass x of (tokens, hidden) and a weight of "
                                 "(hidden,), of one dtype")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise flowdsl.UsageError(f"Cannot rmsnorm_reduce_scatter {x.dtype}: it takes float32, float16, bfloat16 "
                                 "or float64")
    return flowdsl.torch.rows_per_rank("rmsnorm_reduce_scatter", x, comm.nranks)


@flowdsl.torch.custom_op("flowdsl_examples::rmsnorm_reduce_scatter", mutates_args=())
def _rmsnorm_reduce_scatter(comm, x: torch.Tensor, weight: torch.Tensor,
                            eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, hidden = _check(comm, x, weight), x.shape[1]
    buf, win, dcomm = _window(comm, x)
    buf.copy_(x)
    out, summed = x.new_empty((rows, hidden)), x.new_empty((rows, hidden))
    rstd = x.new_empty((rows,), dtype=_rstd_dtype(x.dtype))
    blocks, threads = _shape(rows, hidden)
    rmsnorm_reduce_scatter_kernel[blocks, threads](dcomm, win, _bits(weight), _bits(out), _bits(summed), rstd, rows,
                                                   hidden, float(eps))
    return out, summed, rstd


@_rmsnorm_reduce_scatter.register_fake
def _(comm, x, weight, eps):
    rows = _check(comm, x, weight)
    return (x.new_empty((rows, x.shape[1])), x.new_empty((rows, x.shape[1])),
            x.new_empty((rows,), dtype=_rstd_dtype(x.dtype)))


@flowdsl.torch.custom_op("flowdsl_examples::rmsnorm_backward", mutates_args=())
def _rmsnorm_backward(comm, grad_out: torch.Tensor, summed: torch.Tensor, rstd: torch.Tensor,
                      weight: torch.Tensor) -> torch.Tensor:
    rows, hidden = summed.shape
    grad_summed = torch.empty_like(summed)
    blocks, threads = _shape(rows, hidden)
    rmsnorm_backward_kernel[blocks, threads](_bits(grad_out), _bits(summed), rstd, _bits(weight), _bits(grad_summed),
                                             rows, hidden)
    return grad_summed


@_rmsnorm_backward.register_fake
def _(comm, grad_out, summed, rstd, weight):
    return torch.empty_like(summed)


def _setup_context(ctx, inputs, output):
    group, _, weight, _ = inputs
    _, summed, rstd = output
    ctx.save_for_backward(summed, rstd, weight)
    ctx.group = group


def _backward(ctx, grad_out, _grad_summed, _grad_rstd):
    summed, rstd, weight = ctx.saved_tensors
    grad_out = grad_out.contiguous()
    grad_summed = _rmsnorm_backward(ctx.group, grad_out, summed, rstd, weight)
    grad_x = flowdsl.torch.all_gather(grad_summed, group=ctx.group)  # every rank's rows fed every sum
    # The weight's gradient of this rank's rows (a replicated weight's copies are summed by the caller's
    # data-parallel step, as for any sequence-parallel norm).
    xhat = summed.to(rstd.dtype) * rstd[:, None]
    grad_weight = (grad_out.to(rstd.dtype) * xhat).sum(0).to(weight.dtype)
    return None, grad_x, grad_weight, None


_rmsnorm_reduce_scatter.register_autograd(_backward, setup_context=_setup_context)


def rmsnorm_reduce_scatter(x, weight, eps: float = 1e-6, *, group):
    """``rms_norm(sum over ranks of x)`` of this rank's rows (``x.shape[0] / nranks`` of them), times
    ``weight``; differentiable in ``x`` and ``weight``. ``group``: a communicator or its name."""
    return _rmsnorm_reduce_scatter(group, x, weight, eps)[0]


# ---- the layer ---------------------------------------------------------------------------------

class TensorParallelMLP(torch.nn.Module):
    """linear (row-parallel) -> RMSNorm + ReduceScatter -> linear -> GELU -> AllGather, on ``comm``'s ranks.

    ``w1`` is ``(hidden, hidden)`` and ``w2`` ``(hidden, hidden)``, the same on every rank (pass them from
    one seed); each rank keeps its rows ``rank * hidden / n ...`` of ``w1``. ``backend``: ``"flowdsl"``
    (the fused operator and flowdsl's all-gather) or ``"torch"`` (``torch.distributed``, which must be
    initialised)."""

    def __init__(self, comm, w1, w2, norm_weight, eps: float = 1e-6, backend: str = "flowdsl"):
        super().__init__()
        n, r, hidden = comm.nranks, comm.rank, w1.shape[0]
        if hidden % n:
            raise flowdsl.UsageError(f"Cannot split {hidden} features over {n} ranks: pass a hidden size that is a "
                                     f"multiple of {n}")
        if backend not in ("flowdsl", "torch"):
            raise flowdsl.UsageError(f"Cannot build the MLP with backend={backend!r}: use 'flowdsl' or 'torch'")
        part = hidden // n
        self.first, self.last = r * part, (r + 1) * part
        self.w1 = torch.nn.Parameter(w1[self.first:self.last].clone())
        self.w2 = torch.nn.Parameter(w2.clone())
        self.norm_weight = torch.nn.Parameter(norm_weight.clone())
        self.eps, self.backend, self.nranks = eps, backend, n
        self.group = flowdsl.torch.register(comm)

    def forward(self, x):
        partial = x[:, self.first:self.last] @ self.w1  # this rank's share of every feature's sum
        if self.backend == "flowdsl":
            y = rmsnorm_reduce_scatter(partial, self.norm_weight, self.eps, group=self.group)
            return flowdsl.torch.all_gather(torch.nn.functional.gelu(y @ self.w2), group=self.group)
        from torch.distributed import nn as dist_nn  # noqa: PLC0415 - its collectives have autograd

        summed = partial.new_empty((partial.shape[0] // self.nranks, partial.shape[1]))
        summed = dist_nn.functional.reduce_scatter(summed, list(partial.chunk(self.nranks)))
        y = torch.nn.functional.rms_norm(summed, (summed.shape[1],), self.norm_weight, self.eps)
        z = torch.nn.functional.gelu(y @ self.w2)
        return torch.cat(dist_nn.functional.all_gather(z.contiguous()))


def reference(x, w1, w2, norm_weight, eps=1e-6):
    """The whole layer on one device, in float64: what every rank's output must be."""
    x, w1, w2, g = (t.double() for t in (x, w1, w2, norm_weight))
    y = torch.nn.functional.rms_norm(x @ w1, (w1.shape[1],), g, eps)
    return torch.nn.functional.gelu(y @ w2)


def inputs(tokens, hidden, dtype, device, seed=0):
    """Input and weights from one seed (the same on every rank)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    w1 = torch.randn(hidden, hidden, generator=gen) / math.sqrt(hidden)
    w2 = torch.randn(hidden, hidden, generator=gen) / math.sqrt(hidden)
    g = 1.0 + 0.1 * torch.randn(hidden, generator=gen)
    return tuple(t.to(device=device, dtype=dtype) for t in (x, w1, w2, g))


def main(comm=None, tokens=4096, hidden=4096, dtype=torch.bfloat16, steps=20):
    """On GPUs: both backends' step time (forward and backward) and peak memory, one line each."""
    comm = comm or flowdsl.init()
    device = torch.device("cuda", comm.device)
    made_group = not torch.distributed.is_initialized()
    if made_group:
        import os  # noqa: PLC0415

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        torch.distributed.init_process_group("nccl", rank=comm.rank, world_size=comm.nranks, device_id=device)
    try:
        rows = _timed_steps(comm, device, tokens, hidden, dtype, steps)
    finally:
        if made_group:  # torch warns of a group left open at exit
            torch.distributed.destroy_process_group()
    if comm.rank == 0:
        for backend, ms, mib in rows:
            print(f"tp_mlp {comm.nranks} rank(s) {tokens}x{hidden} {str(dtype).removeprefix('torch.')} {backend:8s} "
                  f"step {ms:8.3f} ms  peak {mib:8.1f} MiB  (flowdsl / torch: {rows[0][1] / rows[1][1]:.2f})")
    return rows


def _timed_steps(comm, device, tokens, hidden, dtype, steps):
    """``[(backend, ms per step, peak MiB)]`` of both backends, forward and backward."""
    x, w1, w2, g = inputs(tokens, hidden, dtype, device)
    rows = []
    for backend in ("flowdsl", "torch"):
        layer = TensorParallelMLP(comm, w1, w2, g, backend=backend)
        xs = x.clone().requires_grad_()
        for _ in range(3):  # warm-up: compiles, windows
            layer(xs).float().square().mean().backward()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            layer(xs).float().square().mean().backward()
        torch.cuda.synchronize(device)
        ms = (time.perf_counter() - t0) / steps * 1e3
        rows.append((backend, ms, torch.cuda.max_memory_allocated(device) / 2**20))
    return rows


def check_on_simulator(nranks: int = 2, tokens: int = 8, hidden: int = 16) -> bool:
    """Without a GPU: the layer on ``nranks`` simulated ranks (CPU tensors, float64) against :func:`reference`,
    one line saying whether every rank's output matched."""
    def rank(comm):
        x, w1, w2, g = inputs(tokens, hidden, torch.float64, "cpu")
        return TensorParallelMLP(comm, w1, w2, g)(x).detach(), reference(x, w1, w2, g)

    ok = all(torch.allclose(out, ref, rtol=1e-9, atol=1e-9)
             for out, ref in flowdsl.sim.spawn(rank, nranks=nranks, host_threads=True))
    print(f"tp_mlp: no GPU found: the layer on {nranks} simulated ranks ({tokens}x{hidden} float64) against the "
          f"whole layer on one device: {'OK' if ok else 'MISMATCH'} (on GPUs this prints both backends' step time "
          "and peak memory)")
    return ok


if __name__ == "__main__":
    import sys

    try:
        main()
    except flowdsl.NoDeviceError:
        sys.exit(0 if check_on_simulator() else 1)
