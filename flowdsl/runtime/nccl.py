"""The loaded NCCL: its release, its library path and a ctypes handle to it.

nccl4py loads libnccl; flowdsl opens the same library with ctypes for the
device-communicator calls whose nccl4py wrappers assume the newest ABI.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import sys

from ..errors import FlowDSLError

__all__ = ["loaded_version", "library", "check", "NcclError", "without_torch_probe"]


class NcclError(FlowDSLError, RuntimeError):
    """An NCCL call returned an error code."""


def _bindings():
    try:
        from nccl.bindings import nccl as bindings  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - nccl4py is a dependency
        raise FlowDSLError("Cannot load NCCL: nccl4py is not installed. pip install nccl4py "
                           "nvidia-nccl-cu13") from exc
    return bindings


@functools.cache
def loaded_version() -> tuple[int, int, int]:
    """Release of the libnccl that nccl4py loaded, e.g. ``(2, 28, 9)``."""
    code = _bindings().get_version()
    return code // 10000, (code // 100) % 100, code % 100


@functools.cache
def library() -> ctypes.CDLL:
    """ctypes handle to the very libnccl nccl4py loaded."""
    path = _bindings().get_library_path()
    if not path:
        raise FlowDSLError("Cannot find libnccl: nccl4py did not report a library path. "
                           "pip install nvidia-nccl-cu13")
    lib = ctypes.CDLL(str(path))
    lib.ncclDevCommCreate.restype = ctypes.c_int
    lib.ncclDevCommCreate.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.ncclDevCommDestroy.restype = ctypes.c_int
    lib.ncclDevCommDestroy.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    lib.ncclGetErrorString.argtypes = [ctypes.c_int]
    return lib


def check(result: int, operation: str) -> None:
    """Raise :class:`NcclError` naming ``operation`` if ``result`` is not ncclSuccess."""
    if result != 0:
        text = library().ncclGetErrorString(result).decode()
        raise NcclError(f"Cannot {operation}: NCCL returned {result} ({text})")


_TORCH_INTEROP = "nccl.core.interop.torch"


@contextlib.contextmanager
def without_torch_probe():
    """Around an nccl4py call that takes buffers, while the process has not imported PyTorch.

    nccl4py resolves every buffer through its PyTorch interop first, which imports torch:
    seconds on the first call of a process that never uses it (the first window a collective
    registers). Without torch imported no buffer can be a tensor, so the interop is hidden for
    the call and nccl4py takes its CuPy path directly.
    """
    if "torch" in sys.modules or sys.modules.get(_TORCH_INTEROP) is not None:
        yield
        return
    sys.modules[_TORCH_INTEROP] = None  # a None entry makes the import raise ImportError
    try:
        yield
    finally:
        if _TORCH_INTEROP in sys.modules and sys.modules[_TORCH_INTEROP] is None:
            del sys.modules[_TORCH_INTEROP]
