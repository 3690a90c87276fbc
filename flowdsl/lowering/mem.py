"""Inline PTX for the memory-model operations of ``flowdsl.mem``.

Each operation is one PTX instruction with its semantics and scope spelled
out (``ld.acquire.gpu``, ``st.release.sys``, ``fence.acq_rel.gpu``,
``atom.acq_rel.sys.add``, ``red.release.gpu.add``, ``ld.v4``), and the
``%globaltimer`` read. Scope and
order are :class:`flowdsl.ThreadScope` / :class:`flowdsl.MemoryOrder`
values. numba types enum members without their value, so each operation
emits one instruction per (order, scope) behind a switch on the values; with
the usual constant arguments LLVM folds the switch to the one instruction,
and a literal that is not allowed is a compile-time error.
"""

from __future__ import annotations

import functools
import itertools

from llvmlite import ir
from numba.core import cgutils, types
from numba.core.errors import NumbaTypeError
from numba.cuda.extending import intrinsic, overload
from numba.cuda.vector_types import VectorType, vector_types

from .. import mem
from ..enums import MemoryOrder, RedOp, ThreadScope
from .checks import check
from .generic import lower_as
from .intrinsics import emit_trap

__all__ = ["PTX_TYPES"]

#: numba type -> (PTX type suffix, inline-asm register constraint)
PTX_TYPES = {
    types.int32: ("s32", "r"), types.uint32: ("u32", "r"),
    types.int64: ("s64", "l"), types.uint64: ("u64", "l"),
    types.float32: ("f32", "f"), types.float64: ("f64", "d"),
}
_SCOPES = {ThreadScope.SYSTEM: "sys", ThreadScope.DEVICE: "gpu", ThreadScope.BLOCK: "cta"}
_ATOM_ORDERS = {MemoryOrder.RELAXED: "relaxed", MemoryOrder.ACQUIRE: "acquire",
                MemoryOrder.RELEASE: "release", MemoryOrder.ACQ_REL: "acq_rel",
                MemoryOrder.SEQ_CST: "acq_rel"}
_FENCES = {MemoryOrder.ACQUIRE: "acq_rel", MemoryOrder.RELEASE: "acq_rel", MemoryOrder.ACQ_REL: "acq_rel",
           MemoryOrder.SEQ_CST: "sc"}


def _element(array):
    """The element type of an array the primitive's spec has already checked (:func:`check`)."""
    return array.dtype


def _item_pointer(context, builder, aryty, ary, idxty, idx):
    arr = context.make_array(aryty)(context, builder, ary)
    idx = context.cast(builder, idx, idxty, types.intp)
    return cgutils.get_item_pointer(context, builder, aryty, arr, [idx], wraparound=False)


def _asm(builder, ret, operands, text, constraints):
    fnty = ir.FunctionType(ret, [op.type for op in operands])
    return builder.asm(fnty, text, constraints, operands, side_effect=True)


def _as_i64(context, builder, value, ty):
    if isinstance(ty, types.IntEnumMember):
        ty = ty.dtype
    return context.cast(builder, value, ty, types.int64)


def _select(context, builder, selectors, emit, result_type=None):
    """Emit ``emit(builder, *key)`` for the key equal to the run-time ``selectors``; trap if none is.

    ``selectors`` are ``(llvm value, numba type, choices)``: an order or scope that is only known once the
    enum member is typed, and the dict of the values it may take (``_SCOPES``, ``_FENCES``, ...), whose
    product is every key; ``emit`` returns the value, or None where ``result_type`` is None.
    """
    values = [_as_i64(context, builder, v, t) for v, t, _ in selectors]
    slot = cgutils.alloca_once(builder, result_type) if result_type is not None else None
    matched = cgutils.false_bit
    for key in itertools.product(*(choices for _, _, choices in selectors)):
        cond = cgutils.true_bit
        for value, want in zip(values, key):
            cond = builder.and_(cond, builder.icmp_signed("==", value, ir.Constant(ir.IntType(64), int(want))))
        matched = builder.or_(matched, cond)
        with builder.if_then(cond):
            out = emit(builder, *key)
            if slot is not None:
                builder.store(out, slot)
    with builder.if_then(builder.not_(matched), likely=False):
        emit_trap(builder)
    return builder.load(slot) if slot is not None else None


def _load(sem):
    @intrinsic
    def load(typingctx, array, index, scope):
        elem = _element(array)
        ptx, reg = PTX_TYPES[elem]

        def codegen(context, builder, sig, args):
            ptr = _item_pointer(context, builder, array, args[0], index, args[1])
            lane = context.get_value_type(elem)
            return _select(context, builder, [(args[2], scope, _SCOPES)],
                           lambda b, s: _asm(b, lane, [ptr], f"ld.{sem}.{_SCOPES[s]}.{ptx} $0, [$1];",
                                             f"={reg},l,~{{memory}}"), lane)

        return elem(array, index, scope), codegen

    return load


def _store(sem):
    @intrinsic
    def store(typingctx, array, index, value, scope):
        elem = _element(array)
        ptx, reg = PTX_TYPES[elem]

        def codegen(context, builder, sig, args):
            ptr = _item_pointer(context, builder, array, args[0], index, args[1])
            val = context.cast(builder, args[2], value, elem)
            _select(context, builder, [(args[3], scope, _SCOPES)],
                    lambda b, s: _asm(b, ir.VoidType(), [ptr, val], f"st.{sem}.{_SCOPES[s]}.{ptx} [$0], $1;",
                                      f"l,{reg},~{{memory}}"))
            return context.get_dummy_value()

        return types.void(array, index, value, scope), codegen

    return store


@intrinsic
def _fence(typingctx, order, scope):

    def codegen(context, builder, sig, args):
        _select(context, builder, [(args[0], order, _FENCES), (args[1], scope, _SCOPES)],
                lambda b, o, s: _asm(b, ir.VoidType(), [], f"fence.{_FENCES[o]}.{_SCOPES[s]};", "~{memory}"))
        return context.get_dummy_value()

    return types.void(order, scope), codegen


def _atomic(ptx_op, returns=True):
    @intrinsic
    def atomic(typingctx, array, index, value, order, scope):
        elem = _element(array)
        ptx, reg = PTX_TYPES[elem]
        # add takes .s32/.u32/.u64/.f32/.f64; exch takes .b32/.b64.
        if ptx_op == "exch":
            ptx = "b" + ptx[1:]
        if ptx_op == "add" and ptx == "s64":
            ptx = "u64"
        instr = "atom" if returns else "red"

        def codegen(context, builder, sig, args):
            ptr = _item_pointer(context, builder, array, args[0], index, args[1])
            val = context.cast(builder, args[2], value, elem)
            lane = context.get_value_type(elem)

            def emit(b, o, s):
                head = f"{instr}.{_ATOM_ORDERS[o]}.{_SCOPES[s]}.{ptx_op}.{ptx}"
                if returns:
                    return _asm(b, lane, [ptr, val], f"{head} $0, [$1], $2;", f"={reg},l,{reg},~{{memory}}")
                return _asm(b, ir.VoidType(), [ptr, val], f"{head} [$0], $1;", f"l,{reg},~{{memory}}")

            out = _select(context, builder, [(args[3], order, _ATOM_ORDERS), (args[4], scope, _SCOPES)], emit,
                          lane if returns else None)
            return out if returns else context.get_dummy_value()

        return (elem if returns else types.void)(array, index, value, order, scope), codegen

    return atomic


@intrinsic
def _atomic_cas(typingctx, array, index, expected, desired, order, scope):
    elem = _element(array)
    ptx, reg = PTX_TYPES[elem]

    def codegen(context, builder, sig, args):
        ptr = _item_pointer(context, builder, array, args[0], index, args[1])
        exp = context.cast(builder, args[2], expected, elem)
        des = context.cast(builder, args[3], desired, elem)
        lane = context.get_value_type(elem)
        return _select(context, builder, [(args[4], order, _ATOM_ORDERS), (args[5], scope, _SCOPES)],
                       lambda b, o, s: _asm(b, lane, [ptr, exp, des],
                                            f"atom.{_ATOM_ORDERS[o]}.{_SCOPES[s]}.cas.b{ptx[1:]} $0, [$1], $2, $3;",
                                            f"={reg},l,{reg},{reg},~{{memory}}"), lane)

    return elem(array, index, expected, desired, order, scope), codegen


#: Narrow elements a 16-byte vector may hold; they travel in four 32-bit registers.
_NARROW = (types.int8, types.uint8, types.int16, types.uint16, types.float16)


def _vector_shape(array):
    elem = _element(array)
    lanes = 16 // (elem.bitwidth // 8)
    if elem in _NARROW:
        return elem, lanes, "b32", "r"
    ptx, reg = PTX_TYPES[elem]
    return elem, lanes, ("b" + ptx[1:]) if ptx[0] in "su" else ptx, reg


def _registers(elem, lanes):
    """(registers, register LLVM type) that carry ``lanes`` elements: 4 x i32 for narrow ones."""
    return (4, ir.IntType(32)) if elem in _NARROW else (lanes, None)


def _emit_load_vec(context, builder, array, ptr, head):
    """``{head}.v*`` of 16 bytes at ``ptr``, as the UniTuple of ``array``'s elements."""
    elem, lanes, ptx, reg = _vector_shape(array)
    nreg, reg_type = _registers(elem, lanes)
    outs = ", ".join(f"${i}" for i in range(nreg))
    text = f"{head}.v{nreg}.{ptx} {{{outs}}}, [${nreg}];"
    result = types.UniTuple(elem, lanes)
    lane_type = context.get_value_type(elem)
    rtype = reg_type or lane_type
    fnty = ir.FunctionType(ir.LiteralStructType([rtype] * nreg), [ptr.type])
    # A plain ld (ptxas schedules it like any other), but LLVM must not hoist or merge it:
    # without a side effect an asm reads no memory as far as LLVM knows, and a load of a
    # staging slot could then be moved above the barrier that made the slot's data visible.
    packed = builder.asm(fnty, text, ",".join([f"={reg}"] * nreg) + ",l", [ptr], side_effect=True)
    regs = [builder.extract_value(packed, i) for i in range(nreg)]
    if reg_type is None:
        return context.make_tuple(builder, result, regs)
    vec = ir.Constant(ir.VectorType(rtype, nreg), None)
    for i, r in enumerate(regs):
        vec = builder.insert_element(vec, r, ir.Constant(ir.IntType(32), i))
    narrow = builder.bitcast(vec, ir.VectorType(lane_type, lanes))
    return context.make_tuple(builder, result, [builder.extract_element(narrow, ir.Constant(ir.IntType(32), i))
                                                for i in range(lanes)])


def _emit_store_vec(context, builder, array, ptr, values, value_type, head):
    """``{head}.v*`` of the 16-byte tuple ``values`` at ``ptr``."""
    elem, lanes, ptx, reg = _vector_shape(array)
    nreg, reg_type = _registers(elem, lanes)
    ins = ", ".join(f"${i + 1}" for i in range(nreg))
    text = f"{head}.v{nreg}.{ptx} [$0], {{{ins}}};"
    lanes_in = [context.cast(builder, builder.extract_value(values, i), value_type[i], elem) for i in range(lanes)]
    if reg_type is not None:
        lane_type = context.get_value_type(elem)
        vec = ir.Constant(ir.VectorType(lane_type, lanes), None)
        for i, v in enumerate(lanes_in):
            vec = builder.insert_element(vec, v, ir.Constant(ir.IntType(32), i))
        wide = builder.bitcast(vec, ir.VectorType(reg_type, nreg))
        lanes_in = [builder.extract_element(wide, ir.Constant(ir.IntType(32), i)) for i in range(nreg)]
    _asm(builder, ir.VoidType(), [ptr] + lanes_in, text, "l," + ",".join([reg] * nreg) + ",~{memory}")


def _check_vector_values(op, array, values):
    elem, lanes, _, _ = _vector_shape(array)
    if not isinstance(values, types.BaseTuple) or len(values) != lanes:
        raise NumbaTypeError(f"flowdsl.mem.{op} requires a tuple of {lanes} {elem} values (16 bytes), got {values}")


@intrinsic
def _load_vec(typingctx, array, index):
    elem, lanes, _, _ = _vector_shape(array)

    def codegen(context, builder, sig, args):
        ptr = _item_pointer(context, builder, array, args[0], index, args[1])
        return _emit_load_vec(context, builder, array, ptr, "ld")

    return types.UniTuple(elem, lanes)(array, index), codegen


@intrinsic
def _load_vec_relaxed(typingctx, array, index, scope):
    elem, lanes, _, _ = _vector_shape(array)
    result = types.UniTuple(elem, lanes)

    def codegen(context, builder, sig, args):
        ptr = _item_pointer(context, builder, array, args[0], index, args[1])
        return _select(context, builder, [(args[2], scope, _SCOPES)],
                       lambda b, s: _emit_load_vec(context, b, array, ptr, f"ld.relaxed.{_SCOPES[s]}"),
                       context.get_value_type(result))

    return result(array, index, scope), codegen


@intrinsic
def _store_vec(typingctx, array, index, values):
    _check_vector_values("store_vec", array, values)

    def codegen(context, builder, sig, args):
        ptr = _item_pointer(context, builder, array, args[0], index, args[1])
        _emit_store_vec(context, builder, array, ptr, args[2], values, "st")
        return context.get_dummy_value()

    return types.void(array, index, values), codegen


@intrinsic
def _store_vec_relaxed(typingctx, array, index, values, scope):
    _check_vector_values("store_vec_relaxed", array, values)

    def codegen(context, builder, sig, args):
        ptr = _item_pointer(context, builder, array, args[0], index, args[1])
        _select(context, builder, [(args[3], scope, _SCOPES)],
                lambda b, s: _emit_store_vec(context, b, array, ptr, args[2], values, f"st.relaxed.{_SCOPES[s]}"))
        return context.get_dummy_value()

    return types.void(array, index, values, scope), codegen


# ---- 16-byte values as numba-cuda's vector types (mem.load_vector & co.) ----------------------------------
# The vector forms are the tuple forms (one 128-bit access each) at element ``index * lanes``, their tuple
# turned into the vector type and back in registers.

def _vector_type(array):
    """numba-cuda's vector type of 16 bytes of ``array``'s elements (4 or 8 bytes, the spec's check)."""
    return vector_types[mem.vector_type_name(str(_element(array)))]


def _check_vector(op, array, value):
    vty = _vector_type(array)
    if value != vty:
        got = value.name if isinstance(value, VectorType) else "a tuple" if isinstance(value, types.BaseTuple) \
            else str(value)
        raise NumbaTypeError(mem.vector_refusal(op, str(_element(array)), got))


@intrinsic
def _vector_of(typingctx, lanes):
    """The vector type of a UniTuple's lanes (``float32 x 4`` -> ``float32x4``)."""
    vty = vector_types[f"{lanes.dtype}x{len(lanes)}"]

    def codegen(context, builder, sig, args):
        out = cgutils.create_struct_proxy(vty)(context, builder)
        for i, name in enumerate(vty.attr_names):
            setattr(out, name, builder.extract_value(args[0], i))
        return out._getvalue()

    return vty(lanes), codegen


@intrinsic
def _lanes_of(typingctx, value):
    """A vector's lanes as the UniTuple the tuple forms store."""
    lanes = types.UniTuple(value.base_type, value.num_elements)

    def codegen(context, builder, sig, args):
        proxy = cgutils.create_struct_proxy(value)(context, builder, value=args[0])
        return context.make_tuple(builder, lanes, [getattr(proxy, n) for n in value.attr_names])

    return lanes(value), codegen


def _sixteen_bytes(op, values):
    if not isinstance(values, types.UniTuple) or not isinstance(values.dtype, (types.Integer, types.Float)) or \
            values.count * (values.dtype.bitwidth // 8) != 16:
        raise NumbaTypeError(f"flowdsl.mem.{op} requires a tuple of 16 bytes of one number type (from "
                             f"flowdsl.mem.load_vec), got {values}")
    return values.dtype, values.count


@intrinsic
def _vec_to_bits(typingctx, values):
    elem, lanes = _sixteen_bytes("vec_to_bits", values)

    def codegen(context, builder, sig, args):
        lane_type = context.get_value_type(elem)
        vec = ir.Constant(ir.VectorType(lane_type, lanes), None)
        for i in range(lanes):
            vec = builder.insert_element(vec, builder.extract_value(args[0], i), ir.Constant(ir.IntType(32), i))
        wide = builder.bitcast(vec, ir.VectorType(ir.IntType(64), 2))
        return context.make_tuple(builder, sig.return_type,
                                  [builder.extract_element(wide, ir.Constant(ir.IntType(32), i)) for i in range(2)])

    return types.UniTuple(types.uint64, 2)(values), codegen


@intrinsic
def _vec_from_bits(typingctx, low, high, dtype):
    target = _scalar_class("vec_from_bits", dtype)
    lanes = 16 // (target.bitwidth // 8)
    result = types.UniTuple(target, lanes)

    def codegen(context, builder, sig, args):
        wide = ir.Constant(ir.VectorType(ir.IntType(64), 2), None)
        for i, (value, ty) in enumerate(((args[0], low), (args[1], high))):
            wide = builder.insert_element(wide, context.cast(builder, value, ty, types.uint64),
                                          ir.Constant(ir.IntType(32), i))
        narrow = builder.bitcast(wide, ir.VectorType(context.get_value_type(target), lanes))
        return context.make_tuple(builder, result, [builder.extract_element(narrow, ir.Constant(ir.IntType(32), i))
                                                    for i in range(lanes)])

    return result(low, high, dtype), codegen


def _scalar_class(op, dtype):
    if isinstance(dtype, types.NumberClass):
        return dtype.instance_type
    if isinstance(dtype, types.DType):
        return dtype.dtype
    raise NumbaTypeError(f"flowdsl.mem.{op} requires dtype to be a numba or NumPy scalar type, got {dtype}")


def _bits_type(op, ty):
    if not isinstance(ty, (types.Integer, types.Float)) or ty.bitwidth not in (8, 16, 32, 64):
        raise NumbaTypeError(f"flowdsl.mem.{op} requires an integer or float scalar of 1, 2, 4 or 8 bytes, "
                             f"got {ty}")
    return ir.IntType(ty.bitwidth)


# LLVM bitcasts, not PTX: the register is reused as is.
@intrinsic
def _to_bits(typingctx, value):
    same = _bits_type("to_bits", value)

    def codegen(context, builder, sig, args):
        return builder.zext(builder.bitcast(args[0], same), ir.IntType(64)) if same.width < 64 else \
            builder.bitcast(args[0], same)

    return types.uint64(value), codegen


@intrinsic
def _from_bits(typingctx, bits, dtype):
    target = _scalar_class("from_bits", dtype)
    same = _bits_type("from_bits", target)
    if not isinstance(bits, types.Integer):
        raise NumbaTypeError(f"flowdsl.mem.from_bits requires integer bits, got {bits}")

    def codegen(context, builder, sig, args):
        word = context.cast(builder, args[0], bits, types.uint64)
        low = builder.trunc(word, same) if same.width < 64 else word
        return builder.bitcast(low, context.get_value_type(target))

    return target(bits, dtype), codegen


@intrinsic
def _address(typingctx, array, index):
    def codegen(context, builder, sig, args):
        ptr = _item_pointer(context, builder, array, args[0], index, args[1])
        return builder.ptrtoint(ptr, ir.IntType(64))

    return types.uint64(array, index), codegen


@intrinsic
def _itemsize(typingctx, array):
    size = _element(array).bitwidth // 8

    def codegen(context, builder, sig, args):
        return context.get_constant(types.intp, size)

    return types.intp(array), codegen


@intrinsic
def _globaltimer(typingctx):
    def codegen(context, builder, sig, args):
        # volatile: every read is a new sample (LLVM must not merge or hoist two reads).
        return _asm(builder, ir.IntType(64), [], "mov.u64 $0, %globaltimer;", "=l")

    return types.uint64(), codegen



# numba offers an overload the non-literal types first, then literals: the non-literal attempt is refused
# by the spec's constant check, so the literal one decides (and its error is the one reported).

#: Primitives whose lowering is their intrinsic, called with the stub's arguments after the spec's checks.
for _stub, _intrinsic in ((mem.load_acquire, _load("acquire")), (mem.load_relaxed, _load("relaxed")),
                          (mem.store_release, _store("release")), (mem.store_relaxed, _store("relaxed")),
                          (mem.fence, _fence), (mem.atomic_add, _atomic("add")), (mem.atomic_exch, _atomic("exch")),
                          (mem.red_add, _atomic("add", returns=False)), (mem.atomic_cas, _atomic_cas),
                          (mem.load_vec, _load_vec),
                          (mem.store_vec, _store_vec), (mem.load_vec_relaxed, _load_vec_relaxed),
                          (mem.store_vec_relaxed, _store_vec_relaxed),
                          # One st.relaxed.v* a lane: a converged warp issues them as one instruction (its meaning).
                          (mem.warp_store_vec, _store_vec_relaxed)):
    lower_as(_stub, _intrinsic)


@overload(mem.load_vector)
def mem_load_vector(array, index):
    check(mem.load_vector, array, index)
    lanes = _vector_type(array).num_elements
    return lambda array, index: _vector_of(_load_vec(array, index * lanes))


@overload(mem.store_vector)
def mem_store_vector(array, index, value):
    check(mem.store_vector, array, index, value)
    _check_vector("store_vector", array, value)
    lanes = value.num_elements
    return lambda array, index, value: _store_vec(array, index * lanes, _lanes_of(value))


@overload(mem.load_vector_relaxed)
def mem_load_vector_relaxed(array, index, scope):
    check(mem.load_vector_relaxed, array, index, scope)
    lanes = _vector_type(array).num_elements
    return lambda array, index, scope: _vector_of(_load_vec_relaxed(array, index * lanes, scope))


@overload(mem.store_vector_relaxed)
def mem_store_vector_relaxed(array, index, value, scope):
    check(mem.store_vector_relaxed, array, index, value, scope)
    _check_vector("store_vector_relaxed", array, value)
    lanes = value.num_elements
    return lambda array, index, value, scope: _store_vec_relaxed(array, index * lanes, _lanes_of(value), scope)


@overload(mem.vec_to_bits)
def mem_vec_to_bits(values):
    return lambda values: _vec_to_bits(values)


@overload(mem.vec_from_bits)
def mem_vec_from_bits(low, high, dtype):
    return lambda low, high, dtype: _vec_from_bits(low, high, dtype)


@overload(mem.to_bits)
def mem_to_bits(value):
    return lambda value: _to_bits(value)


@overload(mem.from_bits)
def mem_from_bits(bits, dtype):
    return lambda bits, dtype: _from_bits(bits, dtype)


@overload(mem.address)
def mem_address(array, index):
    check(mem.address, array, index)
    return lambda array, index: _address(array, index)


@overload(mem.itemsize)
def mem_itemsize(array):
    check(mem.itemsize, array)
    return lambda array: _itemsize(array)


@overload(mem.globaltimer)
def mem_globaltimer():
    return lambda: _globaltimer()


# ---- multimem (NVLink SHARP): one instruction on every LSA team member's copy --------------------------
# ld_reduce and st are weak (a plain load and store: an LSA barrier orders them, as NCCL's kernels do);
# red is relaxed at system scope. Which element type takes which operator is flowdsl.mem.multimem_refusal,
# checked at typing. 16-byte forms move four 32-bit registers: f32 lanes, or f16x2 / bf16x2 pairs.

_MULTIMEM_OPS = {RedOp.SUM: "add", RedOp.MIN: "min", RedOp.MAX: "max"}
#: 16-byte element -> PTX type of one of its four 32-bit registers.
_MULTIMEM_PAIRS = {types.float32: "f32", types.float16: "f16x2", types.uint16: "bf16x2"}


def _per_operator(make):
    """``make(red)``, the intrinsic for operator ``red``, made once per operator with the operator baked in:
    inside an overload's implementation the call's literal types are gone (a closure's or a global's
    operator arrives as a plain integer)."""
    return functools.cache(make)


def _multimem_typing(stub, view, op, vector):
    """The spec's checks, then PTX's table of types and operators (the simulator's refusal text)."""
    name = stub.__name__
    refusal = mem.multimem_refusal(name, str(view.dtype), None if op is None else op.literal_value, vector)
    if refusal is not None:
        raise NumbaTypeError(refusal)


def _multimem_address(context, builder, view_ty, view, index_ty, index):
    proxy = cgutils.create_struct_proxy(view_ty)(context, builder, value=view)
    return builder.gep(proxy.data, [context.cast(builder, index, index_ty, types.intp)])


def _multimem_scalar(elem, op):
    """(PTX type, register constraint) of one element: an int64 sum adds as .u64 (PTX has no .s64 add)."""
    ptx, reg = PTX_TYPES[elem]
    if elem == types.int64 and op == RedOp.SUM:
        ptx = "u64"
    return ptx, reg


def _multimem_lanes(context, builder, elem, regs):
    """The UniTuple of ``elem`` that four i32 registers hold."""
    lanes = 16 // (elem.bitwidth // 8)
    i32 = ir.IntType(32)
    vec = ir.Constant(ir.VectorType(i32, 4), None)
    for i, r in enumerate(regs):
        vec = builder.insert_element(vec, r, ir.Constant(i32, i))
    narrow = builder.bitcast(vec, ir.VectorType(context.get_value_type(elem), lanes))
    return context.make_tuple(builder, types.UniTuple(elem, lanes),
                              [builder.extract_element(narrow, ir.Constant(i32, i)) for i in range(lanes)])


def _multimem_registers(context, builder, elem, values, values_ty):
    """Four i32 registers holding the 16-byte tuple ``values`` of ``elem``."""
    lanes = 16 // (elem.bitwidth // 8)
    i32 = ir.IntType(32)
    vec = ir.Constant(ir.VectorType(context.get_value_type(elem), lanes), None)
    for i in range(lanes):
        lane = context.cast(builder, builder.extract_value(values, i), values_ty[i], elem)
        vec = builder.insert_element(vec, lane, ir.Constant(i32, i))
    wide = builder.bitcast(vec, ir.VectorType(i32, 4))
    return [builder.extract_element(wide, ir.Constant(i32, i)) for i in range(4)]


def _vector_values(stub, view, values):
    lanes = 16 // (view.dtype.bitwidth // 8)
    if not isinstance(values, types.BaseTuple) or len(values) != lanes:
        raise NumbaTypeError(f"flowdsl.mem.{stub.__name__} requires a tuple of {lanes} {view.dtype} values "
                             f"(16 bytes), got {values}")


@_per_operator
def _multimem_ld_reduce(red):

    @intrinsic
    def multimem_ld_reduce(typingctx, view, index, op):
        elem = view.dtype

        def codegen(context, builder, sig, args):
            ptr = _multimem_address(context, builder, view, args[0], index, args[1])
            ptx, reg = _multimem_scalar(elem, red)
            return _asm(builder, context.get_value_type(elem), [ptr],
                        f"multimem.ld_reduce.global.{_MULTIMEM_OPS[red]}.{ptx} $0, [$1];", f"={reg},l,~{{memory}}")

        return elem(view, index, op), codegen

    return multimem_ld_reduce


@intrinsic
def _multimem_store(typingctx, view, index, value):
    elem = view.dtype

    def codegen(context, builder, sig, args):
        ptr = _multimem_address(context, builder, view, args[0], index, args[1])
        ptx, reg = PTX_TYPES[elem]
        _asm(builder, ir.VoidType(), [ptr, context.cast(builder, args[2], value, elem)],
             f"multimem.st.global.{ptx} [$0], $1;", f"l,{reg},~{{memory}}")
        return context.get_dummy_value()

    return types.void(view, index, value), codegen


@_per_operator
def _multimem_red(red):

    @intrinsic
    def multimem_red(typingctx, view, index, value, op):
        elem = view.dtype

        def codegen(context, builder, sig, args):
            ptr = _multimem_address(context, builder, view, args[0], index, args[1])
            ptx, reg = _multimem_scalar(elem, red)
            _asm(builder, ir.VoidType(), [ptr, context.cast(builder, args[2], value, elem)],
                 f"multimem.red.relaxed.sys.global.{_MULTIMEM_OPS[red]}.{ptx} [$0], $1;", f"l,{reg},~{{memory}}")
            return context.get_dummy_value()

        return types.void(view, index, value, op), codegen

    return multimem_red


def _pair_op(elem, red, accumulate):
    """``add.v4.f32``, ``add.acc::f32.v4.f16x2``, ``min.v4.bf16x2``, ...: half sums add in float32 where
    the instruction can (``accumulate``: ld_reduce; multimem.red has no .acc)."""
    acc = ".acc::f32" if accumulate and red == RedOp.SUM and elem != types.float32 else ""
    return f"{_MULTIMEM_OPS[red]}{acc}.v4.{_MULTIMEM_PAIRS[elem]}"


@_per_operator
def _multimem_ld_reduce_vec(red):

    @intrinsic
    def multimem_ld_reduce_vec(typingctx, view, index, op):
        elem = view.dtype
        lanes = 16 // (elem.bitwidth // 8)

        def codegen(context, builder, sig, args):
            ptr = _multimem_address(context, builder, view, args[0], index, args[1])
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [ptr.type])
            packed = builder.asm(fnty, f"multimem.ld_reduce.global.{_pair_op(elem, red, True)} {{$0, $1, $2, $3}}, [$4];",
                                 "=r,=r,=r,=r,l,~{memory}", [ptr], side_effect=True)
            return _multimem_lanes(context, builder, elem, [builder.extract_value(packed, i) for i in range(4)])

        return types.UniTuple(elem, lanes)(view, index, op), codegen

    return multimem_ld_reduce_vec


def _emit_multimem_vec(context, builder, view, index, args, values, instruction):
    """``instruction`` (``multimem.st...global.v4.f32``, ``multimem.red...``) of the 16-byte tuple ``values`` at
    ``view[index]``'s multicast address, in four 32-bit registers. multimem.st has vectors of float types only,
    so it stores 16 bytes of any type as four f32 lanes."""
    ptr = _multimem_address(context, builder, view, args[0], index, args[1])
    regs = _multimem_registers(context, builder, view.dtype, args[2], values)
    _asm(builder, ir.VoidType(), [ptr] + regs, f"{instruction} [$0], {{$1, $2, $3, $4}};", "l,r,r,r,r,~{memory}")


@intrinsic
def _multimem_store_vec(typingctx, view, index, values):
    def codegen(context, builder, sig, args):
        _emit_multimem_vec(context, builder, view, index, args, values, "multimem.st.global.v4.f32")
        return context.get_dummy_value()

    return types.void(view, index, values), codegen


@intrinsic
def _multimem_store_vec_relaxed(typingctx, view, index, values, scope):
    def codegen(context, builder, sig, args):
        _select(context, builder, [(args[3], scope, _SCOPES)],
                lambda b, s: _emit_multimem_vec(context, b, view, index, args, values,
                                                f"multimem.st.relaxed.{_SCOPES[s]}.global.v4.f32"))
        return context.get_dummy_value()

    return types.void(view, index, values, scope), codegen


@_per_operator
def _multimem_red_vec(red):

    @intrinsic
    def multimem_red_vec(typingctx, view, index, values, op):
        elem = view.dtype

        def codegen(context, builder, sig, args):
            _emit_multimem_vec(context, builder, view, index, args, values,
                               f"multimem.red.relaxed.sys.global.{_pair_op(elem, red, False)}")
            return context.get_dummy_value()

        return types.void(view, index, values, op), codegen

    return multimem_red_vec


@intrinsic
def _multimem_address_of(typingctx, view, index):
    def codegen(context, builder, sig, args):
        return builder.ptrtoint(_multimem_address(context, builder, view, args[0], index, args[1]), ir.IntType(64))

    return types.uint64(view, index), codegen


lower_as(mem.multimem_address, _multimem_address_of)


def _multimem_lowering(stub, vector, intrinsic):
    """Lower a multimem primitive: PTX's table of types and operators checked (:func:`_multimem_typing`),
    a vector form's ``values`` checked against the view, an operator baked into its intrinsic (then
    ``intrinsic`` makes it from the :class:`RedOp`)."""
    def choose(view, op=None, values=None, **_):
        _multimem_typing(stub, view, op, vector)
        if values is not None:
            _vector_values(stub, view, values)
        return intrinsic if op is None else intrinsic(RedOp(op.literal_value))
    choose.__qualname__ = f"multimem lowering of {stub.__name__}"
    lower_as(stub, choose=choose)


for _stub, _vector, _intrinsic in ((mem.multimem_ld_reduce, False, _multimem_ld_reduce),
                                   (mem.multimem_store, False, _multimem_store),
                                   (mem.multimem_red, False, _multimem_red),
                                   (mem.multimem_ld_reduce_vec, True, _multimem_ld_reduce_vec),
                                   (mem.multimem_store_vec, True, _multimem_store_vec),
                                   (mem.multimem_store_vec_relaxed, True, _multimem_store_vec_relaxed),
                                   (mem.multimem_red_vec, True, _multimem_red_vec)):
    _multimem_lowering(_stub, _vector, _intrinsic)
