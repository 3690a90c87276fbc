"""Small numba intrinsics the surface bindings are built from (LLVM-level glue).

Contents: :func:`devcomm_ptr`, :func:`array_ptr`, :func:`make_coop`,
:func:`make_team`, :func:`make_session`, :func:`typed_pointer`,
:func:`enum_value`, :func:`emit_trap`, :func:`feature_marker`.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.cuda.extending import intrinsic

from ..enums import CoopKind
from .types import CoopType, DevCommType, LsaBarrierSessionType, team_type

__all__ = ["devcomm_ptr", "array_ptr", "make_coop", "make_team", "make_session", "typed_pointer",
           "enum_value", "emit_trap", "feature_marker"]


@intrinsic
def devcomm_ptr(typingctx, comm):
    """``const ncclDevComm*`` to a local copy of the communicator's words."""
    if not isinstance(comm, DevCommType):
        return None

    def codegen(context, builder, sig, args):
        slot = cgutils.alloca_once(builder, context.get_value_type(comm))
        slot.align = 16
        builder.store(args[0], slot)
        return builder.bitcast(slot, cgutils.voidptr_t)

    return types.voidptr(comm), codegen


@intrinsic
def array_ptr(typingctx, ary):
    """Address of an array's first element, as ``void*``."""
    if not isinstance(ary, types.Array):
        return None

    def codegen(context, builder, sig, args):
        arr = context.make_array(ary)(context, builder, args[0])
        return builder.bitcast(arr.data, cgutils.voidptr_t)

    return types.voidptr(ary), codegen


def _coop_maker(kind):
    coop_type = CoopType(kind)

    @intrinsic
    def make(typingctx, word):
        def codegen(context, builder, sig, args):
            coop = cgutils.create_struct_proxy(coop_type)(context, builder)
            coop.word = context.cast(builder, args[0], sig.args[0], types.uint32)
            return coop._getvalue()

        return coop_type(word), codegen

    return make


#: CoopKind -> intrinsic(word) building that coop.
make_coop = {kind: _coop_maker(kind) for kind in CoopKind}


@intrinsic
def make_team(typingctx, nranks, rank, stride):
    def codegen(context, builder, sig, args):
        team = cgutils.create_struct_proxy(team_type)(context, builder)
        team.nranks, team.rank, team.stride = (
            context.cast(builder, v, t, types.int32) for v, t in zip(args, sig.args))
        return team._getvalue()

    return team_type(nranks, rank, stride), codegen


@intrinsic
def make_session(typingctx, comm, coop, index):
    if not isinstance(comm, DevCommType) or not isinstance(coop, CoopType):
        return None
    session_type = LsaBarrierSessionType(comm, coop)

    def codegen(context, builder, sig, args):
        s = cgutils.create_struct_proxy(session_type)(context, builder)
        s.comm, s.coop = args[0], args[1]
        s.index = context.cast(builder, args[2], sig.args[2], types.uint32)
        return s._getvalue()

    return session_type(comm, coop, index), codegen


@intrinsic
def typed_pointer(typingctx, ptr, dtype):
    """``(T*) ptr`` where ``dtype`` is a number class such as ``float32``."""
    elem = dtype.instance_type if isinstance(dtype, types.NumberClass) else None
    if elem is None:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], context.get_value_type(elem).as_pointer())

    return types.CPointer(elem)(ptr, dtype), codegen


def emit_trap(builder) -> None:
    """Emit PTX ``trap``: the kernel stops and its launch fails."""
    builder.asm(ir.FunctionType(ir.VoidType(), []), "trap;", "", [], side_effect=True)


@intrinsic
def enum_value(typingctx, value):  # noqa: D401
    """An int or IntEnum member as int32 (memory orders cross the C ABI as ``int``)."""
    if not isinstance(value, (types.Integer, types.IntEnumMember, types.IntegerLiteral)):
        return None

    def codegen(context, builder, sig, args):
        src = sig.args[0]
        if isinstance(src, types.IntEnumMember):
            src = src.dtype
        return context.cast(builder, args[0], src, types.int32)

    return types.int32(value), codegen


@intrinsic
def feature_marker(typingctx, name):
    """A PTX comment ``// flowdsl-feature:<name>`` where the code relies on ``name``.

    The compiler reads features back from the lowered code (numba reuses a device
    function's typing and lowering across kernels, so a typing-time note can be lost).
    """
    if not isinstance(name, types.StringLiteral):
        return None
    text = f"// flowdsl-feature:{name.literal_value}"

    def codegen(context, builder, sig, args):
        builder.asm(ir.FunctionType(ir.VoidType(), []), text, "", [], side_effect=True)
        return context.get_dummy_value()

    return types.void(name), codegen
