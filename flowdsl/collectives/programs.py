"""The GENK collectives as flowdsl programs on :mod:`flowdsl.flow`: read them, copy them, fuse them.

Ring: :func:`ring_all_gather`, :func:`ring_reduce_scatter`, :func:`ring_broadcast`,
:func:`ring_reduce`, :func:`ring_all_reduce`. Tree: :func:`tree_all_reduce`
(double binary tree). One LSA team, small messages: :func:`one_shot_all_reduce`
(every rank writes to every peer, no Flow); through the NVLink switch:
:func:`multimem_all_reduce` (NVLink SHARP, ``multimem`` loads and stores). AllToAll: :func:`pairwise_all_to_all`
(pairwise rounds). Several nodes, over the network along rails only: :func:`hierarchical_all_gather`,
:func:`hierarchical_reduce_scatter`, :func:`hierarchical_all_to_all`; with the far phase over a CFT team
(sm_100, NCCL >= 2.32), :func:`hierarchical_cft_all_gather` (a kernel of its own, on a counted window:
``algorithm="hierarchical_cft"``). Each other one is a kernel factory:
``ring_all_reduce(RedOp.SUM)``
returns the ``@flowdsl.kernel`` for that operator (the operator is a compile-time
constant; the element type comes from the arrays). The Flow programs are device functions
made into factories by :func:`flow_program` (``ring_all_reduce.program`` is the algorithm
itself, to call from a kernel of your own; the other ring programs are written chunk by chunk,
:func:`ring_chunks`); :func:`ring_reduce_to_own_piece` and
:func:`ring_gather_after_own_piece` are the halves of an all-reduce round, for programs that
work on a rank's finished piece between them (``flowdsl/examples/allreduce_bias_gelu.py``).
Every kernel takes::

    (comm, stage, src, dst, count, root, inplace, channels, nslots, slot_words, protocol, vectors,
     scalar_bits, scalar_at)

``channels`` is what the staging window was laid out for (the grid may be smaller).
``count`` is the element count per rank (what NCCL calls ``count``); ``src`` and
``dst`` are device arrays (``inplace`` says they are the same memory); ``stage``
is the staging window; ``vectors`` says both arrays start 16-byte aligned.
``scalar_bits`` and ``scalar_at`` are ``PREMULSUM``'s scalar (:func:`premul_scale`): a
one-element device array read when the kernel runs, or, with ``scalar_at`` empty, the
bits of a host immediate (other operators ignore both). Each
block is one channel and takes an equal share of every chunk. With one rank each
collective is the local copy it reduces to. ``gin_peers=True`` builds the kernel for
communicators that span several LSA teams (nodes): connections to peers outside
the team use GIN; without it no GIN code is compiled (faster to build, smaller).
``fp8`` (``flow.E4M3`` or ``flow.E5M2``) reads uint8 elements as fp8. ``ll128=True`` compiles
LL128's code in (the host asks for it when a call's ``FlowConfig`` names ``Protocol.LL128``;
the cost model never picks it, and it is a third to a half of a kernel's link time).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, from_dtype, int64, uint64

import flowdsl
from flowdsl import cft, coop, flow, gin, lsa, mem
from flowdsl.enums import MemoryOrder, RedOp, ThreadScope

__all__ = ["PROGRAMS", "flow_program", "premul_scale", "one_rank", "scale_for", "ring_chunks", "ring_connections", "ring_reduce_to_own_piece",
           "ring_gather_after_own_piece", "piece", "ring_all_gather", "ring_reduce_scatter", "ring_broadcast",
           "ring_reduce", "ring_all_reduce", "tree_all_reduce", "one_shot_all_reduce", "one_shot_words", "one_shot_fits",
           "ONE_SHOT_BLOCKS", "ONE_SHOT_LINES", "kernel_factory", "pairwise_all_to_all", "pairwise_exchange", "all_to_all_share",
           "multimem_all_reduce", "multimem_piece", "multimem_share",
           "multimem_form", "own_block_copy", "hierarchical_layout", "hierarchical_connections", "block_of", "hierarchical_all_gather",
           "hierarchical_reduce_scatter", "node_reduce_scatter", "hierarchical_all_to_all", "hierarchical_round",
           "HIERARCHICAL_ROUNDS_PER_CHANNEL", "hierarchical_cft_all_gather", "cft_all_gather_layout", "CFT_CHUNK_BYTES",
           "CFT_COUNTER_BYTES"]

# Elements a channel's share is rounded to: keeps every channel's start 16-byte aligned.
_ALIGN = 16
# Registers per thread: uncapped, the protocol code takes ~170 and one 256-thread block fits
# an SM, too few loads in flight for HBM (0.76 of a device copy at one rank); 128 gives 0.90.
_MAX_REGISTERS = 128
#: How every collective is compiled: optimised, without debug information, whatever numba's NUMBA_OPT and
#: NUMBA_CUDA_DEBUGINFO say (those default a user's kernels, as numba-cuda's; the library keeps its speed).
_COMPILE = {"max_registers": _MAX_REGISTERS, "debug": False, "opt": True}
_SYS = ThreadScope.SYSTEM


@flowdsl.device
def channel_range(count, proc):
    """``[lo, hi)``: this channel's share of ``count`` elements."""
    per = (count + proc.nchannels - 1) // proc.nchannels
    per = (per + _ALIGN - 1) // _ALIGN * _ALIGN
    lo = min(proc.channel * per, count)
    return lo, min(lo + per, count)


@flowdsl.device
def chunk_elements(proc, itemsize):
    """Elements per pipeline chunk: half the slots, so a sender can fill the next while one drains."""
    return flow.slot_elements(proc, itemsize) * max(1, proc.nslots // 2)


@flowdsl.device
def gin_context(comm):
    """GIN context 0: the kernel reaches peers outside its LSA team (several nodes)."""
    return gin.context(comm, 0)


@flowdsl.device
def no_gin_context(comm):
    """No GIN: every peer is in the LSA team, and Flow compiles no GIN code."""
    return None


@flowdsl.device
def premul_scale(scalar_bits, scalar_at, like):
    """``PREMULSUM``'s scalar in the element type of ``like``: ``scalar_at[0]``, read when the kernel runs
    (NCCL's device residence: a CUDA graph's replay reads the value of that moment), or with
    ``scalar_at`` empty the host immediate's bits (frozen in the launch's arguments)."""
    if scalar_at.size > 0:
        return scalar_at[0]
    return mem.from_bits(scalar_bits, like.dtype)


@flowdsl.device
def no_scale(scalar_bits, scalar_at, like):
    """The other operators have no scalar (their reductions are made without one)."""
    return None


@flowdsl.device
def local_premul(src, dst, count, inplace, vectors, red):
    """One rank, ``PREMULSUM``: ``dst = src * scalar`` (in place too), strided over the whole grid."""
    for i in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, count, cuda.gridDim.x * cuda.blockDim.x):
        dst[i] = flow.premul(red, src[i])


@flowdsl.device
def local_copy_of(src, dst, count, inplace, vectors, red):
    """One rank, every other operator: :func:`local_copy` (the reduction changes nothing)."""
    local_copy(src, dst, count, inplace, vectors)


def one_rank(op):
    """What one rank does for ``op``: ``local_premul`` for ``PREMULSUM``, else the local copy."""
    return local_premul if op == RedOp.PREMULSUM else local_copy_of


def scale_for(op):
    """How a kernel for ``op`` finds its scalar: :func:`premul_scale` for ``PREMULSUM``, else none."""
    return premul_scale if op == RedOp.PREMULSUM else no_scale


@flowdsl.device
def local_copy(src, dst, count, inplace, vectors):
    """One rank: ``dst = src``, strided over the whole grid (each DRAM page is read by many SMs at
    once, which streams faster than one contiguous share per block)."""
    if not inplace:
        flow.copy(src, 0, dst, 0, count, cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x,
                  cuda.gridDim.x * cuda.blockDim.x, vectors)


def kernel_factory(program, kernel_for):
    """``factory(op, gin_peers, fp8, ll128)``, cached: the kernel ``kernel_for(op, context, fp8, ll128)``
    makes around ``program`` (``context``: how it gets its GIN context, ``ll128`` an int), compiled with
    the library's options (``_COMPILE``) and named after ``program``, whose name, docstring and itself the
    factory carries."""
    @functools.cache
    def factory(op=RedOp.SUM, gin_peers=False, fp8=0, ll128=False):
        kernel = kernel_for(op, gin_context if gin_peers else no_gin_context, fp8, int(ll128))
        kernel.__name__ = kernel.__qualname__ = program.__name__  # the kernel's symbol names its program
        return flowdsl.kernel(**_COMPILE)(kernel)

    factory.__name__ = factory.__qualname__ = program.__name__
    factory.__doc__ = program.__doc__
    factory.program = program
    return factory


def flow_program(program):
    """The kernel factory ``factory(op, gin_peers, fp8, ll128)`` of a Flow program.

    ``program(proc, red, partial, src, dst, count, root, lo, hi)`` is the algorithm, a device
    function; the kernel around it opens this block's processor (its channel), gives the
    program its share ``[lo, hi)`` of the ``count`` elements, and, with one rank, is the local
    copy the collective reduces to. ``red`` combines over every rank (and finishes AVG);
    ``partial`` is the same operator over one contribution (sums passed on before the last hop).
    Both carry ``PREMULSUM``'s scalar, which the steps apply to ``src``, this rank's input (a step
    whose ``src`` is a partial result takes ``flow.unscaled(red)``).
    The operator, the fp8 format and ``ll128`` are constants of the kernel.
    """
    def kernel_for(op, context, fp8, ll128):
        scale_of, alone = scale_for(op), one_rank(op)

        def kernel(comm, stage, src, dst, count, root, inplace, channels, nslots, slot_words, protocol, vectors,
                   scalar_bits, scalar_at):
            scale = scale_of(scalar_bits, scalar_at, dst)
            if comm.nranks == 1:  # a local copy on a grid that fills the GPU: no Flow, no channels
                alone(src, dst, count, inplace, vectors, flow.reduction(op, 1, fp8, scale))
                return
            proc = flow.processor(comm, stage, context(comm), channels, nslots, slot_words, protocol, ll128=ll128)
            lo, hi = channel_range(count, proc)
            program(proc, flow.reduction(op, comm.nranks, fp8, scale), flow.reduction(op, 1, fp8, scale), src, dst,
                    count, root, lo, hi)
        return kernel

    return kernel_factory(program, kernel_for)


@flowdsl.device
def ring_connections(proc):
    """Connection 0 to the next rank and from the previous one: the ring's two neighbours."""
    n, r = proc.comm.nranks, proc.comm.rank
    return flow.connect(proc, (r + 1) % n, 0, 0), flow.connect(proc, (r + n - 1) % n, 0, 0)


def ring_chunks(chunk_program):
    """A ring program that moves its share ``[lo, hi)`` one pipeline chunk at a time.

    ``chunk_program(proc, nxt, prv, red, src, dst, count, root, base, m)`` moves elements
    ``[base, base + m)`` of the share (``nxt``, ``prv``: :func:`ring_connections`); the
    program made of it takes the arguments :func:`flow_program` gives.
    """
    chunk_program = flowdsl.device(chunk_program)

    def program(proc, red, partial, src, dst, count, root, lo, hi):
        nxt, prv = ring_connections(proc)
        chunk = chunk_elements(proc, mem.itemsize(dst))
        for base in range(lo, hi, chunk):
            chunk_program(proc, nxt, prv, red, src, dst, count, root, base, min(chunk, hi - base))

    program.__name__ = program.__qualname__ = chunk_program.__name__
    program.__doc__ = chunk_program.__doc__
    return flowdsl.device(program)


@flow_program
@ring_chunks
def ring_all_gather(proc, nxt, prv, red, src, dst, count, root, base, m):
    """Ring AllGather: ``dst[r*count:(r+1)*count] = src@r`` on every rank (``op`` unused)."""
    n, r = proc.comm.nranks, proc.comm.rank
    flow.copy_send(proc, nxt, src, dst[r * count:(r + 1) * count], base, m)
    for s in range(1, n - 1):
        j = (r + n - s) % n
        flow.recv_copy_send(proc, prv, nxt, dst[j * count:(j + 1) * count], base, m)
    j = (r + 1) % n
    flow.recv(proc, prv, dst[j * count:(j + 1) * count], base, m)


@flow_program
@ring_chunks
def ring_reduce_scatter(proc, nxt, prv, red, src, dst, count, root, base, m):
    """Ring ReduceScatter: ``dst@r = op over ranks of src@q[r*count:(r+1)*count]``."""
    n, r = proc.comm.nranks, proc.comm.rank
    j = (r + n - 1) % n
    flow.send(proc, nxt, src[j * count:(j + 1) * count], base, m, red)
    for s in range(1, n - 1):
        j = (r + 2 * n - s - 1) % n
        flow.recv_reduce_send(proc, prv, nxt, src[j * count:(j + 1) * count], base, m, red)
    flow.recv_reduce_copy(proc, prv, src[r * count:(r + 1) * count], dst, base, m, red)


@flow_program
@ring_chunks
def ring_broadcast(proc, nxt, prv, red, src, dst, count, root, base, m):
    """Ring Broadcast: ``dst@r = src@root`` (a chain from ``root``; ``op`` unused)."""
    n, r = proc.comm.nranks, proc.comm.rank
    pos = (r + n - root) % n  # place in the chain that starts at root
    if pos == 0:
        flow.copy_send(proc, nxt, src, dst, base, m)
    elif pos == n - 1:
        flow.recv(proc, prv, dst, base, m)
    else:
        flow.recv_copy_send(proc, prv, nxt, dst, base, m)


@flow_program
@ring_chunks
def ring_reduce(proc, nxt, prv, red, src, dst, count, root, base, m):
    """Ring Reduce: ``dst@root = op over ranks of src`` (a chain that ends at ``root``)."""
    n, r = proc.comm.nranks, proc.comm.rank
    pos = (r + 2 * n - root - 1) % n  # root + 1 starts, root ends
    if pos == 0:
        flow.send(proc, nxt, src, base, m, red)
    elif pos == n - 1:
        flow.recv_reduce_copy(proc, prv, src, dst, base, m, red)
    else:
        flow.recv_reduce_send(proc, prv, nxt, src, base, m, red)


@flowdsl.device
def ring_reduce_to_own_piece(proc, nxt, prv, src, base, size, per, red):
    """A ring all-reduce round's reduce-scatter half, up to this rank's piece: piece ``r-1`` is
    sent, the others are received, combined with ``src`` and passed on. Piece ``j`` of the round
    is ``[base + j*per, base + min((j+1)*per, size))``; this rank's (``r``) arrives next, reduced
    by every other rank."""
    n, r = proc.comm.nranks, proc.comm.rank
    j = (r + n - 1) % n
    flow.send(proc, nxt, src, base + j * per, piece(size, per, j), red)
    for s in range(1, n - 1):
        j = (r + 2 * n - s - 1) % n
        flow.recv_reduce_send(proc, prv, nxt, src, base + j * per, piece(size, per, j), red)


@flowdsl.device
def ring_gather_after_own_piece(proc, nxt, prv, dst, base, size, per):
    """The round's all-gather half after this rank has sent its finished piece: the other
    pieces arrive finished, are stored to ``dst`` and passed on (the last one is only stored)."""
    n, r = proc.comm.nranks, proc.comm.rank
    for s in range(1, n - 1):
        j = (r + n - s) % n
        flow.recv_copy_send(proc, prv, nxt, dst, base + j * per, piece(size, per, j))
    j = (r + 1) % n
    flow.recv(proc, prv, dst, base + j * per, piece(size, per, j))


@flow_program
@flowdsl.device
def ring_all_reduce(proc, red, partial, src, dst, count, root, lo, hi):
    """Ring AllReduce: a reduce-scatter then an all-gather around the ring, round by round."""
    n, r = proc.comm.nranks, proc.comm.rank
    nxt, prv = ring_connections(proc)
    chunk = chunk_elements(proc, mem.itemsize(dst))
    base = lo
    while base < hi:
        size = min(n * chunk, hi - base)
        per = ((size + n - 1) // n + _ALIGN - 1) // _ALIGN * _ALIGN  # pieces start 16-byte aligned
        ring_reduce_to_own_piece(proc, nxt, prv, src, base, size, per, red)
        # This rank's piece: the last contribution combined, finished, stored and sent on.
        flow.recv_reduce_copy_send(proc, prv, nxt, src, dst, base + r * per, piece(size, per, r), red)
        ring_gather_after_own_piece(proc, nxt, prv, dst, base, size, per)
        base += size


@flowdsl.device
def piece(size, per, j):
    """Elements of piece ``j`` of a round of ``size`` cut in pieces of ``per`` (0 past the end)."""
    return max(0, min(per, size - j * per))


@flowdsl.device
def tree_rank(n, tree, pos):
    """World rank at heap position ``pos`` of tree ``tree``: tree 1 mirrors tree 0, so a leaf of
    one tree is an inner node of the other (for even ``n``)."""
    return pos if tree == 0 else n - 1 - pos


@flowdsl.device
def _tree_up(proc, pos, nkids, up, kid0_in, kid1_in, src, dst, base, m, red, partial):
    """Up: the children's sums into this rank's, then to the parent (the root finishes). With two
    children the second is combined with ``dst``, a partial result: ``flow.unscaled``."""
    if pos == 0:
        if nkids == 1:
            flow.recv_reduce_copy(proc, kid0_in, src, dst, base, m, red)
        else:
            flow.recv_reduce_copy(proc, kid0_in, src, dst, base, m, partial)
            flow.recv_reduce_copy(proc, kid1_in, dst, dst, base, m, flow.unscaled(red))
    elif nkids == 0:
        flow.send(proc, up, src, base, m, red)
    elif nkids == 1:
        flow.recv_reduce_send(proc, kid0_in, up, src, base, m, red)
    else:
        flow.recv_reduce_copy(proc, kid0_in, src, dst, base, m, partial)
        flow.recv_reduce_send(proc, kid1_in, up, dst, base, m, flow.unscaled(red))


@flowdsl.device
def _tree_down(proc, pos, nkids, down, kid0_out, kid1_out, dst, base, m):
    """Down: the result from the parent to the children."""
    if pos == 0:
        flow.send(proc, kid0_out, dst, base, m)
        if nkids == 2:
            flow.send(proc, kid1_out, dst, base, m)
    elif nkids == 0:
        flow.recv(proc, down, dst, base, m)
    else:
        flow.recv_copy_send(proc, down, kid0_out, dst, base, m)
        if nkids == 2:
            flow.send(proc, kid1_out, dst, base, m)


@flow_program
@flowdsl.device
def tree_all_reduce(proc, red, partial, src, dst, count, root, lo, hi):
    """Double-binary-tree AllReduce: reduce up to the root, broadcast down; even channels use
    tree 0, odd channels tree 1."""
    n, r = proc.comm.nranks, proc.comm.rank
    tree = proc.channel % 2
    pos = r if tree == 0 else n - 1 - r
    nkids = max(0, min(2, n - (2 * pos + 1)))
    # Connection numbers 1 (parent), 2 and 3 (children), both ways; the ring uses 0. A number
    # always joins the same two ranks, so their step counters stay matched across launches.
    # A parent or child that does not exist (the root's parent, a leaf's children) is this rank itself: its
    # connection is never used, and a connection to a rank outside the communicator would be refused.
    parent = tree_rank(n, tree, (pos - 1) // 2) if pos > 0 else r
    which = 2 + (pos - 1) % 2  # the parent's number for this rank
    kid0 = tree_rank(n, tree, 2 * pos + 1) if nkids >= 1 else r
    kid1 = tree_rank(n, tree, 2 * pos + 2) if nkids >= 2 else r
    up = flow.connect(proc, parent, 1, which)
    down = flow.connect(proc, parent, 1, which)
    kid0_in = flow.connect(proc, kid0, 2, 1)
    kid1_in = flow.connect(proc, kid1, 3, 1)
    kid0_out = flow.connect(proc, kid0, 2, 1)
    kid1_out = flow.connect(proc, kid1, 3, 1)
    chunk = chunk_elements(proc, mem.itemsize(dst))
    # Up runs one chunk ahead of down: while the root sends chunk c down, chunk c+1 is already
    # on its way up (the two directions use different connections, so both stay busy).
    if lo < hi:
        _tree_up(proc, pos, nkids, up, kid0_in, kid1_in, src, dst, lo, min(chunk, hi - lo), red, partial)
    for base in range(lo, hi, chunk):
        if base + chunk < hi:
            _tree_up(proc, pos, nkids, up, kid0_in, kid1_in, src, dst, base + chunk,
                     min(chunk, hi - base - chunk), red, partial)
        _tree_down(proc, pos, nkids, down, kid0_out, kid1_out, dst, base, min(chunk, hi - base))


# ---- all-to-all: pairwise rounds --------------------------------------------------------------------

@flowdsl.device
def own_block_copy(comm, src, dst, count, vectors):
    """An all-to-all's own block, from ``src`` to ``dst`` on this rank: a local copy by the whole grid."""
    r = comm.rank
    flow.copy(src, r * count, dst, r * count, count, cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x,
              cuda.gridDim.x * cuda.blockDim.x, vectors)


@flowdsl.device
def all_to_all_share(count, share, shares):
    """``[lo, hi)``: share ``share`` of ``shares`` of a block of ``count`` elements (16-element aligned)."""
    per = (count + shares - 1) // shares
    per = (per + _ALIGN - 1) // _ALIGN * _ALIGN
    lo = min(share * per, count)
    return lo, min(lo + per, count)


@flowdsl.device
def pairwise_exchange(proc, number, s, src, dst, count, lo, hi):
    """Round ``s`` on connection ``number`` of this processor's channel: elements ``[lo, hi)`` of this rank's
    block for rank + ``s`` go there while those of rank - ``s``'s block for this rank come in, a chunk of each
    in turn (every rank runs the same rounds on the same channels, so each send meets its receive, and a
    sender is never more than the slots ahead)."""
    n, r = proc.comm.nranks, proc.comm.rank
    to = (r + s) % n
    frm = (r + n - s) % n
    out = flow.connect(proc, to, number, number)
    inp = flow.connect(proc, frm, number, number)
    chunk = chunk_elements(proc, mem.itemsize(dst))
    for base in range(lo, hi, chunk):
        m = min(chunk, hi - base)
        flow.send(proc, out, src[to * count:(to + 1) * count], base, m)
        flow.recv(proc, inp, dst[frm * count:(frm + 1) * count], base, m)


@functools.cache
def pairwise_all_to_all(op=RedOp.SUM, gin_peers=False, fp8=0, ll128=False):
    """AllToAll (NCCL's ``ncclAlltoAll``): block ``j`` of this rank's ``src`` lands as block ``r`` of rank
    ``j``'s ``dst`` (``count`` elements a block), in ``n - 1`` pairwise rounds: in round ``s`` every rank
    sends to rank + ``s`` and receives from rank - ``s``; its own block is a local copy.

    A round has fixed channels and a fixed connection number there, whatever the grid: with ``channels``
    (the staging window's layout) of at least ``n - 1``, channel ``c`` carries share ``c // (n - 1)`` of round
    ``c % (n - 1) + 1`` on connection 0; with fewer, channel ``c`` carries all of rounds ``c + 1``,
    ``c + 1 + channels``, ... on connections 0, 1, ... (the host asks for enough channels). So each inbox has
    one sender across launches, as Flow's step counters need, in a staging window of the all-to-alls' own
    (the other programs' inboxes join ring and tree neighbours). A block runs channels ``blockIdx.x``,
    ``blockIdx.x + gridDim.x``, ... one after another, every rank in the same order. ``op`` and ``fp8`` are
    unused (a copy)."""
    context = gin_context if gin_peers else no_gin_context
    ll128 = int(ll128)

    @flowdsl.kernel(**_COMPILE)
    def pairwise_all_to_all(comm, stage, src, dst, count, root, inplace, channels, nslots, slot_words, protocol,
                            vectors, scalar_bits, scalar_at):
        n = comm.nranks
        own_block_copy(comm, src, dst, count, vectors)
        if n == 1:
            return
        for channel in range(cuda.blockIdx.x, channels, cuda.gridDim.x):
            proc = flow.processor(comm, stage, context(comm), channels, nslots, slot_words, protocol, channel, ll128)
            if channels >= n - 1:
                shares = channels // (n - 1)
                if channel < shares * (n - 1):
                    lo, hi = all_to_all_share(count, channel // (n - 1), shares)
                    pairwise_exchange(proc, 0, channel % (n - 1) + 1, src, dst, count, lo, hi)
            else:
                for number in range(flow.MAX_CONNECTIONS):
                    s = 1 + channel + number * channels
                    if s < n:
                        pairwise_exchange(proc, number, s, src, dst, count, 0, count)

    return pairwise_all_to_all


# ---- several nodes: hierarchical all-gather, reduce-scatter and all-to-all ------------------------------
#
# The world is ``nodes`` LSA teams of ``L`` ranks laid out node by node: rank ``r`` is LSA rank ``r % L`` of node
# ``r // L``, and its *rail* is the ranks with its LSA rank on every node (``r % L``, ``r % L + L``, ...). Data
# cross the network only along rails (each rank's own NIC, GIN), and each byte once per node that needs it;
# inside a node they move over LSA. The programs have a staging window of their own (the host's), where
# connection 0 joins rail neighbours, 1 node neighbours and 2 a rank to itself, on every channel.

@flowdsl.device
def hierarchical_layout(comm):
    """``(nodes, L, node, lsa_rank)`` of this rank: ``nodes`` LSA teams of ``L`` ranks, node by node."""
    L = comm.lsa_size
    return comm.nranks // L, L, comm.rank // L, comm.rank % L


@flowdsl.device
def hierarchical_connections(proc):
    """The rail ring (connection 0, over GIN: the same LSA rank on the next and previous node) and the node
    ring (connection 1, over LSA: the next and previous rank of this node): ``rail_nxt, rail_prv, node_nxt,
    node_prv``."""
    nodes, L, a, l = hierarchical_layout(proc.comm)
    rail_nxt = flow.connect(proc, ((a + 1) % nodes) * L + l, 0, 0)
    rail_prv = flow.connect(proc, ((a + nodes - 1) % nodes) * L + l, 0, 0)
    node_nxt = flow.connect(proc, a * L + (l + 1) % L, 1, 1)
    node_prv = flow.connect(proc, a * L + (l + L - 1) % L, 1, 1)
    return rail_nxt, rail_prv, node_nxt, node_prv


@flowdsl.device
def block_of(node, lsa_rank, L):
    """Index of the block of node ``node``'s LSA rank ``lsa_rank`` (its world rank): that rank's block of an
    all-gather's output, the block for it of a reduce-scatter's or all-to-all's input. A step on one array
    takes the block at element ``block_of(...) * count``; a step between two arrays takes a slice of it."""
    return node * L + lsa_rank


@flow_program
@flowdsl.device
def hierarchical_all_gather(proc, red, partial, src, dst, count, root, lo, hi):
    """Hierarchical AllGather, a chunk at a time: a ring along the rail gathers the blocks of this rank's LSA
    rank on every node (over GIN: each block crosses the network once per node), then a ring inside the node
    passes each of those ``nodes`` blocks to the node's other ranks (over LSA)."""
    nodes, L, a, l = hierarchical_layout(proc.comm)
    rail_nxt, rail_prv, node_nxt, node_prv = hierarchical_connections(proc)
    chunk = chunk_elements(proc, mem.itemsize(dst))
    for base in range(lo, hi, chunk):
        m = min(chunk, hi - base)
        # Rail: this rank's block, then the blocks of rail ranks a-1, a-2, ..., a+1 as they come round.
        r = block_of(a, l, L)
        flow.copy_send(proc, rail_nxt, src, dst[r * count:(r + 1) * count], base, m)
        for s in range(1, nodes - 1):
            j = block_of((a + nodes - s) % nodes, l, L)
            flow.recv_copy_send(proc, rail_prv, rail_nxt, dst, j * count + base, m)
        flow.recv(proc, rail_prv, dst, block_of((a + 1) % nodes, l, L) * count + base, m)
        # Node: every node's block of this LSA rank goes round the node; those of the others come in.
        for b in range(nodes):
            flow.send(proc, node_nxt, dst, block_of(b, l, L) * count + base, m)
            for s in range(1, L - 1):
                j = block_of(b, (l + L - s) % L, L)
                flow.recv_copy_send(proc, node_prv, node_nxt, dst, j * count + base, m)
            flow.recv(proc, node_prv, dst, block_of(b, (l + 1) % L, L) * count + base, m)


@flowdsl.device
def node_reduce_scatter(proc, node_nxt, node_prv, red, partial, src, own, dst, count, b, base, m):
    """Column ``b`` of a hierarchical reduce-scatter inside the node: blocks ``(b, 0..L-1)`` reduced around
    the node ring (a ring reduce-scatter), this rank keeping block ``(b, its LSA rank)``'s node sum in ``dst``,
    not finished (``partial``). ``own`` holds this rank's contribution to that block."""
    nodes, L, a, l = hierarchical_layout(proc.comm)
    flow.send(proc, node_nxt, src, block_of(b, (l + L - 1) % L, L) * count + base, m, red)
    for s in range(1, L - 1):
        j = block_of(b, (l + 2 * L - s - 1) % L, L)
        flow.recv_reduce_send(proc, node_prv, node_nxt, src, j * count + base, m, red)
    flow.recv_reduce_copy(proc, node_prv, own, dst, base, m, partial)


@flow_program
@flowdsl.device
def hierarchical_reduce_scatter(proc, red, partial, src, dst, count, root, lo, hi):
    """Hierarchical ReduceScatter, a chunk at a time: a ring along the rail (over GIN) whose every step first
    reduces its column inside the node (over LSA, :func:`node_reduce_scatter`). Step ``k`` of the rail ring
    carries node ``a-1-k``'s column: this node's sum of the block of that node's rank with this LSA rank is
    made in ``dst`` (one block of room, reused each step), then sent, or combined with what the rail brought
    and sent on; the last step is this rank's own block, whose rail sum is combined with this node's and
    finished. Each byte crosses the network once per node. This rank's own input for its own block is kept
    in its own inbox (connection 2) meanwhile: in place it is ``dst``, which the steps before overwrite."""
    nodes, L, a, l = hierarchical_layout(proc.comm)
    rail_nxt, rail_prv, node_nxt, node_prv = hierarchical_connections(proc)
    keep = flow.connect(proc, proc.comm.rank, 2, 2)
    carried = flow.unscaled(red)  # the rail carries node sums, pre-multiplied already
    chunk = chunk_elements(proc, mem.itemsize(dst))
    for base in range(lo, hi, chunk):
        m = min(chunk, hi - base)
        flow.send(proc, keep, src, block_of(a, l, L) * count + base, m)
        for k in range(nodes):
            b = (a + 2 * nodes - 1 - k) % nodes
            if k == nodes - 1:  # this rank's own block: its own input back into dst, then the node's column
                flow.recv(proc, keep, dst, base, m)
                node_reduce_scatter(proc, node_nxt, node_prv, red, partial, src, dst, dst, count, b, base, m)
                flow.recv_reduce_copy(proc, rail_prv, dst, dst, base, m, carried)
            else:
                j = block_of(b, l, L)
                node_reduce_scatter(proc, node_nxt, node_prv, red, partial, src, src[j * count:(j + 1) * count], dst,
                                    count, b, base, m)
                if k == 0:
                    flow.send(proc, rail_nxt, dst, base, m)
                else:
                    flow.recv_reduce_send(proc, rail_prv, rail_nxt, dst, base, m, carried)


@flowdsl.device
def hierarchical_round(proc, number, k, src, dst, count, lo, hi):
    """Round ``k`` (1 .. nranks-1) of the hierarchical all-to-all on connections ``number`` (rail) and
    ``number + 1`` (node): with ``s, t = divmod(k, L)``, this rank's block for the rank ``t`` further on in the
    node ``s`` further on goes along the rail to that node's rank with this LSA rank, which passes it to its
    node peer ``t`` further on (``flow.recv_send``); meanwhile this rank passes on what its rail peer ``s``
    back sent for its node peer ``t`` further on, and takes in what its node peer ``t`` back passed on, from
    node ``s`` back. ``s == 0``: within the node only; ``t == 0``: along the rail only."""
    nodes, L, a, l = hierarchical_layout(proc.comm)
    s, t = k // L, k % L
    to_node, from_node = (a + s) % nodes, (a + nodes - s) % nodes
    rail_out = flow.connect(proc, to_node * L + l, number, number)
    rail_in = flow.connect(proc, from_node * L + l, number, number)
    node_out = flow.connect(proc, a * L + (l + t) % L, number + 1, number + 1)
    node_in = flow.connect(proc, a * L + (l + L - t) % L, number + 1, number + 1)
    chunk = chunk_elements(proc, mem.itemsize(dst))
    for base in range(lo, hi, chunk):
        m = min(chunk, hi - base)
        if s == 0:
            flow.send(proc, node_out, src, block_of(a, (l + t) % L, L) * count + base, m)
            flow.recv(proc, node_in, dst, block_of(a, (l + L - t) % L, L) * count + base, m)
        elif t == 0:
            flow.send(proc, rail_out, src, block_of(to_node, l, L) * count + base, m)
            flow.recv(proc, rail_in, dst, block_of(from_node, l, L) * count + base, m)
        else:
            flow.send(proc, rail_out, src, block_of(to_node, (l + t) % L, L) * count + base, m)
            flow.recv_send(proc, rail_in, node_out, dst, base, m)
            flow.recv(proc, node_in, dst, block_of(from_node, (l + L - t) % L, L) * count + base, m)


#: Rounds of the hierarchical all-to-all a channel carries at most (each takes two connection numbers).
HIERARCHICAL_ROUNDS_PER_CHANNEL = 2


@functools.cache
def hierarchical_all_to_all(op=RedOp.SUM, gin_peers=False, fp8=0, ll128=False):
    """Hierarchical AllToAll: block ``j`` of this rank's ``src`` lands as block ``r`` of rank ``j``'s ``dst``
    (NCCL's ``ncclAlltoAll``), moving over the network only along rails. Its ``nranks - 1`` rounds
    (:func:`hierarchical_round`) go to the channels in turn: round ``k`` on channel ``(k-1) % channels``,
    connections ``2 * ((k-1) // channels)`` and the next (so at least ``(nranks-1)/2`` channels: the host asks
    for them); a block runs channels ``blockIdx.x``, ``blockIdx.x + gridDim.x``, ... one after another, every
    rank in the same order. Each block for another node crosses the network once, from the sender's NIC to
    the receiving node's rank on the same rail. Its own block is a local copy. ``op`` and ``fp8`` are unused
    (a copy); its staging window is its own (the host's)."""
    context = gin_context if gin_peers else no_gin_context
    ll128 = int(ll128)

    @flowdsl.kernel(**_COMPILE)
    def hierarchical_all_to_all(comm, stage, src, dst, count, root, inplace, channels, nslots, slot_words,
                                protocol, vectors, scalar_bits, scalar_at):
        n = comm.nranks
        own_block_copy(comm, src, dst, count, vectors)
        if n == 1:
            return
        for channel in range(cuda.blockIdx.x, channels, cuda.gridDim.x):
            proc = flow.processor(comm, stage, context(comm), channels, nslots, slot_words, protocol, channel, ll128)
            for p in range(HIERARCHICAL_ROUNDS_PER_CHANNEL):
                k = 1 + channel + p * channels
                if k < n:
                    hierarchical_round(proc, 2 * p, k, src, dst, count, 0, count)

    return hierarchical_all_to_all


# ---- one LSA team: one-shot all-reduce ------------------------------------------------------------

#: Blocks of a one-shot all-reduce at most.
ONE_SHOT_BLOCKS = 128
#: LL lines per rank and buffer in the window the host gives one-shot calls (2 MiB).
ONE_SHOT_LINES = 256 * 1024
# The window's header (one 128-byte line): the calls finished on it, and the blocks of the running
# call that are done. One count for the whole window, on the device: the flag and the buffer of a
# call never depend on its grid, count or dtype, and CUDA graph replays advance it too.
_CALLS, _BLOCKS_DONE = 0, 1
_HEADER_WORDS = 16


@flowdsl.device
def one_shot_words(nranks):
    """Size of a one-shot window in uint64 words: its header, then 2 buffers x ``nranks`` x lines."""
    return _HEADER_WORDS + 2 * nranks * ONE_SHOT_LINES


def one_shot_fits(count, itemsize):
    """Whether ``count`` elements of ``itemsize`` bytes fit a one-shot window (8-byte ones take 2 lines)."""
    return count * (2 if itemsize == 8 else 1) <= ONE_SHOT_LINES


@flowdsl.device
def _one_shot_read(comm, words, at, lines, flag, like, lsa_peer):
    """The element LSA peer ``lsa_peer`` left as LL line(s) at ``words[at]`` (spins, bounded, until
    they carry ``flag``)."""
    peer = comm.rank - comm.lsa_rank + lsa_peer
    bits = flow.ll_read(comm, words, at, flag, peer)
    if lines == 2:
        bits |= flow.ll_read(comm, words, at + 1, flag, peer) << uint64(32)
    return mem.from_bits(bits, like.dtype)


@flowdsl.device
def _one_shot_done(words, call):
    """This block is done with call ``call``; the last block of the grid counts the call finished
    (the next launch, stream-ordered after this one, reads the new count)."""
    cuda.syncthreads()  # every thread of the block read the count and finished its lines
    if cuda.threadIdx.x == 0:
        done = mem.atomic_add(words, _BLOCKS_DONE, uint64(1), MemoryOrder.ACQ_REL, ThreadScope.DEVICE)
        if done == uint64(cuda.gridDim.x - 1):  # the others read the count before they arrived
            words[_BLOCKS_DONE] = uint64(0)
            words[_CALLS] = uint64(call + 1)


@functools.cache
def one_shot_all_reduce(op=RedOp.SUM, gin_peers=False, fp8=0, ll128=False):
    """One-shot AllReduce over one LSA team, for small messages (NCCL's symmetric ``AGxLL_R``).

    Each rank stores its input as LL lines (data and flag in one word) into its region of
    every peer's one-shot window, then reduces the ``n`` contributions it holds, in rank
    order (so every rank gets the same bits). No barrier: a line's flag is
    :func:`flowdsl.flow.ll_flag` of the call's number, counted once for the whole window in
    its header (every rank makes the same calls, so the writer and the reader agree whatever
    grid, count or dtype this or an earlier call had). Two buffers by the call's parity: a rank
    can be at most one call ahead of a peer still reading, so it never overwrites unread lines;
    the calls of :func:`flowdsl.flow.ll_cleans` write every line of their buffer, so a flag that
    comes round again never finds an old line carrying it. ``stage`` is the one-shot window
    (:func:`one_shot_words`), not Flow's staging (so no Flow protocol: ``ll128`` is unused).
    """
    scale_of, alone = scale_for(op), one_rank(op)

    @flowdsl.kernel(**_COMPILE)
    def one_shot_all_reduce(comm, stage, src, dst, count, root, inplace, channels, nslots, slot_words, protocol,
                            vectors, scalar_bits, scalar_at):
        n, me = comm.lsa_size, comm.lsa_rank
        scale = scale_of(scalar_bits, scalar_at, dst)
        if n == 1:
            alone(src, dst, count, inplace, vectors, flow.reduction(op, 1, fp8, scale))
            return
        red = flow.reduction(op, n, fp8, scale)
        lines = flow.ll_lines_per_element(mem.itemsize(dst))
        words = lsa.local_view(stage)
        call = int64(words[_CALLS])
        flag = flow.ll_flag(call)
        buffer = _HEADER_WORDS + (call % 2) * n * ONE_SHOT_LINES
        first = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        stride = cuda.gridDim.x * cuda.blockDim.x
        written = ONE_SHOT_LINES if flow.ll_cleans(call, 2) else count * lines  # cleaning: every line
        # Push: this rank's input into its region of every peer's window.
        for step in range(1, n):
            peer = (me + step) % n
            theirs = lsa.lsa_view(stage, peer, buffer + me * ONE_SHOT_LINES, ONE_SHOT_LINES)
            for i in range(first, count, stride):
                bits = mem.to_bits(flow.premul(red, src[i]))
                mem.store_relaxed(theirs, i * lines, flow.ll_line(bits, flag), _SYS)
                if lines == 2:
                    mem.store_relaxed(theirs, i * lines + 1, flow.ll_line(bits >> uint64(32), flag), _SYS)
            for line in range(count * lines + first, written, stride):
                mem.store_relaxed(theirs, line, flow.ll_line(uint64(0), flag), _SYS)
        # Reduce the n contributions, rank 0's first.
        for i in range(first, count, stride):
            acc = flow.premul(red, src[i])
            if me != 0:
                acc = _one_shot_read(comm, words, buffer + i * lines, lines, flag, dst, 0)
            for q in range(1, n):
                if q == me:
                    acc = flow.combine(red.op, acc, flow.premul(red, src[i]), red.fp8)
                else:
                    acc = flow.combine(red.op, acc, _one_shot_read(comm, words, buffer + q * ONE_SHOT_LINES
                                                                   + i * lines, lines, flag, dst, q), red.fp8)
            dst[i] = flow.finish(red.op, acc, red.nranks, red.fp8)
        _one_shot_done(words, call)

    return one_shot_all_reduce


# ---- one LSA team through the NVLink switch: multimem all-reduce -----------------------------------------

@flowdsl.device
def multimem_piece(m, nblocks, unit):
    """Elements of each block's piece of a chunk of ``m``: a multiple of ``unit`` (one 16-byte vector per LSA
    rank), so that every rank's share of a piece is whole vectors and starts 16-byte aligned."""
    per = (m + nblocks - 1) // nblocks
    return (per + unit - 1) // unit * unit


@functools.cache
def multimem_share(mm_op, vector):
    """The device function ``share(mm, lo, hi, lanes, red)`` that reduces elements ``[lo, hi)`` over every
    member's window in the switch by ``mm_op`` (``multimem_ld_reduce``), finishes them (``AVG`` divides) and
    stores them to every member (``multimem_store``): 16 bytes at a time with ``vector`` (``lo`` aligned,
    ``hi`` rounded up to a vector of ``lanes``), else one element at a time. ``mm_op`` must reach the
    multimem primitive as a constant, so it is the factory's, not an argument."""
    if vector:
        def multimem_share_vectors(mm, lo, hi, lanes, red):
            for i in range(lo + cuda.threadIdx.x * lanes, hi, cuda.blockDim.x * lanes):
                mem.multimem_store_vec(mm, i, flow.finish_pack(red, mem.multimem_ld_reduce_vec(mm, i, mm_op)))

        return flowdsl.device(multimem_share_vectors)

    def multimem_share_elements(mm, lo, hi, lanes, red):
        for i in range(lo + cuda.threadIdx.x, hi, cuda.blockDim.x):
            mem.multimem_store(mm, i, flow.finish(red.op, mem.multimem_ld_reduce(mm, i, mm_op), red.nranks, red.fp8))

    return flowdsl.device(multimem_share_elements)


@functools.cache
def multimem_all_reduce(op=RedOp.SUM, gin_peers=False, fp8=0, ll128=False, vector=True):
    """AllReduce through the NVLink switch (NVLink SHARP) over one LSA team: NCCL's NVLS all-reduce.

    ``stage`` is a window of this rank's, registered by every rank of the team; the message goes
    through it a chunk at a time (what it holds, in whole pieces). Each block takes a piece of the
    chunk, and each LSA rank owns ``1/n`` of every piece:

    1. the block copies its piece of ``src`` into this rank's window;
    2. LSA barrier (every member's piece is in place);
    3. reduce-scatter and all-gather in one: this rank's share of the piece is read from every member's
       window, combined in the switch (``multimem_ld_reduce``), and stored to every member's window
       (``multimem_store``);
    4. LSA barrier (every share is stored everywhere);
    5. the block copies its piece of the window to ``dst``.

    Each block syncs its own barrier (index ``blockIdx.x``) with the same block of every peer: a block
    reads only the pieces that block wrote. A piece is whole vectors for every owner; the last vector of
    the message is padded with zeros in the window, never copied out. ``vector``: reduce 16 bytes at a
    time (float32, float16, bfloat16), else one element at a time (integers, float64): a constant of the
    kernel, since PTX has only one of the forms for a type (``flowdsl.mem.MULTIMEM_SCALAR_OPS`` and
    ``MULTIMEM_VECTOR_OPS``). ``AVG`` is the switch's ``SUM``, divided by the owner before it stores. No
    Flow: ``channels``, ``nslots``, ``slot_words``, ``protocol`` and ``ll128`` are unused; ``gin_peers``
    and ``fp8`` too (the host refuses several LSA teams and fp8). With one rank, the local copy.
    """
    mm_op = RedOp.SUM if op == RedOp.AVG else op
    share = multimem_share(mm_op, vector)

    @flowdsl.kernel(**_COMPILE)
    def multimem_all_reduce(comm, stage, src, dst, count, root, inplace, channels, nslots, slot_words, protocol,
                            vectors, scalar_bits, scalar_at):
        n, me = comm.lsa_size, comm.lsa_rank
        if n == 1:
            local_copy(src, dst, count, inplace, vectors)
            return
        red = flow.reduction(op, n, 0)
        window = lsa.local_view(stage, 0, -1, dst.dtype)
        mm = lsa.multimem_view(comm, stage, 0, -1, dst.dtype)
        bar = lsa.barrier(comm, coop.cta(), cuda.blockIdx.x)
        lanes = 16 // mem.itemsize(dst)
        unit = n * lanes
        whole = cuda.gridDim.x * unit
        chunk = window.size // whole * whole  # the host sizes the window for one piece per block at least
        t, threads = cuda.threadIdx.x, cuda.blockDim.x
        for base in range(0, count, chunk):
            m = min(chunk, count - base)
            per = multimem_piece(m, cuda.gridDim.x, unit)
            lo = min(cuda.blockIdx.x * per, m)
            hi = min(lo + per, m)
            flow.copy(src, base + lo, window, lo, hi - lo, t, threads, vectors)
            if lo < hi and hi == m:  # the message's last vector: zeros past its end, whatever an earlier call left
                for i in range(m + t, (m + lanes - 1) // lanes * lanes, threads):
                    window[i] = mem.from_bits(uint64(0), dst.dtype)
            bar.sync(MemoryOrder.ACQ_REL)
            own = cuda.blockIdx.x * per + me * (per // n)
            end = min(own + per // n, (m + lanes - 1) // lanes * lanes)
            share(mm, own, end, lanes, red)
            bar.sync(MemoryOrder.ACQ_REL)
            flow.copy(window, lo, dst, base + lo, hi - lo, t, threads, vectors)
            cuda.syncthreads()  # the next chunk's copy-in may be another thread's element of this copy-out

    return multimem_all_reduce


def multimem_form(dtype: str, op: RedOp) -> bool | None:
    """How PTX's multimem reduces ``dtype`` elements (a kernel's NumPy type; bfloat16 is uint16) by ``op``:
    True 16 bytes at a time, False one element at a time, None not at all. ``AVG`` is ``SUM`` then a
    division; ``PROD`` and ``PREMULSUM`` have no form. From :mod:`flowdsl.mem`'s tables."""
    op = RedOp.SUM if op == RedOp.AVG else RedOp(op)
    if op in mem.MULTIMEM_VECTOR_OPS.get(dtype, ()):
        return True
    if op in mem.MULTIMEM_SCALAR_OPS.get(dtype, ()):
        return False
    return None


# ---- several nodes, the far phase over CFT: hierarchical all-gather --------------------------------------
#
# Where the communicator has CFT (sm_100, NCCL >= 2.32 for counted writes), the rail can be a CFT team:
# ``cft.team(comm, CftTeamMode.HIER_LSA)`` is this LSA rank on every node of the CFT domain. CFT moves
# shared memory in sessions, not Flow slots, so the program has a window of its own, registered for counted
# writes (``comm.register(buf, cft_counted=True)``), laid out by :func:`cft_all_gather_layout`: a u64 counter
# per channel (16 bytes each, first), then per channel ``nodes`` *far* slots (slot ``b``: node ``b``'s chunk,
# written by a counted put from there) and ``nodes`` *share* slots (this rank's column of the chunk, stored
# plainly, which its node peers read over LSA).

#: Bytes a channel moves over CFT at a time: its shared-memory stage and each slot of its window (16-byte units).
CFT_CHUNK_BYTES = 2048
#: Bytes of a channel's counter in the CFT window (a u64, padded to CFT's 16-byte unit).
CFT_COUNTER_BYTES = 16


def cft_all_gather_layout(channels: int, nodes: int) -> tuple[int, int]:
    """``(window bytes, bytes a channel's slots take)`` of :func:`hierarchical_cft_all_gather`'s counted window
    on one rank: ``channels`` counters, then each channel's ``nodes`` far slots and ``nodes`` share slots of
    :data:`CFT_CHUNK_BYTES`."""
    per_channel = 2 * nodes * CFT_CHUNK_BYTES
    return channels * CFT_COUNTER_BYTES + channels * per_channel, per_channel


@functools.cache
def hierarchical_cft_all_gather(dtype):
    """Hierarchical AllGather with the far phase over CFT, for elements of ``dtype`` (a NumPy dtype; the
    shared-memory stage is typed). The kernel takes ``(comm, win, src, dst, count, channels)``: ``win`` is the
    counted window, of any dtype (it is read in ``dst``'s), laid out for ``channels`` by
    :func:`cft_all_gather_layout` and zeroed once when made; ``dst`` holds ``nranks`` blocks of ``count``
    (in place, ``src`` is its block ``rank``). Block ``channel`` of the grid (at most ``channels`` blocks, so
    a call may launch fewer than the window was laid out for) moves share ``channel`` of every block, a chunk
    at a time. The device communicator needs ``cft_barrier_count`` and ``lsa_barrier_count`` of at least the
    grid. ``flowdsl.collectives.all_gather(..., algorithm="hierarchical_cft")`` makes both and launches it.

    A chunk, beside :func:`hierarchical_all_gather`'s rail ring and node ring:

    1. Read this channel's counter, then a CFT barrier: every rank has finished with the last chunk's slots
       (and read its counter's start before any peer adds to it).
    2. Far phase (CFT, the rail): stage this rank's chunk in shared memory, fence it to the fabric, and put it,
       counted, into slot ``a`` (this node) of the same LSA rank on every other node (``HIER_LSA`` team); wait
       until the counter has risen by the other nodes' bytes (``cft.wait_counted`` fences fabric to generic).
    3. Near phase (LSA, the node): store the column (every node's chunk of this LSA rank) into this rank's
       share slots, an LSA barrier, then read every node peer's column from its window.
    """
    elem = from_dtype(np.dtype(dtype))
    size = np.dtype(dtype).itemsize
    chunk = CFT_CHUNK_BYTES // size
    slot = CFT_CHUNK_BYTES // size  # a slot, in elements
    counters = CFT_COUNTER_BYTES // size

    @flowdsl.kernel(**_COMPILE)
    def hierarchical_cft_all_gather(comm, win, src, dst, count, channels):
        state = cuda.shared.array(4, uint64, alignment=16)  # cft.SESSION_WORDS
        stage = cuda.shared.array(chunk, elem, alignment=16)
        nodes, L, a, l = hierarchical_layout(comm)
        cta = coop.cta()
        t, nt = cuda.threadIdx.x, cuda.blockDim.x
        channel, grid = cuda.blockIdx.x, cuda.gridDim.x
        rail = cft.team(comm, cft.CftTeamMode.HIER_LSA)  # node b's rank with this LSA rank is rail rank b
        ctr = channel * CFT_COUNTER_BYTES  # byte offset of this channel's counter
        far = channels * counters + channel * 2 * nodes * slot  # element offset of its far slots
        share = far + nodes * slot  # and of its share slots
        mine = lsa.local_view(win, 0, -1, dst.dtype)
        lo, hi = all_to_all_share(count, channel, grid)
        s = cft.session(comm, cta, state)
        for base in range(lo, hi, chunk):
            m = min(chunk, hi - base)
            nbytes = (m * size + 15) // 16 * 16
            start = cft.read_counter(win, ctr)
            cft.barrier(comm, cta, channel).sync(MemoryOrder.ACQ_REL)
            # Far phase: this rank's chunk to slot a of every other node's rank with this LSA rank.
            for i in range(t, m, nt):
                stage[i] = src[base + i]
            cft.fence(cta, MemoryOrder.RELEASE, cft.MemProxyType.GENERIC, cft.MemProxyType.FABRIC,
                      cft.MemFenceScope.CTA)
            for b in range(nodes):
                if b != a:
                    le, off = cft.le_info(comm, win, (far + a * slot) * size, rail, b)
                    le, counter = cft.le_info(comm, win, ctr, rail, b)
                    cft.put_counted(s, le, off, counter, stage, nbytes)
            cft.submit(s)
            own = block_of(a, l, L) * count + base
            for i in range(t, m, nt):
                x = src[base + i]
                dst[own + i] = x
                mine[share + a * slot + i] = x
            cft.wait_counted(s, win, ctr, start + (nodes - 1) * nbytes)
            for b in range(nodes):
                if b != a:
                    j = block_of(b, l, L) * count + base
                    for i in range(t, m, nt):
                        x = mine[far + b * slot + i]
                        dst[j + i] = x
                        mine[share + b * slot + i] = x
            cft.flush_smem(s)  # the stage is refilled next chunk
            # Near phase: every node peer's column, from its share slots.
            lsa.barrier(comm, cta, channel).sync(MemoryOrder.ACQ_REL)
            for p in range(L):
                if p != l:
                    peer = lsa.lsa_view(win, p, 0, -1, dst.dtype)
                    for b in range(nodes):
                        j = block_of(b, p, L) * count + base
                        for i in range(t, m, nt):
                            dst[j + i] = peer[share + b * slot + i]
        cft.flush(s)
        cft.close(s)

    return hierarchical_cft_all_gather


#: (algorithm, collective) → kernel factory: ``factory(op, gin_peers, fp8, ll128)`` (the multimem one also its
#: form), except the CFT all_gather's, ``factory(dtype)`` (its shared-memory stage is typed; its kernel takes
#: ``(comm, win, src, dst, count, channels)``, see :func:`hierarchical_cft_all_gather`).
PROGRAMS = {
    ("ring", "all_gather"): ring_all_gather,
    ("ring", "reduce_scatter"): ring_reduce_scatter,
    ("ring", "broadcast"): ring_broadcast,
    ("ring", "reduce"): ring_reduce,
    ("ring", "all_reduce"): ring_all_reduce,
    ("tree", "all_reduce"): tree_all_reduce,
    ("one_shot", "all_reduce"): one_shot_all_reduce,
    ("pairwise", "all_to_all"): pairwise_all_to_all,
    ("multimem", "all_reduce"): multimem_all_reduce,
    ("hierarchical", "all_gather"): hierarchical_all_gather,
    ("hierarchical", "reduce_scatter"): hierarchical_reduce_scatter,
    ("hierarchical", "all_to_all"): hierarchical_all_to_all,
    ("hierarchical_cft", "all_gather"): hierarchical_cft_all_gather,
}
