"""GPU meaning of Flow's element arithmetic (:func:`flowdsl.flow.combine`, :func:`flowdsl.flow.finish`,
their 16-byte pack forms), of its reductions (:func:`flowdsl.flow.reduction`), of its strong
signal (:func:`flowdsl.flow.strong_signal_inc`, per NCCL release) and of its staging check (a
processor takes only a window from :func:`flowdsl.flow.staging`, typed ``StagingWindow``).

A reduction's operator and fp8 format, when constants, are part of its numba type
(:class:`ReductionType`): every step given the reduction is compiled for that operator
alone, so its inner loop has no branch on the operator (as NCCL's one function per
operator and type).

The Python bodies in ``flowdsl/flow.py`` are what the simulator runs; here each is
overloaded per element type so the result keeps the element's type (an ``int8``
sum wraps in 8 bits, a ``float16`` product rounds to half). uint16 elements are
bfloat16 bits: they are widened to float32, combined, and rounded back to nearest
even (NCCL has no uint16, NumPy no bfloat16). uint8 elements are fp8 (e4m3fn or
e5m2) when the reduction says so, converted by the GPU's instructions from sm_89 and by
bit arithmetic before (here), and by table in ``flowdsl/_fp8.py`` (the tests hold each
against the table).

"""

from __future__ import annotations

import functools
import math

from numba import float32, float64, int32, uint8, uint16, uint64
from llvmlite import ir
from numba.core import cgutils, types
from numba.core.errors import NumbaTypeError
from numba.cuda.extending import (intrinsic, make_attribute_wrapper, overload, overload_attribute,
                                  register_jitable)

from .. import flow, gin, mem
from .._flow_staging import refusal
from .._flow_elements import (bad_channel_text, bad_connection_text, bad_layout_text, conversion_refusal,
                              missing_gin_context_text, premul_type_refusal, scale_refusal, value_refusal)
from .._fp8 import E4M3 as _E4M3
from ..enums import RedOp
from .gin import STRONG_SIGNAL_FEATURE
from .checks import check, is_omitted
from .intrinsics import feature_marker, printed_refusal
from .target import current, note_feature
from .types import WindowType, register_struct_model

__all__ = ["ReductionType"]

_SUM, _PROD, _MIN, _MAX, _AVG = int(RedOp.SUM), int(RedOp.PROD), int(RedOp.MIN), int(RedOp.MAX), int(RedOp.AVG)
_PREMULSUM = int(RedOp.PREMULSUM)


def _apply(op, a, b):
    if op == _PROD:
        return a * b
    if op == _MIN:
        return a if a < b else b
    if op == _MAX:
        return a if a > b else b
    return a + b


def _bf16_to_float(bits):
    return mem.from_bits(mem.to_bits(bits) << uint64(16), float32)


def _float_to_bf16(value):
    bits = mem.to_bits(float32(value))
    if (bits & uint64(0x7FFFFFFF)) > uint64(0x7F800000):
        return uint16((bits >> uint64(16)) | uint64(0x40))
    return uint16((bits + uint64(0x7FFF) + ((bits >> uint64(16)) & uint64(1))) >> uint64(16))


# fp8 (the format codes of flowdsl/_fp8.py): e4m3fn has no infinities (0x7F is NaN); e5m2 is IEEE-like.


def _fp8_to_float(code, fmt):
    """float32 value of an fp8 code (bit arithmetic; ``flowdsl/_fp8.py`` is the table it must match)."""
    c = int32(code)
    negative = (c & 0x80) != 0
    if fmt == _E4M3:
        e, m = (c >> 3) & 0xF, c & 7
        if e == 15 and m == 7:
            return float32(math.nan)
        v = math.ldexp(float32(m), -9) if e == 0 else math.ldexp(float32(8 + m), e - 10)
    else:
        e, m = (c >> 2) & 0x1F, c & 3
        if e == 31:
            return float32(math.nan) if m != 0 else (float32(-math.inf) if negative else float32(math.inf))
        v = math.ldexp(float32(m), -16) if e == 0 else math.ldexp(float32(4 + m), e - 17)
    return float32(-v) if negative else float32(v)


def _float_to_fp8(value, fmt):
    """Nearest fp8 code of a float32: ties to the even code, saturating at the largest finite."""
    x = float32(value)
    sign = uint8(0x80) if (mem.to_bits(x) >> uint64(31)) != uint64(0) else uint8(0)
    if x != x:
        return uint8(uint8(0x7F) | sign)
    mbits, emin, largest, largest_code = (3, -6, float32(448.0), 0x7E) if fmt == _E4M3 else \
        (2, -14, float32(57344.0), 0x7B)
    bias = 7 if fmt == _E4M3 else 15
    a = abs(x)
    if a >= largest:
        return uint8(uint8(largest_code) | sign)
    e = max(int32((mem.to_bits(a) >> uint64(23)) & uint64(0xFF)) - 127, emin)
    steps = round(math.ldexp(a, mbits - e))  # a in units of the spacing at exponent e, to even
    if steps >= (2 << mbits):  # rounded up into the next binade
        e += 1
        steps = steps // 2
    if e > emin or steps >= (1 << mbits):  # normal
        code = ((e + bias) << mbits) | (steps - (1 << mbits))
    else:
        code = steps
    if code > largest_code:
        code = largest_code
    return uint8(uint8(code) | sign)


class ReductionType(types.Type):
    """:class:`flowdsl.flow.Reduction` on the GPU: ``op`` and ``fp8`` are known when compiled
    (ints), or ``None`` when they are run-time values kept in the struct; ``scale`` is the
    numba type of ``PREMULSUM``'s scalar (a run-time value in the struct), or None without one."""

    def __init__(self, op, fp8, scale=None):
        self.op, self.fp8, self.scale = op, fp8, scale
        op_name = "run-time" if op is None else RedOp(op).name
        scaled = "" if scale is None else f", scale={scale}"
        super().__init__(name=f"Reduction(op={op_name}, fp8={'run-time' if fp8 is None else fp8}{scaled})")

    @property
    def key(self):
        return self.op, self.fp8, self.scale


register_struct_model(ReductionType, lambda ty: [("nranks", types.int64), ("op_value", types.int64),
                                                 ("fp8_value", types.int64)]
                      + ([("scale_value", ty.scale)] if ty.scale is not None else []))


make_attribute_wrapper(ReductionType, "nranks", "nranks")
make_attribute_wrapper(ReductionType, "op_value", "op_value")
make_attribute_wrapper(ReductionType, "fp8_value", "fp8_value")
make_attribute_wrapper(ReductionType, "scale_value", "scale_value")


def _constant(ty):
    """The value of a compile-time integer (a literal, an enum member, a default), or None."""
    if isinstance(ty, int):  # an omitted argument's default, as the typer sees it
        return int(ty)
    if isinstance(ty, types.Omitted):
        return int(ty.value)
    value = getattr(ty, "literal_value", None)
    if isinstance(value, int):
        return int(value)
    return None


@functools.cache
def _reduction_maker(op, fp8, scaled=False):
    """An intrinsic building a :class:`ReductionType` ``(op, fp8)`` (``None``: the run-time argument),
    with a scale (a fourth argument, its type the reduction's ``scale``) when ``scaled``.

    One intrinsic per pair of constants: inside an overload's implementation the literal
    types of the call are gone, so the constants are baked into the intrinsic instead.
    """
    def build(context, builder, result, args, arg_types):
        red = cgutils.create_struct_proxy(result)(context, builder)
        for field, known, value, ty in (("op_value", op, args[0], arg_types[0]),
                                        ("nranks", None, args[1], arg_types[1]),
                                        ("fp8_value", fp8, args[2], arg_types[2])):
            if known is not None:
                setattr(red, field, context.get_constant(types.int64, known))
            else:
                if isinstance(ty, types.IntEnumMember):
                    ty = ty.dtype
                setattr(red, field, context.cast(builder, value, ty, types.int64))
        if scaled:
            red.scale_value = context.cast(builder, args[3], arg_types[3], result.scale)
        return red._getvalue()

    if scaled:
        @intrinsic
        def make_scaled_reduction(typingctx, op_arg, nranks, fp8_arg, scale):
            result = ReductionType(op, fp8, types.unliteral(scale))
            return result(op_arg, nranks, fp8_arg, scale), \
                lambda context, builder, sig, args: build(context, builder, result, args, sig.args)

        return make_scaled_reduction
    result = ReductionType(op, fp8)

    @intrinsic
    def make_reduction(typingctx, op_arg, nranks, fp8_arg):
        return result(op_arg, nranks, fp8_arg), \
            lambda context, builder, sig, args: build(context, builder, result, args, sig.args)

    return make_reduction


def _lanewise(name, lanes, expression, params):
    """``def impl(<params>): return (<expression for lane 0>, ..., <for lane lanes-1>)`` for a pack."""
    body = ", ".join(expression.format(i=i) for i in range(lanes))
    namespace = {}
    exec(f"def {name}({params}):\n    return ({body},)\n", namespace)  # noqa: S102 - fixed text
    return namespace[name]


def _element(op, ty):
    if not isinstance(ty, (types.Integer, types.Float)):
        raise NumbaTypeError(f"flowdsl.flow.{op} requires integer or float elements, got {ty}")


apply = register_jitable(_apply)
to_float = register_jitable(_bf16_to_float)
to_bf16 = register_jitable(_float_to_bf16)
_software_fp8_to_float = register_jitable(_fp8_to_float)
_software_float_to_fp8 = register_jitable(_float_to_fp8)


# ---- fp8 by the GPU's own conversions (sm_89 and newer) --------------------------------------------
# Hopper and Ada convert fp8 in one instruction each way (``cvt ... e4m3x2``), with the rounding
# and saturation of the table (nearest, ties to even, saturating at the largest finite: NCCL's
# __NV_SATFINITE); the bit arithmetic above is for older GPUs. The choice is made by NVVM from
# the target (``__nvvm_reflect("__CUDA_ARCH")``), not when numba types the function, because numba
# reuses a device function's code for every target of a process.

_ARCH_NAME = "flowdsl_cuda_arch_name"


@intrinsic
def _cuda_arch(typingctx):
    """The target's ``__CUDA_ARCH`` (900 for sm_90), a constant once NVVM compiles for a target."""
    def codegen(context, builder, sig, args):
        module = builder.module
        byte_ptr = ir.IntType(8).as_pointer()
        reflect = cgutils.get_or_insert_function(module, ir.FunctionType(ir.IntType(32), [byte_ptr]),
                                                 "__nvvm_reflect")
        name = module.globals.get(_ARCH_NAME)
        if name is None:
            text = bytearray(b"__CUDA_ARCH\0")
            value = ir.Constant(ir.ArrayType(ir.IntType(8), len(text)), text)
            name = ir.GlobalVariable(module, value.type, _ARCH_NAME, addrspace=4)
            name.global_constant, name.linkage, name.initializer = True, "private", value
        zero = ir.Constant(ir.IntType(32), 0)
        return builder.call(reflect, [builder.addrspacecast(builder.gep(name, [zero, zero]), byte_ptr)])
    return types.int32(), codegen


def _cvt_intrinsic(text, result, operand_count, constraints):
    """An intrinsic running PTX ``text`` (no side effect) on one or two operands."""
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(context.get_value_type(sig.return_type), [context.get_value_type(t) for t in sig.args])
        return builder.asm(fnty, text, constraints, list(args), side_effect=False)

    if operand_count == 1:
        @intrinsic
        def cvt(typingctx, a):
            return result(a), codegen
    else:
        @intrinsic
        def cvt(typingctx, a, b):
            return result(a, b), codegen
    return cvt


# One fp8 code (the low byte) to float32, through float16 (exact for both formats).
_e4m3_to_float = _cvt_intrinsic("{ .reg .b32 pair; .reg .b16 lo, hi; cvt.rn.f16x2.e4m3x2 pair, $1; "
                                "mov.b32 {lo, hi}, pair; cvt.f32.f16 $0, lo; }", types.float32, 1, "=f,h")
_half_bits_to_float = _cvt_intrinsic("cvt.f32.f16 $0, $1;", types.float32, 1, "=f,h")
# A float32 to the nearest fp8 code (in the low byte; the high one converts 0).
_float_to_e4m3 = _cvt_intrinsic("cvt.rn.satfinite.e4m3x2.f32 $0, $1, $2;", types.uint16, 2, "=h,f,f")
_float_to_e5m2 = _cvt_intrinsic("cvt.rn.satfinite.e5m2x2.f32 $0, $1, $2;", types.uint16, 2, "=h,f,f")


# A product rounded to its type, never fused with the sum after it: NVVM contracts a multiply and an
# add into one fma by default (one rounding), and the simulator rounds twice, as the definition says.
_mul_rn_f32 = _cvt_intrinsic("mul.rn.f32 $0, $1, $2;", types.float32, 2, "=f,f,f")
_mul_rn_f64 = _cvt_intrinsic("mul.rn.f64 $0, $1, $2;", types.float64, 2, "=d,d,d")


@register_jitable
def fp8_to_float(code, fmt):
    """float32 value of an fp8 code: the GPU's conversion from sm_89, bit arithmetic before."""
    if fmt == _E4M3:
        if _cuda_arch() < 890:
            return _software_fp8_to_float(code, fmt)
        v = _e4m3_to_float(uint16(code))
    else:  # e5m2 is the high byte of a float16
        v = _half_bits_to_float(uint16(uint16(code) << uint16(8)))
    return float32(math.nan) if v != v else v  # NaN codes read as the table's NaN


@register_jitable
def float_to_fp8(value, fmt):
    """Nearest fp8 code of a float32: the GPU's conversion from sm_89, bit arithmetic before."""
    if _cuda_arch() < 890:
        return _software_float_to_fp8(value, fmt)
    x = float32(value)
    if x != x:  # NaN keeps its sign, as in the table
        return uint8(0xFF) if (mem.to_bits(x) >> uint64(31)) != uint64(0) else uint8(0x7F)
    if fmt == _E4M3:
        return uint8(_float_to_e4m3(float32(0.0), x) & uint16(0xFF))
    return uint8(_float_to_e5m2(float32(0.0), x) & uint16(0xFF))


# The refusals Flow makes in device code: the kernel prints the simulator's sentence with the values, then traps.

@overload(flow.missing_gin_context)
def flow_missing_gin_context(peer):
    check(flow.missing_gin_context, peer)
    refuse = printed_refusal(missing_gin_context_text("{}"))
    return lambda peer: refuse((peer,))


@overload(flow.bad_connection)
def flow_bad_connection(peer, number, remote_number, last_rank):
    check(flow.bad_connection, peer, number, remote_number, last_rank)
    refuse = printed_refusal(bad_connection_text("{}", "{}", "{}", "{}"))
    return lambda peer, number, remote_number, last_rank: refuse((peer, number, remote_number, last_rank))


@overload(flow.bad_channel)
def flow_bad_channel(channel, channels):
    check(flow.bad_channel, channel, channels)
    refuse = printed_refusal(bad_channel_text("{}", "{}"))
    return lambda channel, channels: refuse((channel, channels))


@overload(flow.bad_layout)
def flow_bad_layout(channels, nslots, slot_words, needed, held):
    check(flow.bad_layout, channels, nslots, slot_words, needed, held)
    refuse = printed_refusal(bad_layout_text("{}", "{}", "{}", "{}", "{}"))
    return lambda channels, nslots, slot_words, needed, held: refuse((channels, nslots, slot_words, needed, held))


@overload(flow.step_ends)
def flow_step_ends(peer, channel, inbox, step, n, data, protocol, sending):
    check(flow.step_ends, peer, channel, inbox, step, n, data, protocol, sending)
    return lambda peer, channel, inbox, step, n, data, protocol, sending: None  # the simulator's check only


@overload(flow.connection_ends)
def flow_connection_ends(peer, channel, number, remote_number, sending):
    check(flow.connection_ends, peer, channel, number, remote_number, sending)
    return lambda peer, channel, number, remote_number, sending: None  # the simulator's note only


@overload(flow.to_float)
def flow_to_float(x):
    if x == types.uint16:  # bfloat16 bits
        return lambda x: to_float(x)
    if x in (types.float16, types.float32):
        return lambda x: float32(x)
    if x == types.float64:
        return lambda x: x
    raise NumbaTypeError(conversion_refusal("to_float", x))


@overload(flow.from_float)
def flow_from_float(value, like):
    if not isinstance(value, types.Number) or isinstance(value, types.Boolean):
        raise NumbaTypeError(value_refusal(value))
    if like == types.uint16:
        return lambda value, like: to_bf16(float32(value))
    if like in (types.float16, types.float32):
        ty = like
        return lambda value, like: ty(float32(value))
    if like == types.float64:
        return lambda value, like: float64(value)
    raise NumbaTypeError(conversion_refusal("from_float", like))


@overload(flow.combine)
def flow_combine(op, a, b, fp8=0):
    _element("combine", a)
    if a == types.uint16:
        return lambda op, a, b, fp8=0: to_bf16(apply(op, to_float(a), to_float(b)))
    ty = a
    if a == types.float16:  # in float32 (exact for one operation, then rounded once)
        return lambda op, a, b, fp8=0: ty(apply(op, float32(a), float32(b)))
    if a == types.uint8:
        def byte(op, a, b, fp8=0):
            if fp8 != 0:
                return float_to_fp8(apply(op, fp8_to_float(a, fp8), fp8_to_float(b, fp8)), fp8)
            return ty(apply(op, a, b))
        return byte
    return lambda op, a, b, fp8=0: ty(apply(op, a, b))


@overload(flow.reduction, prefer_literal=True)
def flow_reduction(op, nranks, fp8=0, scale=None):
    check(flow.reduction, op, nranks, fp8)
    if is_omitted(scale):
        # A constant PREMULSUM without its scale is refused where it is applied (flow.premul, which every
        # step calls): refused here, numba would retry it as a run-time operator and accept that.
        make = _reduction_maker(_constant(op), _constant(fp8))
        return lambda op, nranks, fp8=0, scale=None: make(op, nranks, fp8)
    if not isinstance(scale, (types.Integer, types.Float)):
        raise NumbaTypeError(f"flowdsl.flow.reduction requires scale to be an integer or float scalar of the "
                             f"element type, got {scale}")
    make_scaled = _reduction_maker(_constant(op), _constant(fp8), True)
    return lambda op, nranks, fp8=0, scale=None: make_scaled(op, nranks, fp8, scale)


def _constant_or(value, run_time):
    """An attribute's implementation: the constant ``value`` compiled in, or ``run_time`` where it is None."""
    if value is None:
        return run_time
    return lambda red: value


@overload_attribute(ReductionType, "op")
def reduction_op(red):
    return _constant_or(red.op, lambda red: red.op_value)


@overload_attribute(ReductionType, "fp8")
def reduction_fp8(red):
    return _constant_or(red.fp8, lambda red: red.fp8_value)


@overload_attribute(ReductionType, "scale")
def reduction_scale(red):
    if red.scale is None:
        return lambda red: None
    return lambda red: red.scale_value


def _multiplies(red) -> bool | None:
    """Whether ``red`` pre-multiplies: True or False when its type says, None when its operator is a
    run-time value (and it has a scale)."""
    if red.scale is None:
        return False
    return None if red.op is None else red.op == _PREMULSUM


@overload(flow.premul)
def flow_premul(red, value):
    _element("premul", value)
    if red.op == _PREMULSUM and red.scale is None:
        raise NumbaTypeError(scale_refusal())
    multiplies = _multiplies(red)
    if multiplies is False:  # every other operator: the value as it is, no code
        return lambda red, value: value
    if red.scale != value:
        raise NumbaTypeError(premul_type_refusal(red.scale, value))
    if value in (types.float32, types.float64):  # combine's PROD, rounded before the sum
        product = _mul_rn_f32 if value == types.float32 else _mul_rn_f64
        if multiplies:
            return lambda red, value: product(value, red.scale)
        return lambda red, value: product(value, red.scale) if red.op == _PREMULSUM else value
    if multiplies:
        return lambda red, value: flow.combine(_PROD, value, red.scale, red.fp8)
    return lambda red, value: flow.combine(_PROD, value, red.scale, red.fp8) if red.op == _PREMULSUM else value


@overload(flow.premul_pack)
def flow_premul_pack(red, a):
    if not isinstance(a, types.UniTuple):
        raise NumbaTypeError(f"flowdsl.flow.premul_pack requires a pack, got {a}")
    if red.op == _PREMULSUM and red.scale is None:
        raise NumbaTypeError(scale_refusal())
    if _multiplies(red) is False:
        return lambda red, a: a
    impl = _lanewise("premul_pack", len(a), "premul(red, a[{i}])", "red, a")
    impl.__globals__["premul"] = flow.premul
    return impl


@overload(flow.unscaled)
def flow_unscaled(red):
    if red.op is not None and red.op != _PREMULSUM:
        return lambda red: red
    if red.op is not None:  # PREMULSUM: a SUM of the same ranks and format, with no scale
        make = _reduction_maker(int(RedOp.SUM), red.fp8)
        return lambda red: make(0, red.nranks, red.fp8)
    make = _reduction_maker(None, red.fp8, red.scale is not None)  # run-time: the same type, the operator swapped
    if red.scale is None:
        return lambda red: make(_SUM if red.op == _PREMULSUM else red.op, red.nranks, red.fp8)
    return lambda red: make(_SUM if red.op == _PREMULSUM else red.op, red.nranks, red.fp8, red.scale)


@overload(flow.premul_only)
def flow_premul_only(red):
    if not is_omitted(red) and _multiplies(red) is not False:
        return lambda red: red
    plain = _reduction_maker(int(RedOp.SUM), 0)
    return lambda red: plain(0, 1, 0)


@overload(flow.combine_packs)
def flow_combine_packs(red, a, b):
    if not isinstance(a, types.UniTuple) or a != b:
        raise NumbaTypeError(f"flowdsl.flow.combine_packs requires two packs of one type, got {a} and {b}")
    impl = _lanewise("combine_packs", len(a), "combine(red.op, a[{i}], b[{i}], red.fp8)", "red, a, b")
    impl.__globals__["combine"] = flow.combine
    return impl


@overload(flow.finish_pack)
def flow_finish_pack(red, a):
    if not isinstance(a, types.UniTuple):
        raise NumbaTypeError(f"flowdsl.flow.finish_pack requires a pack, got {a}")
    impl = _lanewise("finish_pack", len(a), "finish(red.op, a[{i}], red.nranks, red.fp8)", "red, a")
    impl.__globals__["finish"] = flow.finish
    return impl


@overload(flow._require_staging)
def flow_require_staging(stage):
    # A staging window has its own type (made by flow.staging, zeroed): checked here, so a
    # processor over any other window never compiles.
    if not (isinstance(stage, WindowType) and stage.staging):
        raise NumbaTypeError(refusal(str(stage)))
    return lambda stage: None


@overload(flow.strong_signal_inc)
def flow_strong_signal_inc(signal):
    target = current()
    note_feature(STRONG_SIGNAL_FEATURE)  # refused at launch on a weak-only backend
    if target is not None and target.nccl < (2, 32, 0):
        def legacy(signal):
            feature_marker("gin.strong_signals")  # legacy signals are relied on to be strong
            return gin.signal_inc(signal)
        return legacy
    return lambda signal: gin.strong_signal_inc(signal)


@overload(flow.finish)
def flow_finish(op, value, nranks, fp8=0):
    _element("finish", value)
    ty = value
    if value == types.uint16:
        def bf16(op, value, nranks, fp8=0):
            return to_bf16(to_float(value) / nranks) if op == _AVG else value
        return bf16
    if value == types.float16:
        def half(op, value, nranks, fp8=0):
            return ty(float32(value) / nranks) if op == _AVG else value
        return half
    if isinstance(value, types.Float):
        def floating(op, value, nranks, fp8=0):
            return ty(value / nranks) if op == _AVG else value
        return floating

    def integer(op, value, nranks, fp8=0):
        if op != _AVG:
            return value
        q = value // nranks  # floor; C division truncates toward zero (abs() would wrap at INT_MIN)
        if value < 0 and q * nranks != value:
            q += 1
        return ty(q)

    if value == types.uint8:
        def byte(op, value, nranks, fp8=0):
            if op != _AVG:
                return value
            if fp8 != 0:
                return float_to_fp8(fp8_to_float(value, fp8) / float32(nranks), fp8)
            return ty(value // nranks)
        return byte
    if not value.signed:
        def unsigned(op, value, nranks, fp8=0):
            # In the element's own type: numba takes uint64 // int64 in float64, which rounds.
            return ty(value // ty(nranks)) if op == _AVG else value
        return unsigned
    return integer
