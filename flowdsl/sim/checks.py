"""The simulator's side of every primitive's spec (:mod:`flowdsl._spec`): argument values checked by kind.

:func:`check_call` runs before every primitive's implementation (:func:`flowdsl.sim.semantics.run`):
each argument the spec names must be a value of its kind (:data:`KIND_CHECKS`), or the call is
refused in the words the GPU's typing refuses it with (:meth:`flowdsl._spec.Spec.refusal`: "``op``
requires ``what``, got ``type``"), followed by the fix. The kinds whose values this module does not
define (coops, teams, sessions, GIN contexts and actions) are added by the modules that define them.
A narrowed argument is checked for its element types and choices too (whether a value was a
compile-time constant is the GPU's concern alone). Omitted optional arguments (or None for them)
are not checked; checks of value (ranges, ids, which rank's window) stay with each implementation, but
for the one refusal of an id or index beyond what the device communicator was created with
(:func:`check_index`, :func:`barrier_index`).
"""

from __future__ import annotations

import inspect

import numpy as np

from .._release import arch_refusal, nccl_refusal
from .._release import arch_cc
from .._spec import Gate, KindRegistry, spec_of
from . import _state
from .errors import BarrierIndexError, FeatureUnavailableError, KernelTypingError, sim_error
from .memory import Window, WindowView

__all__ = ["check_call", "KIND_CHECKS", "check_index", "barrier_index", "require_release", "require_arch"]


def _is_int(v) -> bool:
    """An integer as numba types one (a bool is not)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_array(v) -> bool:
    return isinstance(v, (np.ndarray, WindowView))


#: Argument kind -> whether a value is of that kind (``coop``, ``team``, ``lsa_session``, ``gin_context``,
#: ``remote``, ``local`` and ``cft_session`` are added by the modules that define those values).
KIND_CHECKS = KindRegistry("the simulator", {
    "comm": lambda v: hasattr(getattr(v, "group", None), "inbox"),
    "window": lambda v: isinstance(v, Window),
    "int": _is_int, "order": _is_int, "enum": _is_int, "scope": _is_int,
    "array": _is_array, "shared_array": _is_array,
    "word": lambda v: isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)),
})

def _typeof(value) -> str:
    """``value``'s type as numba names it where it can (a Python int is an int64), else its class's name."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, np.generic):
        return value.dtype.name
    if _is_array(value):
        return f"array({value.dtype}, {np.ndim(value)}d)"
    return type(value).__name__


#: name -> (required, total, signature, ((position, parameter, kind check, optional, Arg, dtypes), ...)): the
#: stub's parameter counts and signature, and each checked argument (made at first call).
_PLANS: dict[str, tuple] = {}


def _dtypes(names):
    """The NumPy dtypes an argument may have, as a set of dtype objects (comparing those is cheaper than
    reading ``dtype.name``, at every primitive call), or None for any."""
    return frozenset(np.dtype(n) for n in names) if names else None


def require_release(feature: str, needs: tuple[int, int, int]) -> None:
    """Refuse ``feature``, which needs NCCL ``needs``, where the simulation is of an older release
    (``spawn(nccl=...)``), in the words compiling for that release refuses it with."""
    has = _state.sched.world.nccl
    if has is not None and has < needs:
        raise sim_error(FeatureUnavailableError, nccl_refusal(feature, needs, has, simulated=True))


def require_arch(feature: str, min_cc: tuple[int, int]) -> None:
    """Refuse ``feature``, which needs compute capability ``min_cc``, where the simulation is of an older GPU
    (``spawn(arch=...)``), in the words compiling for that arch refuses it with."""
    arch = _state.sched.world.arch
    if arch is not None and arch_cc(arch) < min_cc:
        raise sim_error(FeatureUnavailableError, arch_refusal(feature, min_cc, arch, simulated=True))



def _plan(name: str) -> tuple:
    spec = spec_of(name)
    signature = inspect.Signature(spec.params)  # the stub's (no stub takes *args or **kwargs)
    required = sum(p.default is inspect.Parameter.empty for p in spec.params)
    checked = tuple((i, p.name, KIND_CHECKS[spec.args[p.name].kind], p.default is not inspect.Parameter.empty,
                     spec.args[p.name], _dtypes(spec.args[p.name].dtypes))
                    for i, p in enumerate(spec.params) if p.name in spec.args)
    gated = (spec.gate.nccl if spec.gate.nccl > Gate().nccl else None, spec.gate.min_cc)
    plan = _PLANS[name] = (required, len(spec.params), signature, checked, gated)
    return plan


def check_call(name: str, args: tuple, kwargs: dict) -> None:
    """Refuse a call of primitive ``name`` that the NCCL release or the arch simulated lacks (its spec's gate), or whose
    arguments its stub does not take (one missing, one too many: numba's typing finds no signature) or
    are not of the kinds its spec names."""
    plan = _PLANS.get(name)
    if plan is None:
        plan = _plan(name)
    required, total, signature, checked, gated = plan
    if gated[0] is not None:  # first, as the GPU's typing checks the gate before the arguments
        require_release(name, gated[0])
    if gated[1] is not None:
        require_arch(name, gated[1])
    given = len(args) + len(kwargs)
    if not required <= given <= total or (kwargs and not set(kwargs) <= set(signature.parameters)):
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise sim_error(KernelTypingError, spec_of(name).refusal_arity(str(exc))) from None
    for i, param, is_kind, optional, arg, dtypes in checked:
        if i < len(args):
            value = args[i]
        elif param in kwargs:
            value = kwargs[param]
        else:
            continue
        if value is None and optional:
            continue
        if not is_kind(value):
            spec = spec_of(name)
            raise sim_error(KernelTypingError, spec.refusal(param, _typeof(value)))
        if dtypes is not None and value.dtype not in dtypes:
            spec = spec_of(name)
            raise sim_error(KernelTypingError, spec.refusal_dtype(param, value.dtype.name))
        if arg.choices and value not in arg.choices:
            spec = spec_of(name)
            raise sim_error(KernelTypingError, spec.refusal_choice(param, int(value)))


def check_index(index, count: int, req: str, refusal, error=BarrierIndexError, unit: str = "index",
                at_least: int = 0, why: str = "") -> int:
    """``index`` as an int, refused with ``error`` unless ``0 <= index < count``, ``count`` being what the device
    communicator was created with (its requirement ``req``): the message is ``refusal(index)``, then the fix (a
    larger ``req``, at least ``at_least`` for the reason ``why``, or a smaller ``unit``)."""
    index = int(index)
    if not 0 <= index < count:
        need = max(index + 1, at_least)
        raise sim_error(error, f"{refusal(index)}. Create it with comm.device_communicator({req}={need}) "
                        f"or more{why if need > index + 1 else ''}, or use a smaller {unit}")
    return index


def barrier_index(index, count: int, what: str, req: str) -> int:
    """The index of a ``what`` barrier, refused unless the device communicator has ``count`` of them (its ``req``).
    The fix counts the launch's blocks (a barrier index per block, the usual use, needs one each)."""
    launch = getattr(_state.cur, "launch", None)
    blocks = len(launch.blocks) if launch is not None and launch.blocks else 0
    return check_index(index, count, req, lambda i: f"Cannot open {what} {i}: the device communicator has "
                       f"{req}={count} (valid indices 0..{count - 1})", at_least=blocks,
                       why=f" (this launch has {blocks} blocks: one barrier each needs {blocks})")
