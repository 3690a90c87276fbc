"""A launch's parameters: numba-cuda's flattening of each argument, packed into one reused C buffer,
and ``cuLaunchKernel`` itself (the launch hot path of :mod:`flowdsl._launch`)."""

from __future__ import annotations

import functools
import struct

from numba.core import types

from .errors import UsageError


class _ParameterBuffer:
    """One C buffer of a kernel's flattened parameters, each in its own 8-byte slot, and the
    pointer array ``cuLaunchKernel`` reads: a launch packs its arguments with one
    ``struct.pack_into`` instead of making a ctypes object per parameter. The driver copies
    the parameters during the call, so the buffer is reused, under a lock (the driver call
    releases the GIL)."""

    def __init__(self, argtypes):
        import ctypes  # noqa: PLC0415
        import threading  # noqa: PLC0415

        packers = [_value_packer(t) for t in argtypes]
        self.packers = [pack for _, pack in packers]
        codes = "".join(code for code, _ in packers)
        self.layout = struct.Struct("<" + "".join(c + "x" * (8 - struct.calcsize(c)) for c in codes))
        self.buffer = ctypes.create_string_buffer(max(8, self.layout.size))
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * max(1, len(codes)))(*[base + 8 * i for i in range(len(codes))])
        self.address = ctypes.addressof(self.pointers)
        self.lock = threading.Lock()

    def launch(self, handle: int, args, grid, block, stream: int, shared):
        values: list = []
        for pack, arg in zip(self.packers, args):
            pack(arg, values)
        with self.lock:
            try:
                self.layout.pack_into(self.buffer, 0, *values)
            except struct.error as exc:
                raise UsageError(f"Cannot launch: an argument does not fit its kernel parameter ({exc}). "
                                 "Pass values within the range of the kernel's argument types") from None
            _launch_kernel(handle, *grid, *block, shared, stream, self.address)

@functools.cache
def _cuda_calls():
    """CuPy's wrappers of ``cuLaunchKernel``, ``cudaGraphLaunch`` and ``cudaStreamIsCapturing``.

    They take and return plain ints: a third of the host time of cuda.bindings' wrappers,
    which convert each handle and result to an object (benchmarks/launch_bench.py).
    """
    from cupy_backends.cuda.api import driver, runtime  # noqa: PLC0415

    return driver.launchKernel, runtime.graphLaunch, runtime.streamIsCapturing, driver.CUDADriverError

def _launch_kernel(handle: int, gx, gy, gz, bx, by, bz, shared, stream: int, params: int) -> None:
    launch_kernel, _, _, driver_error = _cuda_calls()
    try:
        launch_kernel(handle, gx, gy, gz, bx, by, bz, shared, stream, params, 0)
    except driver_error as exc:
        raise _launch_error(exc.status) from None

def _launch_error(status: int) -> UsageError:
    from cuda.bindings import driver  # noqa: PLC0415

    name = driver.CUresult(status).name
    return UsageError(f"Cannot launch: cuLaunchKernel returned {name}{_capture_hint(name)}")

def _value_packer(ty):
    """``(struct codes, pack(arg, values))`` of one argument's flattened parameters."""
    from .lowering.types import DevCommType, WindowType  # noqa: PLC0415 - lowering/ is for compiling
    if isinstance(ty, DevCommType):
        return "Q" * ty.nwords, lambda arg, values: values.extend(arg._kernel_word_values())
    if isinstance(ty, WindowType):
        return "QQ", lambda arg, values: values.extend((arg.handle, arg.nbytes))
    if isinstance(ty, types.Array):
        return "q" * (5 + 2 * ty.ndim), _array_packer(ty.dtype.bitwidth // 8)
    if isinstance(ty, types.CPointer):  # a DevicePointer: the address
        return "Q", lambda arg, values: values.append(arg.value)
    if isinstance(ty, types.Integer):
        code = {8: "b", 16: "h", 32: "i", 64: "q"}[ty.bitwidth]
        return (code if ty.signed else code.upper()), lambda arg, values: values.append(arg)
    if ty in (types.float32, types.float64):
        return ("f" if ty == types.float32 else "d"), lambda arg, values: values.append(arg)
    raise AssertionError(f"no packer for {ty}")  # _packer refused it first: the launch is not fast

def _array_packer(itemsize: int):
    """``pack(arg, out)``: an array's flattened fields appended to ``out``, read the way its type is read
    (:func:`_array_fields`, found once per type)."""
    readers: dict = {}

    def pack(arg, out):
        read = readers.get(type(arg))
        if read is None:
            read = readers[type(arg)] = _array_fields(type(arg), itemsize)
        out.extend(read(arg))
    return pack


def _array_fields(kind, itemsize: int):
    """How numba-cuda flattens an array of type ``kind``: meminfo, parent, size, itemsize,
    data, shape, strides (bytes); attribute reads for CuPy and numba-cuda's device arrays, the interface
    otherwise. numba-cuda's own arrays are read as its launcher reads them: their interface reports no strides
    (C-contiguous) for a broadcast array (strides of 0, as its ufuncs make for a scalar operand), whose
    kernel is typed with any layout; the interface's C strides would read past its one element."""
    module = kind.__module__ or ""
    if module.startswith("cupy") and hasattr(kind, "data"):
        return lambda a: (0, 0, a.size, itemsize, a.data.ptr, *a.shape, *a.strides)
    if module.startswith("numba") and hasattr(kind, "device_ctypes_pointer"):
        return lambda a: (0, 0, a.size, itemsize, a.device_ctypes_pointer.value or 0, *a.shape, *a.strides)

    return lambda a: _interface_fields(a, itemsize)

def _interface_fields(a, itemsize: int) -> tuple:
    """An array's flattened fields (as :func:`_array_fields`) from its ``__cuda_array_interface__``."""
    cai = a.__cuda_array_interface__
    shape, strides = cai["shape"], cai.get("strides")
    if strides is None:
        strides, step = [], itemsize
        for dim in reversed(shape):
            strides.append(step)
            step *= dim
        strides.reverse()
    size = 1
    for dim in shape:
        size *= dim
    return (0, 0, size, itemsize, cai["data"][0], *shape, *strides)


def _packer(ty):
    import ctypes  # noqa: PLC0415

    from .lowering.types import DevCommType, WindowType  # noqa: PLC0415

    if isinstance(ty, DevCommType):
        return lambda arg, flat: flat.extend(arg._kernel_words())
    if isinstance(ty, WindowType):
        return lambda arg, flat: flat.extend((ctypes.c_uint64(arg.handle), ctypes.c_uint64(arg.nbytes)))
    if isinstance(ty, types.Array):
        itemsize = ty.dtype.bitwidth // 8 if hasattr(ty.dtype, "bitwidth") else None
        if itemsize is None:
            return None

        return _array_packer(itemsize)
    if isinstance(ty, types.CPointer):  # a DevicePointer: the address
        return lambda arg, flat: flat.append(ctypes.c_uint64(arg.value))
    if isinstance(ty, types.Integer):
        ctype = getattr(ctypes, f"c_{ty}")
        return lambda arg, flat: flat.append(ctype(arg))
    if ty == types.float32:
        return lambda arg, flat: flat.append(ctypes.c_float(arg))
    if ty == types.float64:
        return lambda arg, flat: flat.append(ctypes.c_double(arg))
    return None


#: Launch errors of CUDA-graph capture -> why, and the fix.
_CAPTURE_HINTS = {
    "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT": ". The launch went to the legacy default stream while another stream "
    "captures a CUDA graph: pass the capturing stream as stream=, or launch inside `with stream:` (CuPy) or "
    "torch.cuda.graph (PyTorch)",
    "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED": ". An earlier call that cannot be captured invalidated this "
    "stream's CUDA-graph capture: end it, warm up outside capture, and capture again",
}


def _capture_hint(error_name: str) -> str:
    return _CAPTURE_HINTS.get(error_name, "")
