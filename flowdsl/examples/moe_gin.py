"""MoE-style dispatch and combine over GIN: tokens go to the rank of their expert and come back.

Every rank holds ``tokens`` rows of ``hidden`` float32 values and a routing
array that names one expert per row (``experts_per_rank`` experts live on each
rank; expert ``e`` on rank ``e // experts_per_rank``). The rows are packed by
destination rank on the host (what a permute kernel would do). One kernel,
one block per peer:

1. **dispatch**: block ``b`` puts the rows for rank ``b``, their expert ids and
   their count into per-source slots of rank ``b``'s windows (slot = sender), and
   signals signal 0;
2. **expert**: after signal 0 shows every sender's data, block ``s`` scales the
   rows from sender ``s`` by ``expert id + 1``;
3. **combine**: block ``s`` puts the results back into sender ``s``'s combine
   window (one put, one weak signal on signal 1), and after signal 1 shows every
   expert rank's results each rank un-permutes them into ``out``.

``mode`` picks how the dispatch signals: ``0`` one strong signal after the
three puts (covers them all), ``1`` one weak signal per put (each covers its
put), ``2`` **a bug**: one weak signal on the last put only, while the expert
reads the data of all three (the simulator reports it; on a network that
reorders, such as EFA, the expert may read rows that have not landed).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32, int64

import flowdsl
from flowdsl import GinFenceLevel, MemoryOrder, coop, gin, lsa, team

__all__ = ["moe_gin", "route_tokens", "run", "STRONG", "WEAK_PER_PUT", "WEAK_LAST_ONLY"]

STRONG = 0
WEAK_PER_PUT = 1
WEAK_LAST_ONLY = 2


@flowdsl.kernel
def moe_gin(comm, send_win, smeta_win, recv_win, rmeta_win, rcount_win, y_win, comb_win,
            counts, pos, out, tokens, hidden, mode):
    ctx = gin.context(comm, 0)
    cta = coop.cta()
    world = team.world(comm)
    b = cuda.blockIdx.x
    tx = cuda.threadIdx.x
    nt = cuda.blockDim.x
    base0 = gin.read_signal(ctx, 0)
    base1 = gin.read_signal(ctx, 1)
    bar = gin.hybrid_barrier(ctx, cta, b)
    bar.sync(MemoryOrder.ACQUIRE, GinFenceLevel.NONE)
    row_bytes = hidden * 4
    me = world.rank
    # 1. dispatch: this block sends the rows for rank b into slot `me` of rank b's windows.
    if tx == 0:
        cnt = counts[b]
        if mode == 1:
            gin.put(ctx, world, b, recv_win, me * tokens * row_bytes, send_win, b * tokens * row_bytes,
                    cnt * row_bytes, remote=gin.weak_signal_inc(0), coop=coop.thread())
            gin.put(ctx, world, b, rmeta_win, me * tokens * 4, smeta_win, b * tokens * 4, cnt * 4,
                    remote=gin.weak_signal_inc(0), coop=coop.thread())
            gin.put_value(ctx, world, b, rcount_win, me * 8, cnt, remote=gin.weak_signal_inc(0),
                          coop=coop.thread())
        else:
            gin.put(ctx, world, b, recv_win, me * tokens * row_bytes, send_win, b * tokens * row_bytes,
                    cnt * row_bytes, coop=coop.thread())
            gin.put(ctx, world, b, rmeta_win, me * tokens * 4, smeta_win, b * tokens * 4, cnt * 4,
                    coop=coop.thread())
            if mode == 0:
                gin.put_value(ctx, world, b, rcount_win, me * 8, cnt, remote=gin.strong_signal_inc(0),
                              coop=coop.thread())
            else:
                gin.put_value(ctx, world, b, rcount_win, me * 8, cnt, remote=gin.weak_signal_inc(0),
                              coop=coop.thread())
    per_sender = 1
    if mode == 1:
        per_sender = 3
    gin.wait_signal(ctx, cta, 0, base0 + per_sender * world.nranks)
    # 2. expert: scale the rows that sender b sent by (expert id + 1).
    cnts = lsa.local_view(rcount_win, 0, -1, int64)
    meta = lsa.local_view(rmeta_win, 0, -1, int32)
    rows = lsa.local_view(recv_win)
    y = lsa.local_view(y_win)
    n = cnts[b]
    for j in range(n):
        scale = float32(meta[b * tokens + j] + 1)
        r = (b * tokens + j) * hidden
        for c in range(tx, hidden, nt):
            y[r + c] = rows[r + c] * scale
    cta.sync()
    # 3. combine: send the results back to sender b, into slot `me` of its combine window.
    if tx == 0:
        gin.put(ctx, world, b, comb_win, me * tokens * row_bytes, y_win, b * tokens * row_bytes,
                n * row_bytes, remote=gin.weak_signal_inc(1), coop=coop.thread())
    gin.wait_signal(ctx, cta, 1, base1 + world.nranks)
    comb = lsa.local_view(comb_win)
    for t in range(b, tokens, cuda.gridDim.x):
        src = pos[t] * hidden
        for c in range(tx, hidden, nt):
            out[t * hidden + c] = comb[src + c]
    gin.flush(ctx, cta)
    bar.sync(MemoryOrder.RELEASE, GinFenceLevel.NONE)


def route_tokens(route, nranks, experts_per_rank, tokens):
    """Host packing: destination of each row, per-destination counts, and each row's combine slot.

    Returns:
        ``(order, counts, pos)``: ``order[d]`` the token indices for rank ``d`` (in
        token order), ``counts[d] = len(order[d])``, ``pos[t] = d * tokens + j`` where
        token ``t`` is the ``j``-th row sent to rank ``d``.
    """
    dest = route // experts_per_rank
    order = [np.flatnonzero(dest == d) for d in range(nranks)]
    counts = np.array([len(o) for o in order], np.int64)
    pos = np.empty(tokens, np.int32)
    for d, o in enumerate(order):
        pos[o] = d * tokens + np.arange(len(o), dtype=np.int32)
    return order, counts, pos


def run(comm, tokens: int = 12, hidden: int = 32, experts_per_rank: int = 2, threads: int = 32,
        seed: int = 0, mode: int = STRONG):
    """Run dispatch + expert + combine on ``comm``; return ``(out, reference)`` for this rank.

    ``reference[t] = x[t] * (route[t] + 1)`` computed by NumPy from the seeded inputs.
    """
    n = comm.nranks
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((n, tokens, hidden)).astype(np.float32)
    routes = rng.integers(0, n * experts_per_rank, (n, tokens)).astype(np.int32)
    x, route = xs[comm.rank], routes[comm.rank]
    order, counts_h, pos_h = route_tokens(route, n, experts_per_rank, tokens)
    packed = np.zeros((n, tokens, hidden), np.float32)
    meta_h = np.zeros((n, tokens), np.int32)
    for d, o in enumerate(order):
        packed[d, :len(o)] = x[o]
        meta_h[d, :len(o)] = route[o]

    def buf(shape, dtype, value=None):
        a = comm.alloc(shape, dtype)
        if value is not None:
            a.set(np.asarray(value, dtype).reshape(a.shape))  # set() copies bytes: same dtype and shape
        return a                                   # else: poisoned (NaN / 0xA5 bytes)
    send, smeta = buf(n * tokens * hidden, np.float32, packed), buf(n * tokens, np.int32, meta_h)
    recv, rmeta, rcount = buf(n * tokens * hidden, np.float32), buf(n * tokens, np.int32), buf(n, np.int64)
    y, comb = buf(n * tokens * hidden, np.float32), buf(n * tokens * hidden, np.float32)
    counts, pos = buf(n, np.int64, counts_h), buf(tokens, np.int32, pos_h)
    out = buf(tokens * hidden, np.float32, np.full(tokens * hidden, np.nan, np.float32))
    wins = [comm.register(a) for a in (send, smeta, recv, rmeta, rcount, y, comb)]
    try:
        # The weak modes need no strong signals: not requiring them lets NCCL take a backend without them (EFA GDA)
        weak = {} if mode == STRONG else {"gin_strong_signals_required": False}
        with comm.device_communicator(barrier_count=n, gin_signal_count=2, **weak) as dcomm:
            moe_gin[n, threads](dcomm, *wins, counts, pos, out, tokens, hidden, mode)
            comm.synchronize()
            result = out.get().reshape(tokens, hidden)
    finally:
        for w in wins:
            w.close()
    return result, x * (route[:, None] + 1).astype(np.float32)


if __name__ == "__main__":
    from flowdsl.examples import _cli

    _cli.entry("moe_gin", run, "MoE dispatch, experts and combine over GIN", ranks=4, nodes=2)
