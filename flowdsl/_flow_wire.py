"""Flow's wire formats: how one warp moves its part of a slot, per protocol (the data-movement core).

:mod:`flowdsl.flow` re-exports the public names. A slot is cut into fixed *parts*, one per warp
of the block (:func:`part_words`): the cut depends on the slot's size, the warp count and the
protocol only, never on the element type, the count or the step, so the credit a receiver's
warp gives for its part frees exactly the words the sender's same warp writes next. Each warp
waits for its own part's ready flag and credit and posts them (``flowdsl/flow.py``); no block
barrier per slot. What a part carries:

- **SIMPLE**: the elements themselves; a lane moves 16-byte packs, eight in flight before their
  stores (the last eight of a part too: those past it are loaded, not stored), then single elements.
- **LL**: 16 bytes of payload travel in two 16-byte lines ``{data, flag, data, flag}`` (four
  uint32: the low and high 4 bytes of 8 payload bytes, each beside the step's flag), each
  written by one 16-byte store and read by one 16-byte load, so a line is whole or absent. Pack
  ``j`` of a part (lane ``j % 32`` of pass ``j // 32``) uses lines ``64g + r`` and ``64g + n + r``
  (``g, r = divmod(j, 32)``, ``n`` the packs of pass ``g``): a warp's stores cover 512
  consecutive bytes. The receiver polls both lines until all four flags are the step's. A lane
  takes its whole packs four at a time, every load of the four (lines, ``src``) in flight before
  it waits for the first: one pack per memory round trip would cap a warp at a few GB/s.
- **LL128**: a warp owns 16 lines of 128 bytes (2 KiB of wire, 1920 payload bytes) at a time. In
  pass ``g`` (0-3) lane ``l`` stores 16 bytes at 16-byte chunk ``l % 8`` of line ``4g + l // 8``;
  a lane with ``l % 8 == 7`` puts the line's 64-bit flag in its last 8 bytes. Payload chunks of
  16 bytes map to lanes as NCCL's LL128 does, so ``src`` and ``dst`` are read and written in
  aligned 16-byte packs. Each pass is one warp-wide store (:func:`flowdsl.mem.warp_store_vec`):
  NVLink and HBM write a 128-byte line that one instruction of a converged warp fills whole (the
  simulator models exactly that). The warp takes two passes at a time: the receiver's flag lanes
  load the flags of both passes' 32 lines at once and wait for any still missing, then the warp
  reads the lines (a line can be read torn while it lands; once its flag is there it is whole);
  every load of both passes (lines, ``src``) is in flight before the first store.

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
def _bits_out(arr, at, valid, whole, low, high):
    """Store the first ``valid`` elements of the pack (low, high) at ``arr[at:]``."""
    if whole:
        mem.store_vec(arr, at, mem.vec_from_bits(low, high, arr.dtype))
        return
    size = mem.itemsize(arr)
    per = 8 // size
    width = uint64(8 * size)
    for k in range(valid):
        word = low if k < per else high
        arr[at + k] = mem.from_bits(word >> (width * uint64(k % per)), arr.dtype)


@device
def _src_bits(red, src, at, valid, whole):
    """The 16 bytes of ``src[at:at + valid]``, this rank's own input as ``red`` takes it
    (:func:`flowdsl.flow.premul`), as (low, high) uint64, zero past ``valid`` elements; ``whole``: all 16
    are valid and 16-byte aligned (one vector load)."""
    if whole:
        return mem.vec_to_bits(premul_pack(red, mem.load_vec(src, at)))
    size = mem.itemsize(src)
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
def _pack_load(red, src, at, valid, whole, recv, reduce):
    """What a pack at ``src[at:]`` takes of this rank's input (:func:`_src_bits`), or zeros where the step
    takes none. Loaded apart from :func:`_pack_store` so that a lane has several packs' loads in
    flight before its first store (a store waits for the value it stores)."""
    if recv and not reduce:
        return uint64(0), uint64(0)
    return _src_bits(red, src, at, valid, whole)


@device
def _pack_store(red, dst, at, valid, whole, recv, reduce, store, last, low, high, src_low, src_high):
    """One 16-byte pack at ``dst[at:]``: what was received (``low``, ``high``) combined with the
    pack of ``src`` (``src_low``, ``src_high``, from :func:`_pack_load`), or that pack itself;
    stored (finished if ``last``) to ``dst``; returned to send on."""
    if recv:
        if reduce:
            low, high = _combined(red, low, high, src_low, src_high, dst)
    else:
        low, high = src_low, src_high
    if store:
        if last:
            low, high = _finished(red, low, high, dst)
        _bits_out(dst, at, valid, whole, low, high)
    return low, high


@device
def _pack(src, dst, base, e, valid, whole, red, recv, reduce, store, last, low, high):
    """:func:`_pack_store` of :func:`_pack_load`: one pack at element ``e``, on its own."""
    src_low, src_high = _pack_load(red, src, base + e, valid, whole, recv, reduce)
    return _pack_store(red, dst, base + e, valid, whole, recv, reduce, store, last, low, high, src_low, src_high)


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
def _pack_at(i, k, stride, end):
    """Element of pack ``k`` of a lane's group of eight from ``i``: ``i + k * stride``, or ``i`` itself
    (loaded again, never stored) where that pack is past ``end``."""
    at = i + k * stride
    return at if at < end else i


@device
def simple_part(inbox, at, outbox, to, src, dst, base, lo, hi, lane, red, vectors, recv, send, reduce, store, last):
    """SIMPLE: the warp moves elements ``[lo, hi)`` of the slot (at ``inbox[at:]``, ``outbox[to:]``). A lane
    takes 16-byte packs eight at a time, all eight loaded before any is stored (loads in flight are what HBM
    and NVLink need); in the last group a pack past the part loads the group's first again and is not
    stored, so a small slot costs one memory round trip too, not one per pack. Then single elements;
    ``vectors``: the arrays are 16-byte aligned at ``base`` (slots and part starts always are)."""
    lanes = 16 // mem.itemsize(dst)
    tail = lo
    if vectors:
        end = lo + (hi - lo) // lanes * lanes
        stride = _WARP * lanes
        i = lo + lane * lanes
        while i < end:
            i1 = _pack_at(i, 1, stride, end)
            i2 = _pack_at(i, 2, stride, end)
            i3 = _pack_at(i, 3, stride, end)
            i4 = _pack_at(i, 4, stride, end)
            i5 = _pack_at(i, 5, stride, end)
            i6 = _pack_at(i, 6, stride, end)
            i7 = _pack_at(i, 7, stride, end)
            x0 = _pack_in(inbox, at, src, base, i, red, recv, reduce)
            x1 = _pack_in(inbox, at, src, base, i1, red, recv, reduce)
            x2 = _pack_in(inbox, at, src, base, i2, red, recv, reduce)
            x3 = _pack_in(inbox, at, src, base, i3, red, recv, reduce)
            x4 = _pack_in(inbox, at, src, base, i4, red, recv, reduce)
            x5 = _pack_in(inbox, at, src, base, i5, red, recv, reduce)
            x6 = _pack_in(inbox, at, src, base, i6, red, recv, reduce)
            x7 = _pack_in(inbox, at, src, base, i7, red, recv, reduce)
            _pack_out(outbox, to, dst, base, i, x0, red, send, store, last)
            if i1 != i:
                _pack_out(outbox, to, dst, base, i1, x1, red, send, store, last)
            if i2 != i:
                _pack_out(outbox, to, dst, base, i2, x2, red, send, store, last)
            if i3 != i:
                _pack_out(outbox, to, dst, base, i3, x3, red, send, store, last)
            if i4 != i:
                _pack_out(outbox, to, dst, base, i4, x4, red, send, store, last)
            if i5 != i:
                _pack_out(outbox, to, dst, base, i5, x5, red, send, store, last)
            if i6 != i:
                _pack_out(outbox, to, dst, base, i6, x6, red, send, store, last)
            if i7 != i:
                _pack_out(outbox, to, dst, base, i7, x7, red, send, store, last)
            i += 8 * stride
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
def _ll_fetch(inbox, a, b):
    """The two lines at uint32 words ``a`` and ``b``, loaded once (:func:`_ll_take` checks them)."""
    return mem.load_vec_relaxed(inbox, a, _SYS), mem.load_vec_relaxed(inbox, b, _SYS)


@device
def _ll_fresh(x, y, flag):
    return x[1] == flag and x[3] == flag and y[1] == flag and y[3] == flag


@device
def _ll_wait(comm, peer, inbox, a, b, flag):
    """Wait (bounded) until the lines at uint32 words ``a`` and ``b`` both carry ``flag`` twice. Called
    only once a line was found late. Inline: out of line (a call whose result numba passes through
    local memory) the waits made the steps slower (LL128 by 8-17 % on an H100)."""
    x = mem.load_vec_relaxed(inbox, a, _SYS)
    y = mem.load_vec_relaxed(inbox, b, _SYS)
    state = uint64(0)
    while not _ll_fresh(x, y, flag):
        seen = x[1] if x[1] != flag else (x[3] if x[3] != flag else (y[1] if y[1] != flag else y[3]))
        state = wait.poll(comm, state, wait.LL_LINE, peer, a // 4, flag, seen)
        if state == wait.GAVE_UP:
            return
        x = mem.load_vec_relaxed(inbox, a, _SYS)
        y = mem.load_vec_relaxed(inbox, b, _SYS)


@device
def _ll_data(inbox, a, b, peer, flag, x, y):
    """The 8 + 8 data bytes, as (low, high), of the lines ``x`` and ``y`` loaded from uint32 words ``a``
    and ``b``, taken as this step's when they carry ``flag`` (after a wait that gave up they may not:
    the kernel then runs on with garbage, and its rank reports the timeout)."""
    if _ll_fresh(x, y, flag):
        wait.accepted(inbox, a, 4, peer)
        wait.accepted(inbox, b, 4, peer)
    return uint64(x[0]) | (uint64(x[2]) << uint64(32)), uint64(y[0]) | (uint64(y[2]) << uint64(32))


@device
def _ll_take(comm, peer, inbox, a, b, flag, x, y):
    """:func:`_ll_data` of the lines at uint32 words ``a`` and ``b`` (``x`` and ``y`` as :func:`_ll_fetch`
    first loaded them) once both carry ``flag`` twice."""
    if not _ll_fresh(x, y, flag):
        _ll_wait(comm, peer, inbox, a, b, flag)
        x, y = _ll_fetch(inbox, a, b)
    return _ll_data(inbox, a, b, peer, flag, x, y)


@device
def _ll_put(outbox, a, b, low, high, flag):
    """The pack (low, high) as the two lines at uint32 words ``a`` and ``b``, one store each."""
    mem.store_vec_relaxed(outbox, a, (uint32(low & uint64(0xFFFFFFFF)), flag, uint32(low >> uint64(32)), flag),
                          _SYS)
    mem.store_vec_relaxed(outbox, b, (uint32(high & uint64(0xFFFFFFFF)), flag, uint32(high >> uint64(32)), flag),
                          _SYS)


_NO_LINE = (uint32(0), uint32(0), uint32(0), uint32(0))


@device
def _ll_start(inbox, at, src, base, e0, j, npacks, lanes, red, recv, reduce):
    """The loads of whole pack ``j`` (16 aligned bytes): its two lines (receiving) and its ``src`` pack."""
    x = _NO_LINE
    y = _NO_LINE
    if recv:
        a, b = _ll_lines(j, npacks)
        x, y = _ll_fetch(inbox, at + a, at + b)
    return x, y, _pack_load(red, src, base + e0 + j * lanes, lanes, True, recv, reduce)


@device
def _ll_start4(inbox, at, src, base, e0, j, npacks, lanes, red, recv, reduce):
    """:func:`_ll_start` of packs ``j``, ``j + 32``, ``j + 64`` and ``j + 96``."""
    return (_ll_start(inbox, at, src, base, e0, j, npacks, lanes, red, recv, reduce),
            _ll_start(inbox, at, src, base, e0, j + _WARP, npacks, lanes, red, recv, reduce),
            _ll_start(inbox, at, src, base, e0, j + 2 * _WARP, npacks, lanes, red, recv, reduce),
            _ll_start(inbox, at, src, base, e0, j + 3 * _WARP, npacks, lanes, red, recv, reduce))


@device
def _ll_finish(peer, inbox, at, outbox, to, dst, base, e0, j, npacks, lanes, red, rflag, sflag, recv, send, reduce,
               store, last, loaded):
    """Whole pack ``j`` from what :func:`_ll_start` loaded (its lines there): combine, store, send on."""
    x, y, s = loaded
    a, b = _ll_lines(j, npacks)
    low = uint64(0)
    high = uint64(0)
    if recv:
        low, high = _ll_data(inbox, at + a, at + b, peer, rflag, x, y)
    low, high = _pack_store(red, dst, base + e0 + j * lanes, lanes, True, recv, reduce, store, last, low, high,
                            s[0], s[1])
    if send:
        _ll_put(outbox, to + a, to + b, low, high, sflag)


@device
def ll_part(comm, peer, inbox, at, outbox, to, src, dst, base, e0, npacks, m, lane, red, rflag, sflag, vectors, recv,
            send, reduce, store, last, clean):
    """LL: the warp moves the ``npacks`` packs of its part (its lines from ``inbox[at:]`` and
    ``outbox[to:]``, uint32 views; ``e0``: the part's first element of the slot, of ``m``). ``clean``: write every
    line of the part, those without data too (:func:`flowdsl.flow.ll_cleans`).

    A lane takes whole packs four at a time: the loads of all four (lines and ``src``) are in
    flight before it waits for the first, since a lane that waited for one pack at a time would
    move one pack per memory round trip. The rest go one by one."""
    lanes = 16 // mem.itemsize(dst)
    ndata = min(npacks, max(0, (m - e0 + lanes - 1) // lanes))
    todo = npacks if clean and send else ndata
    j = lane
    if vectors:
        whole = min(npacks, max(0, (m - e0) // lanes))
        while j + 3 * _WARP < whole:
            p0, p1, p2, p3 = _ll_start4(inbox, at, src, base, e0, j, npacks, lanes, red, recv, reduce)
            if recv and not (_ll_fresh(p0[0], p0[1], rflag) and _ll_fresh(p1[0], p1[1], rflag)
                             and _ll_fresh(p2[0], p2[1], rflag) and _ll_fresh(p3[0], p3[1], rflag)):
                # A line was not there yet: one wait loop for the four packs (not four copies of it in
                # the code: link time), then all four loaded again.
                for k in range(4):
                    a, b = _ll_lines(j + k * _WARP, npacks)
                    _ll_wait(comm, peer, inbox, at + a, at + b, rflag)
                p0, p1, p2, p3 = _ll_start4(inbox, at, src, base, e0, j, npacks, lanes, red, recv, reduce)
            _ll_finish(peer, inbox, at, outbox, to, dst, base, e0, j, npacks, lanes, red, rflag, sflag, recv, send,
                       reduce, store, last, p0)
            _ll_finish(peer, inbox, at, outbox, to, dst, base, e0, j + _WARP, npacks, lanes, red, rflag, sflag, recv,
                       send, reduce, store, last, p1)
            _ll_finish(peer, inbox, at, outbox, to, dst, base, e0, j + 2 * _WARP, npacks, lanes, red, rflag, sflag,
                       recv, send, reduce, store, last, p2)
            _ll_finish(peer, inbox, at, outbox, to, dst, base, e0, j + 3 * _WARP, npacks, lanes, red, rflag, sflag,
                       recv, send, reduce, store, last, p3)
            j += 4 * _WARP
    while j < todo:
        a, b = _ll_lines(j, npacks)
        low = uint64(0)
        high = uint64(0)
        if j < ndata:
            e = e0 + j * lanes
            valid = min(lanes, m - e)
            if recv:
                x, y = _ll_fetch(inbox, at + a, at + b)
                low, high = _ll_take(comm, peer, inbox, at + a, at + b, rflag, x, y)
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
def _ll128_flag_wait(comm, peer, inbox, where, flag):
    """Wait (bounded) until ``inbox[where]`` carries ``flag`` (inline, as :func:`_ll_wait`)."""
    seen = mem.load_relaxed(inbox, where, _SYS)
    state = uint64(0)
    while seen != flag:
        state = wait.poll(comm, state, wait.LL128_LINE, peer, where, flag, seen)
        if state == wait.GAVE_UP:
            return
        seen = mem.load_relaxed(inbox, where, _SYS)


@device
def _ll128_arrived(comm, peer, inbox, at, lane, flag, passes):
    """Wait (bounded) until the flags of the 16 lines of each of ``passes`` (1 or 2) passes from
    ``inbox[at:]`` carry ``flag``: each flag lane loads its four (eight) flags at once and, if one is
    missing, waits for each in turn (one wait loop in the code, not eight: link time); then the warp
    meets once. False if a wait gave up. No warp vote inside the spin: the simulator takes a barrier
    for progress, and a spin that meets one every turn would never be seen to hang."""
    ok = True
    if lane % 8 == 7:
        w = at + lane * 2 + 1  # line 4g + lane // 8's flag: the last word of lane's chunk in pass g
        f0 = mem.load_relaxed(inbox, w, _SYS)
        f1 = mem.load_relaxed(inbox, w + 2 * _WARP, _SYS)
        f2 = mem.load_relaxed(inbox, w + 4 * _WARP, _SYS)
        f3 = mem.load_relaxed(inbox, w + 6 * _WARP, _SYS)
        f4 = flag
        f5 = flag
        f6 = flag
        f7 = flag
        if passes > 1:
            f4 = mem.load_relaxed(inbox, w + LL128_PASS_WORDS, _SYS)
            f5 = mem.load_relaxed(inbox, w + LL128_PASS_WORDS + 2 * _WARP, _SYS)
            f6 = mem.load_relaxed(inbox, w + LL128_PASS_WORDS + 4 * _WARP, _SYS)
            f7 = mem.load_relaxed(inbox, w + LL128_PASS_WORDS + 6 * _WARP, _SYS)
        if not (f0 == flag and f1 == flag and f2 == flag and f3 == flag and f4 == flag and f5 == flag
                and f6 == flag and f7 == flag):
            for g in range(4 * passes):
                where = w + g // 4 * LL128_PASS_WORDS + g % 4 * 2 * _WARP
                _ll128_flag_wait(comm, peer, inbox, where, flag)
                ok = ok and mem.load_relaxed(inbox, where, _SYS) == flag
    return not cuda.any_sync(0xFFFFFFFF, not ok)


_NO_CHUNK = (uint64(0), uint64(0))
_NO_CHUNKS = (_NO_CHUNK, _NO_CHUNK, _NO_CHUNK, _NO_CHUNK)


@device
def _ll128_lines_in(inbox, here, lane, peer):
    """The four 16-byte chunks lane ``lane`` holds of the pass at ``inbox[here:]`` (its flags seen)."""
    r = (mem.vec_to_bits(mem.load_vec_relaxed(inbox, here + lane * 2, _SYS)),
         mem.vec_to_bits(mem.load_vec_relaxed(inbox, here + (_WARP + lane) * 2, _SYS)),
         mem.vec_to_bits(mem.load_vec_relaxed(inbox, here + (2 * _WARP + lane) * 2, _SYS)),
         mem.vec_to_bits(mem.load_vec_relaxed(inbox, here + (3 * _WARP + lane) * 2, _SYS)))
    for g in range(4):
        wait.accepted(inbox, here + (g * _WARP + lane) * 2, 2, peer)
    return r


@device
def _ll128_chunk_load(red, src, base, first, chunk, lanes, m, vectors, recv, reduce, whole):
    """:func:`_pack_load` of payload chunk ``chunk`` of the pass that starts at element ``first``
    (``whole``, a constant where called: the pass is full and 16-byte aligned, nothing to check)."""
    e = first + chunk * lanes
    if not whole and e >= m:
        return _NO_CHUNK
    valid = lanes if whole else min(lanes, m - e)
    return _pack_load(red, src, base + e, valid, whole or (vectors and valid == lanes), recv, reduce)


@device
def _ll128_chunk_store(red, dst, base, first, chunk, lanes, m, vectors, recv, reduce, store, last, received, mine,
                       whole):
    """:func:`_pack_store` of payload chunk ``chunk`` of the pass that starts at element ``first``."""
    e = first + chunk * lanes
    if not whole and e >= m:
        return _NO_CHUNK
    valid = lanes if whole else min(lanes, m - e)
    return _pack_store(red, dst, base + e, valid, whole or (vectors and valid == lanes), recv, reduce, store, last,
                       received[0], received[1], mine[0], mine[1])


@device
def _ll128_src(red, src, base, first, lane, lanes, m, vectors, recv, reduce, whole):
    """The ``src`` chunks lane ``lane`` takes in a pass from element ``first`` (flag lanes take two)."""
    c0, c1, c2, c3 = _ll128_chunks(lane)
    s0 = _ll128_chunk_load(red, src, base, first, c0, lanes, m, vectors, recv, reduce, whole)
    s2 = _ll128_chunk_load(red, src, base, first, c2, lanes, m, vectors, recv, reduce, whole)
    s1 = _NO_CHUNK
    s3 = _NO_CHUNK
    if lane % 8 != 7:
        s1 = _ll128_chunk_load(red, src, base, first, c1, lanes, m, vectors, recv, reduce, whole)
        s3 = _ll128_chunk_load(red, src, base, first, c3, lanes, m, vectors, recv, reduce, whole)
    return s0, s1, s2, s3


@device
def _ll128_pass_out(outbox, there, red, dst, base, first, lane, lanes, m, vectors, recv, send, reduce, store, last,
                    received, mine, sflag, whole):
    """A pass from what was received and loaded: combined, stored to ``dst``, sent as 16 lines of 128
    bytes at ``outbox[there:]`` (four warp-wide stores, a flag lane's last 8 bytes the flag)."""
    flagger = lane % 8 == 7
    c0, c1, c2, c3 = _ll128_chunks(lane)
    r0, r1, r2, r3 = received
    if recv and flagger:  # the second halves of chunks c0 and c2 came in passes 1 and 3
        r0 = (r0[0], r1[0])
        r2 = (r2[0], r3[0])
    a = _ll128_chunk_store(red, dst, base, first, c0, lanes, m, vectors, recv, reduce, store, last, r0, mine[0], whole)
    c = _ll128_chunk_store(red, dst, base, first, c2, lanes, m, vectors, recv, reduce, store, last, r2, mine[2], whole)
    b = _NO_CHUNK
    d = _NO_CHUNK
    if not flagger:
        b = _ll128_chunk_store(red, dst, base, first, c1, lanes, m, vectors, recv, reduce, store, last, r1, mine[1],
                               whole)
        d = _ll128_chunk_store(red, dst, base, first, c3, lanes, m, vectors, recv, reduce, store, last, r3, mine[3],
                               whole)
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


@device
def _ll128_passes(comm, peer, inbox, here, outbox, there, src, dst, base, first, lane, lanes, per_pass, m, red, rflag,
                  sflag, vectors, recv, send, reduce, store, last, passes, whole):
    """``passes`` (1 or 2, a constant where called) consecutive passes from element ``first``: their
    flags waited for together, then every load of them (the lines, ``src``) in flight before the
    first store. ``whole``: both passes are full and 16-byte aligned."""
    r = _NO_CHUNKS
    q = _NO_CHUNKS
    if recv and _ll128_arrived(comm, peer, inbox, here, lane, rflag, passes):
        cuda.syncwarp()
        r = _ll128_lines_in(inbox, here, lane, peer)
        if passes > 1:
            q = _ll128_lines_in(inbox, here + LL128_PASS_WORDS, lane, peer)
    s = _ll128_src(red, src, base, first, lane, lanes, m, vectors, recv, reduce, whole)
    t = _NO_CHUNKS
    if passes > 1:
        t = _ll128_src(red, src, base, first + per_pass, lane, lanes, m, vectors, recv, reduce, whole)
    _ll128_pass_out(outbox, there, red, dst, base, first, lane, lanes, m, vectors, recv, send, reduce, store, last,
                    r, s, sflag, whole)
    if passes > 1:
        _ll128_pass_out(outbox, there + LL128_PASS_WORDS, red, dst, base, first + per_pass, lane, lanes, m, vectors,
                        recv, send, reduce, store, last, q, t, sflag, whole)


@device
def ll128_part(comm, peer, inbox, at, outbox, to, src, dst, base, e0, npasses, m, lane, red, rflag, sflag, vectors,
               recv, send, reduce, store, last):
    """LL128: the warp moves the ``npasses`` passes of its part (from ``inbox[at:]`` and ``outbox[to:]``,
    uint64 views; ``e0``: the part's first element of the slot, of ``m``). Passes past the data are
    neither sent nor waited for.

    Full passes go two at a time (:func:`_ll128_passes`), so that a pass costs no memory round
    trip of its own; a pass the data end in goes alone, element by element where it must."""
    lanes = 16 // mem.itemsize(dst)
    per_pass = _LL128_PASS_BYTES // mem.itemsize(dst)
    p = 0
    while p < npasses and e0 + p * per_pass < m:
        first = e0 + p * per_pass
        here = at + p * LL128_PASS_WORDS
        there = to + p * LL128_PASS_WORDS
        if vectors and p + 1 < npasses and first + 2 * per_pass <= m:
            _ll128_passes(comm, peer, inbox, here, outbox, there, src, dst, base, first, lane, lanes, per_pass, m, red,
                          rflag, sflag, vectors, recv, send, reduce, store, last, 2, True)
            p += 2
        else:
            _ll128_passes(comm, peer, inbox, here, outbox, there, src, dst, base, first, lane, lanes, per_pass, m, red,
                          rflag, sflag, vectors, recv, send, reduce, store, last, 1, False)
            p += 1
