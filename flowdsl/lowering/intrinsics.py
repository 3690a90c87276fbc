"""Small numba intrinsics the surface bindings are built from (LLVM-level glue)."""

from __future__ import annotations

import hashlib

from llvmlite import ir
from numba.core import cgutils, types
from numba.cuda.extending import intrinsic, overload

from ..enums import CoopKind
from .checks import is_omitted
from .types import CoopType, DevCommType, LsaBarrierSessionType, team_type

__all__ = ["devcomm_ptr", "emit_devcomm_ptr", "wait_record_ptr", "array_ptr", "struct_maker", "make_coop", "make_team", "make_session",
           "value_or", "typed_pointer", "enum_value", "emit_trap", "feature_marker"]


@intrinsic
def devcomm_ptr(typingctx, comm):
    """``const ncclDevComm*`` to a local copy of the communicator's words."""
    if not isinstance(comm, DevCommType):
        return None

    def codegen(context, builder, sig, args):
        return emit_devcomm_ptr(context, builder, comm, args[0])

    return types.voidptr(comm), codegen


def emit_devcomm_ptr(context, builder, comm_type, value):
    """``const ncclDevComm*`` to a local copy of ``value``'s words (:func:`devcomm_ptr`, from lowering code)."""
    slot = cgutils.alloca_once(builder, context.get_value_type(comm_type))
    slot.align = 16
    builder.store(value, slot)
    return builder.bitcast(slot, cgutils.voidptr_t)


@intrinsic
def wait_record_ptr(typingctx, comm):
    """The device communicator's wait record (its last word: host-mapped memory, or null for unbounded
    waits) as ``void*``, for the support library's wait check (``flowdsl_wait_check``).

    Only that word crosses to the check, so a device function that polls keeps one word of the
    communicator live, and an out-of-line function that only waits is passed that word, not the ~26
    of the struct (a copy of the struct escaping into the support library, as :func:`devcomm_ptr`
    makes, keeps every word live in every function that polls).
    """
    if not isinstance(comm, DevCommType):
        return None

    def codegen(context, builder, sig, args):
        word = builder.extract_value(args[0], (0, comm.nwords - 1))  # the words tuple is the model's only member
        return builder.inttoptr(word, cgutils.voidptr_t)

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


def struct_maker(result, fields):
    """An intrinsic building a struct value from its arguments, one a field, each cast to its field's type.

    ``result`` is the struct's numba type, or a function of the argument types that gives it.
    """
    def typer(args):
        ty = result if isinstance(result, types.Type) else result(*args)
        if ty is None:
            return None

        def codegen(context, builder, sig, llargs):
            value = cgutils.create_struct_proxy(ty)(context, builder)
            model = context.data_model_manager[ty]
            for name, arg, arg_ty in zip(fields, llargs, sig.args):
                setattr(value, name, context.cast(builder, arg, arg_ty, model.get_member_fe_type(name)))
            return value._getvalue()

        return ty(*args), codegen

    # numba lowers an intrinsic's arguments by its parameters: one a field, no *args.
    if len(fields) == 1:
        return intrinsic(lambda typingctx, a: typer((a,)))
    if len(fields) == 3:
        return intrinsic(lambda typingctx, a, b, c: typer((a, b, c)))
    if len(fields) == 2:
        return intrinsic(lambda typingctx, a, b: typer((a, b)))
    return intrinsic(lambda typingctx, a, b, c, d: typer((a, b, c, d)))


#: CoopKind -> intrinsic(word) building that coop.
make_coop = {kind: struct_maker(CoopType(kind), ("word",)) for kind in CoopKind}
make_team = struct_maker(team_type, ("nranks", "rank", "stride"))
make_session = struct_maker(
    lambda comm, coop, index: LsaBarrierSessionType(comm, coop)
    if isinstance(comm, DevCommType) and isinstance(coop, CoopType) else None, ("comm", "coop", "index"))


def value_or(x, default):
    """``x``'s value as an int32 (an enum member's too), or ``default`` when ``x`` is omitted."""


@overload(value_or)
def _value_or(x, default):
    if is_omitted(x):
        return lambda x, default: default
    return lambda x, default: enum_value(x)


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


def emit_refusal(builder, text: str, values) -> None:
    """Print ``text`` through ``vprintf``, each ``{}`` filled with one of ``values`` (int64), then trap: the GPU
    says a refusal in the words the simulator raises it in (``print`` would put a space around each value)."""
    module = builder.module
    fmt_text = (text.replace("%", "%%").replace("{}", "%lld") + "\n\0").encode()
    name = "flowdsl_refusal_" + hashlib.sha256(fmt_text).hexdigest()[:16]
    fmt = module.globals.get(name)
    if fmt is None:
        fmt = cgutils.global_constant(module, name, ir.Constant(ir.ArrayType(ir.IntType(8), len(fmt_text)),
                                                                bytearray(fmt_text)))
    i64 = ir.IntType(64)
    buf = builder.alloca(ir.LiteralStructType([i64] * max(1, len(values))))
    for i, value in enumerate(values):
        builder.store(value, builder.gep(buf, [ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), i)]))
    voidptr = ir.IntType(8).as_pointer()
    vprintf = cgutils.get_or_insert_function(module, ir.FunctionType(ir.IntType(32), [voidptr, voidptr]), "vprintf")
    builder.call(vprintf, [builder.bitcast(fmt, voidptr), builder.bitcast(buf, voidptr)])
    emit_trap(builder)


def printed_refusal(text: str):
    """``refuse(values)``, a device function: ``values`` a tuple of integers, printed into ``text``'s ``{}``
    (:func:`emit_refusal`) before the kernel traps."""
    @intrinsic
    def refuse(typingctx, values):
        if not isinstance(values, types.BaseTuple) or not all(isinstance(t, types.Integer) for t in values):
            return None

        def codegen(context, builder, sig, args):
            items = [context.cast(builder, builder.extract_value(args[0], i), t, types.int64)
                     for i, t in enumerate(values)]
            emit_refusal(builder, text, items)
            return context.get_dummy_value()
        return types.void(values), codegen
    return refuse


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
