"""How ``flowdsl.cft`` compiles: CFT teams, logical endpoints, sessions, counted writes, barriers.

Every primitive is gated by its spec (``flowdsl.cft.GATE``: NCCL >= 2.31, sm_100
or newer, a CUDA >= 13.3 linker) and records :data:`CFT_FEATURE`, so the kernel
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
"""

from __future__ import annotations

import re

from numba import cuda
from numba.core import types
from numba.core.errors import NumbaTypeError
from numba.cuda.extending import make_attribute_wrapper, overload, overload_method

from .. import cft
from .._spec import SPECS
from .checks import KIND_TYPES, check, stub_default
from .declarations import extern
from .intrinsics import array_ptr, devcomm_ptr, enum_value, make_team, struct_maker, value_or
from .target import note_feature
from .types import SessionType, register_struct_model

__all__ = ["CftSessionType", "CftBarrierSessionType", "CFT_FEATURE", "cft_primitives_called"]

#: Recorded on a compiled kernel that uses flowdsl.cft: its link adds the CFT support build.
CFT_FEATURE = "cft"


def _check(stub, *arg_types):
    """Check a CFT primitive's gate and arguments (its spec), and record the feature."""
    check(stub, *arg_types)
    note_feature(CFT_FEATURE)


def _checked(stub, *arg_types, coop=None):
    """:func:`_check`, then the C function ``stub`` calls (``coop``'s, for a function of each coop kind)."""
    _check(stub, *arg_types)
    return extern(stub, coop)


def _session_checked(stub, session, *arg_types):
    """:func:`_checked` for a call on ``session``: the C function of its coop (read once the session is checked)."""
    _check(stub, session, *arg_types)
    return extern(stub, session.coop)


_CALL = re.compile(r"@\"?(flowdsl_cft_[a-z_]+?)(?:__(?:thread|warp|lanes|warp_span|cta))?\"?\(")


def cft_primitives_called(llvm_ir: str) -> list[str]:
    """Names of the ``flowdsl.cft`` primitives whose C functions ``llvm_ir`` calls, sorted (from their
    specs' ``extern``)."""
    primitive_of = {s.extern: s.name for s in SPECS.values() if s.name.startswith("flowdsl.cft.")}
    return sorted({primitive_of[stem] for stem in _CALL.findall(llvm_ir)})


class CftSessionType(SessionType):
    """A CFT session (``ncclCft<Coop>``) over kernel-provided shared memory."""

    label = "CftSession"


class CftBarrierSessionType(SessionType):
    """A CFT barrier session (``ncclCftBarrierSession<Coop>``)."""

    label = "CftBarrierSession"


register_struct_model(CftSessionType, lambda fe: [("comm", fe.comm), ("coop", fe.coop), ("storage", types.voidptr)])
register_struct_model(CftBarrierSessionType, lambda fe: [("comm", fe.comm), ("coop", fe.coop), ("index", types.uint32)])


for _name in ("comm", "coop", "storage"):
    make_attribute_wrapper(CftSessionType, _name, _name)
for _name in ("comm", "coop", "index"):
    make_attribute_wrapper(CftBarrierSessionType, _name, _name)


KIND_TYPES.register("cft_session", CftSessionType)
KIND_TYPES.register("cft_barrier_session", CftBarrierSessionType)

_make_session = struct_maker(lambda comm, coop, storage: CftSessionType(comm, coop), ("comm", "coop", "storage"))
_make_barrier = struct_maker(lambda comm, coop, index: CftBarrierSessionType(comm, coop), ("comm", "coop", "index"))



# ---- teams and logical endpoints -------------------------------------------------------------------

@overload(cft.team)
def cft_team(comm, mode=None):
    fn = _checked(cft.team, comm, mode)
    mode_default = stub_default(cft.team, "mode")

    def impl(comm, mode=None):
        out = cuda.local.array(3, types.int32)
        fn(devcomm_ptr(comm), value_or(mode, mode_default), array_ptr(out))
        return make_team(out[0], out[1], out[2])
    return impl


@overload(cft.le_info)
def cft_le_info(comm, win, offset, team, peer):
    fn = _checked(cft.le_info, comm, win, offset, team)

    def impl(comm, win, offset, team, peer):
        out = cuda.local.array(2, types.uint64)
        fn(devcomm_ptr(comm), win._handle, offset, team.nranks, team.rank, team.stride, peer, array_ptr(out))
        return types.uint32(out[0]), out[1]
    return impl


@overload(cft.peer_le_info)
def cft_peer_le_info(comm, win, offset, peer):
    fn = _checked(cft.peer_le_info, comm, win)

    def impl(comm, win, offset, peer):
        out = cuda.local.array(2, types.uint64)
        fn(devcomm_ptr(comm), win._handle, offset, peer, array_ptr(out))
        return types.uint32(out[0]), out[1]
    return impl


# ---- sessions ---------------------------------------------------------------------------------------

@overload(cft.session)
def cft_session(comm, coop, storage):
    _check(cft.session, comm, coop)
    if not isinstance(storage, types.Array) or storage.dtype != types.uint64:
        raise NumbaTypeError("flowdsl.cft.session requires storage to be a shared u64 array of "
                             f"flowdsl.cft.SESSION_WORDS elements, got {storage}")
    fn = extern(cft.session, coop)

    def impl(comm, coop, storage):
        ptr = array_ptr(storage)
        fn(coop._word, ptr)
        return _make_session(comm, coop, ptr)
    return impl


@overload(cft.put)
def cft_put(session, le_id, le_offset, src, nbytes):
    fn = _session_checked(cft.put, session, le_id, le_offset, src)
    return lambda session, le_id, le_offset, src, nbytes: fn(
        session.coop._word, session.storage, le_id, le_offset, array_ptr(src), nbytes)


@overload(cft.put_counted)
def cft_put_counted(session, le_id, le_offset, counter_offset, src, nbytes):
    fn = _session_checked(cft.put_counted, session, le_id, le_offset, counter_offset, src)
    return lambda session, le_id, le_offset, counter_offset, src, nbytes: fn(
        session.coop._word, session.storage, le_id, le_offset, counter_offset, array_ptr(src), nbytes)


@overload(cft.get)
def cft_get(session, le_id, le_offset, dst, nbytes):
    fn = _session_checked(cft.get, session, le_id, le_offset, dst)
    return lambda session, le_id, le_offset, dst, nbytes: fn(
        session.coop._word, session.storage, le_id, le_offset, array_ptr(dst), nbytes)


def _overload_session_only(stub) -> None:
    """The overload of ``stub(session)``: its C function on the session's coop and storage."""
    @overload(stub)
    def typer(session):
        fn = _session_checked(stub, session)
        return lambda session: fn(session.coop._word, session.storage)


for _stub in (cft.submit, cft.flush, cft.flush_smem, cft.close):
    _overload_session_only(_stub)


# ---- counted writes and fences -------------------------------------------------------------------------

@overload(cft.read_counter)
def cft_read_counter(win, offset, order=None):
    fn = _checked(cft.read_counter, win, offset, order)
    order_default = stub_default(cft.read_counter, "order")
    return lambda win, offset, order=None: fn(win._handle, offset, value_or(order, order_default))


@overload(cft.wait_counted)
def cft_wait_counted(session, win, offset, expected, order=None, consumer=None):
    fn = _session_checked(cft.wait_counted, session, win, offset, expected, order, consumer)

    order_default, consumer_default = (stub_default(cft.wait_counted, p) for p in ("order", "consumer"))

    def impl(session, win, offset, expected, order=None, consumer=None):
        fn(session.coop._word, devcomm_ptr(session.comm), session.storage, win._handle, offset, expected,
           value_or(order, order_default), value_or(consumer, consumer_default))
    return impl


@overload(cft.fence)
def cft_fence(coop, order=None, producer=None, consumer=None, scope=None):
    fn = _checked(cft.fence, coop, order, producer, consumer, scope, coop=coop)

    order_default, producer_default, consumer_default, scope_default = (
        stub_default(cft.fence, p) for p in ("order", "producer", "consumer", "scope"))

    def impl(coop, order=None, producer=None, consumer=None, scope=None):
        fn(coop._word, value_or(order, order_default), value_or(producer, producer_default),
           value_or(consumer, consumer_default), value_or(scope, scope_default))
    return impl


# ---- barriers: the session's arrive, wait and sync call flowdsl_cft_barrier_<method> --------------------

@overload(cft.barrier)
def cft_barrier(comm, coop, index):
    _check(cft.barrier, comm, coop)
    return lambda comm, coop, index: _make_barrier(comm, coop, index)


def _barrier_call(stub, session, order, producer, consumer):
    fn = _session_checked(stub, session, order, producer, consumer)
    producer_default, consumer_default = (stub_default(stub, p) for p in ("producer", "consumer"))

    def impl(session, order, producer=None, consumer=None):
        fn(session.coop._word, devcomm_ptr(session.comm), session.index, enum_value(order),
           value_or(producer, producer_default), value_or(consumer, consumer_default))
    return impl


@overload_method(CftBarrierSessionType, "arrive")
@overload(cft.barrier_arrive)
def cft_barrier_arrive(session, order, producer=None, consumer=None):
    return _barrier_call(cft.barrier_arrive, session, order, producer, consumer)


@overload_method(CftBarrierSessionType, "wait")
@overload(cft.barrier_wait)
def cft_barrier_wait(session, order, producer=None, consumer=None):
    return _barrier_call(cft.barrier_wait, session, order, producer, consumer)


@overload_method(CftBarrierSessionType, "sync")
@overload(cft.barrier_sync)
def cft_barrier_sync(session, order, producer=None, consumer=None):
    return _barrier_call(cft.barrier_sync, session, order, producer, consumer)
