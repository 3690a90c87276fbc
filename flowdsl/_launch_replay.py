"""Launches replayed from one-node CUDA graphs: a prepared launch (``k[...].prepare(*args)``), and a
direct launch repeated with the same arguments on the same stream, which becomes one
(:class:`_Replays`), with the check that every argument is still the same object in the same state."""

from __future__ import annotations

import functools
import weakref

from ._launch_checks import _resource_type
from . import _launch_params as _params  # its functions by module: tests replace the CUDA calls there
from .errors import UsageError


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
        _, graph_launch, is_capturing, _ = _params._cuda_calls()
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
        _params._launch_kernel(int(self.handle), *self.shape, self.stream, self.address)
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


def _driver_launcher(kernel, flat, grid, block, stream, shared):
    """A no-argument launcher of ``kernel`` over parameters packed once into C memory."""
    import ctypes  # noqa: PLC0415

    holders = [v if isinstance(v, ctypes._SimpleCData) else ctypes.c_uint64(int(v) & 0xFFFFFFFFFFFFFFFF)
               for v in flat]
    params = (ctypes.c_void_p * max(1, len(holders)))(*[ctypes.addressof(h) for h in holders])
    g = tuple(grid) + (1,) * (3 - len(grid)) if isinstance(grid, tuple) else (int(grid), 1, 1)
    b = tuple(block) + (1,) * (3 - len(block)) if isinstance(block, tuple) else (int(block), 1, 1)
    return _PreparedLaunch(kernel.handle, (holders, params), g + b + (shared,), stream)
