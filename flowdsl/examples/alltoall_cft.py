"""All-to-all over CFT counted writes: each rank writes its block for peer ``p`` into ``p``'s counted window.

Each rank holds ``nranks`` blocks of ``count`` float32 in its send window (block
``p`` is for rank ``p``). The receive window is registered for counted writes
(``cft_counted=True``): its first 8 bytes are a u64 counter, the blocks start
at byte 16 (CFT moves 16-byte units), block ``s`` from rank ``s``.

One block of threads per rank opens a CFT session (a CTA coop). For every
peer it stages the block in shared memory (CFT sources are shared memory),
fences generic to fabric so the fabric sees the staged bytes, and issues a
counted put to the peer's logical endpoint: the data lands, then the counter
at the peer rises by its byte count. The sender needs no flag. The receiver
waits until its counter has risen by every sender's bytes and fences between
the counter and the data (``cft.wait_counted`` does both), then copies the
blocks to ``out``. A CFT barrier before the puts makes sure every rank has
read its counter's starting value before any peer writes.

``mode`` picks how the receiver waits: :data:`WAIT_COUNTED` (the usual way),
:data:`READ_AND_FENCE` (spin on ``cft.read_counter``, then ``cft.fence``), or
:data:`MISSING_FENCE` (spin, no fence: a planted bug the simulator reports).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, uint64

import flowdsl
from flowdsl import MemoryOrder, cft, coop, lsa

__all__ = ["alltoall_cft", "run", "WAIT_COUNTED", "READ_AND_FENCE", "MISSING_FENCE"]

WAIT_COUNTED, READ_AND_FENCE, MISSING_FENCE = 0, 1, 2
#: Bytes before the data in the receive window: the u64 counter, padded to 16.
HEADER = 16


@flowdsl.kernel
def alltoall_cft(comm, send_win, recv_win, out, count, mode):
    state = cuda.shared.array(4, uint64, alignment=16)  # cft.SESSION_WORDS
    stage = cuda.shared.array(256, float32, alignment=16)
    cta = coop.cta()
    world = cft.team(comm)
    base = cft.read_counter(recv_win, 0)
    cft.barrier(comm, cta, 0).sync(MemoryOrder.ACQ_REL)
    s = cft.session(comm, cta, state)
    send = lsa.local_view(send_win)
    size = count * 4
    for peer in range(world.nranks):
        le, data_off = cft.le_info(comm, recv_win, HEADER + world.rank * size, world, peer)
        le, counter_off = cft.le_info(comm, recv_win, 0, world, peer)
        for c0 in range(0, count, 256):
            n = min(256, count - c0)
            for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
                stage[i] = send[peer * count + c0 + i]
            # The fabric reads shared memory through another proxy: release the staged bytes to it.
            cft.fence(cta, MemoryOrder.RELEASE, cft.MemProxyType.GENERIC, cft.MemProxyType.FABRIC,
                      cft.MemFenceScope.CTA)
            cft.put_counted(s, le, data_off + c0 * 4, counter_off, stage, n * 4)
            cft.submit(s)
            cft.flush_smem(s)  # the stage is refilled next
    expected = base + world.nranks * size
    if mode == WAIT_COUNTED:
        cft.wait_counted(s, recv_win, 0, expected)
    else:
        while cft.read_counter(recv_win, 0) - base < world.nranks * size:
            pass
        if mode == READ_AND_FENCE:
            cft.fence(cta)
    recv = lsa.local_view(recv_win)
    for i in range(cuda.threadIdx.x, world.nranks * count, cuda.blockDim.x):
        out[i] = recv[HEADER // 4 + i]
    cft.flush(s)
    cft.close(s)


def run(comm, count: int = 64, threads: int = 64, seed: int = 0, mode: int = WAIT_COUNTED):
    """Run the all-to-all on ``comm``; return ``(result, reference)`` for this rank.

    ``count`` must be a multiple of 4 (16-byte blocks). ``result[s * count:]`` came
    from rank ``s``; ``reference`` is what NumPy computes from every rank's (seeded) inputs.
    """
    n = comm.nranks
    rng = np.random.default_rng(seed)
    inputs = rng.standard_normal((n, n, count)).astype(np.float32)  # inputs[src][dst]
    send = comm.alloc(n * count, np.float32)
    send.set(inputs[comm.rank].reshape(-1))
    recv = comm.alloc(HEADER // 4 + n * count, np.float32)
    recv.set(np.zeros(HEADER // 4 + n * count, np.float32))  # the counter starts at 0
    out = comm.alloc(n * count, np.float32)
    with comm.register(send) as swin, comm.register(recv, cft_counted=True) as rwin, \
            comm.device_communicator(cft_barrier_count=1) as dcomm:
        alltoall_cft[1, threads](dcomm, swin, rwin, out, count, mode)
        comm.synchronize()
        result = out.get()
    return result, inputs[:, comm.rank, :].reshape(-1)


if __name__ == "__main__":
    from flowdsl.examples import _cli

    _cli.entry("alltoall_cft", run,
               "every rank put its block for each peer into that peer's window over CFT, counted", ranks=4, nodes=2)
