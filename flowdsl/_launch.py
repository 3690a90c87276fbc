"""Launching a loaded flowdsl kernel: ``k[grid, block](*args)`` and ``.prepare(*args)``.

The launch hot path. A launch types its arguments itself (as numba-cuda would, cheaply for
the common kinds), flattens them into one reused parameter buffer and calls
``cuLaunchKernel``; kinds of argument it does not know go through numba-cuda's launcher.
A prepared launch replays a one-node CUDA graph of the launch. A direct launch repeated with
the same arguments on the same stream (a kernel called in a loop) becomes a prepared one:
see :class:`_Replays`.
"""

from __future__ import annotations

import functools
import struct
import weakref

from numba.core import types

from . import _stubs
from .errors import UsageError
from .host.checks import launch_shape
from .host.streams import stream_handle

__all__ = ["check_features"]

@functools.lru_cache(maxsize=32)
def _core_stream(handle: int):
    """A cuda.core stream over the driver handle (for the launch paths that take a stream object)."""
    from .lowering.backend import stream_from_handle  # noqa: PLC0415

    return stream_from_handle(handle)



class _Loaded:
    """A loaded kernel with one parameter packer per argument: the launch hot path.

    Arguments flatten exactly as numba-cuda flattens them (arrays to meminfo, parent,
    size, itemsize, data, shape, strides); kinds without a packer here go through
    numba-cuda's own launcher.
    """

    def __init__(self, numba_kernel, argtypes):
        self.numba_kernel = numba_kernel
        self.argtypes = argtypes
        self.features = getattr(numba_kernel, "flowdsl_features", frozenset())
        self.packers = [_packer(t) for t in argtypes]
        self.fast = all(p is not None for p in self.packers)
        self.cu_kernel = _kernel_function(numba_kernel) if self.fast else None
        self.handle = int(self.cu_kernel.handle) if self.fast else None  # the CUfunction, as an int

    @functools.cached_property
    def params(self):
        """The launches' parameter buffer, made at the first launch (loading the library makes none)."""
        return _ParameterBuffer(self.argtypes) if self.fast else None

    def prepared(self, args, grid, block, stream: int, shared):
        """A no-argument launcher of these ``args`` on stream handle ``stream`` (packed once)."""
        if not self.fast:
            return lambda: self.launch(args, grid, block, stream, shared)
        from cuda.core import LaunchConfig, launch  # noqa: PLC0415

        flat: list = []
        for pack, arg in zip(self.packers, args):
            pack(arg, flat)
        try:
            return _driver_launcher(self.cu_kernel, flat, grid, block, stream, shared)
        except Exception:  # noqa: BLE001 - an unexpected handle type: the general path still works
            config = LaunchConfig(grid=grid, block=block, shmem_size=shared)
            kernel, core_stream = self.cu_kernel, _core_stream(stream)
            return lambda: launch(core_stream, config, kernel, *flat)

    def launch(self, args, grid, block, stream: int, shared):
        """Launch on stream handle ``stream`` (3-tuples ``grid`` and ``block``)."""
        if not self.fast:
            self.numba_kernel.launch(args, grid, block, stream=_core_stream(stream), sharedmem=shared)
            return
        self.params.launch(self.handle, args, grid, block, stream, shared)


def numba_kernel(entry_name: str, cubin: bytes, argtypes):
    """A numba-cuda launchable kernel around an already linked cubin."""
    from .lowering.backend import load_kernel  # noqa: PLC0415
    from .lowering.types import ArgumentMarshaller  # noqa: PLC0415

    return load_kernel(entry_name, cubin, argtypes, [ArgumentMarshaller()])


def _kernel_function(numba_kernel):
    from .lowering.backend import kernel_function  # noqa: PLC0415

    return kernel_function(numba_kernel)


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
        itemsize = ty.dtype.bitwidth // 8
        readers: dict = {}

        def pack_array(arg, values):
            kind = type(arg)
            read = readers.get(kind)
            if read is None:
                read = readers[kind] = _array_fields(kind, itemsize)
            values.extend(read(arg))
        return "q" * (5 + 2 * ty.ndim), pack_array
    if isinstance(ty, types.Integer):
        code = {8: "b", 16: "h", 32: "i", 64: "q"}[ty.bitwidth]
        return (code if ty.signed else code.upper()), lambda arg, values: values.append(arg)
    if ty in (types.float32, types.float64):
        return ("f" if ty == types.float32 else "d"), lambda arg, values: values.append(arg)
    raise AssertionError(f"no packer for {ty}")  # _packer refused it first: the launch is not fast


def _array_fields(kind, itemsize: int):
    """How numba-cuda flattens an array of type ``kind``: meminfo, parent, size, itemsize,
    data, shape, strides (bytes); attribute reads for CuPy, the interface otherwise."""
    if (kind.__module__ or "").startswith("cupy") and hasattr(kind, "data"):
        return lambda a: (0, 0, a.size, itemsize, a.data.ptr, *a.shape, *a.strides)

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


def _driver_launcher(kernel, flat, grid, block, stream, shared):
    """A no-argument launcher of ``kernel`` over parameters packed once into C memory."""
    import ctypes  # noqa: PLC0415

    holders = [v if isinstance(v, ctypes._SimpleCData) else ctypes.c_uint64(int(v) & 0xFFFFFFFFFFFFFFFF)
               for v in flat]
    params = (ctypes.c_void_p * max(1, len(holders)))(*[ctypes.addressof(h) for h in holders])
    g = tuple(grid) + (1,) * (3 - len(grid)) if isinstance(grid, tuple) else (int(grid), 1, 1)
    b = tuple(block) + (1,) * (3 - len(block)) if isinstance(block, tuple) else (int(block), 1, 1)
    return _PreparedLaunch(kernel.handle, (holders, params), g + b + (shared,), stream)


class _PreparedLaunch:
    """One kernel launch with fixed arguments on one stream, repeated by calling it.

    Outside graph capture it replays a one-node CUDA graph of the launch: the driver's graph
    launch takes about a third of ``cuLaunchKernel``'s host time (benchmarks/launch_bench.py),
    which is most of a small collective's time. While the stream captures, it calls
    ``cuLaunchKernel`` so that the launch itself is captured into the user's graph.
    """

    __slots__ = ("handle", "keep_alive", "shape", "stream", "address", "graph_exec", "__weakref__")

    def __init__(self, handle, keep_alive, shape, stream: int):
        import ctypes  # noqa: PLC0415

        self.handle, self.keep_alive, self.shape = handle, keep_alive, shape
        self.stream, self.address = stream, ctypes.addressof(keep_alive[1])
        self.graph_exec = None  # made at the first launch outside capture; False: not available

    def __call__(self):
        _, graph_launch, is_capturing, _ = _cuda_calls()
        graph_exec = self.graph_exec
        if graph_exec is not False:
            try:
                capturing = is_capturing(self.stream)
            except Exception:  # noqa: BLE001 - the legacy stream while another captures: the launch says why
                capturing = True
            if not capturing:
                if graph_exec is None:
                    graph_exec = self.graph_exec = self._instantiate()
                    if graph_exec is False:
                        return self()
                try:
                    graph_launch(graph_exec, self.stream)
                except Exception as exc:  # noqa: BLE001 - CuPy's CUDARuntimeError
                    raise UsageError(f"Cannot launch: cudaGraphLaunch of the prepared launch failed: {exc}") from None
                return None
        _launch_kernel(int(self.handle), *self.shape, self.stream, self.address)
        return None

    def _instantiate(self):
        """A graph of this launch, captured on a private stream and instantiated, or False."""
        import weakref  # noqa: PLC0415

        from cuda.bindings import driver  # noqa: PLC0415

        # Relaxed: creating a stream and instantiating must not disturb another thread's capture.
        relaxed = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        err, previous = driver.cuThreadExchangeStreamCaptureMode(relaxed)
        if err:
            return False
        err, private = driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)
        try:
            if err or driver.cuStreamBeginCapture(private, relaxed)[0]:
                return False
            launched = driver.cuLaunchKernel(self.handle, *self.shape, private, self.address, 0)[0]
            err, graph = driver.cuStreamEndCapture(private)
            if err or launched:
                return False
            err, graph_exec = driver.cuGraphInstantiate(graph, 0)
            driver.cuGraphDestroy(graph)  # the executable graph does not need it
            if err:
                return False
        finally:
            if private is not None:
                driver.cuStreamDestroy(private)
            driver.cuThreadExchangeStreamCaptureMode(previous)
        weakref.finalize(self, driver.cuGraphExecDestroy, graph_exec).atexit = False
        return int(graph_exec)


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

        return lambda arg, flat: flat.extend(_interface_fields(arg, itemsize))
    if isinstance(ty, types.Integer):
        ctype = getattr(ctypes, f"c_{ty}")
        return lambda arg, flat: flat.append(ctype(arg))
    if ty == types.float32:
        return lambda arg, flat: flat.append(ctypes.c_float(arg))
    if ty == types.float64:
        return lambda arg, flat: flat.append(ctypes.c_double(arg))
    return None


def _config_key(config):
    """``config`` with its elements' types (so that 1.0 or False never find 1's or 0's launch),
    or None when it cannot be a key (lists, unhashable streams)."""
    for dims in config[:2]:
        if type(dims) is not int and not (type(dims) is tuple and all(type(d) is int for d in dims)):
            return None
    key = (config, tuple(map(type, config)))
    try:
        hash(key)
    except TypeError:
        return None
    return key


class _Launch:
    def __init__(self, kernel, grid, block, stream, shared):
        self.kernel = kernel
        self.grid = tuple(grid) if isinstance(grid, list) else grid
        self.block = tuple(block) if isinstance(block, list) else block
        self.stream = stream
        self.shared = shared
        name = kernel.__name__
        self.dims = launch_shape(self.grid, self.block, name)  # CUDA's limits, on GPUs and the simulator
        self.replays = _Replays()

    def __call__(self, *args):
        # One resolution for the GPU and the simulator: both accept and refuse the same streams.
        stream = stream_handle(self.stream, args, self.kernel._launch_operation)
        if self._on_simulator(args):
            return _stubs._simulator_launch(self.kernel, self.grid, self.block, stream, self.shared, args)
        key = _replay_key(stream, args)
        replay = self.replays.find(key, args)
        if replay is not None:
            return replay()
        loaded, grid, block = self._checked(args, stream)
        shared = int(self.shared)
        loaded.launch(args, grid, block, stream, shared)
        if loaded.fast:
            self.replays.launched(key, args, lambda: loaded.prepared(args, grid, block, stream, shared))
        return None

    def prepare(self, *args):
        """Check, type and pack ``args`` once; return a callable that launches with them again.

        For a launch repeated with the same arguments (a collective in a loop): a call
        of the result replays a one-node CUDA graph of the launch (less host time than
        ``cuLaunchKernel``), or, while its stream captures, launches into the capture.
        The stream is resolved now: with ``stream=None`` the arrays' framework's current
        stream at this call.
        """
        stream = stream_handle(self.stream, args, self.kernel._launch_operation)
        if self._on_simulator(args):
            return lambda: self(*args)
        loaded, grid, block = self._checked(args, stream)
        return loaded.prepared(args, grid, block, stream, int(self.shared))

    @staticmethod
    def _on_simulator(args) -> bool:
        return _stubs._simulator_launch is not None and (
            _stubs._simulator_active() or any(getattr(a, "__flowdsl_sim__", False) for a in args))

    def _checked(self, args, stream: int):
        """The loaded kernel for ``args`` and the launch shape, after every check before a launch."""
        name = self.kernel.__name__
        grid, block = self.dims
        _check_resources(name, args)
        loaded = self.kernel._specialize(args, stream)
        if loaded.features:
            loaded = self.kernel._for_gin_backend(loaded, args, stream)
            check_features(name, loaded.features, args)
        return loaded, grid, block


@functools.cache
def _resource_type():
    from .runtime.memory import Resource  # noqa: PLC0415

    return Resource


#: argument type -> whether it is a communicator's resource (a window, a device communicator).
_IS_RESOURCE: dict = {}


def _check_resources(name: str, args) -> None:
    """Windows and device communicators must be open and belong to one communicator."""
    owner = None
    for i, arg in enumerate(args):
        kind = type(arg)
        is_resource = _IS_RESOURCE.get(kind)
        if is_resource is None:
            is_resource = _IS_RESOURCE[kind] = issubclass(kind, _resource_type())
        if not is_resource:
            continue
        if arg._closed:
            arg._check_open(f"launch {name} (argument {i})")
        if owner is None:
            owner = arg._comm
        elif arg._comm is not owner:
            raise UsageError(f"Cannot launch {name}: its windows and device communicators come from different "
                             "communicators. Register windows and create the device communicator on the same "
                             "flowdsl communicator.")


def check_features(name: str, features, args) -> None:
    """Refuse a launch whose kernel needs what the device communicator's backend lacks."""
    from .lowering.gin import STRONG_SIGNAL_FEATURE  # noqa: PLC0415

    if STRONG_SIGNAL_FEATURE not in features:
        return
    for arg in args:
        backend = getattr(arg, "gin_backend", None)
        if backend is not None and not backend.strong_signals:
            raise UsageError(
                f"Cannot launch {name}: it issues strong GIN signals (flowdsl.gin.strong_*), but this device "
                f"communicator's GIN backend {backend.name} offers weak signals only. Use one weak signal per "
                "put (flowdsl.gin.weak_signal_inc), or run with a backend that offers strong signals (the "
                "GIN proxy, NCCL_GIN_TYPE=2).")


class _Replays:
    """Launches of one configuration repeated with the same arguments, replayed from a graph.

    A kernel called in a loop with the same arguments, the natural way, would otherwise type,
    check and pack them and call ``cuLaunchKernel`` every time. After ``STREAK`` launches in a
    row with the same arguments on the same stream, the launch is prepared (a one-node CUDA
    graph, :class:`_PreparedLaunch`), and each later launch with those arguments replays it,
    after a check that every argument is the same object in the same state: the same array
    shape, strides and data pointer, no window or device communicator closed since, a scalar of
    the same type and bits. Up to ``LIMIT`` prepared launches are kept (loops over a few
    argument lists alternate them). Arguments are held weakly: no array is kept alive by
    having been launched with. A loop over changing arguments makes no graph at all, and pays
    for one lookup per launch; arguments of kinds this module does not know are not replayed.
    """

    __slots__ = ("prepared", "last_key", "streak")
    STREAK = 3
    LIMIT = 8

    def __init__(self):
        self.prepared: dict = {}
        self.last_key = None
        self.streak: _Seen | None = None

    def find(self, key, args):
        """The prepared launch of these very arguments (``key``: :func:`_replay_key`), or None."""
        seen = self.prepared.get(key)
        return seen.prepared if seen is not None and seen.same(args) else None

    def launched(self, key, args, prepare) -> None:
        """Count a direct launch; at the end of a streak, ``prepare()`` the launch for replays."""
        if key != self.last_key:
            self.last_key, self.streak = key, None
            return
        streak = self.streak
        if streak is None or not streak.same(args):  # the first repeat, or a new object at a reused id
            self.streak = _Seen.of(args)
            return
        streak.count += 1
        if streak.count < self.STREAK:
            return
        self.last_key = self.streak = None
        if len(self.prepared) >= self.LIMIT:
            del self.prepared[next(iter(self.prepared))]  # the oldest; its graph goes with it
        streak.prepared = prepare()
        self.prepared[key] = streak


def _replay_key(stream: int, args) -> tuple:
    """The stream and each argument: an int by value, another scalar by type and bits (1, True
    and 1.0 are equal, 0.0 and -0.0 too), any other object by identity."""
    by_value = _by_value()
    return (stream, *[arg if type(arg) is int else by_value[type(arg)](arg) if type(arg) in by_value else id(arg)
                      for arg in args])


@functools.cache
def _by_value() -> dict:
    """Scalar type -> its key: type and exact bits."""
    import numpy as np  # noqa: PLC0415

    kinds = {bool: lambda b: (bool, b), float: lambda f: (float, f.hex()), complex: lambda c: (complex, repr(c))}
    for kind in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
                 np.float16, np.float32, np.float64, np.complex64, np.complex128):
        kinds[kind] = lambda x: (type(x), x.tobytes())
    return kinds


class _Seen:
    """One argument list, weakly: what decides that a later launch has the very same arguments."""

    __slots__ = ("objects", "states", "changes", "count", "prepared")

    def __init__(self, objects, states, changes: int):
        self.objects, self.states, self.changes = objects, states, changes
        self.count, self.prepared = 2, None

    @classmethod
    def of(cls, args):
        """For ``args`` (already keyed by :func:`_replay_key`), or None if one cannot be held weakly."""
        objects, states = [], []
        for i, arg in enumerate(args):
            if type(arg) is int or type(arg) in _by_value():
                continue  # the key holds it whole
            state = _state_reader(type(arg))
            if state is None or not type(arg).__weakrefoffset__:
                return None
            objects.append((i, weakref.ref(arg)))
            if state is not _unchanging:
                states.append((i, state, state(arg)))
        return cls(objects, states, _memory().changes)

    def same(self, args) -> bool:
        if _memory().changes != self.changes:  # a window or device communicator closed since
            return False
        for i, ref in self.objects:
            if ref() is not args[i]:
                return False
        for i, state, before in self.states:
            if state(args[i]) != before:
                return False
        return True


@functools.cache
def _memory():
    from .runtime import memory  # noqa: PLC0415

    return memory


def _unchanging(obj):
    return None


@functools.cache
def _state_reader(kind):
    """What of an object of type ``kind`` a launch packs and may change in place, or None.

    A CuPy array's data pointer and dtype are fixed, its shape can be set; a PyTorch tensor
    can be re-pointed (``set_``, ``.data =``); windows and device communicators change only
    by closing, which :func:`flowdsl.runtime.memory.resources_changed` counts.
    """
    module = kind.__module__ or ""
    if issubclass(kind, _resource_type()):
        return _unchanging
    if module.startswith("cupy") and hasattr(kind, "data"):
        return lambda array: (array.shape, array.strides)
    if module.startswith("torch") and hasattr(kind, "data_ptr"):
        return lambda tensor: (tensor.data_ptr(), tensor.dtype, tensor.shape, tensor.stride())
    if hasattr(kind, "__cuda_array_interface__"):
        return lambda array: array.__cuda_array_interface__
    return None
