"""Flow: connections to peers over LSA or GIN, and the steps collectives are made of.

Flow is written in flowdsl itself, on :mod:`flowdsl.lsa`, :mod:`flowdsl.gin` and
:mod:`flowdsl.mem`: the same code is compiled for the GPU and run by the
simulator. A kernel builds a :func:`processor` per CTA (one *channel* per block)
over a staging window, opens :func:`connect`-ions to peers, and moves data with
the steps below. Every step is collective over the CTA and moves ``n`` elements
starting at element ``offset`` of the user's arrays, slot by slot.

Transport, chosen per connection at run time: a peer in this rank's LSA team is
reached by stores into its window (NVLink or PCIe P2P), any other peer by GIN
puts with *strong* signals (a strong signal also covers the earlier puts on the
connection). Both kinds go through one code path per step: only posting a slot
and waiting for it differ (``_post``, ``_wait_ready``).

Staging: every connection has ``nslots`` slots in the receiver's window; the
sender may run ``nslots`` slots ahead of the receiver (credits). Counters live
in the window, so connections continue where the previous launch stopped. The
window comes from :func:`staging` (allocated, zeroed, registered); a processor
over any other window is refused (it would start from garbage counters).
Protocols (:class:`flowdsl.Protocol`): ``SIMPLE`` writes a slot, then one
release flag (GIN: the put's signal); ``LL`` writes 8-byte lines of 4 data bytes
and a 4-byte flag with one store each, so the receiver needs no separate flag;
``LL128`` writes 128-byte lines of 120 data bytes whose last 8 bytes are a flag
stored with release semantics. LL and LL128 carry small messages: their slots are
at most :data:`SMALL_SLOT_BYTES`.

Freshness (why a receiver never takes data another step left): every slot is named by its
connection's step counter, which both ends keep in the staging window (on the device: CUDA
graph replays and every grid, count, dtype and channel count advance it alike), never by a
launch's grid or a block. SIMPLE's data is read after the 64-bit ready counter passed the
step; LL128's 64-bit line flag is ``step + 1`` (it does not wrap); LL's 32-bit line flags
cycle (:func:`ll_flag`) and the slots are rewritten whole before a flag can come round again
(:func:`ll_cleans`). The simulator checks it: a line taken with a flag that another call
left raises :class:`flowdsl.sim.StaleDataError`.

Steps (the ``op`` steps take a :func:`reduction`): :func:`send`, :func:`recv`,
:func:`copy_send`, :func:`recv_reduce_send`, :func:`recv_reduce_copy`,
:func:`recv_reduce_copy_send`, :func:`recv_copy_send`, and :func:`copy` (local).
Direct variants (:func:`direct_send`, :func:`direct_recv`,
:func:`direct_copy_send`, :func:`direct_recv_copy_send`) skip the staging
slot: the sender writes straight into the receiver's registered output window
and the receiver only waits for it. Element arithmetic: :func:`combine`,
:func:`finish` (uint16 elements are bfloat16 bits: NCCL has no uint16; uint8
elements are fp8 when the :class:`Reduction` says so).

How a step is fast (the data-movement core, ``_step_kind`` and ``_simple_move``):

- What a step does (receive? send? reduce? store? finish?) is fixed when it is
  compiled: each step is its own specialised function, so the inner loop has no
  run-time flags. A :func:`reduction` carries its operator and fp8 format in its
  type on the GPU, so each operator gets its own loop too.
- SIMPLE moves 16-byte packs (``mem.load_vec``/``store_vec``), four per thread in
  flight before their stores, when the arrays allow it (16-byte aligned at the
  step's offset); elements one by one otherwise and for the tail.
- Roles: the last warp of a block of 64 threads or more is the *sync warp*: its
  first thread publishes a slot (fence, flag, credit) while the other warps move the
  next one, so the system fence is off the data path. Thread 0 waits for each slot
  (credit, ready flag) and the workers sync on their own named barrier; one block
  barrier per slot joins them with the sync warp. With fewer threads, thread 0 does
  both jobs in turn (same order, same result).

Every wait (credit, ready flag or signal, LL and LL128 line flags) is bounded
(:mod:`flowdsl.wait`): after the communicator's limit it gives up, and the host
raises :class:`flowdsl.DeviceTimeoutError` naming the connection and the peer.

Layout of the staging window (uint64 words): per (channel, connection) four
state words, then the inbox slots of each protocol, then (when GIN is possible)
the outbox slots GIN puts are made from. :func:`staging_words` gives its size.
"""

from __future__ import annotations

from collections import namedtuple

from numba import cuda, int64, uint64

from . import coop, gin, lsa, mem, team, wait
from ._devices import device
from ._flow_elements import E4M3, E5M2, Reduction, combine, combine_packs, finish, finish_pack, reduction
from ._flow_staging import (MAX_CONNECTIONS, SMALL_SLOT_BYTES, STATE_WORDS, Staging, protocol_slot_words,
                            region_words, staging, staging_words, state_words)
from ._flow_staging import require_staging as _require_staging
from .enums import MemoryOrder, Protocol, RedOp, ThreadScope

__all__ = [
    "MAX_CONNECTIONS", "SMALL_SLOT_BYTES", "Processor", "Connection", "Reduction", "Staging", "staging",
    "staging_words", "processor",
    "connect", "reduction", "combine", "finish", "combine_packs", "finish_pack", "strong_signal_inc",
    "slot_elements", "ll_line", "ll_read", "ll_lines_per_element", "ll_flag", "ll_cleans", "LL_FLAG_CYCLE",
    "E4M3", "E5M2",
    "send", "recv", "copy_send", "recv_reduce_send", "recv_reduce_copy", "recv_reduce_copy_send",
    "recv_copy_send", "copy", "direct_send", "direct_recv", "direct_copy_send", "direct_recv_copy_send",
]


def __getattr__(name):
    # ``flow.kernel`` is ``flowdsl.kernel`` (as ``flow.device`` is ``flowdsl.device``), taken from the package at
    # first use: the kernel module reaches the compiler, whose lowering of Flow imports this module.
    if name == "kernel":
        from . import kernel  # noqa: PLC0415

        return kernel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Tells the simulator that this module's functions are device code.
__flowdsl_device_module__ = True

_READY, _CREDIT, _SENT, _RECEIVED = 0, 1, 2, 3
_LL128_LINE = 16  # words: 15 of data, then the flag
_SYS = ThreadScope.SYSTEM
_WARP = 32

Processor = namedtuple("Processor", ["comm", "stage", "ctx", "channel", "nchannels", "channels", "nslots",
                                     "slot_words", "protocol", "inbox_at", "outbox_at", "workers",
                                     "sync_thread", "ll128", "ll_at", "ll_slot_words"])
Processor.__doc__ = """One CTA's side of Flow: its channel, staging window and protocol (see :func:`processor`).

``slot_words`` and ``inbox_at`` / ``outbox_at`` are those of the processor's protocol;
threads below ``workers`` move data, thread ``sync_thread`` waits and publishes; ``ll128``
0: the kernel holds no LL128 code; ``ll_at`` and ``ll_slot_words``: where the LL inboxes start
and their slots' size, whatever the protocol (every step may clean an LL slot: :func:`ll_cleans`)."""
Connection = namedtuple("Connection", ["peer", "number", "remote_number", "gin"])
Connection.__doc__ = """A connection to ``peer`` (see :func:`connect`).

``number`` is this side's connection number, ``remote_number`` the peer's number for the
same connection; ``gin`` is 1 when the peer is outside the LSA team."""


# ---- a CTA's processor and its connections ------------------------------------------------------

@device
def processor(comm, stage, ctx, channels, nslots, slot_words, protocol, channel=-1, ll128=1):
    """This CTA's processor: channel ``blockIdx.x`` of ``gridDim.x`` (or ``channel``), over ``stage``.

    Args:
        comm: The device communicator.
        stage: The staging window, from :func:`staging` (zeroed on every rank: counters and
            line flags start at 0); any other window is refused.
        ctx: A GIN context (``gin.context(comm, 0)``), used for peers outside the LSA team, or
            None for a kernel that only ever talks to its LSA team (no GIN code is compiled).
        channels: Channels the staging window was laid out for (``gridDim.x`` may be fewer:
            the layout must not move between launches, or a slot's old flags would be read).
        nslots: Slots per connection (how far a sender may run ahead; at least 2).
        slot_words: Size of one SIMPLE slot in uint64 words (a multiple of 16); LL and LL128
            slots are at most :data:`SMALL_SLOT_BYTES`.
        protocol: A :class:`flowdsl.Protocol`.
        channel: The channel to use instead of ``blockIdx.x`` (two blocks may then hold the
            two ends of one connection, e.g. a rank sending to itself).
        ll128: 0 leaves LL128's code out of the kernel: pass it as a constant (as the
            collectives do for calls that do not ask for LL128); the link carries it into
            every step, and LL128 is a third to a half of a kernel's link time. Such a
            processor runs a ``Protocol.LL128`` request as LL.
    """
    _require_staging(stage)
    if not ll128 and protocol == Protocol.LL128:
        protocol = Protocol.LL
    state = state_words(channels)
    before = 0  # words of the protocols laid out before this one
    if protocol >= Protocol.LL:
        before += region_words(channels, nslots, slot_words, Protocol.SIMPLE)
    if protocol >= Protocol.LL128:
        before += region_words(channels, nslots, slot_words, Protocol.LL)
    boxes = staging_words(channels, nslots, slot_words, False) - state
    mine = cuda.blockIdx.x if channel < 0 else channel
    nt = cuda.blockDim.x
    workers = nt - _WARP if nt >= 2 * _WARP else nt
    sync_thread = nt - _WARP if nt >= 2 * _WARP else 0
    return Processor(comm, stage, ctx, mine, cuda.gridDim.x, channels, nslots,
                     protocol_slot_words(slot_words, protocol), protocol, state + before,
                     state + boxes + before, workers, sync_thread, ll128,
                     state + region_words(channels, nslots, slot_words, Protocol.SIMPLE),
                     protocol_slot_words(slot_words, Protocol.LL))


@device
def connect(proc, peer, number, remote_number):
    """A connection to world rank ``peer``: LSA if ``peer`` is in this rank's LSA team, else GIN.

    A connection number names one inbox per channel: for a connection this rank sends
    on, ``number`` numbers it among this rank's send connections and ``remote_number``
    is the inbox it fills on the peer; for one it receives on, ``number`` is this rank's
    inbox and ``remote_number`` the peer's send connection. Both ends must agree, and
    one inbox must have one sender (its counters count that sender's slots). Send and
    receive connections with one number are independent (separate counters).
    """
    comm = proc.comm
    first = comm.rank - comm.lsa_rank
    remote = 0 if first <= peer < first + comm.lsa_size else 1
    return Connection(peer, number, remote_number, remote)


def strong_signal_inc(signal):
    """A signal increment that covers every earlier put of the connection (strong).

    ``gin.strong_signal_inc`` on NCCL >= 2.32; before, the legacy signal, which the
    backends of those releases (GIN proxy, GDAKI) apply in order. Either way a launch
    on a backend with weak signals only (EFA GDA) is refused.
    """
    return gin.strong_signal_inc(signal)


# ---- where things are ----------------------------------------------------------------------------

@device
def _state_at(proc, which, number):
    return (proc.channel * MAX_CONNECTIONS + number) * STATE_WORDS + which


@device
def _box_at(proc, base, number, slot):
    """Word offset of slot ``slot`` of connection ``number`` in the region starting at ``base``."""
    return base + ((proc.channel * MAX_CONNECTIONS + number) * proc.nslots + slot) * proc.slot_words


@device
def _ready_signal(proc, number):
    return 2 * (proc.channel * MAX_CONNECTIONS + number)


@device
def _credit_signal(proc, number):
    return 2 * (proc.channel * MAX_CONNECTIONS + number) + 1


@device
def slot_elements(proc, itemsize):
    """Elements of ``itemsize`` bytes one slot carries under the processor's protocol."""
    if proc.protocol == Protocol.LL:
        return proc.slot_words // ll_lines_per_element(itemsize)
    if proc.protocol == Protocol.LL128:
        return proc.slot_words // _LL128_LINE * (_LL128_LINE - 1) * (8 // itemsize)
    return proc.slot_words * 8 // itemsize


@device
def _slot_words_used(proc, m, itemsize):
    """Words of a slot that carry ``m`` elements (what a GIN put must move)."""
    if proc.protocol == Protocol.LL:
        return m * ll_lines_per_element(itemsize)
    if proc.protocol == Protocol.LL128:
        per_line = (_LL128_LINE - 1) * (8 // itemsize)
        return (m + per_line - 1) // per_line * _LL128_LINE
    return (m * itemsize + 7) // 8


@device
def _inbox_at(proc, inp, rstep):
    """Word offset of this rank's inbox slot of receive step ``rstep``."""
    return _box_at(proc, proc.inbox_at, inp.number, rstep % proc.nslots)


@device
def _outbox_at(proc, out, sstep):
    """Word offset of where send step ``sstep`` writes: the peer's inbox slot (LSA), or this
    rank's outbox slot (GIN, put from there)."""
    if out.gin:
        return _box_at(proc, proc.outbox_at, out.number, sstep % proc.nslots)
    return _box_at(proc, proc.inbox_at, out.remote_number, sstep % proc.nslots)


# ---- the transport: waiting and publishing (the sync thread) -------------------------------------

# ``ctx`` is None in kernels built for one LSA team: numba then drops the GIN branches before
# typing them, which keeps GIN code (and its compile time) out of those kernels.

def _wait_kind(name, which, what, signal, ahead):
    """The wait ``name(proc, ctx, conn, step)``: until counter ``which`` of connection ``conn`` has
    reached ``step + 1``, less ``nslots`` slots with ``ahead`` (a sender runs ``nslots`` ahead).

    From a peer outside the LSA team the counter is GIN signal ``signal``; otherwise the peer
    releases it into this rank's state word, read here with acquire and bounded
    (:mod:`flowdsl.wait`, as ``what``): a wait that gives up returns, and the step goes on with
    stale data. The two waits are one body, made twice: the simulator's livelock hint names
    the function a thread spins in (``flowdsl/sim/hints.py``).
    """
    def wait_for(proc, ctx, conn, step):
        need = step + 1 - proc.nslots if ahead else step + 1
        if ahead and need <= 0:
            return
        if ctx is not None and conn.gin:
            gin.wait_signal(ctx, coop.thread(), signal(proc, conn.number), uint64(need))
        else:
            words = lsa.local_view(proc.stage)
            at = _state_at(proc, which, conn.number)
            seen = int64(mem.load_acquire(words, at, _SYS))
            state = uint64(0)
            while seen < need:
                state = wait.poll(proc.comm, state, what, conn.peer, conn.number, need, seen)
                if state == wait.GAVE_UP:
                    return
                seen = int64(mem.load_acquire(words, at, _SYS))

    wait_for.__name__ = wait_for.__qualname__ = name
    wait_for.__code__ = wait_for.__code__.replace(co_name=name)  # what the simulator reports
    return device(inline=False)(wait_for)


#: Until the receiver has freed the slot of send step ``step`` (consumed ``step + 1 - nslots`` slots).
_wait_credit = _wait_kind("_wait_credit", _CREDIT, wait.FLOW_CREDIT, _credit_signal, ahead=1)
#: Until the sender has posted the slot of receive step ``step``.
_wait_ready = _wait_kind("_wait_ready", _READY, wait.FLOW_READY, _ready_signal, ahead=0)


@device(inline=False)
def _give_credit(proc, ctx, inp, step):
    """Tell the sender the slot of ``step`` is read (release: the reads come first)."""
    if ctx is not None and inp.gin:
        gin.signal(ctx, team.world(proc.comm), inp.peer,
                   strong_signal_inc(_credit_signal(proc, inp.remote_number)), coop.thread())
    else:
        words = lsa.peer_view(proc.stage, inp.peer)
        mem.store_release(words, _state_at(proc, _CREDIT, inp.remote_number), uint64(step + 1), _SYS)


@device(inline=False)
def _post(proc, ctx, out, step, words):
    """Publish the slot of ``step``: GIN puts the outbox slot (``words`` long) with a strong signal;
    LSA releases a flag for SIMPLE (LL and LL128 lines carry their own flags)."""
    slot = step % proc.nslots
    if ctx is not None and out.gin:
        mem.fence(MemoryOrder.ACQ_REL, _SYS)  # the CTA's outbox stores before the NIC reads them
        gin.put(ctx, team.world(proc.comm), out.peer, proc.stage,
                _box_at(proc, proc.inbox_at, out.remote_number, slot) * 8, proc.stage,
                _box_at(proc, proc.outbox_at, out.number, slot) * 8, words * 8,
                remote=strong_signal_inc(_ready_signal(proc, out.remote_number)), coop=coop.thread())
    elif proc.protocol == Protocol.SIMPLE:
        _release_ready(proc, out, step)


@device(inline=False)
def _post_direct(proc, ctx, out, win, byte_offset, nbytes, step):
    """Publish a direct write: GIN puts ``win``'s bytes to the same place of the peer's ``win``
    with a strong signal; over LSA the stores are done and a flag releases them."""
    if ctx is not None and out.gin:
        mem.fence(MemoryOrder.ACQ_REL, _SYS)
        gin.put(ctx, team.world(proc.comm), out.peer, win, byte_offset, win, byte_offset, nbytes,
                remote=strong_signal_inc(_ready_signal(proc, out.remote_number)), coop=coop.thread())
    else:
        _release_ready(proc, out, step)


@device
def _release_ready(proc, out, step):
    flags = lsa.peer_view(proc.stage, out.peer)
    mem.store_release(flags, _state_at(proc, _READY, out.remote_number), uint64(step + 1), _SYS)


@device
def _wait_slot(proc, inp, out, rstep, sstep, recv, send):
    """Before a slot: the receiver has room for what this rank sends (credit), and what this
    rank receives has arrived (SIMPLE's flag, or GIN's signal; LL lines carry their flags)."""
    if send:
        _wait_credit(proc, proc.ctx, out, sstep)
    if recv and (proc.protocol == Protocol.SIMPLE or inp.gin):
        _wait_ready(proc, proc.ctx, inp, rstep)


@device
def _publish_slot(proc, inp, out, rstep, sstep, m, itemsize, recv, send):
    """After a slot: free the inbox slot for the sender, and post what was sent."""
    if recv:
        _give_credit(proc, proc.ctx, inp, rstep)
    if send:
        if proc.protocol == Protocol.LL:
            _clean_ll_slot(proc, out, sstep, m * ll_lines_per_element(itemsize))
        else:
            _clean_ll_slot(proc, out, sstep, 0)
        _post(proc, proc.ctx, out, sstep, _slot_words_used(proc, m, itemsize))


@device
def _clean_ll_slot(proc, out, sstep, keep):
    """At the steps :func:`ll_cleans` names, of any protocol (they share the step count), write the
    flag of ``sstep`` into every line of its LL slot past the ``keep`` that carry data (see
    :func:`ll_flag`). Over LSA only: over GIN the receiver reads a slot after the signal that covers
    its put, so no old line is read there. Two steps in four billion: the sync thread alone does it."""
    if out.gin or not ll_cleans(sstep, proc.nslots):
        return
    slot = ((proc.channel * MAX_CONNECTIONS + out.remote_number) * proc.nslots + sstep % proc.nslots)
    lines = lsa.peer_view(proc.stage, out.peer, proc.ll_at + slot * proc.ll_slot_words, proc.ll_slot_words)
    for line in range(keep, proc.ll_slot_words):
        mem.store_relaxed(lines, line, ll_line(uint64(0), ll_flag(sstep)), _SYS)


@device
def _workers_sync(proc):
    """Barrier of the worker threads alone (named barrier 1), or of the CTA when all work."""
    if proc.workers == cuda.blockDim.x:
        cuda.syncthreads()
    else:
        coop.sync(coop.warp_span(0, proc.workers // _WARP, 1))


# ---- the data-movement core: one slot ------------------------------------------------------------

@device
def _aligned(src, dst, offset):
    """Whether ``src[offset:]`` and ``dst[offset:]`` start on 16 bytes (16-byte packs possible)."""
    return ((mem.address(src, offset) | mem.address(dst, offset)) & uint64(15)) == uint64(0)


@device
def _pack_in(inbox, src, base, i, red, recv, reduce):
    """The 16-byte pack at element ``i`` of the slot: received, from ``src``, or their combination."""
    if recv and reduce:
        return combine_packs(red, mem.load_vec(inbox, i), mem.load_vec(src, base + i))
    if recv:
        return mem.load_vec(inbox, i)
    return mem.load_vec(src, base + i)


@device
def _pack_out(outbox, dst, base, i, x, red, send, store, last):
    """Store pack ``x`` (finished if ``last``) to ``dst`` and/or the outgoing slot."""
    if store:
        if last:
            x = finish_pack(red, x)
        mem.store_vec(dst, base + i, x)
    if send:
        mem.store_vec(outbox, i, x)


@device
def _element_in(inbox, src, base, i, red, recv, reduce):
    if recv and reduce:
        return combine(red.op, inbox[i], src[base + i], red.fp8)
    if recv:
        return inbox[i]
    return src[base + i]


@device
def _element_out(outbox, dst, base, i, v, red, send, store, last):
    if store:
        if last:
            v = finish(red.op, v, red.nranks, red.fp8)
        dst[base + i] = v
    if send:
        outbox[i] = v


@device
def _simple_move(proc, inbox, outbox, src, dst, base, m, red, vectors, recv, send, reduce, store, last):
    """SIMPLE: move ``m`` elements of one slot by the worker threads.

    16-byte packs, four per thread loaded before any is stored (loads in flight are what
    HBM and NVLink need); then single packs; then element by element. ``vectors``: the
    arrays are 16-byte aligned at ``base`` (slots always are).
    """
    tid = cuda.threadIdx.x
    workers = proc.workers
    lanes = 16 // dst.itemsize
    done = 0
    if vectors:
        npacks = m // lanes
        stride = workers * lanes
        i = tid * lanes
        while i + 3 * stride < npacks * lanes:
            x0 = _pack_in(inbox, src, base, i, red, recv, reduce)
            x1 = _pack_in(inbox, src, base, i + stride, red, recv, reduce)
            x2 = _pack_in(inbox, src, base, i + 2 * stride, red, recv, reduce)
            x3 = _pack_in(inbox, src, base, i + 3 * stride, red, recv, reduce)
            _pack_out(outbox, dst, base, i, x0, red, send, store, last)
            _pack_out(outbox, dst, base, i + stride, x1, red, send, store, last)
            _pack_out(outbox, dst, base, i + 2 * stride, x2, red, send, store, last)
            _pack_out(outbox, dst, base, i + 3 * stride, x3, red, send, store, last)
            i += 4 * stride
        while i < npacks * lanes:
            _pack_out(outbox, dst, base, i, _pack_in(inbox, src, base, i, red, recv, reduce), red, send, store,
                      last)
            i += stride
        done = npacks * lanes
    i = done + tid
    while i < m:
        _element_out(outbox, dst, base, i, _element_in(inbox, src, base, i, red, recv, reduce), red, send, store,
                     last)
        i += workers


#: LL flags run through ``1 .. LL_FLAG_CYCLE`` (:func:`ll_flag`): never 0, the flag of zeroed memory, and
#: below 2**32, the flag's half of a line. Even, so that each half of the cycle has a clean window.
LL_FLAG_CYCLE = 2**32 - 2
_LL_HALF_CYCLE = LL_FLAG_CYCLE // 2


@device
def ll_flag(step):
    """The flag of LL lines written at ``step`` (0, 1, ...: a connection's slot count, or a one-shot
    window's call count), counted on the device at both ends: ``1 + step % LL_FLAG_CYCLE``.

    Why a line from another step is never taken for this one: a reader accepts a line of slot
    ``step % nslots`` only when it carries ``ll_flag(step)``. The writer of an earlier step ``j``
    of the same slot left ``ll_flag(j)``, equal only if ``step - j`` is a multiple of the cycle;
    but the last ``nslots`` steps of every half cycle (:func:`ll_cleans`) rewrite their whole
    slot, so every slot is rewritten at least once between ``j`` and ``step``, and what it holds
    is newer than ``j``. Zeroed memory carries flag 0, which no step uses.
    """
    return uint64(1 + step % LL_FLAG_CYCLE)


@device
def ll_cleans(step, nslots):
    """Whether step ``step`` writes all the lines of its LL slot, not only those carrying data:
    the last ``nslots`` steps of each half of the flag cycle do (one for every slot), see
    :func:`ll_flag`, whatever protocol the step runs (a connection's protocols share its step
    count, so a half cycle of SIMPLE steps must clean the LL slots too). Two steps in four
    billion: no cost to speak of."""
    return step % _LL_HALF_CYCLE >= _LL_HALF_CYCLE - nslots


@device
def ll_line(bits, flag):
    """An LL line: 4 data bytes (the low half of ``bits``) and a 4-byte ``flag``, one uint64
    stored with one relaxed store, so a reader sees the data and the flag together."""
    return (uint64(flag) << uint64(32)) | (uint64(bits) & uint64(0xFFFFFFFF))


@device
def ll_read(comm, view, line, flag, peer):
    """Spin until LL line ``view[line]`` carries ``flag``; return its 4 data bytes.

    Bounded (:mod:`flowdsl.wait`) by device communicator ``comm``'s limit; ``peer`` is the
    world rank that writes the line (named when the wait gives up, which returns the
    line's data as it is).
    """
    w = mem.load_relaxed(view, line, _SYS)
    state = uint64(0)
    while (w >> uint64(32)) != flag:
        state = wait.poll(comm, state, wait.LL_LINE, peer, line, flag, w >> uint64(32))
        if state == wait.GAVE_UP:
            return w & uint64(0xFFFFFFFF)
        w = mem.load_relaxed(view, line, _SYS)
    wait.accepted(view, line, 1, peer)
    return w & uint64(0xFFFFFFFF)


@device
def ll_lines_per_element(itemsize):
    """LL lines one element takes (8-byte elements travel in two)."""
    return 2 if itemsize == 8 else 1


@device
def _ll_move(proc, inp, out, src, dst, base, m, red, rstep, sstep, recv, send, reduce, store, last):
    """LL: each element travels in 8-byte lines of 4 data bytes and the step's flag."""
    lines = ll_lines_per_element(dst.itemsize)
    words = proc.slot_words
    rflag = ll_flag(rstep)
    sflag = ll_flag(sstep)
    inbox = lsa.local_view(proc.stage, _inbox_at(proc, inp, rstep), words)
    if out.gin:
        outbox = lsa.local_view(proc.stage, _outbox_at(proc, out, sstep), words)
    else:
        outbox = lsa.peer_view(proc.stage, out.peer, _outbox_at(proc, out, sstep), words)
    i = cuda.threadIdx.x
    while i < m:
        if recv:
            bits = ll_read(proc.comm, inbox, i * lines, rflag, inp.peer)
            if lines == 2:
                bits |= ll_read(proc.comm, inbox, i * lines + 1, rflag, inp.peer) << uint64(32)
            v = mem.from_bits(bits, dst.dtype)
            if reduce:
                v = combine(red.op, v, src[base + i], red.fp8)
        else:
            v = src[base + i]
        if store:
            if last:
                v = finish(red.op, v, red.nranks, red.fp8)
            dst[base + i] = v
        if send:
            bits = mem.to_bits(v)
            mem.store_relaxed(outbox, i * lines, ll_line(bits, sflag), _SYS)
            if lines == 2:
                mem.store_relaxed(outbox, i * lines + 1, ll_line(bits >> uint64(32), sflag), _SYS)
        i += proc.workers


@device
def _ll128_move(proc, inp, out, src, dst, base, m, red, rstep, sstep, recv, send, reduce, store, last):
    """LL128: 128-byte lines of 15 data words and a flag word stored last, with release."""
    itemsize = dst.itemsize
    per_word = 8 // itemsize
    per_line = (_LL128_LINE - 1) * per_word
    width = uint64(8 * itemsize)
    mask = (uint64(1) << width) - uint64(1) if itemsize < 8 else ~uint64(0)
    words = proc.slot_words
    rflag = uint64(rstep + 1)
    sflag = uint64(sstep + 1)
    inbox = lsa.local_view(proc.stage, _inbox_at(proc, inp, rstep), words)
    if out.gin:
        outbox = lsa.local_view(proc.stage, _outbox_at(proc, out, sstep), words)
    else:
        outbox = lsa.peer_view(proc.stage, out.peer, _outbox_at(proc, out, sstep), words)
    nlines = (m + per_line - 1) // per_line
    line = cuda.threadIdx.x
    while line < nlines:
        at = line * _LL128_LINE
        if recv:
            _ll128_wait(proc, inp, inbox, at + _LL128_LINE - 1, rflag)
        for w in range(_LL128_LINE - 1):
            packed = uint64(0)
            word_in = inbox[at + w] if recv else uint64(0)
            for j in range(per_word):
                i = line * per_line + w * per_word + j
                if i < m:
                    if recv:
                        v = mem.from_bits(word_in >> (width * uint64(j)), dst.dtype)
                        if reduce:
                            v = combine(red.op, v, src[base + i], red.fp8)
                    else:
                        v = src[base + i]
                    if store:
                        if last:
                            v = finish(red.op, v, red.nranks, red.fp8)
                        dst[base + i] = v
                    packed |= (mem.to_bits(v) & mask) << (width * uint64(j))
            if send:
                outbox[at + w] = packed
        if send:
            mem.store_release(outbox, at + _LL128_LINE - 1, sflag, _SYS)
        line += proc.workers


@device
def _ll128_wait(proc, inp, inbox, at, flag):
    """Spin until the LL128 line whose flag word is ``inbox[at]`` carries ``flag`` (acquire); bounded."""
    seen = mem.load_acquire(inbox, at, _SYS)
    state = uint64(0)
    while seen != flag:
        state = wait.poll(proc.comm, state, wait.LL128_LINE, inp.peer, at, flag, seen)
        if state == wait.GAVE_UP:
            return
        seen = mem.load_acquire(inbox, at, _SYS)
    wait.accepted(inbox, at + 1 - _LL128_LINE, _LL128_LINE, inp.peer)  # the data words with their flag


@device
def _move(proc, inp, out, src, dst, base, m, red, rstep, sstep, vectors, recv, send, reduce, store, last):
    """Move one slot under the processor's protocol (worker threads only)."""
    if proc.protocol == Protocol.LL:
        _ll_move(proc, inp, out, src, dst, base, m, red, rstep, sstep, recv, send, reduce, store, last)
    elif proc.ll128 and proc.protocol == Protocol.LL128:  # a constant 0 drops this branch when linked
        _ll128_move(proc, inp, out, src, dst, base, m, red, rstep, sstep, recv, send, reduce, store, last)
    else:
        per_word = 8 // dst.itemsize
        inbox = lsa.local_view(proc.stage, _inbox_at(proc, inp, rstep) * per_word, m, dst.dtype)
        if out.gin:
            outbox = lsa.local_view(proc.stage, _outbox_at(proc, out, sstep) * per_word, m, dst.dtype)
        else:
            outbox = lsa.peer_view(proc.stage, out.peer, _outbox_at(proc, out, sstep) * per_word, m, dst.dtype)
        _simple_move(proc, inbox, outbox, src, dst, base, m, red, vectors, recv, send, reduce, store, last)


# ---- the steps: one specialised function per kind --------------------------------------------------

def _step_kind(name, recv, send, reduce, store, last):
    """The step ``name``: receive from ``inp`` (``recv``), combine with ``src`` (``reduce``),
    store to ``dst`` (``store``, finished if ``last``) and send on ``out`` (``send``).

    The flags are constants of the function made here, so every branch on them folds
    at compile time. Slots are pipelined as in NCCL's SIMPLE primitives: thread 0 (a
    worker) waits until slot k is ready and the workers sync on their own barrier; they
    move it; a block barrier joins them with the sync warp, whose first thread publishes
    slot k (fence, flag, credit) while the workers go on with slot k+1. Waiting for k+1
    needs only what was published up to k-1, so the two never wait on each other. The
    step counters are read once (after the barrier that makes the previous step's update
    visible), and only those of the directions this step uses are read and written back:
    each counter belongs to the one block that uses its direction.
    """
    def step(proc, inp, out, src, dst, offset, n, red):
        tid = cuda.threadIdx.x
        cuda.syncthreads()
        state = lsa.local_view(proc.stage)
        # Only the counters of this step's directions: another block may own the others (a rank
        # sending to itself), and reading them would race with its writes.
        rstep = int64(state[_state_at(proc, _RECEIVED, inp.number)]) if recv else int64(0)
        sstep = int64(state[_state_at(proc, _SENT, out.number)]) if send else int64(0)
        per_slot = slot_elements(proc, dst.itemsize)
        vectors = _aligned(src, dst, offset)
        if tid == 0 and n > 0:
            _wait_slot(proc, inp, out, rstep, sstep, recv, send)
        done = 0
        while done < n:
            m = min(per_slot, n - done)
            if tid < proc.workers:
                _workers_sync(proc)
                _move(proc, inp, out, src, dst, offset + done, m, red, rstep, sstep, vectors, recv, send, reduce,
                      store, last)
            cuda.syncthreads()
            if tid == proc.sync_thread:
                _publish_slot(proc, inp, out, rstep, sstep, m, dst.itemsize, recv, send)
            if tid == 0 and done + m < n:
                _wait_slot(proc, inp, out, rstep + recv, sstep + send, recv, send)
            rstep += recv
            sstep += send
            done += m
        if tid == proc.sync_thread and n > 0:  # n == 0: nothing moved, and no barrier since the reads above
            if recv:
                state[_state_at(proc, _RECEIVED, inp.number)] = uint64(rstep)
            if send:
                state[_state_at(proc, _SENT, out.number)] = uint64(sstep)

    step.__name__ = step.__qualname__ = f"_step_{name}"
    return device(inline=False)(step)


_send_step = _step_kind("send", recv=0, send=1, reduce=0, store=0, last=0)
_recv_step = _step_kind("recv", recv=1, send=0, reduce=0, store=1, last=0)
_copy_send_step = _step_kind("copy_send", recv=0, send=1, reduce=0, store=1, last=0)
_recv_reduce_send_step = _step_kind("recv_reduce_send", recv=1, send=1, reduce=1, store=0, last=0)
_recv_reduce_copy_step = _step_kind("recv_reduce_copy", recv=1, send=0, reduce=1, store=1, last=1)
_recv_reduce_copy_send_step = _step_kind("recv_reduce_copy_send", recv=1, send=1, reduce=1, store=1, last=1)
_recv_copy_send_step = _step_kind("recv_copy_send", recv=1, send=1, reduce=0, store=1, last=0)


@device
def send(proc, out, src, offset, n):
    """Send ``src[offset:offset+n]`` on ``out``."""
    _send_step(proc, out, out, src, src, offset, n, reduction(RedOp.SUM, 1))


@device
def recv(proc, inp, dst, offset, n):
    """Receive ``n`` elements from ``inp`` into ``dst[offset:]``."""
    _recv_step(proc, inp, inp, dst, dst, offset, n, reduction(RedOp.SUM, 1))


@device
def copy_send(proc, out, src, dst, offset, n):
    """``dst[offset:offset+n] = src[...]`` and send the same elements on ``out``."""
    _copy_send_step(proc, out, out, src, dst, offset, n, reduction(RedOp.SUM, 1))


@device
def recv_reduce_send(proc, inp, out, src, offset, n, red):
    """Receive from ``inp``, combine with ``src`` by ``red``, send the result on ``out``."""
    _recv_reduce_send_step(proc, inp, out, src, src, offset, n, red)


@device
def recv_reduce_copy(proc, inp, src, dst, offset, n, red):
    """Receive from ``inp``, combine with ``src``, finish (``AVG`` divides) into ``dst``."""
    _recv_reduce_copy_step(proc, inp, inp, src, dst, offset, n, red)


@device
def recv_reduce_copy_send(proc, inp, out, src, dst, offset, n, red):
    """Receive, combine with ``src``, finish into ``dst`` and send the finished values on ``out``."""
    _recv_reduce_copy_send_step(proc, inp, out, src, dst, offset, n, red)


@device
def recv_copy_send(proc, inp, out, dst, offset, n):
    """Receive into ``dst`` and send the same elements on ``out``."""
    _recv_copy_send_step(proc, inp, out, dst, dst, offset, n, reduction(RedOp.SUM, 1))


# ---- direct steps --------------------------------------------------------------------------------

@device(inline=False)
def _direct_step(proc, inp, out, src, src_offset, win, offset, n, flags):
    """One direct step over ``win[offset:offset+n]`` (the same place on every rank).

    ``flags`` = (recv, send, copy-from-src). Receiving waits until the sender's elements
    are in this rank's ``win``; copying stores ``src[src_offset:]`` there first; sending
    writes this rank's elements into the receiver's ``win`` (LSA stores, or one GIN put
    from this rank's ``win``) and publishes them with one flag or strong signal. One
    slot's credit per call, so a sender runs at most ``nslots`` calls ahead.
    """
    has_recv, has_send, has_copy = flags[0], flags[1], flags[2]
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    cuda.syncthreads()
    state = lsa.local_view(proc.stage)
    rstep = int64(state[_state_at(proc, _RECEIVED, inp.number)]) if has_recv else int64(0)
    sstep = int64(state[_state_at(proc, _SENT, out.number)]) if has_send else int64(0)
    if tid == 0:
        if has_recv:
            _wait_ready(proc, proc.ctx, inp, rstep)
        if has_send:
            _wait_credit(proc, proc.ctx, out, sstep)
    cuda.syncthreads()
    mine = lsa.local_view(win, offset, n)
    if has_copy:
        for i in range(tid, n, nt):
            mine[i] = src[src_offset + i]
    if has_send and not out.gin:
        theirs = lsa.peer_view(win, out.peer, offset, n)
        for i in range(tid, n, nt):
            theirs[i] = mine[i]
    cuda.syncthreads()
    if tid == 0:
        if has_recv:
            _give_credit(proc, proc.ctx, inp, rstep)
            state[_state_at(proc, _RECEIVED, inp.number)] = uint64(rstep + 1)
        if has_send:
            _clean_ll_slot(proc, out, sstep, 0)
            _post_direct(proc, proc.ctx, out, win, offset * mine.itemsize, n * mine.itemsize, sstep)
            state[_state_at(proc, _SENT, out.number)] = uint64(sstep + 1)


@device
def direct_send(proc, out, win, offset, n):
    """Write this rank's ``win[offset:offset+n]`` into ``out``'s receiver's ``win`` at the same place.

    Direct steps skip the staging slots: ``win`` is a registered window (the output)
    with the same layout on every rank.
    """
    _direct_step(proc, out, out, lsa.local_view(win), 0, win, offset, n, (0, 1, 0))


@device
def direct_copy_send(proc, out, src, src_offset, win, offset, n):
    """``win[offset:offset+n] = src[src_offset:src_offset+n]`` here and in ``out``'s receiver's ``win``."""
    _direct_step(proc, out, out, src, src_offset, win, offset, n, (0, 1, 1))


@device
def direct_recv(proc, inp, win, offset, n):
    """Wait until ``inp``'s sender has written ``win[offset:offset+n]`` here."""
    _direct_step(proc, inp, inp, lsa.local_view(win), 0, win, offset, n, (1, 0, 0))


@device
def direct_recv_copy_send(proc, inp, out, win, offset, n):
    """Wait for ``win[offset:offset+n]`` from ``inp``, then write it into ``out``'s receiver's ``win``."""
    _direct_step(proc, inp, out, lsa.local_view(win), 0, win, offset, n, (1, 1, 0))


@device
def copy(src, src_offset, dst, dst_offset, n, first, stride, vectors):
    """``dst[dst_offset + i] = src[src_offset + i]`` for ``i < n``, by threads ``first, first+stride, ...``.

    With ``vectors`` (both arrays start 16-byte aligned, which the host checks), elements
    move in 16-byte vectors where the offsets allow; the rest element by element.
    """
    lanes = 16 // src.itemsize
    done = 0
    if vectors and (src_offset % lanes) == 0 and (dst_offset % lanes) == 0:
        nvec = n // lanes
        v = first
        # Four loads in flight per thread before their stores: HBM needs megabytes in flight.
        while v + 3 * stride < nvec:
            a = mem.load_vec(src, src_offset + v * lanes)
            b = mem.load_vec(src, src_offset + (v + stride) * lanes)
            c = mem.load_vec(src, src_offset + (v + 2 * stride) * lanes)
            d = mem.load_vec(src, src_offset + (v + 3 * stride) * lanes)
            mem.store_vec(dst, dst_offset + v * lanes, a)
            mem.store_vec(dst, dst_offset + (v + stride) * lanes, b)
            mem.store_vec(dst, dst_offset + (v + 2 * stride) * lanes, c)
            mem.store_vec(dst, dst_offset + (v + 3 * stride) * lanes, d)
            v += 4 * stride
        while v < nvec:
            mem.store_vec(dst, dst_offset + v * lanes, mem.load_vec(src, src_offset + v * lanes))
            v += stride
        done = nvec * lanes
    i = done + first
    while i < n:
        dst[dst_offset + i] = src[src_offset + i]
        i += stride
