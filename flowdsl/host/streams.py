"""CUDA streams: what a user's ``stream=`` means, and what may not run during graph capture.

Kernel launches and collectives take ``stream=`` in the forms frameworks hand out. This
module is the one place that turns it into a driver stream handle (the ``CUstream`` as an
int), so the GPU runtime and the simulator accept and refuse the same values. With
``stream=None`` work goes on the current stream of the framework the arrays come from, as
that framework's own kernels would: inside ``torch.cuda.graph(...)`` that is the capture
stream, inside CuPy's ``with stream:`` that stream.

Resolution runs on every call of a repeated collective (its plan is keyed by the handle), so
each type's form is found once and remembered, and no framework is imported here: a stream
or array of a framework's type means the framework is already loaded.
"""

from __future__ import annotations

import ctypes
import operator
import sys

from ..errors import UsageError

__all__ = ["LEGACY_DEFAULT_STREAM", "ACCEPTED_STREAMS", "stream_handle", "current_streams", "is_capturing",
           "refuse_during_capture", "WARM_UP", "wait_for_producers"]

#: The legacy default stream (what a launch without a stream used before streams were resolved).
LEGACY_DEFAULT_STREAM = 0
#: The forms ``stream=`` takes, as error messages list them.
ACCEPTED_STREAMS = ("a CUDA stream (an object with __cuda_stream__; a CuPy, PyTorch, numba or cuda.core "
                    "stream; or a handle as an int)")
#: The fix for work that cannot be captured.
WARM_UP = "Call it once before capturing (a warm-up, as torch.cuda.graph's docs advise)"

_MAX_HANDLE = 1 << 64


def _as_handle(value):
    """``value`` as a ``CUstream`` address, or None when it is not one."""
    if isinstance(value, int) and not isinstance(value, bool):  # also cuda.bindings' int enums
        value = int(value)
        return value if 0 <= value < _MAX_HANDLE else None
    if isinstance(value, ctypes.c_void_p):
        return value.value or 0
    if value is None or isinstance(value, (bool, float, str, bytes)):
        return None
    try:
        value = int(value)  # cuda.bindings' CUstream
    except (TypeError, ValueError):
        return None
    return value if 0 <= value < _MAX_HANDLE else None


def _from_protocol(stream):
    """cuda.core's convention: ``__cuda_stream__()`` returns ``(version, handle)``."""
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is None:
        return None
    value = protocol() if callable(protocol) else protocol
    if not isinstance(value, tuple) or len(value) != 2:
        return None
    return _as_handle(value[1])


def _from_ptr(stream):  # CuPy
    return _as_handle(getattr(stream, "ptr", None))


def _from_cuda_stream(stream):  # PyTorch
    return _as_handle(getattr(stream, "cuda_stream", None))


def _from_handle(stream):  # numba, cuda.core: a CUstream (other objects have handles too: events, windows)
    value = getattr(stream, "handle", None)
    if isinstance(value, (int, ctypes.c_void_p)) or type(value).__name__ == "CUstream":
        return _as_handle(value)
    return None


def _from_int(stream):  # a handle: an int, a NumPy integer, or cuda.bindings' CUstream
    if isinstance(stream, bool):
        return None
    if hasattr(type(stream), "__index__"):
        return _as_handle(operator.index(stream))
    return _as_handle(stream) if type(stream).__name__ == "CUstream" else None


def _from_numba_simulator(stream):
    """numba-cuda's own simulator (``NUMBA_ENABLE_CUDASIM=1``, no GPU at all) makes streams without a handle;
    a simulated rank has one stream, so it is that one (numba's simulator orders nothing by stream either)."""
    return LEGACY_DEFAULT_STREAM if type(stream).__module__ == "numba.cuda.simulator.api" else None


#: The forms in the order they are tried.
_READERS = (_from_protocol, _from_ptr, _from_cuda_stream, _from_handle, _from_int, _from_numba_simulator)
#: type -> the reader that worked for its first instance (tried first for the next ones).
_READER_OF: dict = {}
#: array type -> a function giving its framework's current stream, or None for other types.
_CURRENT_OF: dict = {}


def stream_handle(stream, arrays=(), operation: str = "launch") -> int:
    """The driver stream handle that ``stream=`` names.

    Args:
        stream: An object with ``__cuda_stream__`` (cuda.core's protocol, a method returning
            ``(version, handle)``), a CuPy stream (``.ptr``), a PyTorch stream
            (``.cuda_stream``), a numba or cuda.core stream (``.handle``) or a handle (int).
            ``None``: the current stream of the framework of the first PyTorch tensor or CuPy
            array in ``arrays``; the legacy default stream (0) when there is none.
        arrays: The call's arguments; read only when ``stream`` is None.
        operation: What the caller is doing, for the error (``"all_reduce"``, ``"launch k"``).

    Returns:
        The ``CUstream`` as an int (0 is the legacy default stream).

    Raises:
        UsageError: ``stream`` is none of the accepted forms.
    """
    if stream is None:
        for array in arrays:
            current = _CURRENT_OF.get(type(array), _current_reader)
            if current is _current_reader:
                current = _CURRENT_OF[type(array)] = _current_reader(type(array))
            if current is not None:
                return current(array)
        return LEGACY_DEFAULT_STREAM
    if type(stream) is int and 0 <= stream < _MAX_HANDLE:
        return stream
    reader = _READER_OF.get(type(stream))
    handle = reader(stream) if reader is not None else None
    if handle is not None:
        return handle
    for reader in _READERS:
        handle = reader(stream)
        if handle is not None:
            _READER_OF[type(stream)] = reader
            return handle
    raise UsageError(f"Cannot {operation}: stream= got {_describe(stream)}; pass {ACCEPTED_STREAMS}, or None "
                     "for the current stream of the arrays' framework")


#: array type -> a function giving the stream an array names in its CUDA Array Interface (v3's ``stream``), or
#: None for types that never name one.
_PRODUCER_OF: dict = {}


def _producer_reader(array):
    module = type(array).__module__ or ""
    if module.startswith(("torch", "cupy")) or not hasattr(array, "__cuda_array_interface__"):
        # PyTorch's interface names no stream; CuPy's names its current stream (where a launch without a stream
        # goes), not the one that made the array: neither has a producer to wait for
        return None
    if module.startswith("numba") and hasattr(type(array), "device_ctypes_pointer") and hasattr(array, "stream"):
        # a device array of numba-cuda: its interface names a stream only when it was bound to one
        return lambda a: a.__cuda_array_interface__.get("stream") if a.stream else None
    return lambda a: a.__cuda_array_interface__.get("stream")


def wait_for_producers(arrays, stream: int) -> None:
    """The CUDA Array Interface's rule on a stream an array names (v3: the stream its data is made on), kept as
    numba-cuda keeps it for a launch: that stream is synchronised before a kernel on another stream reads the
    array, so the kernel never reads data still being written; ``NUMBA_CUDA_ARRAY_INTERFACE_SYNC=0`` turns it
    off, as in numba-cuda. The legacy default stream is 0 or 1 (the interface's name for it)."""
    for array in arrays:
        read = _PRODUCER_OF.get(type(array), _producer_reader)
        if read is _producer_reader:
            read = _PRODUCER_OF[type(array)] = _producer_reader(array)
        if read is None:
            continue
        producer = read(array)
        if not producer or producer == stream or (producer == 1 and stream == LEGACY_DEFAULT_STREAM):
            continue
        from numba import cuda  # noqa: PLC0415 - an array that names a stream: a GPU launch, numba-cuda loaded
        from numba.cuda.core import config  # noqa: PLC0415

        if config.CUDA_ARRAY_INTERFACE_SYNC:
            cuda.external_stream(producer).synchronize()


def _describe(stream) -> str:
    if isinstance(stream, (int, float, str, bytes)):
        return repr(stream)[:40]
    kind = type(stream)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"a value of type {name}"


def _current_reader(kind):
    """How to read the current stream of the framework arrays of type ``kind`` come from, or None."""
    module = getattr(kind, "__module__", None) or ""
    if module.startswith("torch") and hasattr(kind, "get_device"):
        return _torch_current_reader()
    if module.startswith("cupy") and hasattr(kind, "data"):
        get_current_stream = sys.modules["cupy"].cuda.get_current_stream
        return lambda array: get_current_stream().ptr
    return None


def _torch_current_reader():
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # private, cheaper: no Stream object
    if raw is not None:
        def read(tensor):
            index = tensor.get_device()
            return raw(index) if index >= 0 else LEGACY_DEFAULT_STREAM  # a CPU tensor: the checks refuse it
    else:
        def read(tensor):
            index = tensor.get_device()
            return torch.cuda.current_stream(index).cuda_stream if index >= 0 else LEGACY_DEFAULT_STREAM
    return read


def current_streams(device: int) -> list[int]:
    """Handles of the current streams on ``device`` of the frameworks already imported (CuPy, PyTorch)."""
    out = []
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            out.append(cupy.cuda.get_current_stream(device).ptr)
        except Exception:  # noqa: BLE001 - no GPU or no context: nothing can be capturing
            pass
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        out.append(torch.cuda.current_stream(device).cuda_stream)
    return out


def is_capturing(handle: int) -> bool:
    """Whether work issued on stream ``handle`` would be captured into a CUDA graph.

    The legacy default stream counts as capturing while a blocking stream of its context
    captures (the driver answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and refuses work
    there). Querying leaves the capture valid. Not for the hot path: a driver call.
    """
    try:
        from cuda.bindings import driver  # noqa: PLC0415

        err, status = driver.cuStreamIsCapturing(handle)
    except Exception:  # noqa: BLE001 - no driver: nothing captures
        return False
    if err == driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
        return True
    return err == driver.CUresult.CUDA_SUCCESS and status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def refuse_during_capture(handle: int, operation: str, reason: str, fix: str = WARM_UP) -> None:
    """Raise :class:`UsageError` when stream ``handle`` is capturing: ``reason`` says what cannot be captured.

    Raises:
        UsageError: "Cannot {operation} during CUDA-graph capture: {reason}. {fix}".
    """
    if is_capturing(handle):
        raise UsageError(f"Cannot {operation} during CUDA-graph capture: {reason}. {fix}")
