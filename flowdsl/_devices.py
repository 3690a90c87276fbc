"""``@flowdsl.device``: helper device functions, bound to numba-cuda at the first compile.

Making one needs no numba (``import flowdsl`` and the simulator never import it): the
function is recorded and registered with numba-cuda (``register_jitable``) when
:mod:`flowdsl.lowering.bindings` is imported, which the compiler does; from then on each
new one is registered as it is made.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping

__all__ = ["device", "DeclaredOverloads", "register_called_kernels", "bind_devices", "code_names", "OUT_OF_LINE"]

#: ``module.qualname`` of every device function made with ``inline=False`` (the compiler keeps them out of line).
OUT_OF_LINE: set[str] = set()
#: Device functions made before numba-cuda was bound (:func:`bind_devices` registers them).
_PENDING_DEVICES: list = []
_devices_bound = False
_devices_lock = threading.Lock()


def device(fn=None, *, signature=None, inline: bool = True, fastmath: bool = False):
    """A helper device function callable from flowdsl kernels (compiled per target).

    Device functions may not return arrays (numba-cuda restriction without NRT):
    pass output arrays in, or return scalars. ``inline=False`` keeps one copy of a
    large function that many call sites share (NVVM inlines every call otherwise,
    which multiplies code size and link time). ``fastmath=True`` compiles its own
    code with fast math (numba-cuda's ``cuda.jit(device=True, fastmath=True)``),
    whatever its callers use. numba-cuda learns of the function when the
    first flowdsl kernel compiles; a plain ``numba.cuda.jit`` kernel that calls it before
    then needs ``import flowdsl.lowering.bindings`` first.

    numba-cuda's device-dispatcher API: ``fn.compile_device(argtypes)`` is numba's compile of the function
    alone (this GPU's arch; sm_90 without one), ``fn.inspect_asm(signature)`` and ``fn.inspect_llvm(signature)``
    its PTX and LLVM IR; ``inspect_sass`` is refused, as numba-cuda refuses it for a device function.
    ``signature`` (numba's: ``"float32(float32, float32)"``, a list of them) declares the types it is
    called with, as ``cuda.jit(signature, device=True)`` does: ``fn.overloads`` lists them
    (``cuda.vectorize`` reads their return types there). Calls of other types
    still compile, inside their callers.
    """
    if fn is None:
        return functools.partial(device, signature=signature, inline=inline, fastmath=fastmath)
    # A new function each time, as numba-cuda's decorator makes a new dispatcher: the same Python function
    # made a device function twice (with and without fast math, say) gives two.
    fn = functools.update_wrapper(_bare_copy(fn), fn)
    if not inline:
        OUT_OF_LINE.add(f"{fn.__module__}.{fn.__qualname__}")
    fn.__flowdsl_inline__ = inline  # part of the cache key of every kernel that calls it
    fn.__flowdsl_fastmath__ = bool(fastmath)  # so is this
    fn.overloads = DeclaredOverloads(fn, signature)
    fn.compile_device = lambda args, return_type=None: fn.overloads.compile(tuple(args), return_type)
    fn.inspect_asm = functools.partial(_inspect_asm, fn)
    fn.inspect_llvm = functools.partial(_inspect_llvm, fn)
    fn.inspect_sass = functools.partial(_inspect_sass, fn)
    fn.py_func = fn
    with _devices_lock:
        if not _devices_bound:  # registered with numba-cuda when something first compiles
            _PENDING_DEVICES.append(fn)
            return fn
    _register_device(fn)
    return fn


class DeclaredOverloads(Mapping):
    """numba-cuda's ``overloads`` of a device function: argument types -> numba's compile result of the function
    alone (``.signature``, ``.fndesc``, ``.library``), for the signatures declared at decoration and those
    ``compile_device`` compiled. A flowdsl device function is compiled inside its callers, so it lists no others.
    The declared ones are compiled when first read (making a device function imports no numba)."""

    def __init__(self, fn, signature):
        self._fn, self._declared, self._entries = fn, signature, None

    def _load(self) -> dict:
        if self._entries is None:
            from numba.core import sigutils  # noqa: PLC0415 - numba's own parser of its signatures

            declared = self._declared
            self._entries = {}
            for one in (declared if isinstance(declared, list) else [] if declared is None else [declared]):
                args, returns = sigutils.normalize_signature(one)
                self.compile(tuple(args), returns)
        return self._entries

    def compile(self, args: tuple, return_type=None):
        """numba's compile result for ``args`` (``compile_device``), compiled once."""
        entries = self._load()
        if args not in entries:
            entries[args] = _compile_alone(self._fn, args, return_type)
        return entries[args]

    def __getitem__(self, args):
        return self._load()[tuple(args)]

    def __iter__(self):
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


def _compile_alone(fn, args: tuple, return_type=None):
    """numba's compile result of ``fn`` alone for ``args`` (this GPU's arch, sm_90 without one)."""
    from .lowering import compiler  # noqa: PLC0415 - binds numba-cuda

    return compiler.backend.compile_device(fn, args, _device_cc(), return_type, fastmath=fn.__flowdsl_fastmath__)


def _device_cc() -> tuple[int, int]:
    from . import _targets  # noqa: PLC0415

    try:
        return _targets.device_target().cc
    except Exception:  # noqa: BLE001 - no GPU: the code an sm_90 would run
        return (9, 0)


def register_called_kernels(fn) -> None:
    """Let ``fn`` call the flowdsl kernels it names (as globals or closure values, its device functions'
    too): each runs as a device function there, as numba-cuda compiles a ``@cuda.jit`` kernel called from
    another kernel. Called before ``fn`` is typed; only kernels named so are registered (a registration
    keeps its kernel alive), each once."""
    from ._kernel import FlowKernel  # noqa: PLC0415

    seen, todo = set(), [fn]
    while todo:
        f = todo.pop()
        code = getattr(f, "__code__", None)
        if code is None or id(f) in seen:
            continue
        seen.add(id(f))
        values = [f.__globals__.get(name) for name in code_names(code)]
        values += [cell.cell_contents for cell in (f.__closure__ or ()) if _filled(cell)]
        for value in values:
            if isinstance(value, FlowKernel):
                with _devices_lock:
                    if value not in _CALLABLE:
                        _CALLABLE.add(value)
                        _register_device(value)
                todo.append(value.py_func)
            elif hasattr(value, "__flowdsl_inline__"):  # a @flowdsl.device function: it may name kernels too
                todo.append(value)


#: Kernels registered as device functions (:func:`register_called_kernels`).
_CALLABLE: set = set()


def code_names(code) -> set:
    """The names ``code`` and the code nested in it use (globals and attributes)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= code_names(const)
    return names


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _register_device(fn) -> None:
    from numba.cuda.extending import overload  # noqa: PLC0415

    if fn.py_func is fn:
        # An overload of fn itself (fn stays the plain Python function), compiled with its own fast-math flag,
        # as register_jitable does, but from a copy without fn's attributes: numba's dispatcher takes over its
        # function's __dict__, and fn.overloads (the declared signatures) would stand in for the dispatcher's own.
        impl = _bare_copy(fn)

        @overload(fn, jit_options={"fastmath": True} if fn.__flowdsl_fastmath__ else {}, inline="never",
                  strict=False)
        def _as_jitable(*args, **kwargs):
            return impl
        return
    impl = fn.py_func  # a kernel object: an overload of the object, implemented by its function

    @overload(fn, inline="never", strict=False)
    def _as_device_function(*args):
        return impl


def _bare_copy(fn):
    """``fn``'s code, globals, defaults and closure as a new function without its attributes."""
    import types  # noqa: PLC0415

    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__, copy.__qualname__, copy.__module__ = fn.__kwdefaults__, fn.__qualname__, fn.__module__
    return copy


def bind_devices() -> None:
    """Register the device functions made so far with numba-cuda, and each later one as it is made
    (called once, by :mod:`flowdsl.lowering.bindings`)."""
    global _devices_bound
    with _devices_lock:
        _devices_bound = True
        pending = list(_PENDING_DEVICES)
        _PENDING_DEVICES.clear()
    for fn in pending:
        _register_device(fn)


def _inspect_asm(fn, signature=None):
    """``fn.inspect_asm(signature)``: the PTX of ``fn`` alone for argument types ``signature``; without one, as
    numba-cuda's device dispatcher, a dict of the PTX of each signature in ``fn.overloads``."""
    if signature is None:
        return {args: cres.library.get_asm_str(_device_cc()) for args, cres in fn.overloads.items()}
    return fn.overloads.compile(tuple(getattr(signature, "args", signature))).library.get_asm_str(_device_cc())


def _inspect_llvm(fn, signature=None):
    """``fn.inspect_llvm(signature)``: numba's LLVM IR of ``fn`` alone (a dict of each without a signature)."""
    if signature is None:
        return {args: cres.library.get_llvm_str() for args, cres in fn.overloads.items()}
    return fn.overloads.compile(tuple(getattr(signature, "args", signature))).library.get_llvm_str()


def _inspect_sass(fn, signature=None):
    from .errors import NotInspectableError  # noqa: PLC0415

    raise NotInspectableError(f"Cannot inspect SASS of a device function ({fn.__qualname__}): SASS is a kernel's, "
                              "after linking. Inspect a kernel that calls it (k.inspect_sass(signature))")
