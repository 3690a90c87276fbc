"""How ``flowdsl.gin`` compiles: GIN contexts, typed signal actions, puts, gets, waits, barriers.

A remote action is a value whose *type* carries its kind (legacy, strong or
weak; indexed or VA; inc or add), so the kernel states at compile time which
signals it needs: strong and weak kinds need NCCL >= 2.32, and a kernel that
uses strong signals is refused at launch on a backend that offers only weak
ones (see :data:`STRONG_SIGNAL_FEATURE`). Each (operation, remote kind,
counted, payload size) is its own C function of the GIN library, so a call
inlines exactly one NCCL template instantiation; the action's operands cross
as ``(signal id, VA window, VA offset, value)``. put, put_value and signal
take the coop kind as a constant argument (it folds after LTO inlining) rather
than one function per coop: a fifth of the functions to build and link. Those
three and the barrier syncs are called through one out-of-line body per
(function, coop kind) in a kernel (:func:`_out_of_line`), so a kernel that puts
from several places compiles NCCL's network code for each kind once; a kind
called from one place is inlined there.

A kernel that calls the GIN library is marked :data:`GIN_FEATURE`: it links a
GIN build, that of its device communicator's backend when the target names it
(marked :func:`backend_feature`, checked at launch: :func:`linked_backend`).
"""

from __future__ import annotations

import functools

from numba.core import cgutils, types
from numba.core.errors import NumbaTypeError
from numba.cuda.extending import intrinsic, make_attribute_wrapper, overload, overload_method

from .. import gin
from .._spec import spec_of
from ..enums import CoopKind, GinBackend
from .checks import KIND_TYPES, check, is_omitted, require_gate
from .declarations import SIGNATURES, call_out_of_line, extern, extern_symbol
from .externs import PAYLOAD_SUFFIX, REMOTE_VARIANTS
from .intrinsics import devcomm_ptr, enum_value, struct_maker
from .target import note_feature, require
from .types import CoopType, DevCommType, OneValueType, register_struct_model

__all__ = ["GinContextType", "RemoteActionType", "LocalActionType", "GinBarrierSessionType", "REMOTE_KINDS",
           "STRONG_SIGNAL_FEATURE", "GIN_FEATURE", "backend_feature", "linked_backend"]

#: Remote action kinds; each names a variant of the GIN support functions (externs.REMOTE_VARIANTS).
REMOTE_KINDS = tuple(kind for kind, _ in REMOTE_VARIANTS)
#: Recorded on a compiled kernel that issues strong signals.
STRONG_SIGNAL_FEATURE = "gin.strong_signals"
#: Recorded on a compiled kernel that calls the GIN library (it links a GIN build).
GIN_FEATURE = "gin"
_BACKEND_FEATURE = "gin.backend:"


def backend_feature(backend: GinBackend) -> str:
    """Recorded on a kernel linked with the GIN build of ``backend`` only (it runs with no other)."""
    return _BACKEND_FEATURE + backend.option


def linked_backend(features) -> GinBackend | None:
    """The one GIN backend a compiled kernel runs with, or None (any: no GIN, or every backend linked)."""
    for feature in features:
        if feature.startswith(_BACKEND_FEATURE):
            return GinBackend.from_option(feature[len(_BACKEND_FEATURE):])
    return None


class GinContextType(OneValueType):
    """A GIN context: a device communicator (``comm``, a :class:`DevCommType`) and a context index
    (``ncclGin``)."""

    label, field = "GinContext", "comm"


class RemoteActionType(OneValueType):
    """A signal action of one ``kind`` (``ncclGin_StrongSignalInc``, ...)."""

    label, field = "GinRemoteAction", "kind"

    @property
    def strong(self) -> bool:
        return self.kind.startswith("strong")


class LocalActionType(types.Type):
    """``counter_inc(counter)``: a counter raised once the put's source may be reused."""

    def __init__(self):
        super().__init__(name="GinCounterInc")


class GinBarrierSessionType(types.Type):
    """A barrier session opened by ``opened_by`` (``gin.rail_barrier``, ``gin.world_barrier`` or
    ``gin.hybrid_barrier``), whose ``sync`` calls that primitive's support function."""

    def __init__(self, ctx: GinContextType, coop: CoopType, opened_by: str):
        self.ctx, self.coop, self.opened_by = ctx, coop, opened_by
        super().__init__(name=f"BarrierSession({opened_by}, {ctx.comm}, {coop})")

    @property
    def key(self):
        return self.ctx, self.coop, self.opened_by


local_action_type = LocalActionType()


register_struct_model(GinContextType, lambda fe: [("comm", fe.comm), ("index", types.int32)])
register_struct_model(RemoteActionType, lambda fe: [("signal", types.uint32), ("win", types.voidptr),
                                                    ("offset", types.uint64), ("value", types.uint64)])
register_struct_model(LocalActionType, lambda fe: [("counter", types.uint32)])
register_struct_model(GinBarrierSessionType, lambda fe: [("ctx", fe.ctx), ("coop", fe.coop), ("index", types.uint32)])


for _name in ("comm", "index"):
    make_attribute_wrapper(GinContextType, _name, _name)
for _name in ("signal", "win", "offset", "value"):
    make_attribute_wrapper(RemoteActionType, _name, _name)
make_attribute_wrapper(LocalActionType, "counter", "counter")
for _name in ("ctx", "coop", "index"):
    make_attribute_wrapper(GinBarrierSessionType, _name, _name)


KIND_TYPES.register("gin_context", GinContextType)
KIND_TYPES.register("remote", RemoteActionType)
KIND_TYPES.register("local", LocalActionType)

_make_context = struct_maker(lambda comm, index: GinContextType(comm), ("comm", "index"))
_make_local = struct_maker(local_action_type, ("counter",))
_REMOTE_FIELDS = ("signal", "win", "offset", "value")
_make_remote = {kind: struct_maker(RemoteActionType(kind), _REMOTE_FIELDS) for kind in REMOTE_KINDS}
#: A session maker for each barrier primitive (its name is the session type's ``opened_by``).
_BARRIERS = ("rail_barrier", "world_barrier", "hybrid_barrier")
_make_barrier = {name: struct_maker(lambda ctx, coop, index, name=name: GinBarrierSessionType(ctx, coop, name),
                                    ("ctx", "coop", "index")) for name in _BARRIERS}
#: A hybrid session's parts (``ncclBarrierSession::lsaBarrier()`` and ``::ginBarrier()``): the session type's
#: ``opened_by`` and the C function of their ``sync``.
_SUB_SESSIONS = {"lsa_barrier": ("hybrid_barrier.lsa_barrier", "flowdsl_hybrid_lsa_barrier_sync"),
                 "gin_barrier": ("hybrid_barrier.gin_barrier", "flowdsl_hybrid_gin_barrier_sync")}
_SUB_SYNC = dict(_SUB_SESSIONS.values())
_make_sub = {part: struct_maker(lambda ctx, coop, index, name=name: GinBarrierSessionType(ctx, coop, name),
                                ("ctx", "coop", "index")) for part, (name, _) in _SUB_SESSIONS.items()}


@intrinsic
def _null(typingctx):
    def codegen(context, builder, sig, args):
        return cgutils.voidptr_t(None)
    return types.voidptr(), codegen


@intrinsic
def _payload_bits(typingctx, value):
    """A scalar's bytes as a u64 (what ``putValue`` sends), and its size."""
    if not isinstance(value, (types.Integer, types.Float, types.Boolean)):
        return None

    def codegen(context, builder, sig, args):
        from llvmlite import ir

        ty = sig.args[0]
        width = 8 if isinstance(ty, types.Boolean) else ty.bitwidth
        bits = builder.bitcast(args[0], ir.IntType(width)) if isinstance(ty, types.Float) else \
            builder.zext(args[0], ir.IntType(width)) if isinstance(ty, types.Boolean) else args[0]
        return builder.zext(bits, ir.IntType(64)) if width < 64 else bits
    return types.uint64(value), codegen


def _size_of(value):
    return 1 if isinstance(value, types.Boolean) else value.bitwidth // 8


def _coop_kind(coop) -> CoopKind:
    """The coop's kind (the calling thread when ``coop`` is omitted), as put/put_value/signal take it."""
    return CoopKind.THREAD if is_omitted(coop) else CoopKind(coop.kind)


def _remote_kind(remote) -> str:
    """The kind of a checked remote action (``"none"`` when omitted): gated on the target here, where the
    context (and so the NCCL release) is known, not in the action's constructor."""
    if is_omitted(remote):
        return "none"
    require_gate(f"flowdsl.gin.{remote.kind}", spec_of(getattr(gin, remote.kind)).gate)
    if remote.strong:
        note_feature(STRONG_SIGNAL_FEATURE)
    return remote.kind


def _coop_word(coop):
    """The coop's word, or the calling thread's when ``coop`` is omitted (typed per argument)."""


def _remote_fields(remote):
    """``(signal, window, offset, value)`` of a remote action, zeros when it is omitted."""


def _counter_args(local):
    """``(counter,)`` of a local action, ``()`` when it is omitted (the uncounted put takes none)."""


@overload(_coop_word)
def _coop_word_typer(coop):
    if is_omitted(coop):
        return lambda coop: types.uint32(0)
    return lambda coop: coop._word


@overload(_remote_fields)
def _remote_fields_typer(remote):
    if is_omitted(remote):
        return lambda remote: (types.uint32(0), _null(), types.uint64(0), types.uint64(0))
    return lambda remote: (remote.signal, remote.win, remote.offset, remote.value)


@overload(_counter_args)
def _counter_args_typer(local):
    if is_omitted(local):
        return lambda local: ()
    return lambda local: (local.counter,)


@functools.cache
def _out_of_line(symbol: str, *leading: CoopKind):
    """An intrinsic ``call(args)`` that calls the GIN function ``symbol`` with the constants ``leading`` first
    and the tuple ``args`` after them, through the body :func:`~.declarations.call_out_of_line` makes once per
    kernel for ``(symbol, leading)`` (inlined where the kernel calls it from one place only): the MoE
    example's eight puts and put_values link three bodies of NCCL's network code and one inlined copy instead
    of eight copies, its two hybrid barrier syncs one body. (A tuple, because an intrinsic takes no
    star-args.) Each argument is cast to the C type of its parameter; the device communicator is passed as
    itself (by value), not as :func:`~.intrinsics.devcomm_ptr`."""
    sig = SIGNATURES[symbol]
    params = sig.args[len(leading):]

    @intrinsic
    def call(typingctx, args):
        if not isinstance(args, types.BaseTuple) or len(args) != len(params):
            return None

        def codegen(context, builder, signature, llargs):
            values = [builder.extract_value(llargs[0], i) for i in range(len(args))]
            values = [v if isinstance(ty, DevCommType) else context.cast(builder, v, ty, param)
                      for v, ty, param in zip(values, args, params)]
            return call_out_of_line(context, builder, symbol, leading, values)
        return sig.return_type(args), codegen
    return call


# ---- contexts and actions ------------------------------------------------------------------------

@overload(gin.context)
def gin_context(comm, index=0):
    check(gin.context, comm)
    return lambda comm, index=0: _make_context(comm, index)


def _overload_action(kind: str) -> None:
    """The overload of ``gin.<kind>``, a remote action of that kind: indexed (``signal``) or VA (``win``,
    ``offset``), an increment or an add (``value``). Its operands are ``(signal, VA window, VA offset, value)``,
    zero where the kind has none, 1 for an increment's value."""
    stub, make = getattr(gin, kind), _make_remote[kind]
    if "va_" not in kind and kind.endswith("_inc"):
        def typer(signal):
            return lambda signal: make(signal, _null(), 0, 1)
    elif "va_" not in kind:
        def typer(signal, value):
            return lambda signal, value: make(signal, _null(), 0, value)
    elif kind.endswith("_inc"):
        def typer(win, offset):
            check(stub, win, gated=False)
            return lambda win, offset: make(0, win._handle, offset, 1)
    else:
        def typer(win, offset, value):
            check(stub, win, gated=False)
            return lambda win, offset, value: make(0, win._handle, offset, value)
    overload(stub)(typer)


for _kind in REMOTE_KINDS:
    if _kind != "none":
        _overload_action(_kind)


@overload(gin.counter_inc)
def gin_counter_inc(counter):
    return lambda counter: _make_local(counter)


# ---- one-sided operations: the coop kind, the remote kind and counted-or-not are constants -------

@overload(gin.put)
def gin_put(ctx, team, peer, dst_win, dst_offset, src_win, src_offset, nbytes, remote=None, local=None,
            coop=None):
    check(gin.put, ctx, team, peer, dst_win, dst_offset, src_win, src_offset, nbytes, remote, local, coop)
    kind, coop_kind = _remote_kind(remote), _coop_kind(coop)
    put = _out_of_line(f"flowdsl_gin_put__{kind}{'' if is_omitted(local) else '__counted'}", coop_kind)

    def impl(ctx, team, peer, dst_win, dst_offset, src_win, src_offset, nbytes, remote=None, local=None,
             coop=None):
        signal, win, offset, value = _remote_fields(remote)
        put((_coop_word(coop), ctx.comm, ctx.index, team.nranks, team.rank, team.stride, peer,
             dst_win._handle, dst_offset, src_win._handle, src_offset, nbytes, signal, win, offset, value)
            + _counter_args(local))
    return impl


@overload(gin.put_value)
def gin_put_value(ctx, team, peer, dst_win, dst_offset, value, remote=None, coop=None):
    check(gin.put_value, ctx, team, peer, dst_win, dst_offset, value, remote, coop)
    if not isinstance(value, (types.Integer, types.Float, types.Boolean)):
        raise NumbaTypeError(f"flowdsl.gin.put_value requires a scalar of at most 8 bytes, got {value}")
    kind, coop_kind = _remote_kind(remote), _coop_kind(coop)
    put_value = _out_of_line(f"flowdsl_gin_put_value__{kind}__{PAYLOAD_SUFFIX[_size_of(value)]}", coop_kind)

    def impl(ctx, team, peer, dst_win, dst_offset, value, remote=None, coop=None):
        signal, win, offset, arg = _remote_fields(remote)
        put_value((_coop_word(coop), ctx.comm, ctx.index, team.nranks, team.rank, team.stride, peer,
                   dst_win._handle, dst_offset, _payload_bits(value), signal, win, offset, arg))
    return impl


@overload(gin.signal)
def gin_signal(ctx, team, peer, remote, coop=None):
    check(gin.signal, ctx, team, peer, remote, coop)
    signal = _out_of_line(f"flowdsl_gin_signal__{_remote_kind(remote)}", _coop_kind(coop))

    def impl(ctx, team, peer, remote, coop=None):
        signal((_coop_word(coop), ctx.comm, ctx.index, team.nranks, team.rank, team.stride, peer,
                remote.signal, remote.win, remote.offset, remote.value))
    return impl


@overload(gin.get)
def gin_get(ctx, team, peer, remote_win, remote_offset, local_win, local_offset, nbytes, coop=None):
    check(gin.get, ctx, team, peer, remote_win, remote_offset, local_win, local_offset, nbytes, coop)
    fn = extern(gin.get, None if is_omitted(coop) else coop)

    def impl(ctx, team, peer, remote_win, remote_offset, local_win, local_offset, nbytes, coop=None):
        fn(_coop_word(coop), devcomm_ptr(ctx.comm), ctx.index, team.nranks, team.rank, team.stride, peer,
           remote_win._handle, remote_offset, local_win._handle, local_offset, nbytes)
    return impl


# flush and the signals' and counters' reads, waits and resets are one C call each: lowered from their
# specs (``returns=``, flowdsl/lowering/generic.py).

# ---- barriers ----------------------------------------------------------------------------------------

def _barrier_opener(name):
    stub, make = getattr(gin, name), _make_barrier[name]

    @overload(stub)
    def gin_barrier(ctx, coop, index):
        check(stub, ctx, coop)
        return lambda ctx, coop, index: make(ctx, coop, index)


for _barrier in _BARRIERS:
    _barrier_opener(_barrier)


def _fence_level(session, fence) -> int | None:
    """The fence level a session's ``sync`` passes (None for the LSA part of a hybrid session, which has
    none), checked as the simulator checks it; PUT and GET need NCCL 2.32."""
    if session.opened_by == "hybrid_barrier.lsa_barrier":
        if not is_omitted(fence):
            raise NumbaTypeError(gin.lsa_part_fence_refusal())
        return None
    if is_omitted(fence):
        level = int(gin.DEFAULT_FENCE)
    else:
        level = getattr(fence, "literal_value", None)
        if not isinstance(level, int) or gin.fence_refusal(level):
            raise NumbaTypeError(gin.fence_refusal(level if isinstance(level, int) else str(fence)))
    if level:
        require(gin.FENCE_FEATURE, nccl=gin.FENCE_NCCL)
    return level


@overload_method(GinBarrierSessionType, "sync")
def gin_barrier_sync(session, order, fence=gin.DEFAULT_FENCE):
    opener = getattr(gin, session.opened_by.split(".")[0])  # a sub-session's: the hybrid barrier's
    sync = _out_of_line(extern_symbol(opener, session.coop, stem=_SUB_SYNC.get(session.opened_by)))
    level = _fence_level(session, fence)
    if level is None:
        return lambda session, order, fence=gin.DEFAULT_FENCE: sync((session.coop._word, session.ctx.comm,
                                                                   session.ctx.index, session.index,
                                                                   enum_value(order)))
    return lambda session, order, fence=gin.DEFAULT_FENCE: sync((session.coop._word, session.ctx.comm,
                                                               session.ctx.index, session.index,
                                                               enum_value(order), level))


def _sub_session(part):
    make = _make_sub[part]

    @overload_method(GinBarrierSessionType, part)
    def gin_barrier_part(session):
        if session.opened_by != "hybrid_barrier":
            raise NumbaTypeError(gin._sub_session_refusal(part, session.opened_by.split(".")[0]))
        return lambda session: make(session.ctx, session.coop, session.index)


for _part in _SUB_SESSIONS:
    _sub_session(_part)
