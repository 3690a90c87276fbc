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
connection).

Staging: every connection has ``nslots`` slots in the receiver's window; the
sender may run ``nslots`` slots ahead of the receiver (credits). Counters and flags
live in the window, so connections continue where the previous launch stopped. The
window comes from :func:`staging` (allocated, zeroed, registered); a processor
over any other window is refused (it would start from garbage counters).
Protocols (:class:`flowdsl.Protocol`; their wire formats in ``flowdsl/_flow_wire.py``):
``SIMPLE`` writes a slot's elements, then a release flag; ``LL`` writes 16-byte lines
of 8 data bytes beside two copies of the step's flag, one store each, so the receiver
needs no flag of its own; ``LL128`` writes 128-byte lines of 120 data bytes whose last
8 bytes are the flag, a warp filling each line in one store. LL slots are at most
:data:`LL_SLOT_BYTES`, LL128 slots :data:`LL128_SLOT_BYTES`.

Each warp owns a fixed part of every slot (``_flow_wire.part_words``) and has its own
ready and credit flag for it over LSA: lane 0 waits for the part's credit (sending) and
ready flag (receiving SIMPLE), the warp moves its part, and lane 0 posts the part's
credit back and its ready flag on, with no barrier of the block per slot. Both ends of a
connection must run blocks of the same number of warps (at most :data:`MAX_PARTS`; the
collectives do). Over GIN the network moves whole slots: thread 0 waits for the slot's
signal, the block moves it, and thread 0 puts it (or signals its credit) after a block
barrier.

Freshness (why a receiver never takes data another step left): every slot is named by its
connection's step counter, which both ends keep in the staging window (on the device: CUDA
graph replays and every grid, count, dtype and channel count advance it alike), never by a
launch's grid or a block. SIMPLE's data is read after the part's 64-bit ready flag passed
the step; LL128's 64-bit line flag is ``step + 1`` (it does not wrap); LL's 32-bit line flags
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
:func:`finish`, :func:`premul` (uint16 elements are bfloat16 bits: NCCL has no uint16; uint8
elements are fp8 when the :class:`Reduction` says so).

What a step does (receive? send? reduce? store? finish?) is fixed when it is compiled:
each step is its own specialised function, so the inner loops have no run-time flags. A
:func:`reduction` carries its operator and fp8 format in its type on the GPU, so each
operator gets its own loop too.

``PREMULSUM`` (NCCL's pre-multiplied sum): a step applies its reduction's :func:`premul` where it
reads ``src``, this rank's own input, and never to what it receives, as NCCL applies its
pre-op where the user's input is loaded. A program passes :func:`unscaled` of the reduction
to a step whose ``src`` is a partial result already multiplied (the tree's second child), and
the reduction to the first :func:`send` of a reduce chain. For every other operator
:func:`premul` is no code at all.

Every wait (credit, ready flag or signal, LL and LL128 line flags) is bounded
(:mod:`flowdsl.wait`): after the communicator's limit it gives up, and the host
raises :class:`flowdsl.DeviceTimeoutError` naming the connection and the peer.

Layout of the staging window (uint64 words): per (channel, connection) its counters and
flags, then the inbox slots of each protocol, then (when GIN is possible) the outbox slots
GIN puts are made from. :func:`staging_words` gives its size.
"""

from __future__ import annotations

from collections import namedtuple

from numba import cuda, int64, uint32, uint64

from . import _flow_wire as wire
from . import coop, gin, lsa, mem, team, wait
from ._devices import device
from ._flow_elements import (E4M3, E5M2, Reduction, bad_channel, bad_connection, bad_layout, combine, combine_packs,
                             connection_ends, finish, finish_pack, from_float, missing_gin_context, premul, premul_only,
                             premul_pack, reduction, step_ends, to_float, unscaled)
from ._flow_staging import (CREDIT, LL128_SLOT_BYTES, LL_SLOT_BYTES, MAX_CONNECTIONS, MAX_PARTS, READY, RECEIVED, SENT,
                            Staging, counter_word, flag_word, protocol_slot_words, region_words, staging, staging_words,
                            state_words)
from ._flow_staging import require_staging as _require_staging
from .enums import MemoryOrder, Protocol, RedOp, ThreadScope

__all__ = [
    "MAX_CONNECTIONS", "MAX_PARTS", "LL_SLOT_BYTES", "LL128_SLOT_BYTES", "Processor", "Connection", "Reduction",
    "Staging", "staging", "staging_words", "processor",
    "connect", "bad_connection", "bad_layout", "bad_channel", "step_ends", "connection_ends", "missing_gin_context",
    "reduction", "to_float", "from_float", "combine", "finish", "combine_packs",
    "finish_pack", "premul", "premul_pack", "unscaled", "strong_signal_inc",
    "slot_elements", "ll_line", "ll_read", "ll_lines_per_element", "ll_flag", "ll_cleans", "LL_FLAG_CYCLE",
    "E4M3", "E5M2",
    "send", "recv", "copy_send", "recv_reduce_send", "recv_reduce_copy", "recv_reduce_copy_send",
    "recv_copy_send", "recv_send", "copy", "direct_send", "direct_recv", "direct_copy_send", "direct_recv_copy_send",
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

_SYS = ThreadScope.SYSTEM
_WARP = 32

Processor = namedtuple("Processor", ["comm", "stage", "ctx", "channel", "nchannels", "channels", "nslots",
                                     "slot_words", "protocol", "inbox_at", "outbox_at", "parts", "ll128", "ll_at",
                                     "ll_slot_words"])
Processor.__doc__ = """One CTA's side of Flow: its channel, staging window and protocol (see :func:`processor`).

``slot_words`` and ``inbox_at`` / ``outbox_at`` are those of the processor's protocol;
``parts``: the warps of the block, one part of every slot each; ``ll128`` 0: the kernel
holds no LL128 code; ``ll_at`` and ``ll_slot_words``: where the LL inboxes start and their
slots' size, whatever the protocol (every step may clean an LL slot: :func:`ll_cleans`)."""
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
        slot_words: Size of one SIMPLE slot in uint64 words (a multiple of 16); LL slots are
            at most :data:`LL_SLOT_BYTES`, LL128 slots :data:`LL128_SLOT_BYTES`.
        protocol: A :class:`flowdsl.Protocol`.
        channel: The channel to use instead of ``blockIdx.x`` (two blocks may then hold the
            two ends of one connection, e.g. a rank sending to itself).
        ll128: 0 leaves LL128's code out of the kernel: pass it as a constant (as the
            collectives do for calls that do not ask for LL128); the link carries it into
            every step, and LL128 is a third to a half of a kernel's link time. Such a
            processor runs a ``Protocol.LL128`` request as LL.

    The block's whole warps (a partial last warp sits out), at most :data:`MAX_PARTS` of them, do
    Flow's work (more sit out the steps), and both ends of a connection run as many.
    """
    _require_staging(stage)
    needed = staging_words(channels, nslots, slot_words, False)
    held = lsa.local_view(stage).size
    if needed > held or nslots < 2 or slot_words < 16 or slot_words % 16:  # a layout past the window: refused
        bad_layout(channels, nslots, slot_words, needed, held)
    if not ll128 and protocol == Protocol.LL128:
        protocol = Protocol.LL
    state = state_words(channels)
    simple = region_words(channels, nslots, slot_words, Protocol.SIMPLE)
    before = 0  # words of the protocols laid out before this one
    if protocol >= Protocol.LL:
        before += simple
    if protocol >= Protocol.LL128:
        before += region_words(channels, nslots, slot_words, Protocol.LL)
    boxes = staging_words(channels, nslots, slot_words, False) - state
    mine = cuda.blockIdx.x if channel < 0 else channel
    if mine >= channels:  # another channel's slots, or past the staging: refused, not raced over
        bad_channel(mine, channels)
    parts = min(max(1, cuda.blockDim.x // _WARP), MAX_PARTS)
    return Processor(comm, stage, ctx, mine, cuda.gridDim.x, channels, nslots,
                     protocol_slot_words(slot_words, protocol), protocol, state + before,
                     state + boxes + before, parts, ll128, state + simple,
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
    if not (0 <= peer < comm.nranks and 0 <= number < MAX_CONNECTIONS and 0 <= remote_number < MAX_CONNECTIONS):
        bad_connection(peer, number, remote_number, comm.nranks - 1)  # an inbox past the staging is another's
    first = comm.rank - comm.lsa_rank
    remote = 0 if first <= peer < first + comm.lsa_size else 1
    if remote and proc.ctx is None:  # only GIN reaches it: stop here, naming the fix, not in a step later
        missing_gin_context(peer)
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
    return wire.part_elements(proc.slot_words, itemsize, proc.protocol)


@device
def _slot_words_used(proc, m, itemsize):
    """Words of a slot that carry ``m`` elements (what a GIN put must move)."""
    if proc.protocol == Protocol.SIMPLE:
        return (m * itemsize + 7) // 8
    return proc.slot_words  # LL and LL128 lines are spread over the slot's parts


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


# ---- the transport: waiting and posting ----------------------------------------------------------

# ``ctx`` is None in kernels built for one LSA team: numba then drops the GIN branches before
# typing them, which keeps GIN code (and its compile time) out of those kernels.

@device
def _over_gin(ctx, conn):
    """Whether ``conn`` runs over GIN (never in a kernel without a GIN context)."""
    if ctx is not None and conn.gin:
        return True
    return False


def _wait_kind(name, which, what, signal, ahead):
    """The wait ``name(proc, ctx, conn, step, part)``: until flag ``which`` of part ``part`` of
    connection ``conn`` has reached ``step + 1``, less ``nslots`` slots with ``ahead`` (a sender
    runs ``nslots`` ahead).

    From a peer outside the LSA team the whole slot's flag is GIN signal ``signal``; otherwise
    the peer releases the part's flag into this rank's state, read here with acquire and
    bounded (:mod:`flowdsl.wait`, as ``what``): a wait that gives up returns, and the step goes
    on with stale data. The two waits are one body, made twice: the simulator's livelock hint
    names the function a thread spins in (``flowdsl/sim/hints.py``).
    """
    def wait_for(proc, ctx, conn, step, part):
        need = step + 1 - proc.nslots if ahead else step + 1
        if ahead and need <= 0:
            return
        if ctx is not None and conn.gin:
            gin.wait_signal(ctx, coop.thread(), signal(proc, conn.number), uint64(need))
        else:
            words = lsa.local_view(proc.stage)
            at = flag_word(proc.channel, conn.number, which, part)
            seen = int64(mem.load_acquire(words, at, _SYS))
            state = uint64(0)
            while seen < need:
                state = wait.poll(proc.comm, state, what, conn.peer, conn.number, need, seen)
                if state == wait.GAVE_UP:
                    return
                seen = int64(mem.load_acquire(words, at, _SYS))

    wait_for.__name__ = wait_for.__qualname__ = name
    wait_for.__code__ = wait_for.__code__.replace(co_name=name)  # what the simulator reports
    return device(wait_for)  # inline: an out-of-line call per slot cost more than its loop


#: Until the receiver has freed the slot (part) of send step ``step`` (consumed ``step + 1 - nslots``).
_wait_credit = _wait_kind("_wait_credit", CREDIT, wait.FLOW_CREDIT, _credit_signal, ahead=1)
#: Until the sender has posted the slot (part) of receive step ``step``.
_wait_ready = _wait_kind("_wait_ready", READY, wait.FLOW_READY, _ready_signal, ahead=0)


@device(inline=False)
def _give_credit(proc, ctx, inp, step, part):
    """Tell the sender part ``part`` of the slot of ``step`` is read (release: the reads come first);
    over GIN the whole slot, by signal."""
    if ctx is not None and inp.gin:
        gin.signal(ctx, team.world(proc.comm), inp.peer,
                   strong_signal_inc(_credit_signal(proc, inp.remote_number)), coop.thread())
    else:
        words = lsa.peer_view(proc.stage, inp.peer)
        mem.store_release(words, flag_word(proc.channel, inp.remote_number, CREDIT, part), uint64(step + 1), _SYS)


@device(inline=False)
def _post_slot(proc, ctx, out, step, words):
    """GIN: put the outbox slot of ``step`` (``words`` long) with a strong signal that covers it."""
    if ctx is not None and out.gin:
        slot = step % proc.nslots
        mem.fence(MemoryOrder.ACQ_REL, _SYS)  # the CTA's outbox stores before the NIC reads them
        gin.put(ctx, team.world(proc.comm), out.peer, proc.stage,
                _box_at(proc, proc.inbox_at, out.remote_number, slot) * 8, proc.stage,
                _box_at(proc, proc.outbox_at, out.number, slot) * 8, words * 8,
                remote=strong_signal_inc(_ready_signal(proc, out.remote_number)), coop=coop.thread())


@device
def _release_ready(proc, out, step, part):
    """LSA: release part ``part`` of the slot of ``step`` to the receiver (its data stores first)."""
    flags = lsa.peer_view(proc.stage, out.peer)
    mem.store_release(flags, flag_word(proc.channel, out.remote_number, READY, part), uint64(step + 1), _SYS)


@device(inline=False)
def _post_direct(proc, ctx, out, win, byte_offset, nbytes, step):
    """Publish a direct write: GIN puts ``win``'s bytes to the same place of the peer's ``win``
    with a strong signal; over LSA the stores are done and every part's flag releases them."""
    if ctx is not None and out.gin:
        mem.fence(MemoryOrder.ACQ_REL, _SYS)
        gin.put(ctx, team.world(proc.comm), out.peer, win, byte_offset, win, byte_offset, nbytes,
                remote=strong_signal_inc(_ready_signal(proc, out.remote_number)), coop=coop.thread())
    else:
        for part in range(proc.parts):
            _release_ready(proc, out, step, part)


# ---- a warp's part of every slot, and one slot ------------------------------------------------------

Part = namedtuple("Part", ["part", "lane", "w0", "words", "inboxes", "outboxes", "flags", "credit_to", "ready_to",
                           "ready_at", "credit_at", "credit_post_at", "ready_post_at"])
Part.__doc__ = """What a warp needs of a step's connections, worked out once a step (``_part``).

``part``: the warp's part of every slot (its words ``[w0, w0 + words)``);
``inboxes`` / ``outboxes``: views of all the slots of the receive and send connection (the peer's
inbox over LSA, this rank's outbox over GIN) in the protocol's word type; ``flags``: this rank's
state; ``credit_to`` / ``ready_to``: the state of the peers the part's credit and ready flag go to;
the ``*_at``: those flags' words."""


@device
def _part(proc, inp, out, dtype, per, recv, send):
    """This warp's :class:`Part` for a step on ``inp`` (``recv``) and ``out`` (``send``) (``dtype``: the
    word type of the protocol's slots, ``per`` of them a uint64 word). Only the directions the step
    uses get views of their own; the others hold the state view, never read."""
    part = cuda.threadIdx.x // _WARP
    qw = wire.part_words(proc.slot_words, proc.parts, proc.protocol)
    w0 = min(part * qw, proc.slot_words)
    span = proc.nslots * proc.slot_words * per
    flags = lsa.local_view(proc.stage)
    unused = lsa.local_view(proc.stage, 0, span, dtype)
    inboxes = unused
    if recv:
        inboxes = lsa.local_view(proc.stage, _box_at(proc, proc.inbox_at, inp.number, 0) * per, span, dtype)
    outboxes = unused
    if send and out.gin:
        outboxes = lsa.local_view(proc.stage, _box_at(proc, proc.outbox_at, out.number, 0) * per, span, dtype)
    elif send:
        outboxes = lsa.peer_view(proc.stage, out.peer, _box_at(proc, proc.inbox_at, out.remote_number, 0) * per, span,
                                 dtype)
    ch = proc.channel
    credit_to = flags if not recv or inp.gin else lsa.peer_view(proc.stage, inp.peer)  # GIN: signals, no views
    ready_to = flags if not send or out.gin or proc.protocol != Protocol.SIMPLE else lsa.peer_view(proc.stage,
                                                                                                   out.peer)
    return Part(part, cuda.threadIdx.x % _WARP, w0, min(qw, proc.slot_words - w0), inboxes, outboxes, flags,
                credit_to, ready_to,
                flag_word(ch, inp.number, READY, part), flag_word(ch, out.number, CREDIT, part),
                flag_word(ch, inp.remote_number, CREDIT, part), flag_word(ch, out.remote_number, READY, part))


def _protocol_slots(name, make_part, move):
    """The slot loop of one protocol: ``make_part(proc, inp, out, dst, recv, send)`` gives the warp's
    :class:`Part` (its views in the protocol's word type), ``move`` moves the part of a slot
    (``flowdsl/_flow_wire.py``). One loop is made per protocol so that each is typed with its
    own views."""
    def slot(proc, ctx, pt, inp, out, src, dst, base, m, red, rstep, sstep, rslot, sslot, vectors, recv, send,
             reduce, store, last, credit_seen, ready_seen):
        """One slot of ``m`` elements (``src`` and ``dst`` at element ``base``): receive step ``rstep``
        from inbox slot ``rslot``, send step ``sstep`` into slot ``sslot``. Returns the part's credit and
        ready flag as lane 0 last saw them (``credit_seen``, ``ready_seen``: as it saw them before).

        Over LSA each warp waits for its part's credit (sending) and ready flag (receiving SIMPLE;
        LL and LL128 lines carry their flags), moves its part, and posts the part's credit back
        and ready flag on: no block barrier. A flag is loaded only when what lane 0 saw of it last
        does not cover this slot: one acquire of credit ``c`` covers the slots up to ``c + nslots - 1``,
        one of ready flag ``r`` the slots up to ``r - 1`` (the peer's warp posted them in order, after
        their data), so most slots start without a round trip to memory. The flags are read inline;
        only a wait that must spin calls the bounded loop. A side over GIN moves the whole slot:
        thread 0 waits for its signal first, and after a block barrier puts the slot or signals its
        credit.
        """
        tid = cuda.threadIdx.x
        gin_in = recv and _over_gin(ctx, inp)
        gin_out = send and _over_gin(ctx, out)
        if gin_in or gin_out:
            if tid == 0:
                if gin_out:
                    _wait_credit(proc, ctx, out, sstep, 0)
                if gin_in:
                    _wait_ready(proc, ctx, inp, rstep, 0)
            cuda.syncthreads()
        if pt.part < proc.parts:
            if pt.lane == 0:
                if send and not gin_out and sstep + 1 - proc.nslots > credit_seen:
                    credit_seen = int64(mem.load_acquire(pt.flags, pt.credit_at, _SYS))
                    if sstep + 1 - proc.nslots > credit_seen:
                        _wait_credit(proc, ctx, out, sstep, pt.part)
                        credit_seen = sstep + 1 - proc.nslots
                if recv and not gin_in and proc.protocol == Protocol.SIMPLE and rstep + 1 > ready_seen:
                    ready_seen = int64(mem.load_acquire(pt.flags, pt.ready_at, _SYS))
                    if rstep + 1 > ready_seen:
                        _wait_ready(proc, ctx, inp, rstep, pt.part)
                        ready_seen = rstep + 1
            cuda.syncwarp()
            move(proc, pt, inp, out, src, dst, base, m, red, rstep, sstep, rslot, sslot, vectors, recv, send, reduce,
                 store, last)
            if send and not gin_out and ll_cleans(sstep, proc.nslots) and proc.protocol != Protocol.LL:
                _clean_ll_part(proc, out, sstep, pt.part, pt.lane)
            cuda.syncwarp()
            if pt.lane == 0:
                if recv and not gin_in:
                    if proc.protocol == Protocol.SIMPLE:  # plain loads of the slot: released
                        mem.store_release(pt.credit_to, pt.credit_post_at, uint64(rstep + 1), _SYS)
                    else:
                        # LL and LL128 lines are read and written by strong (relaxed) accesses, which
                        # cannot race, and a line is taken only with its step's flag: a relaxed
                        # credit, as NCCL posts its credits. A release would wait for the part's
                        # stores to dst to drain, every slot (LL: 0.56 -> 0.91 of the reference on
                        # an H100).
                        mem.store_relaxed(pt.credit_to, pt.credit_post_at, uint64(rstep + 1), _SYS)
                if send and not gin_out and proc.protocol == Protocol.SIMPLE:
                    mem.store_release(pt.ready_to, pt.ready_post_at, uint64(sstep + 1), _SYS)
        if gin_in or gin_out:
            cuda.syncthreads()
            if tid == 0:
                if gin_in:
                    _give_credit(proc, ctx, inp, rstep, 0)
                if gin_out:
                    _post_slot(proc, ctx, out, sstep, _slot_words_used(proc, m, mem.itemsize(dst)))
        return credit_seen, ready_seen

    slot.__name__ = slot.__qualname__ = f"_slot_{name}"
    slot = device(slot)

    def slots(proc, inp, out, src, dst, offset, n, red, rstep, sstep, recv, send, reduce, store, last):
        """The step's ``n`` elements, slot after slot; returns how many slots."""
        pt = make_part(proc, inp, out, dst, recv, send)
        per_slot = slot_elements(proc, mem.itemsize(dst))
        vectors = _aligned(src, dst, offset)
        rslot = rstep % proc.nslots
        sslot = sstep % proc.nslots
        k = 0
        done = 0
        credit_seen = int64(0)  # nothing seen yet: the first slot that needs a flag loads it
        ready_seen = int64(0)
        while done < n:
            m = min(per_slot, n - done)
            credit_seen, ready_seen = slot(proc, proc.ctx, pt, inp, out, src, dst, offset + done, m, red,
                                           rstep + k * recv, sstep + k * send, rslot, sslot, vectors, recv, send,
                                           reduce, store, last, credit_seen, ready_seen)
            rslot = rslot + 1 if rslot + 1 < proc.nslots else 0
            sslot = sslot + 1 if sslot + 1 < proc.nslots else 0
            k += 1
            done += m
        return k

    slots.__name__ = slots.__qualname__ = f"_slots_{name}"
    return device(slots)


@device
def _simple_views(proc, inp, out, dst, recv, send):
    return _part(proc, inp, out, dst.dtype, 8 // mem.itemsize(dst), recv, send)


@device
def _ll_views(proc, inp, out, dst, recv, send):
    return _part(proc, inp, out, uint32, 2, recv, send)


@device
def _ll128_views(proc, inp, out, dst, recv, send):
    return _part(proc, inp, out, uint64, 1, recv, send)


@device
def _move_simple(proc, pt, inp, out, src, dst, base, m, red, rstep, sstep, rslot, sslot, vectors, recv, send, reduce,
                 store, last):
    words = proc.slot_words * (8 // mem.itemsize(dst))
    lo = min(wire.part_elements(pt.w0, mem.itemsize(dst), Protocol.SIMPLE), m)
    hi = min(lo + wire.part_elements(pt.words, mem.itemsize(dst), Protocol.SIMPLE), m)
    wire.simple_part(pt.inboxes, rslot * words, pt.outboxes, sslot * words, src, dst, base, lo, hi, pt.lane, red,
                     vectors, recv, send, reduce, store, last)


@device
def _move_ll(proc, pt, inp, out, src, dst, base, m, red, rstep, sstep, rslot, sslot, vectors, recv, send, reduce,
             store, last):
    wire.ll_part(proc.comm, inp.peer, pt.inboxes, (rslot * proc.slot_words + pt.w0) * 2, pt.outboxes,
                 (sslot * proc.slot_words + pt.w0) * 2, src, dst, base,
                 wire.part_elements(pt.w0, mem.itemsize(dst), Protocol.LL), pt.words // 4, m, pt.lane, red,
                 uint32(ll_flag(rstep)), uint32(ll_flag(sstep)), vectors, recv, send, reduce, store, last,
                 send and ll_cleans(sstep, proc.nslots))


@device
def _move_ll128(proc, pt, inp, out, src, dst, base, m, red, rstep, sstep, rslot, sslot, vectors, recv, send, reduce,
                store, last):
    wire.ll128_part(proc.comm, inp.peer, pt.inboxes, rslot * proc.slot_words + pt.w0, pt.outboxes,
                    sslot * proc.slot_words + pt.w0, src, dst, base,
                    wire.part_elements(pt.w0, mem.itemsize(dst), Protocol.LL128), pt.words // wire.LL128_PASS_WORDS, m,
                    pt.lane, red, uint64(rstep + 1), uint64(sstep + 1), vectors, recv, send, reduce, store, last)


_slots_simple = _protocol_slots("simple", _simple_views, _move_simple)
_slots_ll = _protocol_slots("ll", _ll_views, _move_ll)
_slots_ll128 = _protocol_slots("ll128", _ll128_views, _move_ll128)


@device
def _clean_ll_part(proc, out, sstep, part, lane):
    """At the steps :func:`ll_cleans` names that run SIMPLE or LL128 (a connection's protocols share
    its step count), write the step's flag into every line of this warp's part of its LL slot, as an
    LL step there does (see :func:`ll_flag`). Over LSA only: over GIN a receiver reads a slot after
    the signal that covers its put, so no old line is read there."""
    qw = wire.part_words(proc.ll_slot_words, proc.parts, Protocol.LL)
    w0 = min(part * qw, proc.ll_slot_words)
    words = min(qw, proc.ll_slot_words - w0)
    slot = (proc.channel * MAX_CONNECTIONS + out.remote_number) * proc.nslots + sstep % proc.nslots
    lines = lsa.peer_view(proc.stage, out.peer, (proc.ll_at + slot * proc.ll_slot_words + w0) * 2, words * 2, uint32)
    flag = uint32(ll_flag(sstep))
    for j in range(lane, words // 2, _WARP):
        mem.store_vec_relaxed(lines, j * 4, (uint32(0), flag, uint32(0), flag), _SYS)


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



# ---- the steps: one specialised function per kind --------------------------------------------------

def _step_kind(name, recv, send, reduce, store, last):
    """The step ``name``: receive from ``inp`` (``recv``), combine with ``src`` (``reduce``),
    store to ``dst`` (``store``, finished if ``last``) and send on ``out`` (``send``).

    The flags are constants of the function made here, so every branch on them folds at
    compile time. The step counters are read once, after the block barrier that makes the
    previous step's update visible, and only those of the directions this step uses are
    read and written back (after a barrier, once every warp has read them): each counter
    belongs to the one block that uses its direction. Between the two barriers the warps
    run through the slots on their own (:func:`_slot`), with what their part needs worked
    out once (:func:`_part`).
    """
    def step(proc, inp, out, src, dst, offset, n, red):
        tid = cuda.threadIdx.x
        cuda.syncthreads()
        state = lsa.local_view(proc.stage)
        # Only the counters of this step's directions: another block may own the others (a rank
        # sending to itself), and reading them would race with its writes.
        rstep = int64(state[counter_word(proc.channel, inp.number, RECEIVED)]) if recv else int64(0)
        sstep = int64(state[counter_word(proc.channel, out.number, SENT)]) if send else int64(0)
        if n <= 0:  # nothing moves, and no barrier since the reads above
            return
        if tid == 0:  # the connections this step runs on (the simulator's deadlock report reads them)
            if recv:
                connection_ends(inp.peer, proc.channel, inp.number, inp.remote_number, 0)
            if send:
                connection_ends(out.peer, proc.channel, out.number, out.remote_number, 1)
        if tid == 0:  # what this step moves: the simulator checks the two ends against each other
            if send:
                step_ends(out.peer, proc.channel, out.remote_number, sstep, n, src, proc.protocol, 1)
            if recv:
                step_ends(proc.comm.rank, proc.channel, inp.number, rstep, n, dst, proc.protocol, 0)
        if proc.protocol == Protocol.LL:
            moved = _slots_ll(proc, inp, out, src, dst, offset, n, red, rstep, sstep, recv, send, reduce, store, last)
        elif proc.ll128 and proc.protocol == Protocol.LL128:  # a constant 0 drops this branch when linked
            moved = _slots_ll128(proc, inp, out, src, dst, offset, n, red, rstep, sstep, recv, send, reduce, store,
                                 last)
        else:
            moved = _slots_simple(proc, inp, out, src, dst, offset, n, red, rstep, sstep, recv, send, reduce, store,
                                  last)
        cuda.syncthreads()  # every warp read the counters (and its warps ran apart until here)
        if tid == 0:
            if recv:
                state[counter_word(proc.channel, inp.number, RECEIVED)] = uint64(rstep + moved)
            if send:
                state[counter_word(proc.channel, out.number, SENT)] = uint64(sstep + moved)

    step.__name__ = step.__qualname__ = f"_step_{name}"
    return device(inline=False)(step)


@device
def _aligned(src, dst, offset):
    """Whether ``src[offset:]`` and ``dst[offset:]`` start on 16 bytes (16-byte packs possible)."""
    return ((mem.address(src, offset) | mem.address(dst, offset)) & uint64(15)) == uint64(0)


_send_step = _step_kind("send", recv=0, send=1, reduce=0, store=0, last=0)
_recv_step = _step_kind("recv", recv=1, send=0, reduce=0, store=1, last=0)
_copy_send_step = _step_kind("copy_send", recv=0, send=1, reduce=0, store=1, last=0)
_recv_reduce_send_step = _step_kind("recv_reduce_send", recv=1, send=1, reduce=1, store=0, last=0)
_recv_reduce_copy_step = _step_kind("recv_reduce_copy", recv=1, send=0, reduce=1, store=1, last=1)
_recv_reduce_copy_send_step = _step_kind("recv_reduce_copy_send", recv=1, send=1, reduce=1, store=1, last=1)
_recv_copy_send_step = _step_kind("recv_copy_send", recv=1, send=1, reduce=0, store=1, last=0)
_recv_send_step = _step_kind("recv_send", recv=1, send=1, reduce=0, store=0, last=0)


@device
def send(proc, out, src, offset, n, red=None):
    """Send ``src[offset:offset+n]`` on ``out``; with a ``PREMULSUM`` reduction ``red`` (a reduce
    chain's first send of this rank's input), each element times its scale (:func:`premul`).
    Any other ``red`` changes nothing: the step is the same as without one."""
    _send_step(proc, out, out, src, src, offset, n, premul_only(red))


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


@device
def recv_send(proc, inp, out, like, offset, n):
    """Receive ``n`` elements from ``inp`` and send them on ``out`` as they are, storing nothing (NCCL's
    ``recvSend``: a rank that passes another's data through, as the hierarchical all-to-all's rail ranks
    do). ``like`` is an array of the element type (the slots' element size and alignment; never read or
    written) and ``offset`` an element of it."""
    _recv_send_step(proc, inp, out, like, like, offset, n, reduction(RedOp.SUM, 1))


# ---- direct steps --------------------------------------------------------------------------------

@device(inline=False)
def _direct_step(proc, inp, out, src, src_offset, win, offset, n, flags):
    """One direct step over ``win[offset:offset+n]`` (the same place on every rank).

    ``flags`` = (recv, send, copy-from-src). Receiving waits until the sender's elements
    are in this rank's ``win``; copying stores ``src[src_offset:]`` there first; sending
    writes this rank's elements into the receiver's ``win`` (LSA stores, or one GIN put
    from this rank's ``win``) and publishes them with every part's flag or a strong signal.
    One slot's credit per call (every part's, as slot steps take them), so a sender runs at
    most ``nslots`` calls ahead.
    """
    has_recv, has_send, has_copy = flags[0], flags[1], flags[2]
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    cuda.syncthreads()
    state = lsa.local_view(proc.stage)
    rstep = int64(state[counter_word(proc.channel, inp.number, RECEIVED)]) if has_recv else int64(0)
    sstep = int64(state[counter_word(proc.channel, out.number, SENT)]) if has_send else int64(0)
    if tid == 0:
        if has_recv:
            _wait_ready(proc, proc.ctx, inp, rstep, 0)
        if has_send:
            for part in range(proc.parts):
                _wait_credit(proc, proc.ctx, out, sstep, part)
    cuda.syncthreads()
    mine = lsa.local_view(win, offset, n)
    if has_copy:
        for i in range(tid, n, nt):
            mine[i] = src[src_offset + i]
    if has_send and not out.gin:
        theirs = lsa.peer_view(win, out.peer, offset, n)
        for i in range(tid, n, nt):
            theirs[i] = mine[i]
    if has_send and not _over_gin(proc.ctx, out) and ll_cleans(sstep, proc.nslots) and tid < proc.parts * _WARP:
        _clean_ll_part(proc, out, sstep, tid // _WARP, tid % _WARP)
    cuda.syncthreads()
    if tid == 0:
        if has_recv:
            if _over_gin(proc.ctx, inp):
                _give_credit(proc, proc.ctx, inp, rstep, 0)
            else:
                for part in range(proc.parts):
                    _give_credit(proc, proc.ctx, inp, rstep, part)
            state[counter_word(proc.channel, inp.number, RECEIVED)] = uint64(rstep + 1)
        if has_send:
            _post_direct(proc, proc.ctx, out, win, offset * mem.itemsize(mine), n * mem.itemsize(mine), sstep)
            state[counter_word(proc.channel, out.number, SENT)] = uint64(sstep + 1)


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
    lanes = 16 // mem.itemsize(src)
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
