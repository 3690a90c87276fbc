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
import pickle

import numpy as np

from . import _stubs
from ._argtypes import DevicePointer, scalar_types
from ._features import COOPERATIVE
from ._launch_checks import _check_resources, check_features
from ._launch_params import _packer, _ParameterBuffer
from ._launch_replay import _driver_launcher, _replay_key, _Replays
from .errors import LaunchTypeError, UsageError
from .host.checks import dynamic_shared, launch_shape, within_launch_bounds
from .host.streams import stream_handle, wait_for_producers
from .host.transfers import host_transfers, simulated_copy_in, simulated_copy_out, simulated_empty_like

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
        # A cooperative kernel goes through numba-cuda's launcher, which launches it cooperatively.
        self.fast = all(p is not None for p in self.packers) and COOPERATIVE not in self.features
        #: debug=True: where the kernel records an exception, read after each launch (which then waits for it).
        self.exceptions = _exception_record(numba_kernel) if getattr(numba_kernel, "flowdsl_debug", False) else None
        self.cu_kernel = _kernel_function(numba_kernel) if self.fast else None
        self.handle = int(self.cu_kernel.handle) if self.fast else None  # the CUfunction, as an int

    @functools.cached_property
    def params(self):
        """The launches' parameter buffer, made at the first launch (loading the library makes none)."""
        return _ParameterBuffer(self.argtypes) if self.fast else None

    def prepared(self, args, grid, block, stream: int, shared):
        """A no-argument launcher of these ``args`` on stream handle ``stream`` (packed once)."""
        if self.exceptions is not None:  # each launch clears and reads the exception record
            return lambda: self.launch(args, grid, block, stream, shared)
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
        """Launch on stream handle ``stream`` (3-tuples ``grid`` and ``block``); a ``debug=True`` kernel's launch
        waits for it and raises the exception one of its threads raised, as numba-cuda's does."""
        if self.exceptions is not None:
            self.exceptions.clear(stream)
        if not self.fast:
            self.numba_kernel.launch(args, grid, block, stream=_core_stream(stream), sharedmem=shared)
        else:
            self.params.launch(self.handle, args, grid, block, stream, shared)
        if self.exceptions is not None:
            raised = self.exceptions.raised(stream)
            if raised is not None:
                raise raised

def numba_kernel(entry_name: str, cubin: bytes, argtypes, features=frozenset(), debug: bool = False,
                 exceptions=None, linked_for=None):
    """A numba-cuda launchable kernel around an already linked cubin (``debug``: compiled with ``debug=True``,
    ``exceptions`` its exception table; ``linked_for``: kept for numba-cuda's disk cache, flowdsl/_numba_cache.py)."""
    from .lowering.backend import load_kernel  # noqa: PLC0415
    from .lowering.types import ArgumentMarshaller  # noqa: PLC0415

    return load_kernel(entry_name, cubin, argtypes, [ArgumentMarshaller(features, linked_for)],
                       cooperative=COOPERATIVE in features, debug=debug, exceptions=exceptions)

def _exception_record(numba_kernel):
    from .lowering.backend import ExceptionRecord  # noqa: PLC0415

    return ExceptionRecord(numba_kernel)

def _kernel_function(numba_kernel):
    from .lowering.backend import kernel_function  # noqa: PLC0415

    return kernel_function(numba_kernel)

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

def _as_signature(kernel, args, types):
    """``args`` with each scalar cast to ``types``: the NumPy type the kernel's numba signature gives its
    place (None: not a scalar)."""
    if len(args) != len(types):
        raise UsageError(f"Cannot launch {kernel.__name__} with {len(args)} arguments: its signature "
                         f"{kernel.signature!r} has {len(types)}")
    return tuple((t(a) if isinstance(t, functools.partial) else _as_scalar(kernel.__name__, i, a, t))
                 if t is not None and isinstance(a, (int, float, complex, bool, np.generic)) else a
                 for i, (a, t) in enumerate(zip(args, types)))


def _as_scalar(name: str, index: int, value, scalar_type):
    """``value`` as ``scalar_type``; an int wraps to its width as numba's conversion does (0xFFFFFFFF as an
    int32 is -1), where NumPy would refuse it. A complex value for a real type is refused, as numba-cuda's
    dispatcher refuses it (no implicit conversion drops an imaginary part)."""
    if np.iscomplexobj(value) and np.dtype(scalar_type).kind != "c":
        raise LaunchTypeError(f"Cannot launch {name}: argument {index} is the complex {value!r}, and its signature "
                              f"takes {np.dtype(scalar_type).name} there (no implicit conversion drops an "
                              "imaginary part). Pass a real value, or declare a complex type")
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and np.dtype(scalar_type).kind in "iu":
        return np.array(int(value) & 0xFFFF_FFFF_FFFF_FFFF, np.uint64).astype(scalar_type)[()]
    return scalar_type(value)


def _configured(kernel, grid, block, stream, shared):
    """A configured launch unpickled: ``kernel[grid, block, stream, shared]``."""
    return kernel[grid, block, stream, shared]


class _Launch:
    def __init__(self, kernel, grid, block, stream, shared):
        self.kernel = kernel
        self.grid = tuple(grid) if isinstance(grid, list) else grid
        self.block = tuple(block) if isinstance(block, list) else block
        self.stream = stream
        name = kernel.__name__
        self.dims = launch_shape(self.grid, self.block, name)  # CUDA's limits, on GPUs and the simulator
        within_launch_bounds(self.dims[1], kernel.launch_bounds, name)
        self.shared = dynamic_shared(shared, name)
        self.replays = _Replays()
        #: numba-cuda's: ``callback(kernel, launch)`` before each launch of this configuration (the loaded numba
        #: kernel; on the simulator the kernel object); a launch with callbacks is never replayed from a graph.
        self.pre_launch_callbacks: list = []

    @property
    def griddim(self) -> tuple[int, int, int]:
        """numba-cuda's name: the grid as a 3-tuple."""
        return self.dims[0]

    @property
    def blockdim(self) -> tuple[int, int, int]:
        """numba-cuda's name: the block as a 3-tuple."""
        return self.dims[1]

    def __reduce__(self):
        if self.pre_launch_callbacks:
            raise pickle.PicklingError("Cannot pickle configured launches with pre-launch callbacks: they are "
                                       "Python callables of this process. Pickle the kernel and configure it again")
        return _configured, (self.kernel, self.grid, self.block, self.stream, self.shared)

    def __call__(self, *args):
        if self.kernel.scalar_types is not None:  # numba's signature: the scalars take its types
            args = _as_signature(self.kernel, args, self.kernel.scalar_types)
        elif self.kernel._candidates:  # a list of them: those of the one the arguments match
            args = _as_signature(self.kernel, args, scalar_types(self.kernel._matching(args)))
        # One resolution for the GPU and the simulator: both accept and refuse the same streams.
        stream = stream_handle(self.stream, args, self.kernel._launch_operation)
        wait_for_producers(args, stream)
        if self.kernel.extensions:  # numba-cuda's argument hooks: they may wrap or replace arguments
            return self._through_extensions(args, stream)
        transfers = host_transfers(self.kernel.__name__, args)  # host NumPy arrays: copied as numba-cuda does
        if transfers is not None:
            return self._with_host_arrays(transfers, args, stream)
        if self._on_simulator(args) or self.pre_launch_callbacks:
            return self._once(args, stream)
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

    def _through_extensions(self, args, stream: int):
        """Each argument through the kernel's ``extensions`` (numba-cuda's ``prepare_args`` hooks, last added
        first, as numba-cuda applies them), the launch, then what they left in ``retr``."""
        from ._argtypes import argument_type  # noqa: PLC0415

        retr: list = []
        prepared = []
        for i, value in enumerate(args):
            ty = argument_type(self.kernel.__name__, i, value)  # as a launch types it (CuPy arrays included)
            for extension in reversed(self.kernel.extensions):
                ty, value = extension.prepare_args(ty, value, stream=stream, retr=retr)
            prepared.append(value)
        args = tuple(prepared)
        transfers = host_transfers(self.kernel.__name__, args)
        if transfers is not None:
            self._with_host_arrays(transfers, args, stream)
        else:
            self._once(args, stream)
        for writeback in retr:
            writeback()
        return None

    def _with_host_arrays(self, transfers, args, stream: int):
        """Launch with device copies of the host arrays, then copy back those that go back (and wait)."""
        if self._on_simulator(args):
            copies = (simulated_copy_in, simulated_empty_like, simulated_copy_out)
        else:
            from .runtime.memory import HostArrayCopies  # noqa: PLC0415 - a GPU launch: the runtime is loaded

            gpu = HostArrayCopies(stream, self.kernel.__name__)
            copies = (gpu.copy_in, gpu.empty_like, gpu.copy_out)
        self._once(transfers.to_device(args, copies[0], copies[1]), stream, wait=transfers.copies_back)
        transfers.back(copies[2])  # on the GPU, the copy back waits for the kernel on its stream
        return None

    def _once(self, args, stream: int, wait: bool = False):
        """One launch, no replay: on the simulator (``wait``: until it has run), or checked and launched. A
        ``debug=True`` kernel's launch waits on both, and raises what a thread of it raised."""
        if self._on_simulator(args):
            if any(isinstance(a, DevicePointer) for a in args):
                raise UsageError(f"Cannot launch {self.kernel.__name__} on the simulator with a C pointer argument "
                                 "(its signature's CPointer): an address of GPU memory means nothing there. Pass "
                                 "the array itself (a typed array parameter), or run it on a GPU")
            wait = wait or getattr(self.kernel, "debug", False)
            for callback in self.pre_launch_callbacks:  # the simulator has no loaded kernel: the kernel object
                callback(self.kernel, self)
            _stubs._simulator_launch(self.kernel, self.grid, self.block, stream, self.shared, args, wait=wait)
            return None
        loaded, grid, block = self._checked(args, stream)
        for callback in self.pre_launch_callbacks:
            callback(loaded.numba_kernel, self)
        loaded.launch(args, grid, block, stream, int(self.shared))
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
        wait_for_producers(args, stream)  # once, here: the calls of the result take the arguments as they are
        transfers = host_transfers(self.kernel.__name__, args)
        if transfers is not None:
            transfers.refuse_prepare()
            args = transfers.to_device(args, None, None)  # only hints around device memory are left
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
