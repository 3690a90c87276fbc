"""Device-function stubs: the public face of every primitive.

A primitive is a documented Python function whose meaning is stated in its
docstring. Compiled kernels bind it through ``flowdsl.lowering``; the CPU
simulator binds it through the dispatch hook installed by ``flowdsl.sim``.
Called from plain host code it raises :class:`flowdsl.DeviceOnlyError`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from .errors import DeviceOnlyError

__all__ = ["primitive", "set_simulator_dispatch", "set_simulator_launch", "DeviceOnlyError", "PRIMITIVES"]

#: name -> stub, for every primitive of the device surface (docs and tests walk it).
PRIMITIVES: dict[str, Callable[..., Any]] = {}

_simulator_dispatch: Callable[..., Any] | None = None
#: Called as ``launch(kernel, griddim, blockdim, stream, sharedmem, args, wait=False)`` for launches made
#: inside a simulated rank or with simulated arguments (``__flowdsl_sim__``); set by ``flowdsl.sim``.
_simulator_launch: Callable[..., Any] | None = None
#: Returns True while a simulated rank's host code is running (set by ``flowdsl.sim``).
_simulator_active: Callable[[], bool] = lambda: False
#: ``overload(kernel, argtypes)``: a kernel's code for one signature as the simulator gives it
#: (``kernel.overloads`` inside a simulated rank); set by ``flowdsl.sim``.
_simulator_overload: Callable[..., Any] | None = None


def set_simulator_dispatch(dispatch: Callable[..., Any] | None) -> None:
    """Install (or remove, with ``None``) the simulator's dispatch hook.

    The hook is called as ``dispatch(name, *args, **kwargs)`` and returns the
    primitive's result, or raises if no simulated thread is running.
    """
    global _simulator_dispatch
    _simulator_dispatch = dispatch


def set_simulator_launch(launch: Callable[..., Any] | None, active: Callable[[], bool] | None = None,
                         overload: Callable[..., Any] | None = None) -> None:
    """Install (or remove) the simulator's kernel-launch hook, its "inside a simulated rank" test and its
    maker of a kernel's code for one signature (``kernel.overloads`` there)."""
    global _simulator_launch, _simulator_active, _simulator_overload
    _simulator_launch = launch
    _simulator_active = active or (lambda: False)
    _simulator_overload = overload


def primitive(fn: Callable[..., Any] | None = None, /, *, extern: str | None = None, gate=None,
              module: str | None = None, returns: str | None = None, c=(), **args):
    """Mark ``fn`` as a device primitive; its body is never run.

    Used bare (``@primitive``) or with the primitive's spec (``@primitive(extern=..., c=CFunction(...),
    comm=COMM, ...)``:
    see :mod:`flowdsl._spec`), which every layer reads. ``module`` is the module users reach it
    from, where that is not the one defining it (``flowdsl.flow`` re-exports a private module's).
    """
    if fn is None:
        return lambda f: primitive(f, extern=extern, gate=gate, module=module, returns=returns, c=c, **args)
    from ._spec import make_spec  # noqa: PLC0415 - a leaf module

    if module is not None:
        fn.__module__ = module
    name = f"{fn.__module__}.{fn.__name__}"

    @functools.wraps(fn)
    def stub(*args: Any, **kwargs: Any) -> Any:
        if _simulator_dispatch is not None:
            return _simulator_dispatch(name, *args, **kwargs)
        raise DeviceOnlyError(
            f"{name}() is a device function: call it inside a @flowdsl.kernel "
            "launched on a GPU, or run the program on the simulator with "
            "flowdsl.sim.spawn(...)"
        )

    stub.__flowdsl_primitive__ = name
    stub.__flowdsl_spec__ = make_spec(fn, extern, gate, returns, c, **args)
    PRIMITIVES[name] = stub
    return stub
