"""The typing side of every primitive's spec (:mod:`flowdsl._spec`): argument checks and target gates.

A binding's typer calls :func:`check` with the stub and its argument types, in the stub's order.
Each argument the spec names is checked by its kind (:data:`KIND_TYPES`: the numba type a kind
must have), and refused in the spec's words (:meth:`flowdsl._spec.Spec.refusal`: "``op`` requires
``what``, got ``type``"; the simulator's refusal starts the same); a gated primitive is checked
against the target first. An omitted optional argument is not checked. A narrowed argument
(:class:`flowdsl._spec.Arg` ``dtypes``, ``choices``, ``constant``) is checked for those too.
"""

from __future__ import annotations

import inspect

from numba.core import types
from numba.core.errors import NumbaTypeError

from .._spec import Gate, KindRegistry, spec_of
from .target import require
from .types import CoopType, DevCommType, LsaBarrierSessionType, MultimemViewType, TeamType, WindowType

__all__ = ["check", "require_gate", "expect", "expect_int", "is_omitted", "stub_default", "KIND_TYPES"]

_INTEGERS = (types.Integer, types.IntegerLiteral)
_ENUMS = (types.Integer, types.IntegerLiteral, types.IntEnumMember)

#: Argument kind -> numba type class it must have (the GIN and CFT bindings add theirs).
KIND_TYPES = KindRegistry("the GPU's typing", {
    "comm": DevCommType, "coop": CoopType, "window": WindowType, "team": TeamType, "array": types.Array,
    "shared_array": types.Array, "lsa_session": LsaBarrierSessionType,
    "int": _INTEGERS, "order": _ENUMS, "enum": _ENUMS, "scope": _ENUMS, "word": (types.Integer, types.Float),
    "multimem": MultimemViewType,
})


def expect(op: str, what: str, ty, cls) -> None:
    """Raise a typing error unless ``ty`` is an instance of ``cls``."""
    if not isinstance(ty, cls):
        raise NumbaTypeError(f"{op} requires {what}, got {ty}")


def expect_int(op: str, what: str, ty) -> None:
    """Raise a typing error unless ``ty`` is an integer type."""
    if not isinstance(ty, _INTEGERS):
        raise NumbaTypeError(f"{op} requires {what} to be an integer, got {ty}")


def is_omitted(ty) -> bool:
    """Whether an optional argument was left out (or passed as None); an overload's typer sees a left-out
    argument as its default's Python value."""
    return not isinstance(ty, types.Type) or isinstance(ty, (types.Omitted, types.NoneType))


def stub_default(stub, param: str) -> int:
    """The value of enum parameter ``param`` of ``stub`` when a call leaves it out: the stub's default, as
    the int the C call takes (the simulator's implementation has the same default: one source)."""
    return int(spec_of(stub).default(param))


def require_gate(name: str, gate: Gate) -> None:
    """Raise at compile time when the target lacks what ``gate`` asks (see :func:`require`)."""
    if gate.gates:
        require(name, nccl=gate.nccl, min_cc=gate.min_cc, cuda=gate.cuda if gate.cuda > Gate().cuda else None)


def check(stub, *arg_types, gated: bool = True) -> None:
    """Check ``stub``'s gate (unless ``gated`` is False) and its arguments' types against its spec."""
    spec = spec_of(stub)
    if gated:
        require_gate(spec.name, spec.gate)
    for param, ty in zip(spec.params, arg_types):
        arg = spec.args.get(param.name)
        if arg is None or (param.default is not inspect.Parameter.empty and is_omitted(ty)):
            continue
        if not isinstance(ty, KIND_TYPES[arg.kind]):
            raise NumbaTypeError(spec.refusal(param.name, ty))
        _check_narrowed(spec, param.name, arg, ty)


def _check_narrowed(spec, param: str, arg, ty) -> None:
    if arg.dtypes and str(ty.dtype) not in arg.dtypes:
        raise NumbaTypeError(spec.refusal_dtype(param, ty.dtype))
    value = getattr(ty, "literal_value", None)
    if arg.constant and not isinstance(value, int):
        # numba offers an overload the non-literal type first, then the literal: this refusal of
        # the first attempt is reported only when the value really is not a constant.
        raise NumbaTypeError(spec.refusal_constant(param, ty))
    if arg.choices and isinstance(value, int) and value not in arg.choices:
        raise NumbaTypeError(spec.refusal_choice(param, value))
