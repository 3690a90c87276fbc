"""GIN (GPU-initiated networking): one-sided puts and gets between nodes, with signals and counters.

A GIN context (:func:`context`) issues one-sided operations to a peer of a
team. The receiver learns that data has landed through a **signal** (a
64-bit value at the receiver, indexed by id or placed at a window address,
``va``), the sender that its source may be reused through a **counter**.

Signal kinds — the kernel states which it needs:

* **strong**: when the signal is seen, this put *and every earlier put on the
  same context to the same peer* have landed (NCCL >= 2.32: ``strong_*``);
* **weak**: only the put that carries the signal has landed (``weak_*``).
  Networks that deliver out of order (AWS EFA's SRD) and the EFA GDA backend
  offer weak signals only;
* legacy (:func:`signal_inc`, :func:`signal_add`, NCCL >= 2.28): strong exactly
  where the device communicator requires strong signals (``gin_strong_signals_required``,
  True unless set: NCCL 2.32's rule), weak otherwise.

Remote actions (``remote=`` of :func:`put`, :func:`put_value`, :func:`signal`):
:func:`signal_inc`, :func:`signal_add`, :func:`strong_signal_inc`,
:func:`weak_signal_inc`, :func:`strong_signal_add`, :func:`weak_signal_add`,
:func:`strong_va_signal_inc`, :func:`weak_va_signal_inc`,
:func:`strong_va_signal_add`, :func:`weak_va_signal_add`.
Local action (``local=`` of :func:`put`): :func:`counter_inc`.
Operations: :func:`context`, :func:`put`, :func:`put_value`, :func:`signal`,
:func:`get` (NCCL >= 2.32), :func:`flush`, :func:`read_signal`,
:func:`wait_signal`, :func:`reset_signal`, :func:`read_counter`,
:func:`wait_counter`, :func:`reset_counter`.
Barriers, each named by its team as NCCL's are and each a session with ``sync(order, fence=...)``:
:func:`rail_barrier` (the rail team over GIN), :func:`world_barrier` (every rank over GIN,
NCCL >= 2.30) and :func:`hybrid_barrier` (every rank: LSA inside a node, GIN across).
``fence`` (:class:`flowdsl.GinFenceLevel`, NCCL's ``ncclGinFenceLevel``) is NCCL 2.32's: ``PUT_GET`` when
left out. At ``NONE`` the arrivals are NCCL's legacy signals, ordered after this rank's earlier puts on the
context where those are strong and after none on EFA GDA; ``PUT`` flushes first where signals are weak, so
every member's earlier puts to this rank are visible once the barrier returns; ``GET`` flushes after, so this
rank's earlier gets have landed.
Offsets and sizes are in bytes, as in NCCL.
"""

from __future__ import annotations

from ._spec import C_COMM, C_TEAM, COMM, COOP, GIN_CONTEXT, LOCAL, ORDER, REMOTE, TEAM, WINDOW, CFunction, Gate
from ._stubs import primitive
from .enums import GinFenceLevel, MemoryOrder

__all__ = [
    "context", "signal_inc", "signal_add", "strong_signal_inc", "weak_signal_inc", "strong_signal_add",
    "weak_signal_add", "strong_va_signal_inc", "weak_va_signal_inc", "strong_va_signal_add",
    "weak_va_signal_add", "counter_inc", "put", "put_value", "signal", "get", "flush", "read_signal",
    "wait_signal", "reset_signal", "read_counter", "wait_counter", "reset_counter", "rail_barrier",
    "world_barrier", "hybrid_barrier",
]

#: Strong, weak and VA signals, and get.
NCCL_2_32 = Gate(nccl=(2, 32, 0))
#: The world team's GIN barrier (``worldGinBarrierCount``): NCCL 2.30; of flowdsl's builds, 2.32.3 on.
NCCL_2_30 = Gate(nccl=(2, 30, 0))
#: The threads that issue a put, put_value, signal or get together (default: the calling thread).
ISSUING_COOP = COOP.but("a coop (flowdsl.coop.thread(), .warp(), .cta(), ...)")


@primitive(comm=COMM)
def context(comm, index=0):
    """GIN context ``index`` of the device communicator (``ncclGin(comm, index)``).

    ``index`` must be below the context count the device communicator has.
    """


@primitive
def signal_inc(signal):
    """Remote action: add 1 to signal ``signal`` (legacy kind, ``ncclGin_SignalInc``)."""


@primitive
def signal_add(signal, value):
    """Remote action: add ``value`` to signal ``signal`` (legacy kind, ``ncclGin_SignalAdd``)."""


@primitive(gate=NCCL_2_32)
def strong_signal_inc(signal):
    """Remote action: add 1 to ``signal``, strong (covers earlier puts to the peer). NCCL >= 2.32."""


@primitive(gate=NCCL_2_32)
def weak_signal_inc(signal):
    """Remote action: add 1 to ``signal``, weak (covers only this put). NCCL >= 2.32."""


@primitive(gate=NCCL_2_32)
def strong_signal_add(signal, value):
    """Remote action: add ``value`` to ``signal``, strong. NCCL >= 2.32."""


@primitive(gate=NCCL_2_32)
def weak_signal_add(signal, value):
    """Remote action: add ``value`` to ``signal``, weak. NCCL >= 2.32."""


@primitive(gate=NCCL_2_32, win=WINDOW)
def strong_va_signal_inc(win, offset):
    """Remote action: add 1 to the u64 at byte ``offset`` of the peer's ``win``, strong. NCCL >= 2.32."""


@primitive(gate=NCCL_2_32, win=WINDOW)
def weak_va_signal_inc(win, offset):
    """Remote action: add 1 to the u64 at byte ``offset`` of the peer's ``win``, weak. NCCL >= 2.32."""


@primitive(gate=NCCL_2_32, win=WINDOW)
def strong_va_signal_add(win, offset, value):
    """Remote action: add ``value`` to the u64 at byte ``offset`` of the peer's ``win``, strong. NCCL >= 2.32."""


@primitive(gate=NCCL_2_32, win=WINDOW)
def weak_va_signal_add(win, offset, value):
    """Remote action: add ``value`` to the u64 at byte ``offset`` of the peer's ``win``, weak. NCCL >= 2.32."""


@primitive
def counter_inc(counter):
    """Local action: add 1 to counter ``counter`` once the source of the put may be reused."""


# The C functions of put, put_value and signal: one per remote action (and counted or not, and payload size);
# they take the coop kind and word as arguments (one function for every coop: prebuilt/src/flowdsl_gin.cu).
#: GIN remote actions: (kind, oldest NCCL with it), from the actions' gates: legacy kinds exist since 2.28;
#: strong, weak and VA signals are used from 2.32.
REMOTE_VARIANTS = (("none", Gate().nccl),) + tuple(
    (name, globals()[name].__flowdsl_spec__.gate.nccl) for name in __all__ if name.endswith(("_inc", "_add"))
    and name != "counter_inc")
#: put_value payload sizes: the suffix of each function.
PAYLOAD_SUFFIX = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}
_REMOTE = (("uint32", "signal"), ("window", "signal_win"), ("size_t", "signal_offset"), ("uint64", "value"))
_TO_PEER = (C_COMM, ("int", "ctx"), C_TEAM, ("int", "peer"))
_PUT_ARGS = (("window", "dst"), ("size_t", "dst_offset"), ("window", "src"), ("size_t", "src_offset"),
             ("size_t", "bytes"))
#: The coop as arguments: its kind (flowdsl.enums.CoopKind) and its packed word.
_COOP_ARGS = (("int", "coop_kind"), ("uint32", "coop"))


def _gin_read(what: str) -> CFunction:
    """The C function of a GIN signal's or counter's (``what``) read."""
    return CFunction("uint64", (C_COMM, ("int", "ctx"), ("uint32", what), ("int", "bits"), ("order", "order")),
                     f"ncclGin::read{what.capitalize()}.", library="gin")


def _gin_wait(what: str) -> CFunction:
    """The C function of a GIN signal's or counter's (``what``) bounded wait."""
    return CFunction("void", (C_COMM, ("int", "ctx"), ("uint32", what), ("uint64", "least"), ("int", "bits"),
                              ("order", "order")), f"ncclGin::wait{what.capitalize()}, bounded.", coop=True,
                     library="gin")


def _gin_reset(what: str) -> CFunction:
    """The C function of a GIN signal's or counter's (``what``) reset."""
    return CFunction("void", (C_COMM, ("int", "ctx"), ("uint32", what)), f"ncclGin::reset{what.capitalize()}.",
                     library="gin")


def _gin_barrier(doc: str, name: str | None = None, fence: bool = True) -> CFunction:
    """The C function of a GIN or hybrid barrier session's sync (with its fence level, unless the session is
    the LSA part of a hybrid one, whose sync has none in NCCL)."""
    args = (C_COMM, ("int", "ctx"), ("uint32", "index"), ("order", "order")) + ((("uint32", "fence"),) if fence else ())
    return CFunction("void", args, doc, coop=True, library="gin", name=name)


@primitive(extern="flowdsl_gin_put",
           c=(CFunction("void", _COOP_ARGS + _TO_PEER + _PUT_ARGS + _REMOTE, "ncclGin::put with a remote action.",
                        library="gin", variants=REMOTE_VARIANTS),
              CFunction("void", _COOP_ARGS + _TO_PEER + _PUT_ARGS + _REMOTE + (("uint32", "counter"),),
                        "ncclGin::put with a remote action and a counter.", library="gin",
                        variants=tuple((f"{kind}__counted", since) for kind, since in REMOTE_VARIANTS))),
           ctx=GIN_CONTEXT, team=TEAM.but("a team (flowdsl.team.world(comm), ...)"), dst_win=WINDOW.but("a destination window"), src_win=WINDOW.but("a source window"), remote=REMOTE, local=LOCAL, coop=ISSUING_COOP)
def put(ctx, team, peer, dst_win, dst_offset, src_win, src_offset, nbytes, remote=None, local=None, coop=None):
    """One-sided write of ``nbytes`` from this rank's ``src_win`` to ``team``'s rank ``peer``'s ``dst_win``.

    ``remote`` (a signal action) fires at the peer after the data lands, ``local``
    (:func:`counter_inc`) here once the source may be reused. ``coop`` (default: the
    calling thread) is the group of threads that issue it together.
    """


@primitive(extern="flowdsl_gin_put_value",
           c=CFunction(
               "void", _COOP_ARGS + _TO_PEER + (("window", "dst"), ("size_t", "dst_offset"), ("uint64", "payload")) + _REMOTE,
               "ncclGin::putValue of a 1, 2, 4 or 8-byte payload (the suffix).", library="gin",
               variants=tuple((f"{kind}__{size}", since) for kind, since in REMOTE_VARIANTS for size in PAYLOAD_SUFFIX.values())),
           ctx=GIN_CONTEXT, team=TEAM, dst_win=WINDOW.but("a destination window"), remote=REMOTE, coop=ISSUING_COOP)
def put_value(ctx, team, peer, dst_win, dst_offset, value, remote=None, coop=None):
    """One-sided write of the scalar ``value`` (at most 8 bytes) to the peer's ``dst_win``."""


@primitive(extern="flowdsl_gin_signal",
           c=CFunction("void", _COOP_ARGS + _TO_PEER + _REMOTE, "ncclGin::signal.", library="gin",
                       variants=REMOTE_VARIANTS[1:]),
           ctx=GIN_CONTEXT, team=TEAM, remote=REMOTE, coop=ISSUING_COOP)
def signal(ctx, team, peer, remote, coop=None):
    """Apply the signal action ``remote`` at the peer with no data (ordered after earlier puts if strong)."""


@primitive(extern="flowdsl_gin_get",
           c=CFunction(
               "void", (C_COMM, ("int", "ctx"), C_TEAM, ("int", "peer"), ("window", "remote"), ("size_t", "remote_offset"),
               ("window", "local"), ("size_t", "local_offset"), ("size_t", "bytes")), "ncclGin::get.", coop=True,
               library="gin"),
           gate=NCCL_2_32, ctx=GIN_CONTEXT, team=TEAM, remote_win=WINDOW.but("a remote window"), local_win=WINDOW.but("a local window"), coop=ISSUING_COOP)
def get(ctx, team, peer, remote_win, remote_offset, local_win, local_offset, nbytes, coop=None):
    """One-sided read of ``nbytes`` from the peer's ``remote_win`` into ``local_win``. NCCL >= 2.32.

    Completion is known through :func:`flush`.
    """


@primitive(extern="flowdsl_gin_flush",
           returns="none",
           c=CFunction("void", (C_COMM, ("int", "ctx"), ("order", "order")), "ncclGin::flush.",
                       coop=True, library="gin"),
           ctx=GIN_CONTEXT, coop=COOP.but("a coop"), order=ORDER)
def flush(ctx, coop, order=MemoryOrder.ACQUIRE):
    """Wait until every operation this coop issued on ``ctx`` has consumed its source (and gets landed).

    It does not mean puts have landed at the peer.
    """


@primitive(extern="flowdsl_gin_read_signal",
           returns="value",
           c=_gin_read("signal"),
           ctx=GIN_CONTEXT, order=ORDER)
def read_signal(ctx, signal, bits=64, order=MemoryOrder.ACQUIRE):
    """Current value of signal ``signal`` (low ``bits`` bits)."""


@primitive(extern="flowdsl_gin_wait_signal",
           returns="none",
           c=_gin_wait("signal"),
           ctx=GIN_CONTEXT, coop=COOP.but("a coop"), order=ORDER)
def wait_signal(ctx, coop, signal, least, bits=64, order=MemoryOrder.ACQUIRE):
    """Wait until signal ``signal`` reaches ``least`` (rolling comparison over ``bits`` bits)."""


@primitive(extern="flowdsl_gin_reset_signal",
           returns="none",
           c=_gin_reset("signal"),
           ctx=GIN_CONTEXT)
def reset_signal(ctx, signal):
    """Set signal ``signal`` to 0. Must not race with puts that signal it."""


@primitive(extern="flowdsl_gin_read_counter",
           returns="value",
           c=_gin_read("counter"),
           ctx=GIN_CONTEXT, order=ORDER)
def read_counter(ctx, counter, bits=56, order=MemoryOrder.ACQUIRE):
    """Current value of counter ``counter`` (counters have 56 bits)."""


@primitive(extern="flowdsl_gin_wait_counter",
           returns="none",
           c=_gin_wait("counter"),
           ctx=GIN_CONTEXT, coop=COOP.but("a coop"), order=ORDER)
def wait_counter(ctx, coop, counter, least, bits=56, order=MemoryOrder.ACQUIRE):
    """Wait until counter ``counter`` reaches ``least``."""


@primitive(extern="flowdsl_gin_reset_counter",
           returns="none",
           c=_gin_reset("counter"),
           ctx=GIN_CONTEXT)
def reset_counter(ctx, counter):
    """Set counter ``counter`` to 0. Must not race with puts that count on it."""


@primitive(extern="flowdsl_gin_rail_barrier_sync",
           c=_gin_barrier("ncclGinBarrierSession (rail team)::sync, bounded."),
           ctx=GIN_CONTEXT, coop=COOP.but("a coop"))
def rail_barrier(ctx, coop, index):
    """A GIN barrier session on the rail team (``ncclGinBarrierSession`` on ``ncclTeamTagRail``): the ranks of
    this LSA rank on every node.

    ``index`` must be below the device communicator's ``rail_gin_barrier_count``.
    The session's ``sync(order, fence=GinFenceLevel.PUT_GET)`` is collective on ``coop`` (``fence``: what it
    drains, :class:`flowdsl.GinFenceLevel`; NCCL 2.28 takes ``NONE`` only).
    """


@primitive(extern="flowdsl_gin_world_barrier_sync",
           c=_gin_barrier("ncclGinBarrierSession (world team)::sync, bounded."),
           gate=NCCL_2_30, ctx=GIN_CONTEXT, coop=COOP.but("a coop"))
def world_barrier(ctx, coop, index):
    """A GIN barrier session on the world team (``ncclGinBarrierSession`` on ``ncclTeamTagWorld``): every rank,
    each arrival a GIN signal, also between ranks of one node (needs GIN connections to every rank:
    ``gin_connection_type`` FULL, flowdsl's default).

    ``index`` must be below the device communicator's ``world_gin_barrier_count``.
    The session's ``sync(order, fence=GinFenceLevel.PUT_GET)`` is collective on ``coop``.
    """


def __getattr__(name: str):
    if name == "barrier":  # the rail team's barrier had this name: a port of NCCL's world barrier took it
        raise AttributeError("flowdsl.gin has no barrier: name the team, as NCCL does. flowdsl.gin.rail_barrier is "
                             "NCCL's rail GIN barrier (ncclTeamTagRail), flowdsl.gin.world_barrier its world GIN "
                             "barrier (ncclTeamTagWorld), flowdsl.gin.hybrid_barrier its ncclBarrierSession over "
                             "every rank (LSA inside a node, GIN across)")
    raise AttributeError(f"module 'flowdsl.gin' has no attribute {name!r}")


#: A barrier session's ``sync(order, fence=...)`` when ``fence`` is left out: NCCL 2.32's default.
DEFAULT_FENCE = GinFenceLevel.PUT_GET
#: NCCL 2.28 has fence level None only (its ``Relaxed``); PUT and GET need 2.32.
FENCE_NCCL = (2, 32, 0)


def fence_refusal(fence) -> str | None:
    """Why ``fence`` is refused as a barrier's fence level, or None (the GPU's typing and the simulator
    say the same)."""
    if isinstance(fence, bool) or not isinstance(fence, int) or not 0 <= int(fence) <= int(GinFenceLevel.PUT_GET):
        got = int(fence) if isinstance(fence, int) and not isinstance(fence, bool) else fence  # as a kernel sees it
        return (f"A GIN barrier's sync requires fence to be a flowdsl.GinFenceLevel (NONE, PUT, GET or PUT_GET), "
                f"got {got!r}. Pass one of them, or leave fence out for NCCL's default, PUT_GET")
    return None


#: What a fence level other than NONE is called when a target refuses it (:data:`FENCE_NCCL`).
FENCE_FEATURE = ("A GIN barrier's fence level PUT or GET (sync's fence; left out it is NCCL 2.32's default, PUT_GET, "
                 "and NCCL 2.28's barriers have NONE only: pass fence=flowdsl.GinFenceLevel.NONE there)")


def lsa_part_fence_refusal() -> str:
    """Why the LSA part of a hybrid session takes no fence level."""
    return ("The LSA part of a hybrid barrier session (session.lsa_barrier()) syncs with sync(order) only: NCCL's "
            "lsaBarrier().sync has no fence level, as LSA stores need no draining. Leave fence out")


def _sub_session_refusal(part: str, opened_by: str) -> str:
    """Why ``part()`` (``lsa_barrier`` or ``gin_barrier``) of a session opened by ``opened_by`` is refused (the
    GPU's typing and the simulator say the same)."""
    return (f"Cannot take {part}() of a flowdsl.gin.{opened_by} session: only a hybrid barrier session "
            "(flowdsl.gin.hybrid_barrier) has an LSA and a GIN part. Sync this session itself")


@primitive(extern="flowdsl_hybrid_barrier_sync",
           c=(_gin_barrier("ncclBarrierSession (world: LSA inside, GIN across)::sync, bounded."),
              _gin_barrier("ncclBarrierSession (world)::lsaBarrier().sync, bounded.",
                           name="flowdsl_hybrid_lsa_barrier_sync", fence=False),
              _gin_barrier("ncclBarrierSession (world)::ginBarrier().sync, bounded.",
                           name="flowdsl_hybrid_gin_barrier_sync")),
           ctx=GIN_CONTEXT, coop=COOP.but("a coop"))
def hybrid_barrier(ctx, coop, index):
    """A barrier over every rank: LSA inside each node, GIN across nodes (``ncclBarrierSession``, world).

    Needs both ``lsa_barrier_count`` and ``rail_gin_barrier_count`` above ``index``. The session's
    ``sync(order, fence=GinFenceLevel.PUT_GET)`` is collective on ``coop``: the LSA barrier, then the rail
    team's GIN barrier; with ``PUT`` where GIN reaches ranks outside the rail team, NCCL 2.32's barrier over
    every GIN-connected rank instead of the rail one (the rail barrier's arrivals would not follow puts to
    the others). Its parts are sessions of their own, as NCCL's ``lsaBarrier()`` and ``ginBarrier()`` return
    them: ``session.lsa_barrier().sync(order)`` syncs this node's ranks only (its LSA team, no fence level),
    ``session.gin_barrier().sync(order, fence=...)`` the rail team only (this LSA rank on every node). A
    part's sync moves the epoch the whole session's next sync starts from.
    """
