"""Flow's reductions and element arithmetic: what :func:`flowdsl.flow.combine`,
:func:`flowdsl.flow.finish` and :func:`flowdsl.flow.premul` mean, element by element.

:mod:`flowdsl.flow` re-exports every name here. The bodies are what the simulator runs; on the
GPU each is overloaded per element type (``lowering/flow.py``) so that the result keeps the
element type.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from . import _fp8
from ._spec import ARRAY, INT, RED_OP
from ._stubs import primitive
from .enums import RedOp

__all__ = ["Reduction", "reduction", "missing_gin_context", "to_float", "from_float", "combine", "finish",
           "combine_packs", "finish_pack", "premul", "premul_pack", "unscaled", "E4M3", "E5M2"]

Reduction = namedtuple("Reduction", ["op", "nranks", "fp8", "scale"], defaults=(None,))
Reduction.__doc__ = """A reduction operator (:class:`flowdsl.RedOp`) over ``nranks`` contributions.

``fp8`` says how to read uint8 elements: 0 as integers, :data:`E4M3` or :data:`E5M2` as fp8.
``scale`` is ``PREMULSUM``'s scalar, in the element type (None for the other operators).
On the GPU, ``op`` and ``fp8`` given as constants are part of the value's type, and so is
the scalar's type."""

#: fp8 format e4m3fn of uint8 elements (``Reduction.fp8``).
E4M3 = _fp8.E4M3
#: fp8 format e5m2 of uint8 elements (``Reduction.fp8``).
E5M2 = _fp8.E5M2


@primitive(module="flowdsl.flow", op=RED_OP, nranks=INT, fp8=INT)
def reduction(op, nranks, fp8=0, scale=None):
    """A :class:`Reduction` for ``op`` over ``nranks`` ranks (``nranks`` divides for ``AVG``);
    ``fp8`` = :data:`E4M3` or :data:`E5M2` reads uint8 elements as fp8; ``scale`` is the scalar
    ``PREMULSUM`` multiplies this rank's input by (:func:`premul`), in the element type (its bits
    for bfloat16 and fp8), and is needed for ``PREMULSUM`` (other operators ignore it).

    On the GPU a constant ``op`` and ``fp8`` (a kernel factory's, as in the collectives)
    become part of the reduction's type: the steps given it are compiled for that
    operator alone. A ``PREMULSUM`` without a ``scale`` is refused: by the simulator here, by
    the GPU's typing where the reduction is applied (:func:`premul`, which every step calls);
    given as a run-time value, the GPU cannot tell, and a reduction typed without a scale
    never multiplies. The simulator makes the :class:`Reduction` (``flowdsl/sim/flow.py``).
    """


@primitive(module="flowdsl.flow", peer=INT)
def missing_gin_context(peer):
    """Stop the kernel: a Flow connection to world rank ``peer``, outside this rank's LSA team, on a processor
    made without a GIN context (``ctx=None``). On the GPU the kernel prints the peer, the reason and the fix
    (``gin.context(comm, 0)``) and traps (the launch fails); the simulator raises a ``flowdsl.sim.UsageError``
    with the same words.
    :func:`flowdsl.flow.connect` calls it."""


@primitive(module="flowdsl.flow", peer=INT, number=INT, remote_number=INT, last_rank=INT)
def bad_connection(peer, number, remote_number, last_rank):
    """Stop the kernel: :func:`flowdsl.flow.connect` was given a peer that is not a world rank, or a connection
    number past ``flowdsl.flow.MAX_CONNECTIONS``. On the GPU the kernel prints the values, the ranges and the
    fix and traps (the launch fails); the simulator raises a ``flowdsl.sim.UsageError`` with the same words."""


def bad_connection_text(peer, number, remote_number, last_rank) -> str:
    from ._flow_staging import MAX_CONNECTIONS  # noqa: PLC0415

    return (f"Cannot make a Flow connection to peer {peer} with number {number} and remote_number {remote_number}: "
            f"the peer must be a world rank, 0 to {last_rank}, and both numbers 0 to {MAX_CONNECTIONS - 1} "
            "(flowdsl.flow.MAX_CONNECTIONS inboxes a channel). Pass those")


@primitive(module="flowdsl.flow", channels=INT, nslots=INT, slot_words=INT, needed=INT, held=INT)
def bad_layout(channels, nslots, slot_words, needed, held):
    """Stop the kernel: :func:`flowdsl.flow.processor` was given a layout its staging window does not hold
    (or one no staging has). On the GPU the kernel prints the layout, the sizes and the fix and traps; the
    simulator raises a ``flowdsl.sim.UsageError`` with the same words."""


def bad_layout_text(channels, nslots, slot_words, needed, held) -> str:
    return (f"Cannot build a Flow processor with channels={channels}, nslots={nslots}, slot_words={slot_words}: "
            f"a layout needs nslots of 2 or more and slot_words a positive multiple of 16, and this one needs "
            f"{needed} words of staging where the window holds {held}. Pass the layout flow.staging(comm, config) "
            "made: config.channels, config.nslots and config.slot_bytes // 8")


@primitive(module="flowdsl.flow", channel=INT, channels=INT)
def bad_channel(channel, channels):
    """Stop the kernel: :func:`flowdsl.flow.processor` was asked for a channel (``channel=``, else the block's
    index) that its staging layout has no room for. On the GPU the kernel prints it and the fix and traps; the
    simulator raises a ``flowdsl.sim.UsageError`` with the same words."""


def bad_channel_text(channel, channels) -> str:
    return (f"Cannot build a Flow processor on channel {channel}: its staging is laid out for channels={channels}, "
            "so a channel must be below that. Launch at most that many blocks, or pass each block a channel below "
            "it (flow.processor(..., channel=c)), or lay the staging out for more (FlowConfig(channels=...))")


@primitive(module="flowdsl.flow", peer=INT, channel=INT, inbox=INT, step=INT, n=INT, data=ARRAY, protocol=INT,
           sending=INT)
def step_ends(peer, channel, inbox, step, n, data, protocol, sending):
    """The simulator's check that the two ends of a Flow step agree: a sending step notes what it sends into
    inbox ``inbox`` of rank ``peer`` from slot ``step`` on (``n`` elements of ``data``'s type, ``protocol``), and
    the receiving step that takes them compares its own (``peer``: its own rank). Nothing on a GPU, where ends
    that disagree move wrong bytes without a sound; the simulator raises a ``flowdsl.sim.UsageError`` naming both."""


@primitive(module="flowdsl.flow", peer=INT, channel=INT, number=INT, remote_number=INT, sending=INT)
def connection_ends(peer, channel, number, remote_number, sending):
    """The simulator's note of a connection a step starts on (this rank's ``flow.connect(proc, peer, number,
    remote_number)`` on ``channel``, sending or receiving), for a deadlock report to find two ends that do not
    mirror each other. Nothing on a GPU."""


def missing_gin_context_text(peer) -> str:
    return (f"Cannot connect to world rank {peer}: it is outside this rank's LSA team, and the Flow processor "
            "has no GIN context (ctx=None) to reach it. Give flow.processor a GIN context, gin.context(comm, 0), "
            "when any peer is on another node")


def scale_refusal() -> str:
    """Why a ``PREMULSUM`` reduction without a scale is refused (the GPU's typing and the simulator say
    the same)."""
    return ("flowdsl.flow.reduction requires scale for RedOp.PREMULSUM: the scalar this rank's input is "
            "multiplied by, in the element type. Pass flow.reduction(RedOp.PREMULSUM, nranks, fp8, scale)")


def _bf16_to_float(bits):
    return np.array(np.uint32(int(bits) << 16)).view(np.float32)[()]


def _float_to_bf16(value):
    bits = int(np.array(np.float32(value)).view(np.uint32)[()])
    if (bits & 0x7FFFFFFF) > 0x7F800000:  # NaN stays a quiet NaN
        return np.uint16((bits >> 16) | 0x40)
    return np.uint16((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)  # round to nearest even


def to_float(x):
    """Element ``x`` as the float to compute with: float16 widened to float32, uint16 read as bfloat16 bits
    (flowdsl's and NCCL's bfloat16 elements) into float32, float32 and float64 as they are. Exact for all."""
    if isinstance(x, np.uint16):
        return _bf16_to_float(x)
    if isinstance(x, (np.float16, np.float32)):
        return np.float32(x)
    if isinstance(x, np.float64):  # a float64 kernel computes in float64 (gradient checks use it)
        return x
    raise _element_refusal("to_float", x)


def from_float(value, like):
    """``value`` as an element of ``like``'s type, rounded to nearest even: float16, bfloat16 bits for a
    uint16 ``like``, float32 (from float32), float64 (from the value as it is). ``like`` gives only the type
    (pass the element being replaced)."""
    if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
        raise _value_refusal(value)
    if isinstance(like, np.uint16):
        return _float_to_bf16(value)
    if isinstance(like, np.float16):
        with np.errstate(over="ignore"):  # past float16's range: inf, as the GPU's conversion
            return np.float16(np.float32(value))
    if isinstance(like, np.float32):
        return np.float32(value)
    if isinstance(like, np.float64):
        return np.float64(value)
    raise _element_refusal("from_float", like)


def _element_refusal(name: str, x):
    """The simulator's refusal of an element type ``to_float``/``from_float`` do not take (the GPU's typing
    says the same)."""
    from .sim.errors import KernelTypingError, sim_error  # noqa: PLC0415 - only the simulator runs these bodies

    return sim_error(KernelTypingError, conversion_refusal(name, np.asarray(x).dtype))


def _value_refusal(value):
    from .sim.errors import KernelTypingError, sim_error  # noqa: PLC0415 - only the simulator runs these bodies

    from numba import typeof  # noqa: PLC0415 - the type's name as the GPU's typing words it

    try:
        got = typeof(value)
    except ValueError:  # a value numba has no type for
        got = type(value).__name__
    return sim_error(KernelTypingError, value_refusal(got))


def value_refusal(got) -> str:
    return f"flowdsl.flow.from_float requires value to be a number, got {got}. Pass one element (x[i]), not an array"


def conversion_refusal(name: str, element) -> str:
    return (f"flowdsl.flow.{name} requires a float64, float32, float16 or bfloat16 (uint16 bits) element, got {element}. "
            "Convert other types with numba's casts (float32(x))")


def _fp8_op(fn, fmt, *codes):
    values = [np.float32(_fp8.from_fp8(c, fmt)) for c in codes]
    return np.uint8(_fp8.to_fp8(fn(*values), fmt))


def combine(op, a, b, fp8=0):
    """``a op b`` in the element type of ``a`` (wrapping for integers, bfloat16 for uint16,
    fp8 for uint8 when ``fp8`` names a format; 16- and 8-bit floats are combined in float32)."""
    if isinstance(a, np.uint16):
        return _float_to_bf16(combine(op, _bf16_to_float(a), _bf16_to_float(b)))
    if fp8 and isinstance(a, np.uint8):
        return _fp8_op(lambda x, y: combine(op, x, y), fp8, a, b)
    with np.errstate(over="ignore", invalid="ignore"):
        if op == RedOp.PROD:
            r = a * b
        elif op == RedOp.MIN:
            r = a if a < b else b
        elif op == RedOp.MAX:
            r = a if a > b else b
        else:
            r = a + b
    return np.asarray(r).astype(np.asarray(a).dtype)[()]


def finish(op, value, nranks, fp8=0):
    """The reduction's last touch: ``AVG`` divides by ``nranks`` (integers truncate); others keep."""
    if op != RedOp.AVG:
        return value
    if isinstance(value, np.uint16):
        with np.errstate(invalid="ignore"):  # a signalling NaN stays NaN, quietly (as on the GPU)
            return _float_to_bf16(_bf16_to_float(value) / nranks)
    if fp8 and isinstance(value, np.uint8):
        return _fp8_op(lambda x: np.float32(x / nranks), fp8, value)
    dt = np.asarray(value).dtype
    if dt.kind == "f":
        return dt.type(value / nranks)
    q = abs(int(value)) // nranks
    return np.array(-q if int(value) < 0 else q).astype(dt)[()]


def combine_packs(red, a, b):
    """Lane by lane :func:`combine` of two 16-byte packs (tuples from ``mem.load_vec``) by ``red``."""
    return tuple(combine(red.op, x, y, red.fp8) for x, y in zip(a, b))


def finish_pack(red, a):
    """Lane by lane :func:`finish` of a 16-byte pack by ``red``."""
    return tuple(finish(red.op, x, red.nranks, red.fp8) for x in a)


def premul(red, value):
    """``value`` as ``red`` takes a rank's own input: times ``red.scale`` for ``PREMULSUM``, unchanged for
    the other operators.

    The product is :func:`combine`'s ``PROD`` (one definition on the GPU and the simulator):
    integers wrap in their type; float32 and float64 multiply in their type; float16,
    bfloat16 and fp8 multiply in float32 (exact: the product of two such values fits its 24
    bits) and round once to the element type, to nearest even (fp8 saturating at the largest
    finite value). The sum that follows rounds again, once per combine. NCCL's float16 and
    bfloat16 ``__hmul`` round the same; its fp8 multiplies in float16 on sm_90, which agrees
    except for e5m2 products below 2**-14 (float16's subnormals).
    """
    if red.op != RedOp.PREMULSUM or red.scale is None:
        return value
    if type(red.scale) is not type(value):  # only the simulator runs this body: the GPU's typing refuses first
        from .sim.errors import KernelTypingError, sim_error  # noqa: PLC0415

        raise sim_error(KernelTypingError, premul_type_refusal(np.asarray(red.scale).dtype, np.asarray(value).dtype))
    return combine(RedOp.PROD, value, red.scale, red.fp8)


def premul_type_refusal(scale, element) -> str:
    """Why a scale of another type than the elements is refused."""
    return (f"flowdsl.flow.premul requires the reduction's scale in the element type, got a {scale} scale for "
            f"{element} elements. Give flow.reduction the scale as a {element}")


def premul_pack(red, a):
    """Lane by lane :func:`premul` of a 16-byte pack by ``red``."""
    return tuple(premul(red, x) for x in a)


def unscaled(red):
    """``red`` for values that carry their pre-multiply already (a partial result, not a rank's own
    input): a ``PREMULSUM`` reduction becomes a plain ``SUM`` (same ``nranks`` and ``fp8``); the
    others stay as they are."""
    if red.op == RedOp.PREMULSUM:
        return Reduction(RedOp.SUM, red.nranks, red.fp8)
    return red


def premul_only(red):
    """What a step that sends a rank's own input without combining takes of ``red`` (None: nothing):
    ``red`` itself for ``PREMULSUM`` (its pre-multiply), else a ``SUM`` over one rank, which changes
    nothing, so that such a step is compiled once for every other operator."""
    if red is not None and red.op == RedOp.PREMULSUM:
        return red
    return Reduction(RedOp.SUM, 1, 0)
