"""How ``flowdsl.lsa`` compiles: window pointers and typed views, barrier sessions, reduce and copy.

Pointers and views call the support library's ``ncclGet*Pointer`` wrappers; a view is a numba array
over the pointer, its length checked against the window (past the end, it prints what and traps).
A barrier session is a struct (communicator, coop, index) whose arrive, wait and sync call the
function of the coop's kind. reduce_sum, copy and reduce_sum_copy, and their multimem forms, compile the
flowdsl programs that state their meaning (``flowdsl/lsa.py``), which the simulator runs too.
"""

from __future__ import annotations

import inspect

from llvmlite import ir
from numba.core import cgutils, types
from numba.core.errors import NumbaTypeError
from numba.cuda.extending import lower_builtin, make_attribute_wrapper, overload, overload_method, register_jitable
from numba.cuda.typing.templates import AbstractTemplate, infer, infer_global, signature

from .. import lsa
from .._spec import spec_of
from .backend import populate_array
from .checks import check, is_omitted
from .declarations import call_extern, extern
from .intrinsics import devcomm_ptr, emit_devcomm_ptr, emit_refusal, emit_trap, enum_value, make_session, printed_refusal, typed_pointer
from .types import LsaBarrierSessionType, MultimemViewType, TeamType

__all__: list[str] = []

for _name in ("comm", "coop", "index"):
    make_attribute_wrapper(LsaBarrierSessionType, _name, _name)


# ---- pointers ----------------------------------------------------------------------------------

@overload(lsa.get_local_pointer)
def lsa_get_local_pointer(win, offset):
    check(lsa.get_local_pointer, win)
    fn, elem = extern(lsa.get_local_pointer), win.dtype
    return lambda win, offset: typed_pointer(fn(win._handle, offset), elem)


@overload(lsa.get_lsa_pointer)
def lsa_get_lsa_pointer(win, offset, lsa_peer):
    check(lsa.get_lsa_pointer, win)
    fn, elem = extern(lsa.get_lsa_pointer), win.dtype
    return lambda win, offset, lsa_peer: typed_pointer(fn(win._handle, offset, lsa_peer), elem)


@overload(lsa.get_peer_pointer)
def lsa_get_peer_pointer(win, offset, peer):
    check(lsa.get_peer_pointer, win)
    fn, elem = extern(lsa.get_peer_pointer), win.dtype
    return lambda win, offset, peer: typed_pointer(fn(win._handle, offset, peer), elem)


@overload(lsa.get_team_pointer)
def lsa_get_team_pointer(win, offset, team, peer):
    check(lsa.get_team_pointer, win, offset, team)
    fn, elem = extern(lsa.get_team_pointer), win.dtype
    return lambda win, offset, team, peer: typed_pointer(
        fn(win._handle, offset, team.nranks, team.rank, team.stride, peer), elem)


# ---- views ---------------------------------------------------------------------------------------

def _view_dtype(op, win, dtype):
    if dtype is None or isinstance(dtype, (types.Omitted, types.NoneType)):
        return win.dtype
    if isinstance(dtype, types.NumberClass):
        return dtype.instance_type
    if isinstance(dtype, types.DType):
        return dtype.dtype
    raise NumbaTypeError(f"{op} requires dtype to be a numba or NumPy scalar type (e.g. "
                         f"numba.float32), got {dtype}")


def _view_element(stub, full, win):
    """Typing of a window view: checks every argument (the spec's, then ``dtype``), gives its element type."""
    check(stub, *full)
    name = spec_of(stub).name
    elem = _view_dtype(name, win, full[-1])
    if not isinstance(elem, (types.Integer, types.Float, types.Complex)):
        raise NumbaTypeError(f"{name} cannot view a window as {elem}: use a numeric type")
    return elem


def _view_type(stub, full):
    """The type of a window view (an array) made with the arguments ``full``."""
    return types.Array(_view_element(stub, full, full[0]), 1, "C")


def _bind(stub, pysig, args, kws):
    """Keywords and defaults folded into positions (omitted ones typed Omitted), as @overload does, so
    ``peer_view(win, p, count=4)`` works."""
    try:
        bound = pysig.bind(*args, **kws)
    except TypeError as exc:
        raise NumbaTypeError(spec_of(stub).refusal_arity(str(exc))) from exc
    return [bound.arguments[name] if name in bound.arguments else types.Omitted(param.default)
            for name, param in pysig.parameters.items()]


def _start_count(context, builder, sig, args, first):
    """The view's ``start`` and ``count`` (positions ``first`` and ``first + 1``) as int64, or their defaults."""
    i64 = types.int64

    def arg(pos, default):
        if pos < len(sig.args) and not is_omitted(sig.args[pos]):
            return context.cast(builder, args[pos], sig.args[pos], i64)
        return context.get_constant(i64, default)

    return arg(first, 0), arg(first + 1, -1)


def _view_length(context, builder, op, nbytes, start, count, itemsize):
    """The view's length; a view past the end of the window prints what and traps.

    Plain integer code (no division: ``itemsize`` is a power of two) with the report in a
    cold, never-inlined function, so that views made inside hot loops cost a compare.
    """
    i64 = ir.IntType(64)
    total = builder.lshr(nbytes, ir.Constant(i64, itemsize.bit_length() - 1))
    n = builder.select(builder.icmp_signed("<", count, ir.Constant(i64, 0)), builder.sub(total, start), count)
    past_end = builder.or_(builder.icmp_signed("<", start, ir.Constant(i64, 0)),
                           builder.icmp_signed(">", builder.add(start, n), total))
    with cgutils.if_unlikely(builder, past_end):
        builder.call(_view_error_function(builder.module, op), [start, n, total])
    return n


def _view_error_function(module, op):
    name = f"flowdsl_{op}_past_end"
    i64 = ir.IntType(64)
    fn = cgutils.get_or_insert_function(module, ir.FunctionType(ir.VoidType(), [i64, i64, i64]), name)
    if not fn.is_declaration:
        return fn
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    fn.attributes.add("cold")
    builder = ir.IRBuilder(fn.append_basic_block())
    text = (f"flowdsl.lsa.{op}: view past the end of the window: start %lld, count %lld, "
            "window holds %lld elements\n\0").encode()
    fmt = cgutils.global_constant(module, f"{name}_fmt", ir.Constant(ir.ArrayType(ir.IntType(8), len(text)),
                                                                   bytearray(text)))
    record = ir.LiteralStructType([i64, i64, i64])
    buf = builder.alloca(record)
    for i, arg in enumerate(fn.args):
        builder.store(arg, builder.gep(buf, [ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), i)]))
    voidptr = ir.IntType(8).as_pointer()
    vprintf = cgutils.get_or_insert_function(module, ir.FunctionType(ir.IntType(32), [voidptr, voidptr]),
                                             "vprintf")
    builder.call(vprintf, [builder.bitcast(fmt, voidptr), builder.bitcast(buf, voidptr)])
    emit_trap(builder)
    builder.unreachable()
    return fn


def _register_view(stub, nwhere):
    """Type and lower a view (arrays made inside the callee, which numba forbids a device function to
    return without NRT: so views are typed and lowered directly rather than through @overload).
    ``nwhere``: the arguments after the window that say whose window (a peer, or a team and a peer)."""
    pysig = inspect.signature(stub)
    op = stub.__name__
    symbol = spec_of(stub).extern

    class ViewTemplate(AbstractTemplate):
        key = stub

        def generic(self, args, kws):
            full = _bind(stub, pysig, args, kws)
            return signature(_view_type(stub, full), *full).replace(pysig=pysig)

    infer(ViewTemplate)
    infer_global(stub, types.Function(ViewTemplate))

    @lower_builtin(stub, types.VarArg(types.Any))
    def lower(context, builder, sig, args):
        win_ty, win = sig.args[0], args[0]
        view_ty = sig.return_type
        itemsize = context.get_abi_sizeof(context.get_data_type(view_ty.dtype))
        i64 = types.int64
        start, count = _start_count(context, builder, sig, args, 1 + nwhere)
        window = cgutils.create_struct_proxy(win_ty)(context, builder, value=win)
        n = _view_length(context, builder, op, window.nbytes, start, count, itemsize)
        offset = builder.mul(start, context.get_constant(i64, itemsize))
        where = []
        for ty, val in zip(sig.args[1:1 + nwhere], args[1:1 + nwhere]):
            if isinstance(ty, TeamType):
                team_val = cgutils.create_struct_proxy(ty)(context, builder, value=val)
                where += [team_val.nranks, team_val.rank, team_val.stride]
            else:
                where.append(context.cast(builder, val, ty, types.int32))
        ptr = call_extern(context, builder, symbol, [window.handle, offset] + where)
        ary = context.make_array(view_ty)(context, builder)
        data = builder.bitcast(ptr, context.get_data_type(view_ty.dtype).as_pointer())
        populate_array(ary, data=data, shape=cgutils.pack_array(builder, [n]),
                       strides=cgutils.pack_array(builder, [context.get_constant(types.intp, itemsize)]),
                       itemsize=context.get_constant(types.intp, itemsize), meminfo=None)
        return ary._getvalue()


_register_view(lsa.local_view, 0)
_register_view(lsa.lsa_view, 1)
_register_view(lsa.peer_view, 1)
_register_view(lsa.team_view, 2)


# ---- the multimem view ----------------------------------------------------------------------------

class _MultimemViewTemplate(AbstractTemplate):
    key = lsa.multimem_view
    _pysig = inspect.signature(lsa.multimem_view)

    def generic(self, args, kws):
        full = _bind(lsa.multimem_view, self._pysig, args, kws)
        elem = _view_element(lsa.multimem_view, full, full[1])
        return signature(MultimemViewType(elem), *full).replace(pysig=self._pysig)


infer(_MultimemViewTemplate)
infer_global(lsa.multimem_view, types.Function(_MultimemViewTemplate))


@lower_builtin(lsa.multimem_view, types.VarArg(types.Any))
def _lower_multimem_view(context, builder, sig, args):
    """The multicast address of element ``start`` (checked against the window as views are), from NCCL's
    ``ncclGetLsaMultimemPointer`` on a copy of the communicator; a communicator without multimem prints
    the simulator's refusal and traps."""
    comm_ty, win_ty = sig.args[:2]
    view_ty = sig.return_type
    itemsize = context.get_abi_sizeof(context.get_data_type(view_ty.dtype))
    start, count = _start_count(context, builder, sig, args, 2)
    window = cgutils.create_struct_proxy(win_ty)(context, builder, value=args[1])
    n = _view_length(context, builder, "multimem_view", window.nbytes, start, count, itemsize)
    offset = builder.mul(start, context.get_constant(types.int64, itemsize))
    ptr = call_extern(context, builder, spec_of(lsa.multimem_view).extern,
                      [window.handle, offset, emit_devcomm_ptr(context, builder, comm_ty, args[0])])
    with cgutils.if_unlikely(builder, cgutils.is_null(builder, ptr)):
        emit_refusal(builder, lsa.MULTIMEM_MISSING, [])
    view = cgutils.create_struct_proxy(view_ty)(context, builder)
    view.data = builder.bitcast(ptr, context.get_data_type(view_ty.dtype).as_pointer())
    view.count = n
    return view._getvalue()


# ---- barriers ------------------------------------------------------------------------------------

@overload(lsa.barrier)
def lsa_barrier(comm, coop, index):
    check(lsa.barrier, comm, coop, index)
    return lambda comm, coop, index: make_session(comm, coop, index)


def _session_call(stub, session, order):
    check(stub, session, order)
    fn = extern(stub, session.coop)
    return lambda session, order: fn(session.coop._word, devcomm_ptr(session.comm), session.index,
                                     enum_value(order))


@overload_method(LsaBarrierSessionType, "arrive")
@overload(lsa.arrive)
def lsa_arrive(session, order):
    return _session_call(lsa.arrive, session, order)


@overload_method(LsaBarrierSessionType, "wait")
@overload(lsa.wait)
def lsa_wait(session, order):
    return _session_call(lsa.wait, session, order)


@overload_method(LsaBarrierSessionType, "sync")
@overload(lsa.sync)
def lsa_sync(session, order):
    return _session_call(lsa.sync, session, order)


# ---- reduce and copy: the programs of flowdsl/lsa.py ----------------------------------------------

@overload(lsa._vec_add)
def _vec_add(a, b):
    if isinstance(a, types.UniTuple) and len(a) == 2:
        return lambda a, b: (a[0] + b[0], a[1] + b[1])
    if isinstance(a, types.UniTuple) and len(a) == 4:
        return lambda a, b: (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])
    raise NumbaTypeError(f"flowdsl: no 16-byte vector of {a}")


register_jitable(lsa._vector_lanes)
_reduce_sum = register_jitable(lsa.reduce_sum_program)
_copy = register_jitable(lsa.copy_program)
_reduce_sum_copy = register_jitable(lsa.reduce_sum_copy_program)


@overload(lsa.reduce_sum)
def lsa_reduce_sum(coop, comm, win, start, dst, count):
    check(lsa.reduce_sum, coop, comm, win, start, dst)
    return lambda coop, comm, win, start, dst, count: _reduce_sum(coop, comm, win, start, dst, count)


@overload(lsa.copy)
def lsa_copy(coop, comm, src, win, start, count):
    check(lsa.copy, coop, comm, src, win)
    return lambda coop, comm, src, win, start, count: _copy(coop, comm, src, win, start, count)


@overload(lsa.reduce_sum_copy)
def lsa_reduce_sum_copy(coop, comm, src_win, src_start, dst_win, dst_start, count):
    check(lsa.reduce_sum_copy, coop, comm, src_win, src_start, dst_win)
    return lambda coop, comm, src_win, src_start, dst_win, dst_start, count: _reduce_sum_copy(
        coop, comm, src_win, src_start, dst_win, dst_start, count)


# ---- the multimem helpers: the programs of flowdsl/lsa.py, with the loops the element type has -------------

register_jitable(lsa._multimem_vectors)
register_jitable(lsa._misalignment)
_multimem_reduce_sum = register_jitable(lsa.multimem_reduce_sum_program)
_multimem_store = register_jitable(lsa.multimem_store_program)


def _multimem_forms(stub, view, other, store_only=False):
    """``(lanes, one)`` of the view's element type (None where PTX lacks the form: the program's branch on it
    is dropped when numba types it), or the table's refusal."""
    forms = lsa.multimem_helper_forms(stub.__name__, str(view.dtype), None if other is None else str(other.dtype),
                                      store_only)
    if isinstance(forms, str):
        raise NumbaTypeError(forms)
    return forms


@overload(lsa.multimem_reduce_sum)
def lsa_multimem_reduce_sum(coop, view, dst, count):
    check(lsa.multimem_reduce_sum, coop, view, dst, count)
    lanes, one = _multimem_forms(lsa.multimem_reduce_sum, view, dst)
    return lambda coop, view, dst, count: _multimem_reduce_sum(coop, view, dst, count, lanes, one)


@overload(lsa.multimem_copy)
def lsa_multimem_copy(coop, src, view, count):
    check(lsa.multimem_copy, coop, src, view, count)
    lanes, one = _multimem_forms(lsa.multimem_copy, view, src, store_only=True)
    return lambda coop, src, view, count: _multimem_store(coop, True, src, None, view, count, lanes, one)


@overload(lsa.multimem_reduce_sum_copy)
def lsa_multimem_reduce_sum_copy(coop, src_view, dst_view, count):
    check(lsa.multimem_reduce_sum_copy, coop, src_view, dst_view, count)
    lanes, one = _multimem_forms(lsa.multimem_reduce_sum_copy, src_view, dst_view)
    return lambda coop, src_view, dst_view, count: _multimem_store(coop, None, None, src_view, dst_view, count,
                                                                   lanes, one)


@overload(lsa.multimem_partial_vectors)
def lsa_multimem_partial_vectors(offset, count, lanes):
    check(lsa.multimem_partial_vectors, offset, count, lanes)
    refuse = printed_refusal(lsa.multimem_partial_vectors_text("{}", "{}", "{}"))  # {}: count, offset, lanes, lanes
    return lambda offset, count, lanes: refuse((count, offset, lanes, lanes))
