"""``@flowdsl.device`` functions, and flowdsl kernels called from kernels, registered with numba-cuda: the binder
the device surface (:mod:`flowdsl._devices`) is given when the compiler first loads (:mod:`flowdsl.lowering.bindings`
calls :func:`bind_device_functions`), and the registration of the kernels a kernel calls, before it is typed.
"""

from __future__ import annotations

import threading

from numba.cuda.extending import overload

from .._devices import bare_copy, code_names, install_binder

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
            declared = _declared_signatures(fn)
            if not declared:
                return made[0]
            # Declared signatures, as numba-cuda's device dispatcher compiles only those: a call takes the one its
            # arguments convert to by numba's rules (an int32 function called with floats casts them; a tie takes
            # the first, as numba-cuda's does for device functions); none is numba's typing error.
            from numba.cuda.descriptor import cuda_target  # noqa: PLC0415

            chosen = cuda_target.typing_context.resolve_overload(fn, declared, args, kwargs, allow_ambiguous=True)
            if chosen is None:
                return None
            if not _numbers_differ(chosen.args, args):  # arrays of another layout compile for their own type
                return made[0]
            return _casting_call(fn, chosen.args, args)
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


def _numbers_differ(declared: tuple, given: tuple) -> bool:
    """Whether a number of ``given`` is not of its ``declared`` type (what a call converts)."""
    from numba.core import types  # noqa: PLC0415

    return any(d != g and isinstance(d, (types.Number, types.Boolean)) for d, g in zip(declared, given))


def _casting_call(fn, declared: tuple, given: tuple):
    """A function that calls ``fn`` with its numbers cast to their declared types (numba's conversion of a call
    to a declared signature); the other arguments as they are (an array of another layout, which numba's typing
    converts)."""
    from numba.core import types  # noqa: PLC0415

    names = [f"a{i}" for i in range(len(declared))]
    casts = [f"T{i}({n})" if d != g and isinstance(d, (types.Number, types.Boolean)) else n
             for i, (n, d, g) in enumerate(zip(names, declared, given))]
    namespace = {"fn": fn, **{f"T{i}": d for i, d in enumerate(declared)}}
    exec(f"def call({', '.join(names)}):\n    return fn({', '.join(casts)})", namespace)  # noqa: S102 - our text
    return namespace["call"]


def _declared_signatures(fn) -> list:
    """numba signatures of the types ``fn`` was declared with (``@flowdsl.device(signature=...)``), or []."""
    from numba.core import sigutils, typing  # noqa: PLC0415

    declared = fn.overloads.declared
    out = []
    for one in (declared if isinstance(declared, list) else [] if declared is None else [declared]):
        args, returns = sigutils.normalize_signature(one)
        out.append(typing.signature(returns, *args))
    return out


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
        values = [f.__globals__.get(name) for name in code_names(code)]
        values += [cell.cell_contents for cell in (f.__closure__ or ()) if _filled(cell)]
        for value in values:
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
