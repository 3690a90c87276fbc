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

__all__ = ["DECLARED", "NUMBA_TYPES", "signature_of", "call_extern", "extern"]

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


_SIGNATURES = {symbol: signature_of(ext) for ext in EXTERNS for symbol in ext.symbols()}


def call_extern(context, builder, symbol, args):
    """Emit a C-ABI call of ``symbol`` from lowering code (same signature as ``DECLARED``)."""
    from numba.core import cgutils  # noqa: PLC0415

    sig = _SIGNATURES[symbol]
    fnty = ir.FunctionType(context.get_value_type(sig.return_type),
                           [context.get_value_type(t) for t in sig.args])
    fn = cgutils.get_or_insert_function(builder.module, fnty, symbol)
    args = [builder.bitcast(a, t) if a.type != t else a for a, t in zip(args, fnty.args)]
    return builder.call(fn, args)


def extern(stub, coop=None, stem: str | None = None):
    """The declared C function ``stub`` calls (its spec's ``extern``, or ``stem``), that of ``coop``'s kind
    for a coop row (the calling thread's when ``coop`` is None)."""
    stem = stem or spec_of(stub).extern
    if not by_name(stem).coop:
        return DECLARED[stem]
    return DECLARED[f"{stem}__{COOP_SUFFIX[CoopKind.THREAD if coop is None else coop.kind]}"]
