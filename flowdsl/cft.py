"""CFT (Compute Fabric Transport): puts and gets addressed by logical endpoint, counted writes, barriers.

CFT (NCCL >= 2.31, Blackwell sm_100 or newer, CUDA >= 13.3) moves data
between shared memory of this block and a peer's window through the fabric.
A peer's window is addressed by a **logical endpoint** (LE) id and a byte
offset in it, not by a pointer: :func:`le_info` gives both for a window,
an offset and a peer of a team (:func:`team` is a CFT team: every rank with CFT,
or with :class:`CftTeamMode` ``HIER_LSA`` one rank per LSA team).

Operations run in a **session** (``ncclCft``) that a coop opens over 32 bytes
of shared memory (:data:`SESSION_WORDS` u64 words, 16-byte aligned:
``cuda.shared.array(4, uint64, alignment=16)``): :func:`put`,
:func:`put_counted` and :func:`get` queue operations, :func:`submit` hands
them to the fabric, :func:`flush` waits until they have completed (puts
written at the peer, gets landed in shared memory) and :func:`flush_smem`
only until the fabric has read their shared-memory sources. Sources and
destinations are shared memory, 16-byte aligned, sizes multiples of 16 bytes.
:func:`close` ends the session. Each concurrent session (one per warp, say)
needs its own storage.

**Counted writes** (NCCL >= 2.32): :func:`put_counted` writes into a window registered with
``comm.register(buf, cft_counted=True)`` (``NCCL_WIN_CFT_COUNTED``) and then
adds the number of bytes written to a u64 **counter** in that window, after
the data. The sender needs no fence and no flag; the receiver waits until the
counter reaches the bytes it expects (:func:`wait_counted`) and must **fence
between reading the counter and reading the data** (:func:`fence`, fabric to
generic proxy). :func:`wait_counted` includes that fence; :func:`read_counter`
does not.

:func:`barrier` is a barrier session over the CFT team (``ncclCftBarrierSession``;
the device communicator needs ``cft_barrier_count``), with ``arrive``,
``wait`` and ``sync(order, producer, consumer)``.
"""

from __future__ import annotations

import enum

from ._spec import (C_COMM, C_TEAM, C_WIN, CFT_BARRIER_SESSION, CFT_SESSION, COMM, COOP, ENUM, SHARED_ARRAY, TEAM,
                    WINDOW, CFunction, Gate)
from ._stubs import primitive
from .enums import ConstantEnumMeta, MemoryOrder

__all__ = [
    "SESSION_WORDS", "MemProxyType", "MemFenceScope", "CftTeamMode", "team", "le_info", "peer_le_info", "session",
    "put", "put_counted", "get", "submit", "flush", "flush_smem", "close", "read_counter", "wait_counted", "fence",
    "barrier", "barrier_arrive", "barrier_wait", "barrier_sync",
]

#: Every CFT primitive needs NCCL 2.31, Blackwell (sm_100) and a CUDA 13.3 linker (NCCL's headers compile
#: CFT only then).
GATE = Gate(nccl=(2, 31, 0), min_cc=(10, 0), cuda=(13, 3))
#: Counted writes, counters and ``waitCounted`` came with NCCL 2.32 (2.31.2's headers have none of them).
COUNTED_GATE = Gate(nccl=(2, 32, 0), min_cc=(10, 0), cuda=(13, 3))
COUNTED_WINDOW = WINDOW.but("a counted window")
ORDER_ENUM = ENUM.but("a flowdsl.MemoryOrder", "Pass a flowdsl.MemoryOrder")
PROXY_ENUM = ENUM.but("a flowdsl.cft.MemProxyType", "Pass a flowdsl.cft.MemProxyType")

#: A session's C argument: the address of its shared-memory storage.
_SESSION = ("ptr", "session")


def _cft_session_call(doc: str) -> CFunction:
    """The C function of a session call that takes only the session."""
    return CFunction("void", (_SESSION,), doc, coop=True, library="cft")


def _cft_transfer(buffer: str, doc: str) -> CFunction:
    """The C function of a put or a get: ``bytes`` between an LE at an offset and the shared array ``buffer``."""
    return CFunction("void", (_SESSION, ("uint32", "le_id"), ("size_t", "le_offset"), ("ptr", buffer),
                              ("uint32", "bytes")), doc, coop=True, library="cft")


def _cft_barrier(doc: str) -> CFunction:
    """The C function of a CFT barrier session's arrive, wait or sync."""
    return CFunction("void", (C_COMM, ("uint32", "index"), ("order", "order"), ("int", "producer"),
                              ("int", "consumer")), doc, coop=True, library="cft")


#: u64 words of shared memory one session needs (its mbarrier and NCCL's session state).
SESSION_WORDS = 4


class MemProxyType(enum.IntEnum, metaclass=ConstantEnumMeta):
    """Which proxy produced or consumes memory (``ncclMemProxyType``; values match NCCL).

    ``GENERIC``: ordinary loads and stores. ``FABRIC``: CFT operations.
    """

    GENERIC = 1
    FABRIC = 2


class MemFenceScope(enum.IntEnum, metaclass=ConstantEnumMeta):
    """Scope of :func:`fence` (``ncclMemFenceScope``; values match NCCL)."""

    CTA = 1
    SYS = 2


class CftTeamMode(enum.IntEnum, metaclass=ConstantEnumMeta):
    """Which CFT team :func:`team` gives (``ncclCftTeamMode_t``; values match NCCL).

    ``FLAT``: every rank of the CFT domain (``cftSize`` ranks, this rank's index ``cftRank``, stride 1).
    ``HIER_LSA``: the ranks at this rank's position in every LSA team of the CFT domain
    (``cftSize / lsaSize`` ranks, index ``cftRank / lsaSize``, stride ``lsaSize``): one rank per node,
    the team a hierarchical collective's far phase uses beside an LSA phase inside the node.
    ``HIER_MULTIMEM``: the same over the CFT multimem teams (``ncclTeamCftMultimem``) instead of the
    LSA teams (``cftSize / cftMultimemSize`` ranks, stride ``cftMultimemSize``).
    """

    FLAT = 0
    HIER_MULTIMEM = 1
    HIER_LSA = 2


@primitive(extern="flowdsl_cft_team",
           c=CFunction("void", (C_COMM, ("int", "mode"), ("int_out", "out")),
                       "ncclTeamCft(comm, mode): mode is an ncclCftTeamMode_t.", library="cft"),
           gate=GATE, comm=COMM,
           mode=ENUM.but("a flowdsl.cft.CftTeamMode", "Pass flowdsl.cft.CftTeamMode.FLAT, HIER_LSA or HIER_MULTIMEM",
                         choices=tuple(CftTeamMode), constant=True))
def team(comm, mode=CftTeamMode.FLAT):
    """A CFT team of the device communicator (``ncclTeamCft(comm, mode)``; see :class:`CftTeamMode`).

    The default, ``FLAT``, is every rank with CFT. ``team(comm, CftTeamMode.HIER_LSA)`` is one rank per
    LSA team: this rank and the ranks with its LSA rank in the other LSA teams (nodes), so :func:`le_info`
    over it addresses this LSA rank on every node, as ``flowdsl.team.rail`` does for GIN. ``HIER_MULTIMEM``
    needs a device communicator made with ``cft_caps`` including NCCL_CFT_MULTIMEM (2). ``mode`` is a
    compile-time constant.
    """


@primitive(extern="flowdsl_cft_le_info",
           c=CFunction(
               "void", (C_COMM, C_WIN, ("size_t", "offset"), C_TEAM, ("int", "peer"), ("u64_out", "out")),
               "ncclGetCftLeInfo: out[0] = LE id, out[1] = LE offset.", library="cft"),
           gate=GATE, comm=COMM, win=WINDOW.but("a window"), team=TEAM.but("a team (flowdsl.cft.team(comm), ...)"))
def le_info(comm, win, offset, team, peer):
    """``(le_id, le_offset)`` of byte ``offset`` of ``team``'s rank ``peer``'s ``win`` (``ncclGetCftLeInfo``)."""


@primitive(extern="flowdsl_cft_peer_le_info",
           c=CFunction(
               "void", (C_COMM, C_WIN, ("size_t", "offset"), ("int", "peer"), ("u64_out", "out")),
               "ncclGetPeerLeInfo (world peer): out[0] = LE id, out[1] = LE offset.", library="cft"),
           gate=GATE, comm=COMM, win=WINDOW.but("a window"))
def peer_le_info(comm, win, offset, peer):
    """``(le_id, le_offset)`` of byte ``offset`` of world rank ``peer``'s ``win`` (``ncclGetPeerLeInfo``)."""


@primitive(extern="flowdsl_cft_read_counter",
           c=CFunction(
               "uint64", (C_WIN, ("size_t", "offset"), ("order", "order")),
               "Load of the u64 counter at a byte offset of the local counted window (no fabric fence).", library="cft"),
           gate=COUNTED_GATE, win=COUNTED_WINDOW, order=ORDER_ENUM)
def read_counter(win, offset, order=MemoryOrder.RELAXED):
    """The u64 counter at byte ``offset`` of this rank's counted ``win``.

    It does not order the data the counter covers: :func:`fence` before reading it.
    """


@primitive(extern="flowdsl_cft_session_open",
           c=_cft_session_call(
               "ncclCft constructor: initialises the session's mbarrier in shared memory."),
           gate=GATE, comm=COMM, coop=COOP.but("a coop (flowdsl.coop.warp(), .cta(), ...)"))
def session(comm, coop, storage):
    """Open a CFT session of ``coop`` over ``storage`` (``ncclCft(coop, smem)``).

    ``storage`` is a shared-memory u64 array of at least :data:`SESSION_WORDS`
    elements, 16-byte aligned, used by no other open session. Every thread of
    ``coop`` calls it and every later operation of the session.
    """


@primitive(extern="flowdsl_cft_session_close",
           c=_cft_session_call("ncclCft destructor: invalidates the session's mbarrier."),
           gate=GATE, session=CFT_SESSION)
def close(session):
    """End the session (``~ncclCft``: its mbarrier is invalidated; the storage may be reused)."""


@primitive(extern="flowdsl_cft_put",
           c=_cft_transfer("src", "ncclCft::put."),
           gate=GATE, session=CFT_SESSION, src=SHARED_ARRAY)
def put(session, le_id, le_offset, src, nbytes):
    """Queue a write of ``nbytes`` from the shared array ``src`` to the LE ``le_id`` at ``le_offset``."""


@primitive(extern="flowdsl_cft_put_counted",
           c=CFunction(
               "void", (_SESSION, ("uint32", "le_id"), ("size_t", "le_offset"), ("size_t", "counter_offset"), ("ptr", "src"),
               ("uint32", "bytes")), "ncclCft::putCounted.", coop=True, library="cft"),
           gate=COUNTED_GATE, session=CFT_SESSION, src=SHARED_ARRAY)
def put_counted(session, le_id, le_offset, counter_offset, src, nbytes):
    """Queue a counted write: the data, then ``nbytes`` added to the u64 counter at ``counter_offset``.

    Both offsets are LE offsets of the same counted window (from :func:`le_info`).
    """


@primitive(extern="flowdsl_cft_get",
           c=_cft_transfer("dst", "ncclCft::get."),
           gate=GATE, session=CFT_SESSION, dst=SHARED_ARRAY)
def get(session, le_id, le_offset, dst, nbytes):
    """Queue a read of ``nbytes`` from the LE ``le_id`` at ``le_offset`` into the shared array ``dst``."""


@primitive(extern="flowdsl_cft_submit",
           c=_cft_session_call("ncclCft::submit."),
           gate=GATE, session=CFT_SESSION)
def submit(session):
    """Hand the operations queued since the last submit to the fabric (``ncclCft::submit``)."""


@primitive(extern="flowdsl_cft_flush",
           c=CFunction("uint32", (_SESSION,), "ncclCft::flush; 0, or 0x100 | the fabric's report.",
                       coop=True, library="cft"),
           gate=GATE, session=CFT_SESSION)
def flush(session):
    """Wait until every submitted operation has completed; 0, or ``0x100 | report`` if the fabric reported one."""


@primitive(extern="flowdsl_cft_flush_smem",
           c=_cft_session_call("ncclCft::flushSmem."),
           gate=GATE, session=CFT_SESSION)
def flush_smem(session):
    """Wait until the fabric has read the shared-memory sources of the submitted puts (they may be reused)."""


@primitive(extern="flowdsl_cft_wait_counted",
           c=CFunction(
               "void", (C_COMM, _SESSION, C_WIN, ("size_t", "offset"), ("uint64", "expected"), ("order", "order"),
               ("int", "consumer")),
               "ncclCft::waitCounted, bounded (waits, then fences fabric -> consumer).", coop=True, library="cft"),
           gate=COUNTED_GATE, session=CFT_SESSION, win=COUNTED_WINDOW, order=ORDER_ENUM, consumer=PROXY_ENUM)
def wait_counted(session, win, offset, expected, order=MemoryOrder.ACQUIRE, consumer=MemProxyType.GENERIC):
    """Wait until the counter at byte ``offset`` of this rank's ``win`` reaches ``expected`` bytes, then fence.

    ``order`` and ``consumer`` choose the fence from the fabric to whoever reads the data next
    (``ncclCft::waitCounted``).
    """


@primitive(extern="flowdsl_cft_mem_fence",
           c=CFunction(
               "void", (("order", "order"), ("int", "producer"), ("int", "consumer"), ("int", "scope")), "ncclMemFence.",
               coop=True, library="cft"),
           gate=GATE, coop=COOP.but("a coop"), order=ORDER_ENUM, producer=PROXY_ENUM, consumer=PROXY_ENUM, scope=ENUM.but("a flowdsl.cft.MemFenceScope", "Pass a flowdsl.cft.MemFenceScope"))
def fence(coop, order=MemoryOrder.ACQUIRE, producer=MemProxyType.FABRIC, consumer=MemProxyType.GENERIC,
          scope=MemFenceScope.SYS):
    """``ncclMemFence``: order ``producer``'s memory accesses before ``consumer``'s.

    The defaults are the receiver-side fence between reading a counter (:func:`read_counter`) and reading the data it counts.
    """


@primitive(gate=GATE, comm=COMM, coop=COOP.but("a coop"))
def barrier(comm, coop, index):
    """A barrier session over the CFT team (``ncclCftBarrierSession``, barrier ``index``).

    ``index`` must be below the device communicator's ``cft_barrier_count``. The session's
    ``arrive``, ``wait`` and ``sync`` are :func:`barrier_arrive`, :func:`barrier_wait` and
    :func:`barrier_sync` (``session.sync(order)``), collective on ``coop``.
    """


# The session's methods: NCCL's ncclCftBarrierSession::arrive, wait and sync. ``order`` has no default (as
# NCCL's); ``producer`` and ``consumer`` choose the proxies the wait's fence orders (NCCL's defaults).
_BARRIER_ARGS = dict(gate=GATE, session=CFT_BARRIER_SESSION, order=ORDER_ENUM, producer=PROXY_ENUM,
                     consumer=PROXY_ENUM)


@primitive(extern="flowdsl_cft_barrier_arrive",
           c=_cft_barrier("ncclCftBarrierSession::arrive."),
           **_BARRIER_ARGS)
def barrier_arrive(session, order, producer=MemProxyType.GENERIC, consumer=MemProxyType.GENERIC):
    """``session.arrive(order)``: this coop has arrived at the CFT barrier."""


@primitive(extern="flowdsl_cft_barrier_wait",
           c=_cft_barrier("ncclCftBarrierSession::wait, bounded."),
           **_BARRIER_ARGS)
def barrier_wait(session, order, producer=MemProxyType.GENERIC, consumer=MemProxyType.GENERIC):
    """``session.wait(order)``: wait until every rank has arrived, then fence ``producer`` to ``consumer``."""


@primitive(extern="flowdsl_cft_barrier_sync",
           c=_cft_barrier("ncclCftBarrierSession::sync, its wait bounded."),
           **_BARRIER_ARGS)
def barrier_sync(session, order, producer=MemProxyType.GENERIC, consumer=MemProxyType.GENERIC):
    """``session.sync(order)``: ``arrive`` then ``wait``."""
