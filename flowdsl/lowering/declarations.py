"""Numba declarations of every support-library function, made from the extern table.

``DECLARED[symbol]`` is a device function declared with the C ABI
(``abi="c"``: plain C arguments and return value) and no link file: the
compiler links the support build matching the target itself.
"""

from __future__ import annotations

from llvmlite import ir
from numba import cuda
from numba.core import types

from .._spec import spec_of
from ..enums import CoopKind
from .externs import COOP_SUFFIX, EXTERNS, Extern, by_name

__all__ = ["DECLARED", "NUMBA_TYPES", "signature_of", "call_extern", "call_out_of_line", "inline_bodies_called_once", "extern",
           "extern_symbol", "SIGNATURES"]

#: Table C type key -> numba type(s). Must agree with externs.C_TYPES.
NUMBA_TYPES = {
    "void": types.void,
    "int": types.int32,
    "uint32": types.uint32,
    "size_t": types.uint64,
    "uint64": types.uint64,
    "ptr": types.voidptr,
    "devcomm": types.voidptr,
    "window": types.voidptr,
    "int_out": types.voidptr,
    "u64_out": types.voidptr,
    "order": types.int32,
    "team": (types.int32, types.int32, types.int32),
}


def signature_of(ext: Extern):
    args = [types.uint32] if ext.coop else []
    for key, _ in ext.args:
        t = NUMBA_TYPES[key]
        args += list(t) if isinstance(t, tuple) else [t]
    return NUMBA_TYPES[ext.ret](*args)


DECLARED = {
    symbol: cuda.declare_device(symbol, signature_of(ext), abi="c")
    for ext in EXTERNS
    for symbol in ext.symbols()
}


def _devcomm_params(ext: Extern) -> frozenset[int]:
    """Positions of ``ext``'s ``const ncclDevComm*`` parameters in its C signature."""
    positions, at = [], 1 if ext.coop else 0
    for key, _ in ext.args:
        if key == "devcomm":
            positions.append(at)
        at += len(NUMBA_TYPES[key]) if isinstance(NUMBA_TYPES[key], tuple) else 1
    return frozenset(positions)


_DEVCOMM_PARAMS = {symbol: _devcomm_params(ext) for ext in EXTERNS for symbol in ext.symbols()}

#: symbol -> its numba signature (that of ``DECLARED[symbol]``), for calls emitted by lowering code.
SIGNATURES = {symbol: signature_of(ext) for ext in EXTERNS for symbol in ext.symbols()}


def call_extern(context, builder, symbol, args):
    """Emit a C-ABI call of ``symbol`` from lowering code (same signature as ``DECLARED``)."""
    from numba.core import cgutils  # noqa: PLC0415

    sig = SIGNATURES[symbol]
    fnty = ir.FunctionType(context.get_value_type(sig.return_type),
                           [context.get_value_type(t) for t in sig.args])
    fn = cgutils.get_or_insert_function(builder.module, fnty, symbol)
    args = [builder.bitcast(a, t) if a.type != t else a for a, t in zip(args, fnty.args)]
    return builder.call(fn, args)


_BODY_PREFIX = "out_of_line__"


def call_out_of_line(context, builder, symbol, leading, args):
    """Call ``symbol`` through a body of its own, ``out_of_line__<symbol>__<leading...>``, that passes the
    integer constants ``leading`` (a coop kind named by its suffix) as its first arguments and ``args``
    after them: each of the C parameter's type, except the device communicator (the struct's value),
    passed as its words, one parameter each, rather than as ``const ncclDevComm*``.

    For the GIN library, whose functions are NCCL's network code (a GDAKI put is a few hundred lines of
    verbs): inlined at every call site, the link compiled that code once per site. The body is made once
    per module (``linkonce_odr``: NVVM keeps one of the copies the kernel's modules hold), the support
    function and its constants are inlined into it, and the link's optimiser may not inline it
    (``noinline``), so the link compiles it once per kernel. (Not ``noduplicate``, as the Flow steps are:
    a function that calls one is not inlined either, so numba's wrapper around the call stayed out of line
    too.) The communicator crosses as words because a pointer to the caller's copy would keep that copy
    in local memory at every call (the words stored, then loaded again in the body), and so would the
    struct passed whole (a 256-byte parameter is passed on the stack); as words, the copy the support
    function reads is the body's own, which the link folds into registers as at an inlined call. The
    PTX still passes every word (the MoE example's put reads 5 of 32), but ptxas, which sees the whole
    call graph, sets only the registers the body reads: a call costs a few moves. No dots in the name:
    NVVM refuses them."""
    from numba.core import cgutils  # noqa: PLC0415

    sig = SIGNATURES[symbol]
    fnty = ir.FunctionType(context.get_value_type(sig.return_type),
                           [context.get_value_type(t) for t in sig.args])
    name = _BODY_PREFIX + "__".join([symbol, *(COOP_SUFFIX[c] if isinstance(c, CoopKind) else str(int(c))
                                               for c in leading)])
    by_value = {at - len(leading) for at in _DEVCOMM_PARAMS[symbol]}
    params, passed = [], []
    for i, (arg, c_type) in enumerate(zip(args, fnty.args[len(leading):])):
        if i in by_value:
            words = _leaves(arg.type)
            params += [ty for _, ty in words]
            passed += [builder.extract_value(arg, path) for path, _ in words]
        else:
            params.append(c_type)
            passed.append(builder.bitcast(arg, c_type) if arg.type != c_type else arg)
    body = cgutils.get_or_insert_function(builder.module, ir.FunctionType(fnty.return_type, params), name)
    if body.is_declaration:
        body.linkage = "linkonce_odr"
        body.attributes.add("noinline")
        inner = ir.IRBuilder(body.append_basic_block())
        received, c_args = iter(body.args), []
        for i, arg in enumerate(args):
            if i in by_value:
                value = ir.Constant(arg.type, None)
                for path, _ in _leaves(arg.type):
                    value = inner.insert_value(value, next(received), path)
                copy = inner.alloca(arg.type)
                copy.align = 16
                inner.store(value, copy)
                c_args.append(inner.bitcast(copy, cgutils.voidptr_t))
            else:
                c_args.append(next(received))
        target = cgutils.get_or_insert_function(builder.module, fnty, symbol)
        constants = [ir.Constant(t, int(c)) for t, c in zip(fnty.args, leading)]
        result = inner.call(target, constants + c_args)
        inner.ret_void() if isinstance(fnty.return_type, ir.VoidType) else inner.ret(result)
    return builder.call(body, passed)


def inline_bodies_called_once(modules) -> None:
    """Let the link inline each :func:`call_out_of_line` body that the kernel calls from one place only.

    A body pays off where the kernel calls it from several places; called from one, it is only a
    call more than the inlined code (Flow's GIN transport calls each kind from one out-of-line
    function). The places are counted through the kernel's call graph in ``modules`` (numba's
    LLVM modules, before NVVM): a call in a function the link inlines is made once per place that
    function is inlined, a call in an out-of-line function (``noinline``) or the kernel once. Such a
    body becomes ``alwaysinline``, so the code is the same as a direct call of the support function."""
    from llvmlite import ir as llvm_ir  # noqa: PLC0415

    if not any(fn.name.startswith(_BODY_PREFIX) for mod in modules for fn in mod.functions):
        return  # no GIN call: nothing to walk (a collective's 84 functions)
    defined, calls, bodies = {}, {}, {}
    for mod in modules:
        for fn in mod.functions:
            if fn.is_declaration:
                continue
            if fn.name.startswith(_BODY_PREFIX):  # each module that calls a body holds a copy of it
                bodies.setdefault(fn.name, []).append(fn)
            if fn.name in defined:
                continue
            defined[fn.name] = fn
            calls[fn.name] = [instr.callee.name for block in fn.blocks for instr in block.instructions
                              if isinstance(instr, llvm_ir.CallInstr) and isinstance(instr.callee, llvm_ir.Function)]
    callers = {}
    for caller, callees in calls.items():
        for callee in callees:
            callers.setdefault(callee, []).append(caller)

    copies: dict[str, int] = {}

    def copies_of(name, seen=()):
        """How many times the body of function ``name`` is in the linked kernel (2: more than once)."""
        if name in copies:
            return copies[name]
        if name in seen:  # a cycle: leave it out of line
            return 2
        fn = defined[name]
        if name not in callers or "noinline" in fn.attributes:
            n = 1
        else:
            n = min(2, sum(copies_of(caller, (*seen, name)) for caller in callers[name]))
        copies[name] = n
        return n

    for name, copies_in_modules in bodies.items():
        once = sum(copies_of(caller) for caller in callers.get(name, ())) == 1
        for fn in copies_in_modules:  # set both ways: numba shares these modules with other kernels
            fn.attributes.discard("alwaysinline" if not once else "noinline")
            fn.attributes.add("alwaysinline" if once else "noinline")


def _leaves(ty, path=()):
    """``(index path, scalar type)`` of each scalar in the aggregate LLVM type ``ty``, in order."""
    if isinstance(ty, ir.BaseStructType):
        return [leaf for i, member in enumerate(ty.elements) for leaf in _leaves(member, (*path, i))]
    if isinstance(ty, ir.ArrayType):
        return [leaf for i in range(ty.count) for leaf in _leaves(ty.element, (*path, i))]
    return [(list(path), ty)]


def extern_symbol(stub, coop=None, stem: str | None = None) -> str:
    """The C function ``stub`` calls (its spec's ``extern``, or ``stem``), that of ``coop``'s kind for a
    coop row (the calling thread's when ``coop`` is None)."""
    stem = stem or spec_of(stub).extern
    if not by_name(stem).coop:
        return stem
    return f"{stem}__{COOP_SUFFIX[CoopKind.THREAD if coop is None else coop.kind]}"


def extern(stub, coop=None, stem: str | None = None):
    """The declared C function of :func:`extern_symbol`."""
    return DECLARED[extern_symbol(stub, coop, stem)]
