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
than one function per coop: a fifth of the functions to build and link.

A kernel that calls the GIN library is marked :data:`GIN_FEATURE`: it links a
GIN build, that of its device communicator's backend when the target names it
(marked :func:`backend_feature`, checked at launch: :func:`linked_backend`).
"""

from __future__ import annotations

import inspect

from numba.core import cgutils, types
from numba.core.errors import NumbaTypeError
from numba.cuda import models
from numba.cuda.extending import intrinsic, make_attribute_wrapper, overload, overload_method, register_model

from .. import gin
from ..enums import CoopKind, GinBackend, MemoryOrder
from .checks import expect, is_omitted
from .declarations import DECLARED
from .externs import COOP_SUFFIX, PAYLOAD_SUFFIX, REMOTE_VARIANTS
from .intrinsics import devcomm_ptr, enum_value
from .target import note_feature, require
from .types import CoopType, DevCommType, TeamType, WindowType

__all__ = ["GinContextType", "RemoteActionType", "LocalActionType", "GinBarrierSessionType", "REMOTE_KINDS",
           "STRONG_SIGNAL_FEATURE", "GIN_FEATURE", "backend_feature", "linked_backend", "bind"]

#: Remote action kinds; each names a variant of the GIN support functions (externs.REMOTE_VARIANTS).
REMOTE_KINDS = tuple(kind for kind, _ in REMOTE_VARIANTS)
#: Recorded on a compiled kernel that issues strong signals.
STRONG_SIGNAL_FEATURE = "gin.strong_signals"
#: Recorded on a compiled kernel that calls the GIN library (it links a GIN build).
GIN_FEATURE = "gin"
_BACKEND_FEATURE = "gin.backend:"
_NCCL_2_32 = (2, 32, 0)


def backend_feature(backend: GinBackend) -> str:
    """Recorded on a kernel linked with the GIN build of ``backend`` only (it runs with no other)."""
    return _BACKEND_FEATURE + backend.option


def linked_backend(features) -> GinBackend | None:
    """The one GIN backend a compiled kernel runs with, or None (any: no GIN, or every backend linked)."""
    for feature in features:
        if feature.startswith(_BACKEND_FEATURE):
            return GinBackend.from_option(feature[len(_BACKEND_FEATURE):])
    return None


class GinContextType(types.Type):
    """A GIN context: a device communicator and a context index (``ncclGin``)."""

    def __init__(self, comm: DevCommType):
        self.comm = comm
        super().__init__(name=f"GinContext({comm})")

    @property
    def key(self):
        return self.comm


class RemoteActionType(types.Type):
    """A signal action of one kind (``ncclGin_StrongSignalInc``, ...)."""

    def __init__(self, kind: str):
        self.kind = kind
        super().__init__(name=f"GinRemoteAction({kind})")

    @property
    def key(self):
        return self.kind

    @property
    def strong(self) -> bool:
        return self.kind.startswith("strong")


class LocalActionType(types.Type):
    """``counter_inc(counter)``: a counter raised once the put's source may be reused."""

    def __init__(self):
        super().__init__(name="GinCounterInc")


class GinBarrierSessionType(types.Type):
    """A GIN (rail) or hybrid (world) barrier session."""

    def __init__(self, ctx: GinContextType, coop: CoopType, hybrid: bool):
        self.ctx, self.coop, self.hybrid = ctx, coop, hybrid
        super().__init__(name=f"{'Hybrid' if hybrid else 'Gin'}BarrierSession({ctx.comm}, {coop})")

    @property
    def key(self):
        return self.ctx, self.coop, self.hybrid


local_action_type = LocalActionType()


@register_model(GinContextType)
class _GinContextModel(models.StructModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, [("comm", fe_type.comm), ("index", types.int32)])


@register_model(RemoteActionType)
class _RemoteActionModel(models.StructModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, [("signal", types.uint32), ("win", types.voidptr),
                                        ("offset", types.uint64), ("value", types.uint64)])


@register_model(LocalActionType)
class _LocalActionModel(models.StructModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, [("counter", types.uint32)])


@register_model(GinBarrierSessionType)
class _GinBarrierSessionModel(models.StructModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, [("ctx", fe_type.ctx), ("coop", fe_type.coop), ("index", types.uint32)])


for _name in ("comm", "index"):
    make_attribute_wrapper(GinContextType, _name, _name)
for _name in ("signal", "win", "offset", "value"):
    make_attribute_wrapper(RemoteActionType, _name, _name)
make_attribute_wrapper(LocalActionType, "counter", "counter")
for _name in ("ctx", "coop", "index"):
    make_attribute_wrapper(GinBarrierSessionType, _name, _name)


def _expect(op, what, ty, cls):
    expect(f"flowdsl.gin.{op}", what, ty, cls)


def _remote_maker(kind):
    remote_type = RemoteActionType(kind)

    @intrinsic
    def make(typingctx, signal, win, offset, value):
        def codegen(context, builder, sig, args):
            s = cgutils.create_struct_proxy(remote_type)(context, builder)
            s.signal = context.cast(builder, args[0], sig.args[0], types.uint32)
            s.win = args[1]
            s.offset = context.cast(builder, args[2], sig.args[2], types.uint64)
            s.value = context.cast(builder, args[3], sig.args[3], types.uint64)
            return s._getvalue()
        return remote_type(signal, win, offset, value), codegen
    return make


_make_remote = {kind: _remote_maker(kind) for kind in REMOTE_KINDS}


@intrinsic
def _make_local(typingctx, counter):
    def codegen(context, builder, sig, args):
        s = cgutils.create_struct_proxy(local_action_type)(context, builder)
        s.counter = context.cast(builder, args[0], sig.args[0], types.uint32)
        return s._getvalue()
    return local_action_type(counter), codegen


@intrinsic
def _null(typingctx):
    def codegen(context, builder, sig, args):
        return cgutils.voidptr_t(None)
    return types.voidptr(), codegen


@intrinsic
def _make_context(typingctx, comm, index):
    ctx_type = GinContextType(comm)

    def codegen(context, builder, sig, args):
        s = cgutils.create_struct_proxy(ctx_type)(context, builder)
        s.comm = args[0]
        s.index = context.cast(builder, args[1], sig.args[1], types.int32)
        return s._getvalue()
    return ctx_type(comm, index), codegen


def _session_maker(hybrid):
    @intrinsic
    def make(typingctx, ctx, coop, index):
        session_type = GinBarrierSessionType(ctx, coop, hybrid)

        def codegen(context, builder, sig, args):
            s = cgutils.create_struct_proxy(session_type)(context, builder)
            s.ctx, s.coop = args[0], args[1]
            s.index = context.cast(builder, args[2], sig.args[2], types.uint32)
            return s._getvalue()
        return session_type(ctx, coop, index), codegen
    return make


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


def _coop_of(op, coop):
    """The coop argument's type, or the calling thread when it is omitted."""
    if is_omitted(coop):
        return None
    _expect(op, "a coop (flowdsl.coop.thread(), .warp(), .cta(), ...)", coop, CoopType)
    return coop


def _order_of(op, order):
    if is_omitted(order):
        return None
    if not isinstance(order, (types.Integer, types.IntEnumMember)):
        raise NumbaTypeError(f"flowdsl.gin.{op} requires order to be a flowdsl.MemoryOrder, got {order}")
    return order


_ACQUIRE = int(MemoryOrder.ACQUIRE)


def _coop_kind(coop) -> int:
    """The coop's kind (the calling thread when ``coop`` is None), as put/put_value/signal take it."""
    return int(CoopKind.THREAD if coop is None else coop.kind)


def _symbol(stem, coop):
    return DECLARED[f"{stem}__{COOP_SUFFIX[_coop_kind(coop)]}"]


def _check_remote(op, remote):
    """Check a remote action where the context (and so the NCCL release) is known."""
    _expect(op, "a signal action (flowdsl.gin.strong_signal_inc(id), ...)", remote, RemoteActionType)
    if remote.kind not in ("signal_inc", "signal_add"):
        # Checked here, not in the action's constructor: only here does the type carry the NCCL ABI.
        require(f"flowdsl.gin.{remote.kind}", nccl=_NCCL_2_32)
    if remote.strong:
        note_feature(STRONG_SIGNAL_FEATURE)


def _coop_word(coop):
    """The coop's word, or the calling thread's when ``coop`` is omitted (typed per argument)."""


def _remote_fields(remote):
    """``(signal, window, offset, value)`` of a remote action, zeros when it is omitted."""


def _counter_of(local):
    """The counter of a local action, 0 when it is omitted."""


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


@overload(_counter_of)
def _counter_of_typer(local):
    if is_omitted(local):
        return lambda local: types.uint32(0)
    return lambda local: local.counter


def bind():
    """Register every overload of ``flowdsl.gin``."""

    @overload(gin.context)
    def _context(comm, index=0):
        _expect("context", "a device communicator", comm, DevCommType)
        return lambda comm, index=0: _make_context(comm, index)

    def remote_maker(kind, args):
        make = _make_remote[kind]

        def typer(*params):
            return {
                ("signal",): lambda signal: make(signal, _null(), 0, 1),
                ("signal", "value"): lambda signal, value: make(signal, _null(), 0, value),
                ("win", "offset"): lambda win, offset: make(0, win._handle, offset, 1),
                ("win", "offset", "value"): lambda win, offset, value: make(0, win._handle, offset, value),
            }[args]
        return typer

    for kind in REMOTE_KINDS:
        if kind == "none":
            continue
        stub = getattr(gin, kind)
        args = tuple(stub.__wrapped__.__code__.co_varnames[:stub.__wrapped__.__code__.co_argcount])
        typer = remote_maker(kind, args)
        typer.__signature__ = inspect.signature(stub)  # numba matches the stub's parameter names
        overload(stub)(typer)

    @overload(gin.counter_inc)
    def _counter_inc(counter):
        return lambda counter: _make_local(counter)

    # put: remote and local actions are optional; their kinds and the coop kind are compile-time constants.
    def put_impl(fn, has_local, kind):
        if has_local:
            def impl(ctx, team, peer, dst_win, dst_offset, src_win, src_offset, nbytes, remote=None, local=None,
                     coop=None):
                signal, win, offset, value = _remote_fields(remote)
                fn(kind, _coop_word(coop), devcomm_ptr(ctx.comm), ctx.index, team.nranks, team.rank, team.stride,
                   peer, dst_win._handle, dst_offset, src_win._handle, src_offset, nbytes, signal, win, offset,
                   value, _counter_of(local))
            return impl

        def impl(ctx, team, peer, dst_win, dst_offset, src_win, src_offset, nbytes, remote=None, local=None,
                 coop=None):
            signal, win, offset, value = _remote_fields(remote)
            fn(kind, _coop_word(coop), devcomm_ptr(ctx.comm), ctx.index, team.nranks, team.rank, team.stride,
               peer, dst_win._handle, dst_offset, src_win._handle, src_offset, nbytes, signal, win, offset, value)
        return impl

    @overload(gin.put)
    def _put(ctx, team, peer, dst_win, dst_offset, src_win, src_offset, nbytes, remote=None, local=None,
             coop=None):
        _expect("put", "a GIN context (flowdsl.gin.context(comm))", ctx, GinContextType)
        _expect("put", "a team (flowdsl.team.world(comm), ...)", team, TeamType)
        _expect("put", "a destination window", dst_win, WindowType)
        _expect("put", "a source window", src_win, WindowType)
        has_remote = not is_omitted(remote)
        if has_remote:
            _check_remote("put", remote)
        has_local = not is_omitted(local)
        if has_local:
            _expect("put", "local=flowdsl.gin.counter_inc(counter)", local, LocalActionType)
        c = _coop_of("put", coop)
        kind = remote.kind if has_remote else "none"
        return put_impl(DECLARED[f"flowdsl_gin_put__{kind}{'__counted' if has_local else ''}"], has_local,
                        _coop_kind(c))

    @overload(gin.put_value)
    def _put_value(ctx, team, peer, dst_win, dst_offset, value, remote=None, coop=None):
        _expect("put_value", "a GIN context", ctx, GinContextType)
        _expect("put_value", "a team", team, TeamType)
        _expect("put_value", "a destination window", dst_win, WindowType)
        if not isinstance(value, (types.Integer, types.Float, types.Boolean)):
            raise NumbaTypeError(f"flowdsl.gin.put_value requires a scalar of at most 8 bytes, got {value}")
        has_remote = not is_omitted(remote)
        if has_remote:
            _check_remote("put_value", remote)
        kind = _coop_kind(_coop_of("put_value", coop))
        fn = DECLARED[f"flowdsl_gin_put_value__{remote.kind if has_remote else 'none'}__"
                      f"{PAYLOAD_SUFFIX[_size_of(value)]}"]

        def impl(ctx, team, peer, dst_win, dst_offset, value, remote=None, coop=None):
            signal, win, offset, arg = _remote_fields(remote)
            fn(kind, _coop_word(coop), devcomm_ptr(ctx.comm), ctx.index, team.nranks, team.rank, team.stride, peer,
               dst_win._handle, dst_offset, _payload_bits(value), signal, win, offset, arg)
        return impl

    @overload(gin.signal)
    def _signal(ctx, team, peer, remote, coop=None):
        _expect("signal", "a GIN context", ctx, GinContextType)
        _expect("signal", "a team", team, TeamType)
        _check_remote("signal", remote)
        kind = _coop_kind(_coop_of("signal", coop))
        fn = DECLARED[f"flowdsl_gin_signal__{remote.kind}"]

        def impl(ctx, team, peer, remote, coop=None):
            fn(kind, _coop_word(coop), devcomm_ptr(ctx.comm), ctx.index, team.nranks, team.rank, team.stride, peer,
               remote.signal, remote.win, remote.offset, remote.value)
        return impl

    @overload(gin.get)
    def _get(ctx, team, peer, remote_win, remote_offset, local_win, local_offset, nbytes, coop=None):
        require("flowdsl.gin.get", nccl=_NCCL_2_32)
        _expect("get", "a GIN context", ctx, GinContextType)
        _expect("get", "a team", team, TeamType)
        _expect("get", "a remote window", remote_win, WindowType)
        _expect("get", "a local window", local_win, WindowType)
        c = _coop_of("get", coop)
        fn = _symbol("flowdsl_gin_get", c)

        def impl(ctx, team, peer, remote_win, remote_offset, local_win, local_offset, nbytes, coop=None):
            fn(_coop_word(coop), devcomm_ptr(ctx.comm), ctx.index, team.nranks, team.rank, team.stride, peer,
               remote_win._handle, remote_offset, local_win._handle, local_offset, nbytes)
        return impl

    @overload(gin.flush)
    def _flush(ctx, coop, order=None):
        _expect("flush", "a GIN context", ctx, GinContextType)
        _expect("flush", "a coop", coop, CoopType)
        fn = _symbol("flowdsl_gin_flush", coop)
        if _order_of("flush", order) is None:
            return lambda ctx, coop, order=None: fn(coop._word, devcomm_ptr(ctx.comm), ctx.index, _ACQUIRE)
        return lambda ctx, coop, order=None: fn(coop._word, devcomm_ptr(ctx.comm), ctx.index, enum_value(order))

    read_signal, read_counter = DECLARED["flowdsl_gin_read_signal"], DECLARED["flowdsl_gin_read_counter"]
    reset_signal, reset_counter = DECLARED["flowdsl_gin_reset_signal"], DECLARED["flowdsl_gin_reset_counter"]

    @overload(gin.read_signal)
    def _read_signal(ctx, signal, bits=64, order=None):
        _expect("read_signal", "a GIN context", ctx, GinContextType)
        if _order_of("read_signal", order) is None:
            return lambda ctx, signal, bits=64, order=None: read_signal(
                devcomm_ptr(ctx.comm), ctx.index, signal, bits, _ACQUIRE)
        return lambda ctx, signal, bits=64, order=None: read_signal(
            devcomm_ptr(ctx.comm), ctx.index, signal, bits, enum_value(order))

    @overload(gin.read_counter)
    def _read_counter(ctx, counter, bits=56, order=None):
        _expect("read_counter", "a GIN context", ctx, GinContextType)
        if _order_of("read_counter", order) is None:
            return lambda ctx, counter, bits=56, order=None: read_counter(
                devcomm_ptr(ctx.comm), ctx.index, counter, bits, _ACQUIRE)
        return lambda ctx, counter, bits=56, order=None: read_counter(
            devcomm_ptr(ctx.comm), ctx.index, counter, bits, enum_value(order))

    @overload(gin.wait_signal)
    def _wait_signal(ctx, coop, signal, least, bits=64, order=None):
        _expect("wait_signal", "a GIN context", ctx, GinContextType)
        _expect("wait_signal", "a coop", coop, CoopType)
        fn = _symbol("flowdsl_gin_wait_signal", coop)
        if _order_of("wait_signal", order) is None:
            return lambda ctx, coop, signal, least, bits=64, order=None: fn(
                coop._word, devcomm_ptr(ctx.comm), ctx.index, signal, least, bits, _ACQUIRE)
        return lambda ctx, coop, signal, least, bits=64, order=None: fn(
            coop._word, devcomm_ptr(ctx.comm), ctx.index, signal, least, bits, enum_value(order))

    @overload(gin.wait_counter)
    def _wait_counter(ctx, coop, counter, least, bits=56, order=None):
        _expect("wait_counter", "a GIN context", ctx, GinContextType)
        _expect("wait_counter", "a coop", coop, CoopType)
        fn = _symbol("flowdsl_gin_wait_counter", coop)
        if _order_of("wait_counter", order) is None:
            return lambda ctx, coop, counter, least, bits=56, order=None: fn(
                coop._word, devcomm_ptr(ctx.comm), ctx.index, counter, least, bits, _ACQUIRE)
        return lambda ctx, coop, counter, least, bits=56, order=None: fn(
            coop._word, devcomm_ptr(ctx.comm), ctx.index, counter, least, bits, enum_value(order))

    @overload(gin.reset_signal)
    def _reset_signal(ctx, signal):
        _expect("reset_signal", "a GIN context", ctx, GinContextType)
        return lambda ctx, signal: reset_signal(devcomm_ptr(ctx.comm), ctx.index, signal)

    @overload(gin.reset_counter)
    def _reset_counter(ctx, counter):
        _expect("reset_counter", "a GIN context", ctx, GinContextType)
        return lambda ctx, counter: reset_counter(devcomm_ptr(ctx.comm), ctx.index, counter)

    def barrier_typer(make, name):
        def typer(ctx, coop, index):
            _expect(name, "a GIN context", ctx, GinContextType)
            _expect(name, "a coop", coop, CoopType)
            return lambda ctx, coop, index: make(ctx, coop, index)
        return typer

    overload(gin.barrier)(barrier_typer(_session_maker(False), "barrier"))
    overload(gin.hybrid_barrier)(barrier_typer(_session_maker(True), "hybrid_barrier"))

    @overload_method(GinBarrierSessionType, "sync")
    def _barrier_sync(session, order):
        stem = "flowdsl_hybrid_barrier_sync" if session.hybrid else "flowdsl_gin_barrier_sync"
        fn = _symbol(stem, session.coop)
        return lambda session, order: fn(session.coop._word, devcomm_ptr(session.ctx.comm), session.ctx.index,
                                         session.index, enum_value(order))
