"""How ``flowdsl.cft`` compiles: CFT teams, logical endpoints, sessions, counted writes, barriers.

Every primitive is gated by :func:`require_cft` (NCCL >= 2.31, sm_100 or
newer, a CUDA >= 13.3 linker) and records :data:`CFT_FEATURE`, so the kernel
is linked with the separate CFT support build (``prebuilt/src/flowdsl_cft.cu``)
and kernels without CFT link exactly as before.

A session (``ncclCft``) is a value of :class:`CftSessionType`: the device
communicator, the coop and the address of the shared memory the kernel gave
it. NCCL's session is a C++ object with state that changes at each call; it
cannot cross the C ABI, so the support library keeps that state next to the
session's mbarrier in the same shared memory, and each call is one C function
per coop kind.

numba caches an overload's typing per argument types, so a second kernel
whose CFT calls have the same types does not run the typers again:
:func:`cft_primitives_called` reads which CFT functions the lowered code
calls, and the compiler checks the gates and records the feature from that.

Contents: :class:`CftSessionType`, :class:`CftBarrierSessionType`,
:data:`CFT_FEATURE`, :func:`require_cft`, :func:`cft_primitives_called`, :func:`bind`.
"""

from __future__ import annotations

import re

from numba import cuda
from numba.core import cgutils, types
from numba.core.errors import NumbaTypeError
from numba.cuda import models
from numba.cuda.extending import intrinsic, make_attribute_wrapper, overload, overload_method, register_model

from .. import cft
from ..enums import CoopKind, MemoryOrder
from .checks import expect, is_omitted
from .declarations import DECLARED
from .externs import CFT_CUDA, CFT_SINCE, COOP_SUFFIX
from .intrinsics import array_ptr, devcomm_ptr, enum_value, make_team
from .target import note_feature, require
from .types import CoopType, DevCommType, TeamType, WindowType

__all__ = ["CftSessionType", "CftBarrierSessionType", "CFT_FEATURE", "require_cft", "cft_primitives_called", "bind"]

#: Recorded on a compiled kernel that uses flowdsl.cft: its link adds the CFT support build.
CFT_FEATURE = "cft"
_SM_100 = (10, 0)


def require_cft(op: str) -> None:
    """Gate ``flowdsl.cft.<op>`` on the target (NCCL, arch, linking CUDA) and record the feature."""
    require(f"flowdsl.cft.{op}", nccl=CFT_SINCE, min_cc=_SM_100, cuda=CFT_CUDA)
    note_feature(CFT_FEATURE)


#: C function stem -> the flowdsl.cft primitive that calls it.
_PRIMITIVE_OF = {"session_open": "session", "session_close": "close", "mem_fence": "fence",
                 "barrier_arrive": "barrier", "barrier_wait": "barrier", "barrier_sync": "barrier"}
_CALL = re.compile(r"@\"?flowdsl_cft_([a-z_]+?)(?:__(?:thread|warp|lanes|warp_span|cta))?\"?\(")


def cft_primitives_called(llvm_ir: str) -> list[str]:
    """Names of the ``flowdsl.cft`` primitives whose C functions ``llvm_ir`` calls, sorted."""
    return sorted({f"flowdsl.cft.{_PRIMITIVE_OF.get(stem, stem)}" for stem in _CALL.findall(llvm_ir)})


class CftSessionType(types.Type):
    """A CFT session (``ncclCft<Coop>``) over kernel-provided shared memory."""

    def __init__(self, comm: DevCommType, coop: CoopType):
        self.comm, self.coop = comm, coop
        super().__init__(name=f"CftSession({comm}, {coop})")

    @property
    def key(self):
        return self.comm, self.coop


class CftBarrierSessionType(types.Type):
    """A CFT barrier session (``ncclCftBarrierSession<Coop>``)."""

    def __init__(self, comm: DevCommType, coop: CoopType):
        self.comm, self.coop = comm, coop
        super().__init__(name=f"CftBarrierSession({comm}, {coop})")

    @property
    def key(self):
        return self.comm, self.coop


@register_model(CftSessionType)
class _CftSessionModel(models.StructModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, [("comm", fe_type.comm), ("coop", fe_type.coop), ("storage", types.voidptr)])


@register_model(CftBarrierSessionType)
class _CftBarrierSessionModel(models.StructModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, [("comm", fe_type.comm), ("coop", fe_type.coop), ("index", types.uint32)])


for _name in ("comm", "coop", "storage"):
    make_attribute_wrapper(CftSessionType, _name, _name)
for _name in ("comm", "coop", "index"):
    make_attribute_wrapper(CftBarrierSessionType, _name, _name)


@intrinsic
def _make_session(typingctx, comm, coop, storage):
    session_type = CftSessionType(comm, coop)

    def codegen(context, builder, sig, args):
        s = cgutils.create_struct_proxy(session_type)(context, builder)
        s.comm, s.coop, s.storage = args
        return s._getvalue()
    return session_type(comm, coop, storage), codegen


@intrinsic
def _make_barrier(typingctx, comm, coop, index):
    session_type = CftBarrierSessionType(comm, coop)

    def codegen(context, builder, sig, args):
        s = cgutils.create_struct_proxy(session_type)(context, builder)
        s.comm, s.coop = args[0], args[1]
        s.index = context.cast(builder, args[2], sig.args[2], types.uint32)
        return s._getvalue()
    return session_type(comm, coop, index), codegen


def _expect(op, what, ty, cls):
    expect(f"flowdsl.cft.{op}", what, ty, cls)


def _expect_shared(op, what, ty):
    if not isinstance(ty, types.Array):
        raise NumbaTypeError(f"flowdsl.cft.{op} requires {what} (a cuda.shared.array), got {ty}")


def _symbol(stem, coop):
    kind = CoopKind.THREAD if coop is None else coop.kind
    return DECLARED[f"{stem}__{COOP_SUFFIX[kind]}"]


def _enum_or(op, what, ty, default):
    """``None`` when omitted (the default applies), else check it is an int or enum member."""
    if is_omitted(ty):
        return None
    if not isinstance(ty, (types.Integer, types.IntEnumMember, types.IntegerLiteral)):
        raise NumbaTypeError(f"flowdsl.cft.{op} requires {what}, got {ty}")
    return ty


def _value_or(x, default):
    """``x``'s value, or ``default`` when ``x`` is omitted."""


@overload(_value_or)
def _value_or_typer(x, default):
    if is_omitted(x):
        return lambda x, default: default
    return lambda x, default: enum_value(x)


_ACQUIRE = int(MemoryOrder.ACQUIRE)
_RELAXED = int(MemoryOrder.RELAXED)
_GENERIC = int(cft.MemProxyType.GENERIC)
_FABRIC = int(cft.MemProxyType.FABRIC)
_SYS = int(cft.MemFenceScope.SYS)


def bind():
    """Register every overload of ``flowdsl.cft``."""

    team_fn = DECLARED["flowdsl_cft_team"]
    le_info_fn, peer_le_info_fn = DECLARED["flowdsl_cft_le_info"], DECLARED["flowdsl_cft_peer_le_info"]
    read_counter_fn = DECLARED["flowdsl_cft_read_counter"]

    @overload(cft.team)
    def _team(comm):
        require_cft("team")
        _expect("team", "a device communicator", comm, DevCommType)

        def impl(comm):
            out = cuda.local.array(3, types.int32)
            team_fn(devcomm_ptr(comm), array_ptr(out))
            return make_team(out[0], out[1], out[2])
        return impl

    @overload(cft.le_info)
    def _le_info(comm, win, offset, team, peer):
        require_cft("le_info")
        _expect("le_info", "a device communicator", comm, DevCommType)
        _expect("le_info", "a window", win, WindowType)
        _expect("le_info", "a team (flowdsl.cft.team(comm), ...)", team, TeamType)

        def impl(comm, win, offset, team, peer):
            out = cuda.local.array(2, types.uint64)
            le_info_fn(devcomm_ptr(comm), win._handle, offset, team.nranks, team.rank, team.stride, peer,
                       array_ptr(out))
            return types.uint32(out[0]), out[1]
        return impl

    @overload(cft.peer_le_info)
    def _peer_le_info(comm, win, offset, peer):
        require_cft("peer_le_info")
        _expect("peer_le_info", "a device communicator", comm, DevCommType)
        _expect("peer_le_info", "a window", win, WindowType)

        def impl(comm, win, offset, peer):
            out = cuda.local.array(2, types.uint64)
            peer_le_info_fn(devcomm_ptr(comm), win._handle, offset, peer, array_ptr(out))
            return types.uint32(out[0]), out[1]
        return impl

    @overload(cft.session)
    def _session(comm, coop, storage):
        require_cft("session")
        _expect("session", "a device communicator", comm, DevCommType)
        _expect("session", "a coop (flowdsl.coop.warp(), .cta(), ...)", coop, CoopType)
        if not isinstance(storage, types.Array) or storage.dtype != types.uint64:
            raise NumbaTypeError("flowdsl.cft.session requires storage to be a shared u64 array of "
                                 f"flowdsl.cft.SESSION_WORDS elements, got {storage}")
        open_fn = _symbol("flowdsl_cft_session_open", coop)

        def impl(comm, coop, storage):
            ptr = array_ptr(storage)
            open_fn(coop._word, ptr)
            return _make_session(comm, coop, ptr)
        return impl

    def session_op(op, stem):
        def check(session):
            require_cft(op)
            _expect(op, "a CFT session (flowdsl.cft.session(comm, coop, storage))", session, CftSessionType)
            return _symbol(stem, session.coop)
        return check

    @overload(cft.put)
    def _put(session, le_id, le_offset, src, nbytes):
        fn = session_op("put", "flowdsl_cft_put")(session)
        _expect_shared("put", "src to be a shared-memory array", src)
        return lambda session, le_id, le_offset, src, nbytes: fn(
            session.coop._word, session.storage, le_id, le_offset, array_ptr(src), nbytes)

    @overload(cft.put_counted)
    def _put_counted(session, le_id, le_offset, counter_offset, src, nbytes):
        fn = session_op("put_counted", "flowdsl_cft_put_counted")(session)
        _expect_shared("put_counted", "src to be a shared-memory array", src)
        return lambda session, le_id, le_offset, counter_offset, src, nbytes: fn(
            session.coop._word, session.storage, le_id, le_offset, counter_offset, array_ptr(src), nbytes)

    @overload(cft.get)
    def _get(session, le_id, le_offset, dst, nbytes):
        fn = session_op("get", "flowdsl_cft_get")(session)
        _expect_shared("get", "dst to be a shared-memory array", dst)
        return lambda session, le_id, le_offset, dst, nbytes: fn(
            session.coop._word, session.storage, le_id, le_offset, array_ptr(dst), nbytes)

    def session_only(op, stem):
        def typer(session):
            fn = session_op(op, stem)(session)
            return lambda session: fn(session.coop._word, session.storage)
        return typer

    for stub, stem in ((cft.submit, "flowdsl_cft_submit"), (cft.flush, "flowdsl_cft_flush"),
                       (cft.flush_smem, "flowdsl_cft_flush_smem"), (cft.close, "flowdsl_cft_session_close")):
        overload(stub)(session_only(stub.__name__, stem))

    @overload(cft.read_counter)
    def _read_counter(win, offset, order=None):
        require_cft("read_counter")
        _expect("read_counter", "a counted window", win, WindowType)
        _enum_or("read_counter", "order to be a flowdsl.MemoryOrder", order, None)
        return lambda win, offset, order=None: read_counter_fn(win._handle, offset, _value_or(order, _RELAXED))

    @overload(cft.wait_counted)
    def _wait_counted(session, win, offset, expected, order=None, consumer=None):
        fn = session_op("wait_counted", "flowdsl_cft_wait_counted")(session)
        _expect("wait_counted", "a counted window", win, WindowType)
        _enum_or("wait_counted", "order to be a flowdsl.MemoryOrder", order, None)
        _enum_or("wait_counted", "consumer to be a flowdsl.cft.MemProxyType", consumer, None)

        def impl(session, win, offset, expected, order=None, consumer=None):
            fn(session.coop._word, devcomm_ptr(session.comm), session.storage, win._handle, offset, expected,
               _value_or(order, _ACQUIRE), _value_or(consumer, _GENERIC))
        return impl

    @overload(cft.fence)
    def _fence(coop, order=None, producer=None, consumer=None, scope=None):
        require_cft("fence")
        _expect("fence", "a coop", coop, CoopType)
        for what, ty in (("order to be a flowdsl.MemoryOrder", order),
                         ("producer to be a flowdsl.cft.MemProxyType", producer),
                         ("consumer to be a flowdsl.cft.MemProxyType", consumer),
                         ("scope to be a flowdsl.cft.MemFenceScope", scope)):
            _enum_or("fence", what, ty, None)
        fn = _symbol("flowdsl_cft_mem_fence", coop)

        def impl(coop, order=None, producer=None, consumer=None, scope=None):
            fn(coop._word, _value_or(order, _ACQUIRE), _value_or(producer, _FABRIC), _value_or(consumer, _GENERIC),
               _value_or(scope, _SYS))
        return impl

    @overload(cft.barrier)
    def _barrier(comm, coop, index):
        require_cft("barrier")
        _expect("barrier", "a device communicator", comm, DevCommType)
        _expect("barrier", "a coop", coop, CoopType)
        return lambda comm, coop, index: _make_barrier(comm, coop, index)

    def barrier_method(method):
        def typer(session, order, producer=None, consumer=None):
            _enum_or(f"barrier(...).{method}", "order to be a flowdsl.MemoryOrder", order, None)
            fn = _symbol(f"flowdsl_cft_barrier_{method}", session.coop)

            def impl(session, order, producer=None, consumer=None):
                fn(session.coop._word, devcomm_ptr(session.comm), session.index, enum_value(order),
                   _value_or(producer, _GENERIC), _value_or(consumer, _GENERIC))
            return impl
        return typer

    for method in ("arrive", "wait", "sync"):
        overload_method(CftBarrierSessionType, method)(barrier_method(method))
