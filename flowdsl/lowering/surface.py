"""How the device surface (``flowdsl.coop``, ``.team``, ``.lsa``, DevComm fields) compiles.

Each stub gets an ``@overload`` (or a method/attribute on its value type) whose
implementation calls the support library through :data:`DECLARED`, or is
written in flowdsl itself (the LSA reduce/copy helpers, which NCCL 2.28 lacks,
share one implementation for every NCCL release).

Contents: :func:`bind`, :func:`reduce_sum_impl`, :func:`copy_impl`,
:func:`reduce_sum_copy_impl`.
"""

from __future__ import annotations

from numba import cuda
from numba.core import types
from numba.core.errors import NumbaTypeError
import inspect

from llvmlite import ir
from numba.core import cgutils
from numba.cuda.extending import (lower_builtin, make_attribute_wrapper, overload, overload_attribute,
                                  overload_method, register_jitable)
from .backend import populate_array
from numba.cuda.typing.templates import AbstractTemplate, infer, infer_global, signature

from .. import coop as coop_mod
from .. import lsa, mem, team
from ..enums import CoopKind
from . import flow_surface, gin_surface, ptx, wait_surface
from .checks import expect, expect_int, is_omitted
from .declarations import DECLARED, call_extern
from .externs import COOP_SUFFIX
from .intrinsics import (array_ptr, devcomm_ptr, enum_value, make_coop, make_session, make_team,
                         emit_trap, typed_pointer)
from .types import CoopType, DevCommType, LsaBarrierSessionType, TeamType, WindowType

__all__ = ["bind", "reduce_sum_impl", "copy_impl", "reduce_sum_copy_impl"]

make_attribute_wrapper(CoopType, "word", "_word")
for _name in ("comm", "coop", "index"):
    make_attribute_wrapper(LsaBarrierSessionType, _name, _name)




def _coop_fn(stem, coop):
    return DECLARED[f"{stem}__{COOP_SUFFIX[coop.kind]}"]


# ---- coops -----------------------------------------------------------------------
# Typers must have exactly the stub's parameters, so values are captured by factories.

def _constant_coop(maker):
    def typer():
        return lambda: maker(0)
    return typer


def _bind_coops():
    for kind, stub in ((CoopKind.THREAD, coop_mod.thread), (CoopKind.WARP, coop_mod.warp),
                       (CoopKind.CTA, coop_mod.cta)):
        overload(stub)(_constant_coop(make_coop[kind]))

    @overload(coop_mod.lanes)
    def _lanes(mask):
        expect_int("flowdsl.coop.lanes", "mask", mask)
        maker = make_coop[CoopKind.LANES]
        return lambda mask: maker(mask)

    @overload(coop_mod.warp_span)
    def _warp_span(first_warp, nwarps, id):
        for what, ty in (("first_warp", first_warp), ("nwarps", nwarps), ("id", id)):
            expect_int("flowdsl.coop.warp_span", what, ty)
        maker = make_coop[CoopKind.WARP_SPAN]
        return lambda first_warp, nwarps, id: maker(
            (first_warp & 0xFF) | ((nwarps & 0xFF) << 8) | ((id & 0xFF) << 16))

    def coop_call(stem, method):
        def typer(c):
            expect(f"flowdsl.coop.{method}", "a coop (flowdsl.coop.cta(), .warp(), ...)", c, CoopType)
            fn = _coop_fn(stem, c)
            return lambda c: fn(c._word)
        return typer

    for stem, stub in (("flowdsl_coop_sync", coop_mod.sync),
                       ("flowdsl_coop_thread_rank", coop_mod.thread_rank),
                       ("flowdsl_coop_size", coop_mod.size)):
        typer = coop_call(stem, stub.__name__)
        overload(stub)(typer)
        overload_method(CoopType, stub.__name__)(typer)


# ---- device communicator fields and teams -------------------------------------------

def _bind_comm_and_teams():
    def field(fn):
        def typer(comm):
            return lambda comm: fn(devcomm_ptr(comm))
        return typer

    for attr, symbol in (("rank", "flowdsl_comm_rank"), ("nranks", "flowdsl_comm_nranks"),
                         ("lsa_rank", "flowdsl_comm_lsa_rank"), ("lsa_size", "flowdsl_comm_lsa_size")):
        overload_attribute(DevCommType, attr)(field(DECLARED[symbol]))

    def team_of_comm(fn, name):
        def typer(comm):
            expect(f"flowdsl.team.{name}", "a device communicator", comm, DevCommType)

            def impl(comm):
                out = cuda.local.array(3, types.int32)
                fn(devcomm_ptr(comm), array_ptr(out))
                return make_team(out[0], out[1], out[2])
            return impl
        return typer

    for stub, symbol in ((team.world, "flowdsl_team_world"), (team.lsa, "flowdsl_team_lsa"),
                         (team.rail, "flowdsl_team_rail")):
        overload(stub)(team_of_comm(DECLARED[symbol], stub.__name__))

    def rank_conversion(fn, name):
        def typer(comm, team, rank):
            expect(f"flowdsl.team.{name}", "a device communicator", comm, DevCommType)
            expect(f"flowdsl.team.{name}", "a team", team, TeamType)
            return lambda comm, team, rank: fn(devcomm_ptr(comm), team.nranks, team.rank, team.stride, rank)
        return typer

    for stub, symbol in ((team.rank_to_world, "flowdsl_team_rank_to_world"),
                         (team.rank_to_lsa, "flowdsl_team_rank_to_lsa")):
        overload(stub)(rank_conversion(DECLARED[symbol], stub.__name__))

    def two_teams(fn, name, is_bool):
        def typer(a, b, b_rank):
            expect(f"flowdsl.team.{name}", "teams", a, TeamType)
            expect(f"flowdsl.team.{name}", "teams", b, TeamType)
            if is_bool:
                return lambda a, b, b_rank: fn(a.nranks, a.rank, a.stride, b.nranks, b.rank, b.stride,
                                               b_rank) != 0
            return lambda a, b, b_rank: fn(a.nranks, a.rank, a.stride, b.nranks, b.rank, b.stride, b_rank)
        return typer

    overload(team.rank_is_member)(two_teams(DECLARED["flowdsl_team_rank_is_member"], "rank_is_member", True))
    overload(team.rank_to_team)(two_teams(DECLARED["flowdsl_team_rank_to_team"], "rank_to_team", False))

    def difference(fn):
        def typer(parent, subset, index):
            expect("flowdsl.team.rank_in_difference", "teams", parent, TeamType)
            expect("flowdsl.team.rank_in_difference", "teams", subset, TeamType)
            return lambda parent, subset, index: fn(parent.nranks, parent.rank, parent.stride, subset.nranks,
                                                    subset.rank, subset.stride, index)
        return typer

    overload(team.rank_in_difference)(difference(DECLARED["flowdsl_team_rank_in_difference"]))

    def factor(fn, name):
        def typer(parent, inner_size):
            expect(f"flowdsl.team.{name}", "a team", parent, TeamType)

            def impl(parent, inner_size):
                out = cuda.local.array(3, types.int32)
                fn(parent.nranks, parent.rank, parent.stride, inner_size, array_ptr(out))
                return make_team(out[0], out[1], out[2])
            return impl
        return typer

    for stub, symbol in ((team.inner_factor, "flowdsl_team_inner_factor"),
                         (team.outer_factor, "flowdsl_team_outer_factor")):
        overload(stub)(factor(DECLARED[symbol], stub.__name__))


# ---- LSA pointers and views ----------------------------------------------------------

def _view_dtype(op, win, dtype):
    if dtype is None or isinstance(dtype, (types.Omitted, types.NoneType)):
        return win.dtype
    if isinstance(dtype, types.NumberClass):
        return dtype.instance_type
    if isinstance(dtype, types.DType):
        return dtype.dtype
    raise NumbaTypeError(f"{op} requires dtype to be a numba or NumPy scalar type (e.g. "
                         f"numba.float32), got {dtype}")


def _view_typer(op, win, where, start, count, dtype):
    """Typing of a window view: checks every argument, returns the view's array type."""
    name = f"flowdsl.lsa.{op}"
    expect(name, "a window (from comm.register(buf))", win, WindowType)
    for what, ty in where:
        if what == "team":
            expect(name, "a team", ty, TeamType)
        else:
            expect_int(name, what, ty)
    for what, ty in (("start", start), ("count", count)):
        if not is_omitted(ty):
            expect_int(name, what, ty)
    elem = _view_dtype(name, win, dtype)
    if not isinstance(elem, (types.Integer, types.Float, types.Complex)):
        raise NumbaTypeError(f"{name} cannot view a window as {elem}: use a numeric type")
    return types.Array(elem, 1, "C")


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


def _bind_lsa_pointers_and_views():
    # Views are arrays made inside the callee, which numba forbids a device function to return
    # (without NRT): so views are typed and lowered directly rather than through @overload.
    def bind_view(stub, op, symbol, where_names):
        pysig = inspect.signature(stub)
        where_pos = {name: i + 1 for i, name in enumerate(where_names)}

        class ViewTemplate(AbstractTemplate):
            key = stub

            def generic(self, args, kws):
                # Fold keywords and defaults into positions (omitted ones typed Omitted), as
                # @overload does, so `peer_view(win, p, count=4)` works.
                try:
                    bound = pysig.bind(*args, **kws)
                except TypeError as exc:
                    raise NumbaTypeError(f"flowdsl.lsa.{op}: {exc}") from exc
                full = [bound.arguments[name] if name in bound.arguments else types.Omitted(param.default)
                        for name, param in pysig.parameters.items()]
                where = [(name, full[where_pos[name]]) for name in where_names]
                nwhere = len(where_names)
                ret = _view_typer(op, full[0], where, full[1 + nwhere], full[2 + nwhere], full[3 + nwhere])
                return signature(ret, *full).replace(pysig=pysig)

        infer(ViewTemplate)
        infer_global(stub, types.Function(ViewTemplate))

        @lower_builtin(stub, types.VarArg(types.Any))
        def lower(context, builder, sig, args):
            nwhere = len(where_names)
            win_ty, win = sig.args[0], args[0]
            view_ty = sig.return_type
            itemsize = context.get_abi_sizeof(context.get_data_type(view_ty.dtype))
            rest = list(zip(sig.args[1 + nwhere:], args[1 + nwhere:]))
            i64 = types.int64

            def arg(pos, default):
                if pos < len(rest) and not is_omitted(rest[pos][0]):
                    return context.cast(builder, rest[pos][1], rest[pos][0], i64)
                return context.get_constant(i64, default)

            start, count = arg(0, 0), arg(1, -1)
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

    bind_view(lsa.local_view, "local_view", "flowdsl_get_local_pointer", ())
    bind_view(lsa.lsa_view, "lsa_view", "flowdsl_get_lsa_pointer", ("lsa_peer",))
    bind_view(lsa.peer_view, "peer_view", "flowdsl_get_peer_pointer", ("peer",))
    bind_view(lsa.team_view, "team_view", "flowdsl_get_team_pointer", ("team", "peer"))

    local = DECLARED["flowdsl_get_local_pointer"]
    lsa_ptr = DECLARED["flowdsl_get_lsa_pointer"]
    peer_ptr = DECLARED["flowdsl_get_peer_pointer"]
    team_ptr = DECLARED["flowdsl_get_team_pointer"]

    @overload(lsa.get_local_pointer)
    def _get_local_pointer(win, offset):
        expect("flowdsl.lsa.get_local_pointer", "a window (from comm.register(buf))", win, WindowType)
        elem = win.dtype
        return lambda win, offset: typed_pointer(local(win._handle, offset), elem)

    @overload(lsa.get_lsa_pointer)
    def _get_lsa_pointer(win, offset, lsa_peer):
        expect("flowdsl.lsa.get_lsa_pointer", "a window (from comm.register(buf))", win, WindowType)
        elem = win.dtype
        return lambda win, offset, lsa_peer: typed_pointer(lsa_ptr(win._handle, offset, lsa_peer), elem)

    @overload(lsa.get_peer_pointer)
    def _get_peer_pointer(win, offset, peer):
        expect("flowdsl.lsa.get_peer_pointer", "a window (from comm.register(buf))", win, WindowType)
        elem = win.dtype
        return lambda win, offset, peer: typed_pointer(peer_ptr(win._handle, offset, peer), elem)

    @overload(lsa.get_team_pointer)
    def _get_team_pointer(win, offset, team, peer):
        expect("flowdsl.lsa.get_team_pointer", "a window (from comm.register(buf))", win, WindowType)
        expect("flowdsl.lsa.get_team_pointer", "a team", team, TeamType)
        elem = win.dtype
        return lambda win, offset, team, peer: typed_pointer(
            team_ptr(win._handle, offset, team.nranks, team.rank, team.stride, peer), elem)


# ---- LSA barriers ---------------------------------------------------------------------

def _bind_lsa_barriers():
    @overload(lsa.barrier)
    def _barrier(comm, coop, index):
        expect("flowdsl.lsa.barrier", "a device communicator", comm, DevCommType)
        expect("flowdsl.lsa.barrier", "a coop (flowdsl.coop.cta(), .warp(), ...)", coop, CoopType)
        expect_int("flowdsl.lsa.barrier", "index", index)
        return lambda comm, coop, index: make_session(comm, coop, index)

    def barrier_call(op):
        def typer(session, order):
            expect(f"flowdsl.lsa.{op}", "a barrier session (from flowdsl.lsa.barrier)", session,
                    LsaBarrierSessionType)
            if not isinstance(order, (types.Integer, types.IntegerLiteral, types.IntEnumMember)):
                raise NumbaTypeError(f"flowdsl.lsa.{op} requires order to be a flowdsl.MemoryOrder, "
                                     f"got {order}")
            fn = _coop_fn(f"flowdsl_lsa_barrier_{op}", session.coop)
            return lambda session, order: fn(session.coop._word, devcomm_ptr(session.comm),
                                             session.index, enum_value(order))
        return typer

    for op, stub in (("arrive", lsa.arrive), ("wait", lsa.wait), ("sync", lsa.sync)):
        overload(stub)(barrier_call(op))
        overload_method(LsaBarrierSessionType, op)(barrier_call(op))


# ---- LSA reduce / copy, written in flowdsl ---------------------------------------------------
# One implementation for every NCCL release (2.28 has no such helpers). The bulk moves in
# 16-byte vectors (mem.load_vec/store_vec) when both sides are 16-byte aligned; the rest,
# and unaligned ranges, element by element.

def _vec_add(a, b):
    """Element-wise sum of two equal-length tuples (typed per length on the GPU)."""
    return tuple(x + y for x, y in zip(a, b))


@overload(_vec_add)
def _vec_add_typer(a, b):
    if isinstance(a, types.UniTuple) and len(a) == 2:
        return lambda a, b: (a[0] + b[0], a[1] + b[1])
    if isinstance(a, types.UniTuple) and len(a) == 4:
        return lambda a, b: (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])
    raise NumbaTypeError(f"flowdsl: no 16-byte vector of {a}")


def _vector_lanes(view, start):
    """Elements per 16-byte vector, or 0 if ``view``'s dtype or ``start`` does not allow vectors."""
    size = view.itemsize
    if (size == 4 or size == 8) and (start * size) % 16 == 0:
        return 16 // size
    return 0


def reduce_sum_impl(coop, comm, win, start, dst, count):
    """The flowdsl program behind :func:`flowdsl.lsa.reduce_sum` (GPU and simulator)."""
    rank = coop_mod.thread_rank(coop)
    nthreads = coop_mod.size(coop)
    npeers = comm.lsa_size
    i = rank
    while i < count:
        acc = lsa.lsa_view(win, 0, start, count)[i]
        for peer in range(1, npeers):
            acc += lsa.lsa_view(win, peer, start, count)[i]
        dst[i] = acc
        i += nthreads


def copy_impl(coop, comm, src, win, start, count):
    """The flowdsl program behind :func:`flowdsl.lsa.copy`."""
    rank = coop_mod.thread_rank(coop)
    nthreads = coop_mod.size(coop)
    for peer in range(comm.lsa_size):
        out = lsa.lsa_view(win, peer, start, count)
        i = rank
        while i < count:
            out[i] = src[i]
            i += nthreads


def reduce_sum_copy_impl(coop, comm, src_win, src_start, dst_win, dst_start, count):
    """The flowdsl program behind :func:`flowdsl.lsa.reduce_sum_copy`."""
    rank = coop_mod.thread_rank(coop)
    nthreads = coop_mod.size(coop)
    npeers = comm.lsa_size
    first = lsa.lsa_view(src_win, 0, src_start, count)
    lanes = _vector_lanes(first, src_start)
    if lanes != _vector_lanes(first, dst_start):
        lanes = 0
    done = 0
    if lanes != 0:
        nvec = count // lanes
        v = rank
        while v < nvec:
            i = v * lanes
            acc = mem.load_vec(lsa.lsa_view(src_win, 0, src_start, count), i)
            for peer in range(1, npeers):
                acc = _vec_add(acc, mem.load_vec(lsa.lsa_view(src_win, peer, src_start, count), i))
            for peer in range(npeers):
                mem.store_vec(lsa.lsa_view(dst_win, peer, dst_start, count), i, acc)
            v += nthreads
        done = nvec * lanes
    i = done + rank
    while i < count:
        acc = lsa.lsa_view(src_win, 0, src_start, count)[i]
        for peer in range(1, npeers):
            acc += lsa.lsa_view(src_win, peer, src_start, count)[i]
        for peer in range(npeers):
            lsa.lsa_view(dst_win, peer, dst_start, count)[i] = acc
        i += nthreads


def _bind_reduce_copy():
    global _vector_lanes
    _vector_lanes = register_jitable(_vector_lanes)
    reduce_sum = register_jitable(reduce_sum_impl)
    copy = register_jitable(copy_impl)
    reduce_sum_copy = register_jitable(reduce_sum_copy_impl)

    @overload(lsa.reduce_sum)
    def _reduce_sum(coop, comm, win, start, dst, count):
        expect("flowdsl.lsa.reduce_sum", "a coop", coop, CoopType)
        expect("flowdsl.lsa.reduce_sum", "a window", win, WindowType)
        expect("flowdsl.lsa.reduce_sum", "an output array", dst, types.Array)
        return lambda coop, comm, win, start, dst, count: reduce_sum(coop, comm, win, start, dst, count)

    @overload(lsa.copy)
    def _copy(coop, comm, src, win, start, count):
        expect("flowdsl.lsa.copy", "a coop", coop, CoopType)
        expect("flowdsl.lsa.copy", "an input array", src, types.Array)
        expect("flowdsl.lsa.copy", "a window", win, WindowType)
        return lambda coop, comm, src, win, start, count: copy(coop, comm, src, win, start, count)

    @overload(lsa.reduce_sum_copy)
    def _reduce_sum_copy(coop, comm, src_win, src_start, dst_win, dst_start, count):
        expect("flowdsl.lsa.reduce_sum_copy", "a coop", coop, CoopType)
        expect("flowdsl.lsa.reduce_sum_copy", "a source window", src_win, WindowType)
        expect("flowdsl.lsa.reduce_sum_copy", "a destination window", dst_win, WindowType)
        return lambda coop, comm, src_win, src_start, dst_win, dst_start, count: reduce_sum_copy(
            coop, comm, src_win, src_start, dst_win, dst_start, count)


_bound = False


def bind():
    """Register every overload of the device surface (idempotent)."""
    global _bound
    if _bound:
        return
    _bound = True
    _bind_coops()
    _bind_comm_and_teams()
    _bind_lsa_pointers_and_views()
    _bind_lsa_barriers()
    _bind_reduce_copy()
    ptx.bind()
    gin_surface.bind()
    flow_surface.bind()
    wait_surface.bind()
