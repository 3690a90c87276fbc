"""``@flowdsl.device`` functions, and flowdsl kernels called from kernels, registered with numba-cuda: the binder
the device surface (:mod:`flowdsl._devices`) is given when the compiler first loads (:mod:`flowdsl.lowering.bindings`
calls :func:`bind_device_functions`), and the registration of the kernels a kernel calls, before it is typed.
"""

from __future__ import annotations

import threading

from numba.cuda.extending import overload

from .._devices import bare_copy, code_names, install_binder, referenced_values

__all__ = ["bind_device_functions", "register_called_kernels", "register_device"]

#: Kernels registered as device functions (:func:`register_called_kernels`).
_CALLABLE: set = set()
_lock = threading.Lock()


def bind_device_functions() -> None:
    """Register the device functions made so far with numba-cuda, and each later one as it is made."""
    install_binder(register_device)


def register_device(fn) -> None:
    """``fn`` as an overload numba-cuda's typing finds: a device function, or a kernel called from a kernel."""
    if fn.py_func is fn:
        # An overload of fn itself (fn stays the plain Python function), compiled with its own options (fast
        # math, debug, opt), as register_jitable does, but from a copy without fn's attributes: numba's dispatcher
        # takes over its function's __dict__, and fn.overloads (the declared signatures) would stand in for the
        # dispatcher's own. A function that calls itself is numba's dispatcher instead (_recursive_call).
        impl = bare_copy(fn)
        made = []

        @overload(fn, jit_options=dict(fn.__flowdsl_jit_options__), inline="never", strict=False)
        def _as_jitable(*args, **kwargs):
            if not made:
                made.append(_recursive_call(fn) if _calls_itself(fn) else impl)
            if fn.overloads.declared is None:
                return made[0]
            # Declared signatures, as numba-cuda's device dispatcher compiles only those: the numbers of a call are
            # converted to the one numba's rules choose (an int32 function called with floats casts them); none
            # is numba's typing error.
            from numba.cuda.descriptor import cuda_target  # noqa: PLC0415

            casts = fn.overloads.conversions(args, cuda_target.typing_context, kwargs)
            if casts is None:
                return None
            return _casting_call(fn, casts) if any(casts) else made[0]
        return
    impl = fn.py_func  # a kernel object: an overload of the object, implemented by its function
    options = {k: v for k, v in fn.targetoptions.items() if k != "inline" and v}  # numba's, as cuda.jit takes them
    if not fn.opt:
        options["opt"] = False

    @overload(fn, inline=fn.inline, jit_options=options, strict=False)
    def _as_device_function(*args):
        return impl


def _calls_itself(fn) -> bool:
    """Whether ``fn``'s code names ``fn`` itself (a global or a closure value of its own name)."""
    if fn.__name__ not in code_names(fn.__code__) and fn.__name__ not in fn.__code__.co_freevars:
        return False
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    named = cells[fn.__name__].cell_contents if fn.__name__ in cells and _filled(cells[fn.__name__]) else \
        fn.__globals__.get(fn.__name__)
    return named is fn


def _recursive_call(fn):
    """A function that calls numba-cuda's device dispatcher of ``fn``'s code, in which ``fn``'s own name is that
    dispatcher: numba types a dispatcher that calls itself (and reports runaway recursion in its words), where
    an overload entered again for the same types is refused as re-entrant. The globals are a copy taken now, at
    the first compile of a call to ``fn``, as numba freezes them then."""
    import types as pytypes  # noqa: PLC0415

    # numba-cuda's own decorator, as its overloads take it: not numba.cuda.jit, which a program may have replaced
    # (numba-cuda's test suite run through flowdsl makes it flowdsl's, which would come back here)
    from numba.cuda.decorators import jit  # noqa: PLC0415

    name = fn.__name__
    namespace = dict(fn.__globals__)
    closure = tuple(pytypes.CellType(c.cell_contents) if _filled(c) else c for c in fn.__closure__ or ())
    code = pytypes.FunctionType(fn.__code__, namespace, name, fn.__defaults__, closure)
    dispatcher = jit(device=True, **fn.__flowdsl_jit_options__)(code)
    if name in fn.__code__.co_freevars:
        closure[fn.__code__.co_freevars.index(name)].cell_contents = dispatcher
    else:
        namespace[name] = dispatcher
    params = [f"a{i}" for i in range(fn.__code__.co_argcount)]
    calls = {"dispatcher": dispatcher}
    exec(f"def call({', '.join(params)}):\n    return dispatcher({', '.join(params)})", calls)  # noqa: S102
    return calls["call"]


def _casting_call(fn, casts: tuple):
    """A function that calls ``fn`` with each argument converted to its type in ``casts`` (None: as it is)."""
    names = [f"a{i}" for i in range(len(casts))]
    namespace = {"fn": fn, **{f"T{i}": t for i, t in enumerate(casts) if t is not None}}
    converted = [f"T{i}({n})" if t is not None else n for i, (n, t) in enumerate(zip(names, casts))]
    exec(f"def call({', '.join(names)}):\n    return fn({', '.join(converted)})", namespace)  # noqa: S102 - our text
    return namespace["call"]


def register_called_kernels(fn) -> None:
    """Let ``fn`` call the flowdsl kernels it names (as globals or closure values, its device functions'
    too): each runs as a device function there, as numba-cuda compiles a ``@cuda.jit`` kernel called from
    another kernel. Called before ``fn`` is typed; only kernels named so are registered (a registration
    keeps its kernel alive), each once."""
    seen, todo = set(), [fn]
    while todo:
        f = todo.pop()
        code = getattr(f, "__code__", None)
        if code is None or id(f) in seen:
            continue
        seen.add(id(f))
        for value in referenced_values(f):
            if getattr(type(value), "__flowdsl_kernel__", False):  # a FlowKernel (its module imports this one)
                with _lock:
                    if value not in _CALLABLE:
                        _CALLABLE.add(value)
                        register_device(value)
                todo.append(value.py_func)
            elif hasattr(value, "__flowdsl_inline__"):  # a @flowdsl.device function: it may name kernels too
                todo.append(value)


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True
