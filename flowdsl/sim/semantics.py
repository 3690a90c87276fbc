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

import importlib
import inspect
from typing import Any, Callable

from .. import _stubs
from .._spec import spec_of
from ..errors import FlowDSLError
from . import _state
from .checks import check_call
from .errors import UnsupportedFeatureError, sim_error
from .scheduler import KernelThread

__all__ = ["SEMANTICS", "implements", "take_stub_defaults", "dispatch", "run", "method_of", "BarrierSession", "current"]

#: primitive name -> implementation (same arguments as the stub).
SEMANTICS: dict[str, Callable[..., Any]] = {}


def implements(name: str):
    """Register the decorated function as the semantics of primitive ``name``.

    It takes the stub's parameters, by name and in order, and states no defaults: it is given the stub's here
    (the spec is their one home, as the lowering reads them from it too), so the two cannot drift.
    """
    def deco(fn):
        take_stub_defaults(name, fn)
        SEMANTICS[name] = fn
        return fn
    return deco


def take_stub_defaults(name: str, fn) -> None:
    """Give ``fn`` the defaults of primitive ``name``'s stub; refuse it if its parameters are not the stub's or
    it states a default of its own."""
    importlib.import_module(name.rpartition(".")[0])  # the surface module whose stub holds the spec
    spec = spec_of(name)
    own = list(inspect.signature(fn).parameters.values())
    if [(p.name, p.kind) for p in own] != [(p.name, p.kind) for p in spec.params]:
        raise FlowDSLError(f"Cannot register {fn.__qualname__} as the simulation of {name}: it takes "
                           f"{inspect.signature(fn)}, the stub {spec.signature}. Take the stub's parameters")
    stated = [p.name for p in own if p.default is not inspect.Parameter.empty]
    if stated:
        raise FlowDSLError(f"Cannot register {fn.__qualname__} as the simulation of {name}: it states defaults "
                           f"({', '.join(stated)}), which are the stub's to give. Drop them: the stub's "
                           f"{spec.signature} are used")
    positional = tuple(p.default for p in spec.params if p.default is not inspect.Parameter.empty
                       and p.kind is not inspect.Parameter.KEYWORD_ONLY)
    keyword = {p.name: p.default for p in spec.params if p.default is not inspect.Parameter.empty
               and p.kind is inspect.Parameter.KEYWORD_ONLY}
    fn.__defaults__, fn.__kwdefaults__ = positional or None, keyword or None


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


class BarrierSession:
    """One thread's barrier session: its device communicator, coop, barrier index and copy of the epoch."""

    __slots__ = ("comm", "coop", "index", "epoch")

    def __init__(self, comm, coop, index, epoch):
        self.comm, self.coop, self.index, self.epoch = comm, coop, index, epoch


def method_of(name: str):
    """A simulated session's method that is primitive ``name`` on the session: the stub's parameters after the
    session, checked by :func:`run` as the GPU's typing checks them (``session.sync(order)`` is
    ``lsa.sync(session, order)``)."""
    def method(self, *args, **kwargs):
        return run(name, self, *args, **kwargs)
    method.__name__ = name.rpartition(".")[2]
    return method


def current() -> KernelThread:
    """The simulated kernel thread now running."""
    return _state.cur
