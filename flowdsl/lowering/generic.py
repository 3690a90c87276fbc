"""Primitives lowered from their spec alone: one call of their support function.

A primitive whose spec sets ``returns`` (:data:`flowdsl._spec.RESULTS`) needs no hand-written
lowering: its typer checks the arguments against the spec (:func:`check`), and its implementation
passes each argument to the C function as its kind says (:data:`C_ARGUMENTS`: a device
communicator as its pointer, a GIN context as its communicator's pointer and its index, a team as
its three ints, a memory order as its int, an integer as it is; a coop's word first, to the C
function of its kind), then gives the result as ``returns`` says. Adding such a primitive touches its stub (with its extern row, ``c=``), its C body
and its simulation. A primitive that is one numba ``@intrinsic`` after the checks is registered the same
way by :func:`lower_as`. Both functions are generated with the stub's own parameter names and
defaults, so numba folds keyword and default arguments as it does for a hand-written overload.
"""

from __future__ import annotations

import inspect

from numba import cuda
from numba.core import types
from numba.cuda.extending import overload

from .._spec import spec_of
from .._stubs import PRIMITIVES
from ..errors import FlowDSLError
from .checks import check
from .declarations import extern
from .intrinsics import array_ptr, devcomm_ptr, make_team, value_or

__all__ = ["C_ARGUMENTS", "bind_spec_lowerings", "lower_as"]

#: Argument kind -> the C arguments a value of it becomes, an expression over the parameter's name
#: (``None``: a parameter the spec does not check, passed as it is).
C_ARGUMENTS = {
    "comm": "devcomm_ptr({p})",
    "gin_context": "devcomm_ptr({p}.comm), {p}.index",
    "team": "{p}.nranks, {p}.rank, {p}.stride",
    "int": "{p}",
    "order": "value_or({p}, 0)",  # a MemoryOrder member (a default's too) as its int32
    None: "{p}",
}

#: ``returns`` -> the implementation's body, over ``{args}`` (the C arguments).
_BODIES = {
    "none": "fn({args})",
    "value": "return fn({args})",
    "bool": "return fn({args}) != 0",
    "team": ("out = cuda.local.array(3, types.int32)\n"
             "fn({args}, array_ptr(out))\n"
             "return make_team(out[0], out[1], out[2])"),
}


def _signature(params, defaults: dict) -> str:
    """``a, b, c=_default_c`` for the stub's parameters (defaults by name from ``defaults``)."""
    parts = []
    for p in params:
        if p.default is inspect.Parameter.empty:
            parts.append(p.name)
        else:
            defaults[f"_default_{p.name}"] = p.default
            parts.append(f"{p.name}=_default_{p.name}")
    return ", ".join(parts)


def _register(stub, setup: str, body: str, namespace: dict, what: str) -> None:
    """Register ``@overload(stub)`` of a typer generated with the stub's parameters and defaults:
    the spec's checks, then ``setup`` (lines at the typer's level), then an implementation whose body
    is ``body`` (lines at the implementation's level)."""
    spec = spec_of(stub)
    names = ", ".join(p.name for p in spec.params)
    namespace.update(check=check, stub=stub)
    signature = _signature(spec.params, namespace)
    code = (f"def typer({signature}):\n"
            f"    check(stub, {names})\n"
            + "".join("    " + line + "\n" for line in setup.splitlines())
            + f"    def impl({signature}):\n"
            + "".join("        " + line + "\n" for line in body.splitlines())
            + "    return impl\n")
    exec(compile(code, f"<lowering of {spec.name} {what}>", "exec"), namespace)  # noqa: S102 - from a spec
    typer = namespace["typer"]
    typer.__qualname__ = typer.__name__ = f"lower_{spec.short.replace('.', '_')}"
    overload(stub)(typer)


def lower_from_spec(stub) -> None:
    """Register the typing and lowering of ``stub`` made from its spec."""
    spec = spec_of(stub)
    c_args = []
    coop = None
    for p in spec.params:
        arg = spec.args.get(p.name)
        kind = arg.kind if arg is not None else None
        if kind == "coop":  # a coop call's C function is its kind's, and takes the coop's word first
            coop = p.name
            c_args.insert(0, f"{p.name}._word")
            continue
        if kind not in C_ARGUMENTS:
            raise FlowDSLError(f"Cannot lower {spec.name} from its spec: its argument {p.name} is of kind {kind!r}, "
                               "which has no C mapping (flowdsl.lowering.generic.C_ARGUMENTS). Add one, or write "
                               "its lowering by hand and leave returns= out of its spec")
        c_args.append(C_ARGUMENTS[kind].format(p=p.name))
    namespace = {"extern": extern, "cuda": cuda, "types": types, "value_or": value_or,
                 "devcomm_ptr": devcomm_ptr, "array_ptr": array_ptr, "make_team": make_team}
    _register(stub, f"fn = extern(stub, {coop})" if coop else "fn = extern(stub)", _BODIES[spec.returns].format(args=", ".join(c_args)), namespace,
              "from its spec")


def lower_as(stub, intrinsic=None, choose=None) -> None:
    """Register the typing and lowering of ``stub`` as the spec's checks, then a numba ``@intrinsic``
    called with the stub's arguments as they are: ``intrinsic``, or the one ``choose`` returns when
    called with the argument types by name (it checks what the spec cannot say, and may bake a
    constant argument into the intrinsic it makes)."""
    params = [p.name for p in spec_of(stub).params]
    names = ", ".join(params)
    if choose is None:
        _register(stub, "", f"return fn({names})", {"fn": intrinsic}, f"as {intrinsic.__name__}")
    else:
        _register(stub, "fn = choose(" + ", ".join(f"{n}={n}" for n in params) + ")", f"return fn({names})",
                  {"choose": choose}, f"as {choose.__qualname__}")


def bind_spec_lowerings() -> None:
    """Lower every primitive whose spec says ``returns`` (once, when the lowering is bound)."""
    for stub in PRIMITIVES.values():
        if spec_of(stub).returns is not None:
            lower_from_spec(stub)
