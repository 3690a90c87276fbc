"""The numba types of kernel arguments: at launch (cheaply, for the common kinds) and for explicit compiles.

A launch types its arguments itself, as numba-cuda would; :func:`argtypes_for` types host
values and the stand-ins ``"devcomm"``, ``("window", dtype)`` and ``("staging", dtype)``.
"""

from __future__ import annotations

import functools

import numpy as np
from numba.core import types

from .host.arrays import cuda_array_interface
from ._release import parse_version
from .errors import UsageError, without_colours

__all__ = ["argument_type", "array_type", "argtypes_for", "scalar_types"]

_SCALARS = {int: types.int64, float: types.float64, bool: types.boolean}


def argument_type(kernel_name: str, index: int, arg, operation: str = "launch"):
    """numba type of a launch argument, cheaply for the common kinds (the launch hot path). A simulator's
    object that is not an array (a device communicator, a window) is ``pyobject``: the simulator types
    nothing, and its launches take it as it is (``specialize`` and a list of signatures on the simulator)."""
    kind = type(arg)
    ty = _SCALARS.get(kind)
    if ty is not None:
        return ty
    typer = _TYPER_OF.get(kind, _unknown)
    if typer is _unknown:
        typer = _TYPER_OF[kind] = _typer(kind)
    if typer is not None:
        return typer(arg)
    ty = getattr(arg, "_numba_type_", None)
    if ty is not None:
        return ty
    if getattr(arg, "__flowdsl_sim__", False) and not isinstance(arg, np.ndarray):
        return types.pyobject
    cai = cuda_array_interface(arg)
    if cai is not None:
        return array_type(cai["typestr"], len(cai["shape"]), cai.get("strides") is None)
    from .lowering.backend import argument_type  # noqa: PLC0415

    try:
        ty = argument_type(arg)
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"Cannot {operation} {kernel_name}: argument {index} ({type(arg).__name__}) has no "
                         f"kernel type: {without_colours(str(exc))}") from exc
    if ty is None:
        raise UsageError(f"Cannot {operation} {kernel_name}: argument {index} of type {type(arg).__name__} "
                         "cannot be passed to a kernel (pass device arrays, scalars, windows and "
                         "device communicators)")
    return ty


#: argument type -> a function giving its numba type without __cuda_array_interface__ (which
#: CuPy builds as a new dict at every access), or None for the general path.
_TYPER_OF: dict = {}
_unknown = object()


def _typer(kind):
    if (kind.__module__ or "").startswith("cupy") and hasattr(kind, "flags") and hasattr(kind, "data"):
        return lambda a: array_type(a.dtype, a.ndim, a.flags.c_contiguous)  # the dtype: bfloat16's typestr is |V2
    return None


@functools.cache
def array_type(dtype, ndim: int, c_contiguous: bool):
    """numba's array type of elements ``dtype`` (a NumPy dtype, or the typestr of an array interface)."""
    import numpy as np  # noqa: PLC0415
    from .lowering.backend import numpy_to_type  # noqa: PLC0415

    return types.Array(numpy_to_type(np.dtype(dtype)), ndim, "C" if c_contiguous else "A")


def argtypes_for(*args, nccl: str | tuple | None = None) -> tuple:
    """numba types of host arguments (:meth:`flowdsl.FlowKernel.argtypes_for`)."""
    import numpy as np  # noqa: PLC0415

    from .lowering.backend import argument_type, numpy_to_type  # noqa: PLC0415
    from .lowering.types import DevCommType, WindowType, devcomm_words  # noqa: PLC0415
    from .runtime import nccl as nccl_runtime  # noqa: PLC0415
    from .runtime.support import abi_layout  # noqa: PLC0415

    version = parse_version(nccl) if nccl is not None else nccl_runtime.loaded_version()
    out = []
    for arg in args:
        if isinstance(arg, str) and arg == "devcomm":
            out.append(DevCommType(version, devcomm_words(abi_layout(version)["dev_comm_size"])))
        elif isinstance(arg, tuple) and arg and isinstance(arg[0], str) and arg[0] in ("window", "staging"):
            out.append(WindowType(numpy_to_type(np.dtype(arg[1])), staging=arg[0] == "staging"))
        elif isinstance(arg, types.Type):
            out.append(arg)
        elif isinstance(arg, np.ndarray):  # stands for a device array of the same dtype and shape
            out.append(array_type(arg.dtype, arg.ndim, arg.flags.c_contiguous))
        else:
            try:
                out.append(argument_type(arg))
            except Exception as exc:  # noqa: BLE001 - numba's own error for a value it cannot type
                raise UsageError(f"Cannot make the kernel argument type of {type(arg).__name__} {arg!r:.60}: {exc}. "
                                 "Pass a NumPy array (for a device array of its dtype and shape), a scalar, a numba "
                                 "type, \"devcomm\", (\"window\", dtype) or (\"staging\", dtype)") from exc
    return tuple(out)


def scalar_types(argtypes):
    """Per argument, the NumPy type a scalar argument takes under declared ``argtypes`` (None: not a scalar;
    None for no ``argtypes``); a C pointer's place takes an int as :class:`DevicePointer`."""
    if argtypes is None:
        return None
    from numba.core import types  # noqa: PLC0415
    from numba.np.numpy_support import as_dtype  # noqa: PLC0415

    return tuple(as_dtype(t).type if isinstance(t, (types.Number, types.Boolean))
                 else functools.partial(DevicePointer, numba_type=t) if isinstance(t, types.CPointer) else None
                 for t in argtypes)


class DevicePointer:
    """An int passed where a kernel's signature declares a C pointer (``types.CPointer(float32)``): the device
    address, typed as that pointer, as numba-cuda passes an int for it."""

    __slots__ = ("value", "_numba_type_")

    def __init__(self, value, numba_type):
        self.value, self._numba_type_ = int(value), numba_type
