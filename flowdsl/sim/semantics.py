"""The one place that defines what every flowdsl primitive does in the simulator.

:data:`SEMANTICS` maps a primitive's name (``flowdsl.lsa.barrier``, the key
of ``flowdsl._stubs.PRIMITIVES``) to its implementation, registered with
:func:`implements`. :func:`dispatch` is the hook the stubs call; a primitive
with no entry raises :class:`~flowdsl.sim.errors.UnsupportedFeatureError`
naming it. :func:`run` checks the arguments against the primitive's spec
(:mod:`flowdsl.sim.checks`) before its implementation runs: the stubs and the
methods of simulated values (``session.sync(order)``) both call it. Adding a primitive is one ``@implements`` function in the module
of its surface module's name.

The entries live in one module per module of the surface: :mod:`flowdsl.sim.coop`,
:mod:`~flowdsl.sim.team`, :mod:`~flowdsl.sim.lsa`, :mod:`~flowdsl.sim.mem`, :mod:`~flowdsl.sim.gin`,
:mod:`~flowdsl.sim.cft` and :mod:`~flowdsl.sim.wait`, each importing this one.
"""

from __future__ import annotations

from typing import Any, Callable

from .. import _stubs
from . import _state
from .checks import check_call
from .errors import UnsupportedFeatureError, sim_error
from .scheduler import KernelThread

__all__ = ["SEMANTICS", "implements", "dispatch", "run", "current"]

#: primitive name -> implementation (same arguments as the stub).
SEMANTICS: dict[str, Callable[..., Any]] = {}


def implements(name: str):
    """Register the decorated function as the semantics of primitive ``name``."""
    def deco(fn):
        SEMANTICS[name] = fn
        return fn
    return deco


def dispatch(name, *args, **kwargs):
    """The hook ``flowdsl._stubs`` calls: run primitive ``name`` for the current thread."""
    impl = SEMANTICS.get(name)
    if impl is None:
        raise sim_error(UnsupportedFeatureError, (
            f"Cannot run {name}: {name} is not modelled by the simulator yet. "
            f"Run this kernel on a GPU, or add its semantics to flowdsl/sim/{name.split('.')[1]}.py"))
    if not isinstance(_state.cur, KernelThread):
        raise _stubs.DeviceOnlyError(
            f"{name}() is a device function: call it inside a kernel; no simulated kernel thread is running "
            "(launch the kernel from a main function run by flowdsl.sim.spawn(...))")
    check_call(name, args, kwargs)
    return impl(*args, **kwargs)


def run(name, *args, **kwargs):
    """Primitive ``name`` with its arguments checked (a method of a simulated value calls it)."""
    check_call(name, args, kwargs)
    return SEMANTICS[name](*args, **kwargs)


def current() -> KernelThread:
    """The simulated kernel thread now running."""
    return _state.cur
