"""numba-cuda's device-dispatcher API on ``@flowdsl.device`` functions: ``overloads``, ``compile_device``,
``inspect_asm``, ``inspect_llvm`` (and ``inspect_sass``, refused as numba-cuda refuses it). The kernel layer's, as
the same API on kernels is :mod:`flowdsl._kernel`'s: it compiles, so the device surface (:mod:`flowdsl._devices`)
is given it here rather than importing the compiler.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from . import _devices

__all__ = ["DeclaredOverloads"]


def _attach(fn, signature) -> None:
    fn.overloads = DeclaredOverloads(fn, signature)
    fn.signatures = _Signatures(fn.overloads)
    fn.compile_device = lambda args, return_type=None: fn.overloads.compile(tuple(args), return_type)
    fn.inspect_asm = functools.partial(_inspect_asm, fn)
    fn.inspect_llvm = functools.partial(_inspect_llvm, fn)
    fn.inspect_sass = functools.partial(_inspect_sass, fn)


_devices.install_dispatcher_api(_attach)


class _Signatures(Sequence):
    """numba-cuda's ``signatures`` of a device function: the argument types of its ``overloads``, in order."""

    def __init__(self, overloads):
        self._overloads = overloads

    def __getitem__(self, i):
        return list(self._overloads)[i]

    def __len__(self) -> int:
        return len(self._overloads)


class DeclaredOverloads(Mapping):
    """numba-cuda's ``overloads`` of a device function: argument types -> numba's compile result of the function
    alone (``.signature``, ``.fndesc``, ``.library``), for the signatures declared at decoration and those
    ``compile_device`` compiled. A flowdsl device function is compiled inside its callers, so it lists no others.
    The declared ones are compiled when first read (making a device function imports no numba)."""

    def __init__(self, fn, signature):
        self._fn, self._declared, self._entries = fn, signature, None

    def _load(self) -> dict:
        if self._entries is None:
            self._entries = {}
            for signature in self.declared_signatures():
                self.compile(tuple(signature.args), signature.return_type)
        return self._entries

    @property
    def declared(self):
        """The signature (or list) declared at decoration, as given, or None."""
        return self._declared

    def declared_signatures(self) -> list:
        """numba signatures of the types declared at decoration (numba's parser of its signatures), or []."""
        declared = self._declared
        if declared is None:
            return []
        from numba.core import sigutils, typing  # noqa: PLC0415

        return [typing.signature(returns, *args) for args, returns in
                (sigutils.normalize_signature(one) for one in (declared if isinstance(declared, list) else [declared]))]

    def conversions(self, given: tuple, context, kwargs=None):
        """How a call with argument types ``given`` takes a declared signature, as numba-cuda's device dispatcher
        takes only those: per argument the numba type its number is converted to (None: taken as it is, arrays of
        another layout included), for the declared signature numba's rules (``context``'s) choose, a tie taking
        the first; None where no declared signature takes them (numba's typing error). The GPU's lowering and the
        simulator both ask this."""
        from numba.core import types  # noqa: PLC0415

        chosen = context.resolve_overload(self._fn, self.declared_signatures(), given, kwargs or {},
                                          allow_ambiguous=True)
        if chosen is None:
            return None
        return tuple(d if d != g and isinstance(d, (types.Number, types.Boolean)) else None
                     for d, g in zip(chosen.args, given))

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

    return compiler.backend.compile_device(fn, args, _device_cc(), return_type, **fn.__flowdsl_jit_options__)


def _device_cc() -> tuple[int, int]:
    from . import _targets  # noqa: PLC0415

    try:
        return _targets.device_target().cc
    except Exception:  # noqa: BLE001 - no GPU: the code an sm_90 would run
        return (9, 0)


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
