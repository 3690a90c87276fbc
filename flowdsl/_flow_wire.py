"""Flow's wire formats: how one warp moves its part of a slot, per protocol (the data-movement core).

:mod:`flowdsl.flow` re-exports the public names. A slot is cut into fixed *parts*, one per warp
of the block (:func:`part_words`): the cut depends on the slot's size, the warp count and the
protocol only, never on the element type, the count or the step, so the credit a receiver's
warp gives for its part frees exactly the words the sender's same warp writes next. Each warp
waits for its own part's ready flag and credit and posts them (``flowdsl/flow.py``); no block
barrier per slot. What a part carries:

- **SIMPLE**: the elements themselves; a lane moves 16-byte packs, eight in flight before their
  stores, then single packs, then single elements.
- **LL**: 16 bytes of payload travel in two 16-byte lines ``{data, flag, data, flag}`` (four
  uint32: the low and high 4 bytes of 8 payload bytes, each beside the step's flag), each
  written by one 16-byte store and read by one 16-byte load, so a line is whole or absent. Pack
  ``j`` of a part (lane ``j % 32`` of pass ``j // 32``) uses lines ``64g + r`` and ``64g + n + r``
  (``g, r = divmod(j, 32)``, ``n`` the packs of pass ``g``): a warp's stores cover 512
  consecutive bytes. The receiver polls both lines until all four flags are the step's.
- **LL128**: a warp owns 16 lines of 128 bytes (2 KiB of wire, 1920 payload bytes) at a time. In
  pass ``g`` (0-3) lane ``l`` stores 16 bytes at 16-byte chunk ``l % 8`` of line ``4g + l // 8``;
  a lane with ``l % 8 == 7`` puts the line's 64-bit flag in its last 8 bytes. Payload chunks of
  16 bytes map to lanes as NCCL's LL128 does, so ``src`` and ``dst`` are read and written in
  aligned 16-byte packs. Each pass is one warp-wide store (:func:`flowdsl.mem.warp_store_vec`):
  NVLink and HBM write a 128-byte line that one instruction of a converged warp fills whole (the
  simulator models exactly that). The receiver's flag lanes wait until every one of the 16 lines
  carries the step's flag, then the warp reads the lines again (a line can be read torn while it
  lands; once its flag is there it is whole).

Elements of every type travel as their bits: a 16-byte pack is two uint64 (:func:`flowdsl.mem.vec_to_bits`)
and is combined as a tuple of elements (:func:`flowdsl.flow.combine_packs`). What a step reads of
``src``, this rank's own input, it takes through :func:`flowdsl.flow.premul` (``PREMULSUM``'s scale;
nothing for the other operators).
"""

from __future__ import annotations

from numba import cuda, uint32, uint64

from . import mem, wait
from ._devices import device
from ._flow_elements import combine, combine_packs, finish, finish_pack, premul, premul_pack
from .enums import Protocol, ThreadScope

__all__ = ["part_words", "part_elements", "simple_part", "ll_part", "ll128_part", "LL128_PASS_WORDS"]

#: Tells the simulator that this module's functions are device code.
__flowdsl_device_module__ = True

_SYS = ThreadScope.SYSTEM
_WARP = 32
#: Words of one LL128 warp pass: 16 lines of 128 bytes.
LL128_PASS_WORDS = 256
_LL128_PASS_BYTES = 1920  # payload of a pass: 15 of every 16 words


@device
def part_words(slot_words, parts, protocol):
    """Words of each part of a slot (the last parts may be shorter or empty): an equal share,
    rounded up to what a warp moves at once (16 bytes; LL: two lines; LL128: a pass)."""
    grain = 2
    if protocol == Protocol.LL:
        grain = 4
    elif protocol == Protocol.LL128:
        grain = LL128_PASS_WORDS
    share = (slot_words + parts - 1) // parts
    return (share + grain - 1) // grain * grain


@device
def part_elements(words, itemsize, protocol):
    """Elements of ``itemsize`` bytes that ``words`` words of a part carry."""
    if protocol == Protocol.LL:
        return words * 4 // itemsize
    if protocol == Protocol.LL128:
        return words // LL128_PASS_WORDS * (_LL128_PASS_BYTES // itemsize)
    return words * 8 // itemsize


# ---- 16-byte packs as bits -----------------------------------------------------------------------

@device
def _bits_in(arr, at, valid, whole):
    """The 16 bytes of ``arr[at:at + valid]`` as (low, high) uint64, zero past ``valid`` elements;
    ``whole``: all 16 are valid and 16-byte aligned (one vector load)."""
    if whole:
        return mem.vec_to_bits(mem.load_vec(arr, at))
    size = arr.itemsize
    per = 8 // size
    width = uint64(8 * size)
    mask = (uint64(1) << width) - uint64(1) if size < 8 else ~uint64(0)
    low = uint64(0)
    high = uint64(0)
    for k in range(valid):
        bits = mem.to_bits(arr[at + k]) & mask
        if k < per:
            low |= bits << (width * uint64(k))
        else:
            high |= bits << (width * uint64(k - per))
    return low, high


@device
def _bits_out(arr, at, valid, whole, low, high):
    """Store the first ``valid`` elements of the pack (low, high) at ``arr[at:]``."""
    if whole:
        mem.store_vec(arr, at, mem.vec_from_bits(low, high, arr.dtype))
        return
    size = arr.itemsize
    per = 8 // size
    width = uint64(8 * size)
    for k in range(valid):
        word = low if k < per else high
        arr[at + k] = mem.from_bits(word >> (width * uint64(k % per)), arr.dtype)


@device
def _src_bits(red, src, at, valid, whole):
    """:func:`_bits_in` of this rank's own input, as ``red`` takes it (:func:`flowdsl.flow.premul`)."""
    if whole:
        return mem.vec_to_bits(premul_pack(red, mem.load_vec(src, at)))
    size = src.itemsize
    per = 8 // size
    width = uint64(8 * size)
    mask = (uint64(1) << width) - uint64(1) if size < 8 else ~uint64(0)
    low = uint64(0)
    high = uint64(0)
    for k in range(valid):
        bits = mem.to_bits(premul(red, src[at + k])) & mask
        if k < per:
            low |= bits << (width * uint64(k))
        else:
            high |= bits << (width * uint64(k - per))
    return low, high


@device
def _combined(red, low, high, src_low, src_high, like):
    return mem.vec_to_bits(combine_packs(red, mem.vec_from_bits(low, high, like.dtype),
                                         mem.vec_from_bits(src_low, src_high, like.dtype)))


@device
def _finished(red, low, high, like):
    return mem.vec_to_bits(finish_pack(red, mem.vec_from_bits(low, high, like.dtype)))


@device
def _pack(src, dst, base, e, valid, whole, red, recv, reduce, store, last, low, high):
    """One 16-byte pack at element ``e``: what was received (``low``, ``high``) combined with
    ``src``, or ``src`` itself; stored (finished if ``last``) to ``dst``; returned to send on."""
    if recv:
        if reduce:
            src_low, src_high = _src_bits(red, src, base + e, valid, whole)
            low, high = _combined(red, low, high, src_low, src_high, dst)
    else:
        low, high = _src_bits(red, src, base + e, valid, whole)
    if store:
        if last:
            low, high = _finished(red, low, high, dst)
        _bits_out(dst, base + e, valid, whole, low, high)
    return low, high


# ---- SIMPLE ----------------------------------------------------------------------------------------

@device
def _pack_in(inbox, at, src, base, i, red, recv, reduce):
    """The 16-byte pack at element ``i`` of the slot (``inbox[at:]``): received, from ``src``, or
    their combination."""
    if recv and reduce:
        return combine_packs(red, mem.load_vec(inbox, at + i), premul_pack(red, mem.load_vec(src, base + i)))
    if recv:
        return mem.load_vec(inbox, at + i)
    return premul_pack(red, mem.load_vec(src, base + i))


@device
def _pack_out(outbox, to, dst, base, i, x, red, send, store, last):
    """Store pack ``x`` (finished if ``last``) to ``dst`` and/or the outgoing slot (``outbox[to:]``)."""
    if store:
        if last:
            x = finish_pack(red, x)
        mem.store_vec(dst, base + i, x)
    if send:
        mem.store_vec(outbox, to + i, x)


@device
def _element(inbox, at, outbox, to, src, dst, base, i, red, recv, send, reduce, store, last):
    if recv:
        v = inbox[at + i]
        if reduce:
            v = combine(red.op, v, premul(red, src[base + i]), red.fp8)
    else:
        v = premul(red, src[base + i])
    if store:
        if last:
            v = finish(red.op, v, red.nranks, red.fp8)
        dst[base + i] = v
    if send:
        outbox[to + i] = v


@device
def simple_part(inbox, at, outbox, to, src, dst, base, lo, hi, lane, red, vectors, recv, send, reduce, store, last):
    """SIMPLE: the warp moves elements ``[lo, hi)`` of the slot (at ``inbox[at:]``, ``outbox[to:]``). 16-byte packs, eight per lane loaded before any is stored (loads in flight are what
    HBM and NVLink need), then single packs, then elements; ``vectors``: the arrays are 16-byte
    aligned at ``base`` (slots and part starts always are)."""
    lanes = 16 // dst.itemsize
    tail = lo
    if vectors:
        end = lo + (hi - lo) // lanes * lanes
        stride = _WARP * lanes
        i = lo + lane * lanes
        while i + 7 * stride < end:
            x0 = _pack_in(inbox, at, src, base, i, red, recv, reduce)
            x1 = _pack_in(inbox, at, src, base, i + stride, red, recv, reduce)
            x2 = _pack_in(inbox, at, src, base, i + 2 * stride, red, recv, reduce)
            x3 = _pack_in(inbox, at, src, base, i + 3 * stride, red, recv, reduce)
            x4 = _pack_in(inbox, at, src, base, i + 4 * stride, red, recv, reduce)
            x5 = _pack_in(inbox, at, src, base, i + 5 * stride, red, recv, reduce)
            x6 = _pack_in(inbox, at, src, base, i + 6 * stride, red, recv, reduce)
            x7 = _pack_in(inbox, at, src, base, i + 7 * stride, red, recv, reduce)
            _pack_out(outbox, to, dst, base, i, x0, red, send, store, last)
            _pack_out(outbox, to, dst, base, i + stride, x1, red, send, store, last)
            _pack_out(outbox, to, dst, base, i + 2 * stride, x2, red, send, store, last)
            _pack_out(outbox, to, dst, base, i + 3 * stride, x3, red, send, store, last)
            _pack_out(outbox, to, dst, base, i + 4 * stride, x4, red, send, store, last)
            _pack_out(outbox, to, dst, base, i + 5 * stride, x5, red, send, store, last)
            _pack_out(outbox, to, dst, base, i + 6 * stride, x6, red, send, store, last)
            _pack_out(outbox, to, dst, base, i + 7 * stride, x7, red, send, store, last)
            i += 8 * stride
        while i < end:
            _pack_out(outbox, to, dst, base, i, _pack_in(inbox, at, src, base, i, red, recv, reduce), red, send, store,
                      last)
            i += stride
        tail = end
    i = tail + lane
    while i < hi:
        _element(inbox, at, outbox, to, src, dst, base, i, red, recv, send, reduce, store, last)
        i += _WARP


# ---- LL: 16-byte lines of two data words and two flags -----------------------------------------------

@device
def _ll_lines(j, npacks):
    """Word offsets (in uint32) of the two lines of pack ``j`` of a part of ``npacks`` packs."""
    g = j // _WARP
    r = j - g * _WARP
    n = min(_WARP, npacks - g * _WARP)
    return (g * 2 * _WARP + r) * 4, (g * 2 * _WARP + n + r) * 4


@device
def _ll_take(comm, peer, inbox, a, b, flag):
    """Spin (bounded) until the lines at uint32 words ``a`` and ``b`` both carry ``flag`` twice; their
    8 + 8 data bytes as (low, high)."""
    x = mem.load_vec_relaxed(inbox, a, _SYS)
    y = mem.load_vec_relaxed(inbox, b, _SYS)
    state = uint64(0)
    while x[1] != flag or x[3] != flag or y[1] != flag or y[3] != flag:
        seen = x[1] if x[1] != flag else (x[3] if x[3] != flag else (y[1] if y[1] != flag else y[3]))
        state = wait.poll(comm, state, wait.LL_LINE, peer, a // 4, flag, seen)
        if state == wait.GAVE_UP:
            return uint64(x[0]) | (uint64(x[2]) << uint64(32)), uint64(y[0]) | (uint64(y[2]) << uint64(32))
        x = mem.load_vec_relaxed(inbox, a, _SYS)
        y = mem.load_vec_relaxed(inbox, b, _SYS)
    wait.accepted(inbox, a, 4, peer)
    wait.accepted(inbox, b, 4, peer)
    return uint64(x[0]) | (uint64(x[2]) << uint64(32)), uint64(y[0]) | (uint64(y[2]) << uint64(32))


@device
def _ll_put(outbox, a, b, low, high, flag):
    """The pack (low, high) as the two lines at uint32 words ``a`` and ``b``, one store each."""
    mem.store_vec_relaxed(outbox, a, (uint32(low & uint64(0xFFFFFFFF)), flag, uint32(low >> uint64(32)), flag),
                          _SYS)
    mem.store_vec_relaxed(outbox, b, (uint32(high & uint64(0xFFFFFFFF)), flag, uint32(high >> uint64(32)), flag),
                          _SYS)


@device
def ll_part(comm, peer, inbox, at, outbox, to, src, dst, base, e0, npacks, m, lane, red, rflag, sflag, vectors, recv,
            send, reduce, store, last, clean):
    """LL: the warp moves the ``npacks`` packs of its part (its lines from ``inbox[at:]`` and
    ``outbox[to:]``, uint32 views; ``e0``: the part's first element of the slot, of ``m``). ``clean``: write every
    line of the part, those without data too (:func:`flowdsl.flow.ll_cleans`)."""
    lanes = 16 // dst.itemsize
    ndata = min(npacks, max(0, (m - e0 + lanes - 1) // lanes))
    todo = npacks if clean and send else ndata
    j = lane
    while j < todo:
        a, b = _ll_lines(j, npacks)
        low = uint64(0)
        high = uint64(0)
        if j < ndata:
            e = e0 + j * lanes
            valid = min(lanes, m - e)
            if recv:
                low, high = _ll_take(comm, peer, inbox, at + a, at + b, rflag)
            low, high = _pack(src, dst, base, e, valid, vectors and valid == lanes, red, recv, reduce, store, last,
                              low, high)
        if send:
            _ll_put(outbox, to + a, to + b, low, high, sflag)
        j += _WARP


# ---- LL128: a warp owns 16 lines of 128 bytes ----------------------------------------------------------

@device
def _ll128_chunks(lane):
    """The 16-byte payload chunks of a pass that lane ``lane`` holds in passes 0-3 (NCCL's LL128 map):
    flag lanes (``lane % 8 == 7``) hold none in passes 1 and 3."""
    lost = lane // 8
    return lane, 32 + lane - lost, 60 + lane, 92 + lane - lost


@device
def _ll128_arrived(comm, peer, inbox, at, lane, flag):
    """Wait (bounded) until the flags of the pass's 16 lines (from ``inbox[at:]``) carry ``flag``: each
    flag lane waits for its four in turn (they land in that order), then the warp meets once;
    False if a wait gave up. No warp vote inside the spin: the simulator takes a barrier for
    progress, and a spin that meets one every turn would never be seen to hang."""
    gave_up = False
    if lane % 8 == 7:
        for g in range(4):
            where = at + (g * _WARP + lane) * 2 + 1
            seen = mem.load_relaxed(inbox, where, _SYS)
            state = uint64(0)
            while seen != flag and not gave_up:
                state = wait.poll(comm, state, wait.LL128_LINE, peer, where, flag, seen)
                if state == wait.GAVE_UP:
                    gave_up = True
                else:
                    seen = mem.load_relaxed(inbox, where, _SYS)
    return not cuda.any_sync(0xFFFFFFFF, gave_up)


@device
def ll128_part(comm, peer, inbox, at, outbox, to, src, dst, base, e0, npasses, m, lane, red, rflag, sflag, vectors,
               recv, send, reduce, store, last):
    """LL128: the warp moves the ``npasses`` passes of its part (from ``inbox[at:]`` and ``outbox[to:]``,
    uint64 views; ``e0``: the part's first element of the slot, of ``m``). Passes past the data are
    neither sent nor waited for."""
    lanes = 16 // dst.itemsize
    per_pass = _LL128_PASS_BYTES // dst.itemsize
    flagger = lane % 8 == 7
    c0, c1, c2, c3 = _ll128_chunks(lane)
    p = 0
    while p < npasses and e0 + p * per_pass < m:
        here = at + p * LL128_PASS_WORDS
        there = to + p * LL128_PASS_WORDS
        first = e0 + p * per_pass
        r0 = (uint64(0), uint64(0))
        r1 = (uint64(0), uint64(0))
        r2 = (uint64(0), uint64(0))
        r3 = (uint64(0), uint64(0))
        if recv:
            if _ll128_arrived(comm, peer, inbox, here, lane, rflag):
                cuda.syncwarp()
                r0 = mem.vec_to_bits(mem.load_vec_relaxed(inbox, here + lane * 2, _SYS))
                r1 = mem.vec_to_bits(mem.load_vec_relaxed(inbox, here + (_WARP + lane) * 2, _SYS))
                r2 = mem.vec_to_bits(mem.load_vec_relaxed(inbox, here + (2 * _WARP + lane) * 2, _SYS))
                r3 = mem.vec_to_bits(mem.load_vec_relaxed(inbox, here + (3 * _WARP + lane) * 2, _SYS))
                for g in range(4):
                    wait.accepted(inbox, here + (g * _WARP + lane) * 2, 2, peer)
            if flagger:  # the second halves of chunks c0 and c2 came in passes 1 and 3
                r0 = (r0[0], r1[0])
                r2 = (r2[0], r3[0])
        a = _ll128_pack(src, dst, base, first, c0, lanes, m, vectors, red, recv, reduce, store, last, r0)
        c = _ll128_pack(src, dst, base, first, c2, lanes, m, vectors, red, recv, reduce, store, last, r2)
        b = (uint64(0), uint64(0))
        d = (uint64(0), uint64(0))
        if not flagger:
            b = _ll128_pack(src, dst, base, first, c1, lanes, m, vectors, red, recv, reduce, store, last, r1)
            d = _ll128_pack(src, dst, base, first, c3, lanes, m, vectors, red, recv, reduce, store, last, r3)
        if send:
            if flagger:  # each 8 payload bytes beside the line's flag
                b = (a[1], sflag)
                a = (a[0], sflag)
                d = (c[1], sflag)
                c = (c[0], sflag)
            mem.warp_store_vec(outbox, there + lane * 2, a, _SYS)
            mem.warp_store_vec(outbox, there + (_WARP + lane) * 2, b, _SYS)
            mem.warp_store_vec(outbox, there + (2 * _WARP + lane) * 2, c, _SYS)
            mem.warp_store_vec(outbox, there + (3 * _WARP + lane) * 2, d, _SYS)
        p += 1


@device
def _ll128_pack(src, dst, base, first, chunk, lanes, m, vectors, red, recv, reduce, store, last, received):
    """The payload chunk ``chunk`` of the pass that starts at element ``first`` (see :func:`_pack`)."""
    e = first + chunk * lanes
    if e >= m:
        return (uint64(0), uint64(0))
    valid = min(lanes, m - e)
    low, high = _pack(src, dst, base, e, valid, vectors and valid == lanes, red, recv, reduce, store, last,
                      received[0], received[1])
    return (low, high)
