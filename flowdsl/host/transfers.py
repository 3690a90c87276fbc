"""Host NumPy arrays passed to a kernel launch, as numba-cuda takes them.

numba-cuda copies a host array argument to the device before the launch and back after it,
with a ``NumbaPerformanceWarning``; ``numba.cuda.In(a)`` copies in only, ``Out(a)`` back only
and ``InOut(a)`` both, without the warning. A launch that copies back returns when the copy
has landed (the kernel has finished); one that copies in only returns at once. The GPU path
and the simulator share this module, so both take the same arguments and give the same
results: on the simulator a kernel also works on a copy, and an ``In`` array it writes stays
unchanged on the host.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..errors import UsageError
from .arrays import is_torch

__all__ = ["HostTransfers", "host_transfers", "simulated_copy_in", "simulated_empty_like", "simulated_copy_out"]

#: numba-cuda's words, which its users' tests match.
IMPLICIT_COPY_WARNING = "Host array used in CUDA kernel will incur copy overhead to/from device."

#: Byte the simulator fills an ``Out`` array's device copy with: its contents are undefined on a GPU.
_OUT_POISON = 0xFF


def _hint(value):
    """``(copy_in, copy_out)`` of a ``numba.cuda.In/Out/InOut`` (numba-cuda's or its simulator's), else None."""
    kind = type(value)
    if kind.__name__ in ("In", "Out", "InOut") and kind.__module__.startswith("numba.cuda") and hasattr(value, "value"):
        return {"In": (True, False), "Out": (False, True), "InOut": (True, True)}[kind.__name__]
    return None


def _is_host_array(value) -> bool:
    """A NumPy array in host memory: neither simulated device memory nor mapped or managed memory (those
    have ``__cuda_array_interface__`` and are passed as they are)."""
    if not isinstance(value, np.ndarray) or getattr(value, "__flowdsl_sim__", False):
        return False
    try:
        return getattr(value, "__cuda_array_interface__", None) is None
    except Exception:  # noqa: BLE001 - an interface that raises is not a device array's
        return True


class HostTransfers:
    """The host arrays of one launch: which argument, whether it is copied in, whether back."""

    def __init__(self, kernel_name: str, places: list[tuple[int, np.ndarray, bool, bool]], implicit: bool):
        self.kernel_name = kernel_name
        self.places = places  # (argument index, array, copy in, copy out); neither: device memory in a hint
        self.implicit = implicit  # a plain array among them: numba's performance warning
        self.copies_back = any(out for _, _, _, out in places)
        self._device: list = []

    def to_device(self, args: tuple, copy_in, empty_like) -> tuple:
        """``args`` with each host array replaced by its device copy: ``copy_in(host)`` (a copy of its
        contents) or ``empty_like(host)`` (``Out``: contents undefined)."""
        if self.implicit:
            _warn_implicit_copy()
        args = list(args)
        self._device = []
        for index, host, copy, out in self.places:
            device = copy_in(host) if copy else empty_like(host) if out else host
            self._device.append(device)
            args[index] = device
        return tuple(args)

    def back(self, copy_out) -> None:
        """Copy the device copies of ``Out``/``InOut`` and plain arrays back: ``copy_out(device, host)``
        (called after the kernel, on its stream)."""
        for (_, host, _, out), device in zip(self.places, self._device):
            if out:
                copy_out(device, host)
        self._device = []

    def refuse_prepare(self) -> None:
        """A prepared launch cannot copy at each replay: refuse host arrays (hints around device memory pass)."""
        index = next((i for i, _, copy, out in self.places if copy or out), None)
        if index is None:
            return
        raise UsageError(f"Cannot prepare a launch of {self.kernel_name} with a host NumPy array (argument {index}): "
                         "a prepared launch replays the same device memory, and a host array is copied in and out "
                         "at each launch. Pass device memory (comm.alloc, cupy.asarray, numba.cuda.to_device) to "
                         "prepare, or launch it directly")


def host_transfers(kernel_name: str, args: tuple) -> HostTransfers | None:
    """The host arrays and ``In/Out/InOut`` hints among ``args`` (None: there are none, the common case)."""
    places = None
    implicit = False
    for index, value in enumerate(args):
        kind = type(value)
        if kind in _PLAIN:  # scalars, windows, CuPy arrays, ...: known at their first launch
            continue
        if kind in _CONTAINERS:  # numba-cuda refuses them at the launch: so do both paths, naming the fix
            raise UsageError(f"Cannot launch {kernel_name}: argument {index} is a Python {kind.__name__}, which a "
                             "kernel cannot take. Pass a NumPy array (np.asarray(...)) or a device array")
        if getattr(value, "requires_grad", False) and is_torch(value):  # PyTorch would refuse it in its own words
            raise UsageError(f"Cannot launch {kernel_name}: argument {index} is a PyTorch tensor that requires grad, "
                             "which cannot be passed to a kernel (autograd would not see what the kernel does to "
                             "it). Pass tensor.detach(), or make the kernel a torch operator (flowdsl.torch) to "
                             "give it a backward")
        hint = _hint(value)
        if hint is not None:
            places = places if places is not None else []
            # Device memory in a hint is passed as it is (numba-cuda's rule): nothing to copy either way.
            places.append((index, value.value, *(hint if _is_host_array(value.value) else (False, False))))
        elif _is_host_array(value):
            places = places if places is not None else []
            places.append((index, value, True, True))
            implicit = True
        elif len(_PLAIN) < 256 and not is_torch(value):  # a tensor's requires_grad is read at every launch
            _PLAIN.add(kind)
    return HostTransfers(kernel_name, places, implicit) if places is not None else None


#: Types of arguments that are never host arrays or hints (a set that the launches fill).
_PLAIN: set = {int, float, bool}
#: Python containers a kernel cannot take (numba-cuda's launch refuses reflected lists and sets).
_CONTAINERS = (list, dict, set)


def _warn_implicit_copy() -> None:
    """numba-cuda's warning, under numba-cuda's settings (``NUMBA_CUDA_WARN_ON_IMPLICIT_COPY``,
    ``NUMBA_DISABLE_PERFORMANCE_WARNINGS``)."""
    try:
        from numba.cuda.core import config  # noqa: PLC0415
        from numba.cuda.core.errors import NumbaPerformanceWarning  # noqa: PLC0415
    except ImportError:  # pragma: no cover - numba-cuda is a dependency
        return
    if config.CUDA_WARN_ON_IMPLICIT_COPY and not config.DISABLE_PERFORMANCE_WARNINGS:
        warnings.warn(NumbaPerformanceWarning(IMPLICIT_COPY_WARNING), stacklevel=5)  # the user's launch


def simulated_copy_in(host: np.ndarray) -> np.ndarray:
    """The simulator's device copy of ``host`` (its memory is NumPy's)."""
    return np.array(host, copy=True, order="K")


def simulated_empty_like(host: np.ndarray) -> np.ndarray:
    """The simulator's device memory for an ``Out`` array: poisoned, as undefined memory may hold anything."""
    device = np.empty(host.shape, host.dtype)
    device.reshape(-1).view(np.uint8).fill(_OUT_POISON)
    return device


def simulated_copy_out(device: np.ndarray, host: np.ndarray) -> None:
    np.copyto(host, device)
