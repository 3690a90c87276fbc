"""``@flowdsl.device`` as the device surface records it: a helper device function, bound to numba-cuda when
something first compiles.

Making one needs no numba (``import flowdsl`` and the simulator never import it). Two parts from the layers
above are installed here once, so that this module imports neither of them:

* the binder (:mod:`flowdsl.lowering.devices`, when the compiler first loads): it registers the functions made
  so far with numba-cuda and, from then on, each one as it is made;
* numba-cuda's device-dispatcher API on each function (``compile_device``, ``overloads``, ``inspect_asm``, ...:
  :mod:`flowdsl._device_api`, which the package installs when it is imported).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings

__all__ = ["device", "install_binder", "install_dispatcher_api", "code_names", "referenced_values", "bare_copy",
           "OUT_OF_LINE", "debug_options"]

#: ``module.qualname`` of every device function made with ``inline=False`` (the compiler keeps them out of line).
OUT_OF_LINE: set[str] = set()
#: Device functions made before numba-cuda was bound (:func:`install_binder` registers them).
_PENDING_DEVICES: list = []
_binder = None
_dispatcher_api = None
_devices_lock = threading.Lock()


def debug_options(debug: bool | None, opt: bool | None, lineinfo: bool | None) -> tuple[bool, bool]:
    """``(debug, opt)`` as numba-cuda's ``cuda.jit`` resolves them when it decorates, with its warnings: None takes
    numba's configuration (``NUMBA_CUDA_DEBUGINFO``, ``NUMBA_OPT``; its live ``config`` once numba-cuda is
    imported, as a kernel module's ``from numba import cuda`` does, else the environment); debug with optimisation,
    or with lineinfo, warns in numba-cuda's words and class."""
    if debug is None or opt is None:
        config = sys.modules.get("numba.cuda.core.config")
        if config is not None:
            default_debug, default_opt = bool(config.CUDA_DEBUGINFO_DEFAULT), config.OPT != 0
        else:
            default_debug = os.environ.get("NUMBA_CUDA_DEBUGINFO", "0") not in ("", "0")
            default_opt = os.environ.get("NUMBA_OPT", "3") != "0"
        debug = default_debug if debug is None else debug
        opt = default_opt if opt is None else opt
    for wrong, message in ((debug and opt, "debug=True with opt=True is not supported by CUDA. This may result in a "
                                           "crash - set debug=False or opt=False."),
                           (debug and lineinfo, "debug and lineinfo are mutually exclusive. Use debug to get full "
                                                "debug info (this disables some optimizations), or lineinfo for line "
                                                "info only with code generation unaffected.")):
        if wrong:
            from numba.cuda.core.errors import NumbaInvalidConfigWarning  # noqa: PLC0415 - numba-cuda's own

            warnings.warn(NumbaInvalidConfigWarning(message), stacklevel=3)
    return bool(debug), bool(opt)


def device(fn=None, *, signature=None, inline: bool = True, fastmath: bool = False, debug: bool | None = None,
           opt: bool | None = None, lineinfo: bool | None = None):
    """A helper device function callable from flowdsl kernels (compiled per target).

    Device functions may not return arrays (numba-cuda restriction without NRT):
    pass output arrays in, or return scalars. ``inline=False`` keeps one copy of a
    large function that many call sites share (NVVM inlines every call otherwise,
    which multiplies code size and link time). ``fastmath=True`` compiles its own
    code with fast math (numba-cuda's ``cuda.jit(device=True, fastmath=True)``),
    whatever its callers use; ``debug``, ``opt`` and ``lineinfo`` are numba-cuda's device-function options too
    (its own debug information and optimisation, as ``cuda.jit(device=True, debug=True, opt=False)``; left None,
    numba-cuda's defaults, with its warnings at decoration). numba-cuda learns of the function when the
    first flowdsl kernel compiles; a plain ``numba.cuda.jit`` kernel that calls it before
    then needs ``import flowdsl.lowering.bindings`` first.

    numba-cuda's device-dispatcher API: ``fn.compile_device(argtypes)`` is numba's compile of the function
    alone (this GPU's arch; sm_90 without one), ``fn.inspect_asm(signature)`` and ``fn.inspect_llvm(signature)``
    its PTX and LLVM IR; ``inspect_sass`` is refused, as numba-cuda refuses it for a device function.
    ``signature`` (numba's: ``"float32(float32, float32)"``, a list of them) declares the types it is
    called with, as ``cuda.jit(signature, device=True)`` does: ``fn.overloads`` lists them
    (``cuda.vectorize`` reads their return types there). As numba-cuda compiles only a declared signature, a
    call of other types takes the declared one its arguments convert to by numba's rules (numbers are cast);
    where none does, it is numba's typing error.
    """
    if debug is not None or opt is not None:  # else numba-cuda's defaults, left to its own compile of the function
        debug, opt = debug_options(debug, opt, lineinfo)
    make = functools.partial(_device, signature=signature, inline=inline, fastmath=fastmath, debug=debug, opt=opt,
                             lineinfo=lineinfo)
    return make if fn is None else make(fn)


def _device(fn, *, signature, inline, fastmath, debug, opt, lineinfo):
    # A new function each time, as numba-cuda's decorator makes a new dispatcher: the same Python function
    # made a device function twice (with and without fast math, say) gives two.
    fn = functools.update_wrapper(bare_copy(fn), fn)
    if not inline:
        OUT_OF_LINE.add(f"{fn.__module__}.{fn.__qualname__}")
    fn.__flowdsl_inline__ = inline  # part of the cache key of every kernel that calls it
    # numba-cuda's options of its own compile (fast math, debug, ...: the overload's jit options; part of every
    # caller's cache key, as inline is)
    own = {"debug": debug, "opt": opt, "lineinfo": lineinfo}
    fn.__flowdsl_jit_options__ = ({"fastmath": True} if fastmath else {}) | {
        k: bool(v) for k, v in own.items() if v is not None}
    fn.py_func = fn
    if _dispatcher_api is not None:
        _dispatcher_api(fn, signature)
    with _devices_lock:
        register = _binder
        if register is None:  # registered with numba-cuda when something first compiles
            _PENDING_DEVICES.append(fn)
            return fn
    register(fn)
    return fn


def install_binder(register) -> None:
    """Register the device functions made so far with ``register`` and each later one as it is made (called once,
    by :mod:`flowdsl.lowering.devices`)."""
    global _binder
    with _devices_lock:
        _binder = register
        pending = list(_PENDING_DEVICES)
        _PENDING_DEVICES.clear()
    for fn in pending:
        register(fn)


def install_dispatcher_api(attach) -> None:
    """``attach(fn, signature)`` gives each device function made from now on numba-cuda's dispatcher API (called
    once, by :mod:`flowdsl._device_api`, which ``import flowdsl`` imports before any device function is made)."""
    global _dispatcher_api
    _dispatcher_api = attach


def code_names(code) -> set:
    """The names ``code`` and the code nested in it use (globals and attributes)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= code_names(const)
    return names


def referenced_values(fn) -> list:
    """The values ``fn``'s code can reach by name: the globals it (and the code nested in it) names, and its
    filled closure cells' contents."""
    values = [fn.__globals__.get(name) for name in code_names(fn.__code__)]
    for cell in fn.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    return values


def bare_copy(fn):
    """``fn``'s code, globals, defaults and closure as a new function without its attributes."""
    import types  # noqa: PLC0415

    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__, copy.__qualname__, copy.__module__ = fn.__kwdefaults__, fn.__qualname__, fn.__module__
    return copy
