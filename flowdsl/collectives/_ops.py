"""The ``op=`` of the reducing collectives: NCCL's five named operators, and :func:`premul_sum`.

:func:`premul_sum` is NCCL's ``ncclRedOpCreatePreMulSum``: every rank multiplies its own input
by its own scalar (the scalars may differ across ranks), then the products are summed. The
scalar is a host immediate (a number, taken when the op is made) or a one-element device
array (read by the kernel when it runs, so a CUDA graph's replay sees the value of that
moment), always in the element type of the data (NCCL takes it in the data's
``datatype``). How it is checked against a call's data and turned into kernel arguments is
here too (host code, NumPy only).
"""

from __future__ import annotations

import numbers

import numpy as np

from .. import _fp8
from ..host.arrays import cuda_array_interface, is_torch
from .._flow_elements import _float_to_bf16
from ..errors import UsageError

__all__ = ["PreMulSum", "premul_sum", "HOST", "DEVICE"]

#: Where a :class:`PreMulSum`'s scalar lives (NCCL's ``ncclScalarHostImmediate`` / ``ncclScalarDevice``).
HOST, DEVICE = "host", "device"
_FP8 = {"float8_e4m3fn": _fp8.E4M3, "float8_e5m2": _fp8.E5M2}


class PreMulSum:
    """A pre-multiplied sum: ``op=`` of :func:`~flowdsl.collectives.all_reduce`, ``reduce`` and
    ``reduce_scatter`` (make one with :func:`premul_sum`).

    Attributes:
        scalar: The host immediate (a Python or NumPy number), or the one-element device array.
        residence: ``"host"`` or ``"device"``.
    """

    __slots__ = ("scalar", "residence", "key")

    def __init__(self, scalar, residence: str, key: tuple):
        self.scalar, self.residence, self.key = scalar, residence, key

    def __eq__(self, other):
        return isinstance(other, PreMulSum) and other.key == self.key

    def __hash__(self):
        return hash(self.key)

    def __repr__(self):
        if self.residence == HOST:
            return f"premul_sum({self.scalar!r})"
        return f"premul_sum(<one-element {getattr(self.scalar, 'dtype', '?')} device array>)"


def _is_device_array(x) -> bool:
    """A device array (CuPy, a PyTorch tensor, the simulator's buffers), not a NumPy host array."""
    if isinstance(x, np.ndarray):
        return getattr(x, "__flowdsl_sim__", False) is not False
    return is_torch(x) or cuda_array_interface(x) is not None  # torch first: fp8 tensors have no interface


def _size(x) -> int:
    numel = getattr(x, "numel", None)
    return int(numel()) if callable(numel) else int(np.prod(getattr(x, "shape", ()), dtype=np.int64))


def _pointer(x) -> int:
    data_ptr = getattr(x, "data_ptr", None)
    if callable(data_ptr):
        return int(data_ptr())
    if isinstance(x, np.ndarray):
        return int(x.__array_interface__["data"][0])
    return int(cuda_array_interface(x)["data"][0])


def premul_sum(scalar) -> PreMulSum:
    """``op=`` that multiplies each rank's input by ``scalar`` (this rank's), then sums over ranks.

    Args:
        scalar: A number (an int or float, or a NumPy scalar or one-element NumPy array): a host
            immediate, frozen now (a CUDA graph captured with it replays this value). Or a
            one-element device array (CuPy, a PyTorch CUDA tensor, or on the simulator a
            ``comm.alloc`` buffer) of the data's element type (its bits for bfloat16 or fp8 in
            uint16/uint8 arrays): read by the kernel when it runs. It is converted to the data's
            element type at the call, and refused there if the type cannot hold it.

    Returns:
        A :class:`PreMulSum`; calls with equal scalars (the same device array) reuse one plan.
    """
    if _is_device_array(scalar):
        if _size(scalar) != 1:
            raise UsageError(f"Cannot make premul_sum over a device array of {_size(scalar)} elements: the scalar "
                             "is one element. Pass a one-element array (or a number)")
        return PreMulSum(scalar, DEVICE, (DEVICE, id(scalar), _pointer(scalar), str(scalar.dtype)))
    if isinstance(scalar, np.ndarray):
        if scalar.size != 1:
            raise UsageError(f"Cannot make premul_sum over a NumPy array of {scalar.size} elements: the scalar is "
                             "one number. Pass a number, or a one-element device array")
        scalar = scalar.reshape(-1)[0]  # a host immediate: its value now
    if isinstance(scalar, (bool, np.bool_)) or not isinstance(scalar, (numbers.Integral, numbers.Real)):
        raise UsageError(f"Cannot make premul_sum({scalar!r}): the scalar must be a real number (a host immediate) "
                         f"or a one-element device array, got {type(scalar).__name__}. Pass an int or a float")
    return PreMulSum(scalar, HOST, (HOST, type(scalar).__name__, scalar if scalar == scalar else "nan"))


# ---- a call's scalar: checked against its data, made into kernel arguments --------------------

def host_bits(op: PreMulSum, dtype: str, operation: str) -> int:
    """The host immediate's bits in ``dtype`` (a collectives dtype name), as a signed 64-bit int (how
    the kernel takes them); refused if ``dtype`` cannot hold the value."""
    value = op.scalar
    where = f"Cannot {operation} {dtype} with {op!r}"
    kind = np.dtype(dtype).kind if dtype not in _FP8 and dtype != "bfloat16" else "f"
    if kind in "iu":
        if isinstance(value, numbers.Integral):
            integer = int(value)
        elif float(value).is_integer():
            integer = int(value)
        else:
            raise UsageError(f"{where}: {value!r} is not an integer, and NCCL takes the scalar in the data's type. "
                             f"Pass an integer scalar")
        info = np.iinfo(dtype)
        if not info.min <= integer <= info.max:
            raise UsageError(f"{where}: {integer} is outside {dtype}'s range ({info.min}..{info.max}). Pass a scalar "
                             f"that {dtype} holds")
        stored = np.array(integer, dtype)
    else:
        x = float(value)
        if dtype in _FP8:
            largest = float(np.nanmax(_fp8.values(_FP8[dtype])))
            if abs(x) > largest:  # infinities too: the conversion saturates (NCCL's __NV_SATFINITE)
                raise UsageError(f"{where}: {x!r} is outside {dtype}'s range (±{largest:g}). Pass a scalar that "
                                 f"{dtype} holds")
            stored = _fp8.to_fp8(x, _FP8[dtype])
        else:
            with np.errstate(over="ignore"):
                stored = _float_to_bf16(np.float32(x)) if dtype == "bfloat16" else np.array(x, dtype)
            if np.isinf(_float_value(stored, dtype)) and np.isfinite(x):
                largest = _float_value(np.uint16(0x7F7F), dtype) if dtype == "bfloat16" else float(np.finfo(dtype).max)
                raise UsageError(f"{where}: {x!r} is outside {dtype}'s range (±{largest:g}). Pass a scalar that "
                                 f"{dtype} holds")
    raw = np.asarray(stored).reshape(1)
    bits = int(raw.view(f"u{raw.itemsize}")[0])
    return bits - (1 << 64) if bits >= 1 << 63 else bits


def _float_value(stored, dtype: str) -> float:
    """The value of a float16/32/64 scalar, or of bfloat16 bits."""
    if dtype == "bfloat16":
        return float(np.array(np.uint32(int(stored) << 16)).view(np.float32))
    return float(stored)
