"""``@flowdsl.kernel`` (and ``@flowdsl.device``, made in :mod:`flowdsl._devices`).

A :class:`FlowKernel` is compiled per (argument types, NCCL release, arch) at
first launch: numba lowers it to LTO-IR, nvJitLink links it with the support
build of the loaded NCCL, and the cubin is cached on disk (keyed by what the
kernel's code depends on — see :mod:`flowdsl._cache` — the argument types, the NCCL
release, the arch, the support build and the compilers' versions) so that a second
process loads it instead of compiling. A launch types and flattens its arguments itself
(as numba-cuda would), packs them into one parameter buffer and calls
``cuLaunchKernel``; kinds of argument it does not know go through numba-cuda's
launcher. A prepared launch replays a one-node CUDA graph.

Contents: :func:`kernel`, :func:`device`, :class:`FlowKernel`, :func:`check_features`.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import struct
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from numba.core import types

from . import _cache, _stubs
from ._devices import device
from ._release import format_version, parse_version
from ._version import __version__
from .errors import UsageError
from .runtime.checks import launch_shape
from .runtime.streams import refuse_during_capture, stream_handle

if TYPE_CHECKING:  # the compiler (numba-cuda, nvJitLink) is imported at the first compile
    from .lowering.compiler import CompiledKernel
    from .lowering.target import Target

__all__ = ["kernel", "device", "FlowKernel", "check_features"]


def kernel(fn=None, *, fastmath: bool = False, lineinfo: bool = False, max_registers: int | None = None):
    """Make ``fn`` a flowdsl kernel; launch it as ``k[grid, block](*args)``.

    ``k[grid, block, stream, shared_bytes](*args)`` also takes a stream (anything with
    ``__cuda_stream__``, a CuPy, PyTorch, numba or cuda.core stream, or a handle) and dynamic
    shared memory in bytes. Without a stream (or ``None``) the kernel goes on the current stream
    of the framework its PyTorch or CuPy arrays come from, else on the legacy default stream.
    A launch on a capturing stream is captured into the CUDA graph; the first launch for new
    argument types compiles or loads the kernel, which cannot be captured.
    ``max_registers`` caps registers per thread (``-maxrregcount``): more threads fit
    on an SM, which bandwidth-bound loops need, at the price of spills elsewhere.
    """
    if fn is None:
        return lambda f: kernel(f, fastmath=fastmath, lineinfo=lineinfo, max_registers=max_registers)
    return FlowKernel(fn, fastmath=fastmath, lineinfo=lineinfo, max_registers=max_registers)


def _cache_root() -> Path:
    from .runtime.support import cache_dir  # noqa: PLC0415

    return cache_dir() / "kernels"


def _attribute_pairs(code) -> set[tuple[str, str]]:
    """``(module, attribute)`` pairs the code loads, e.g. ``("lsa", "barrier")`` for ``lsa.barrier``."""
    import dis  # noqa: PLC0415

    pairs = set()
    previous = None
    for instr in dis.get_instructions(code):
        if instr.opname in ("LOAD_ATTR", "LOAD_METHOD") and previous is not None:
            pairs.add((previous, instr.argval))
        previous = instr.argval if instr.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF") else (
            instr.argval if instr.opname in ("LOAD_ATTR", "LOAD_METHOD") else None)
    for const in code.co_consts:
        if inspect.iscode(const):
            pairs |= _attribute_pairs(const)
    return pairs


@functools.lru_cache(maxsize=32)
def _core_stream(handle: int):
    """A cuda.core stream over the driver handle (for the launch paths that take a stream object)."""
    from numba.cuda.cudadrv import driver  # noqa: PLC0415

    return driver.ExperimentalStream.from_handle(handle)


class FlowKernel:
    """A flowdsl kernel: compiled at first launch per argument types, cached on disk."""

    def __init__(self, py_func, *, fastmath: bool = False, lineinfo: bool = False, max_registers: int | None = None):
        self.py_func = py_func
        self.__name__ = py_func.__name__
        self.__doc__ = py_func.__doc__
        self.__wrapped__ = py_func
        self.fastmath = fastmath
        self.max_registers = max_registers
        self.lineinfo = lineinfo
        self._launch_operation = f"launch {py_func.__name__}"  # for errors; built once, not per launch
        self._loaded: dict = {}
        self._loaded_by_ids: dict = {}  # numba types are interned: their ids are a cheaper key
        self._launches: dict = {}
        #: Last compile/load: {"source": "compiled"|"disk", "seconds": float, "key": str,
        #: "phases": CPU seconds per compile step (:attr:`CompiledKernel.phases`; empty from disk)}
        self.last_build: dict = {}

    def __repr__(self):
        return f"<flowdsl.kernel {self.py_func.__module__}.{self.__name__}>"

    def __call__(self, *args, **kwargs):
        raise UsageError(f"Cannot call kernel {self.__name__} directly: launch it with "
                         f"{self.__name__}[grid, block](...)")

    def __getitem__(self, config):
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise UsageError(f"Cannot launch {self.__name__}: write {self.__name__}[grid, block] or "
                             f"{self.__name__}[grid, block, stream, shared_bytes]")
        key = _config_key(config)  # a configuration is checked once; None: every time
        launch = self._launches.get(key) if key is not None else None
        if launch is None:
            grid, block, *rest = config
            stream = rest[0] if rest else None  # None: the arrays' framework's current stream
            shared = rest[1] if len(rest) > 1 else 0
            launch = _Launch(self, grid, block, stream, shared)
            if key is not None:
                if len(self._launches) >= 64:
                    self._launches.clear()
                self._launches[key] = launch
        return launch

    # -- requirements ------------------------------------------------------------------------
    def requirements(self, grid) -> dict:
        """Device-communicator requirements this kernel implies for a launch over ``grid``.

        Barrier sessions get one barrier per block (the usual ``index=blockIdx.x``):
        ``lsa.barrier`` an LSA barrier, ``gin.barrier`` a rail GIN barrier,
        ``gin.hybrid_barrier`` both (``barrier_count``), ``cft.barrier`` a CFT barrier
        (``cft_barrier_count``). GIN signal and counter counts depend on run-time ids:
        pass ``gin_signal_count`` / ``gin_counter_count``.
        """
        pairs = _attribute_pairs(self.py_func.__code__)
        blocks = 1
        for dim in (grid if isinstance(grid, tuple) else (grid or 1,)):
            blocks *= int(dim)
        reqs = {}
        if ("lsa", "barrier") in pairs:
            reqs["lsa_barrier_count"] = blocks
        if ("gin", "barrier") in pairs:
            reqs["rail_gin_barrier_count"] = blocks
        if ("gin", "hybrid_barrier") in pairs:
            reqs["barrier_count"] = blocks
        if ("cft", "barrier") in pairs:
            reqs["cft_barrier_count"] = blocks
        return reqs

    # -- compilation ---------------------------------------------------------------------------
    def _cache_key(self, argtypes, target: Target, support) -> str:
        """The disk-cache key of this kernel for ``argtypes`` and ``target``.

        Computed at each compile or load (not once per kernel): numba freezes the globals'
        values at compile time, so a value changed since counts. Raises ``Uncacheable``.
        """
        payload = json.dumps({
            "format": _cache.ENTRY_FORMAT, "flowdsl": __version__, "versions": _versions(),
            "numba_config": _numba_config(),
            "code": _cache.dependency_digest(self.py_func, lineinfo=self.lineinfo),
            "flowdsl_sources": _cache.package_digest(), "qualname": self.py_func.__qualname__,
            "module": self.py_func.__module__, "args": [str(t) for t in argtypes],
            "nccl": format_version(target.nccl), "arch": target.arch,
            "support": _digest_of(support.ltoir), "cft": _cft_digest(target),
            "options": [self.fastmath, self.lineinfo, self.max_registers],
        }, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    def compile(self, argtypes, *, arch: str = "sm_90", nccl: str | tuple | None = None,
                cuda: str | tuple | None = None) -> CompiledKernel:
        """Compile and link for explicit argument types and target; needs no GPU.

        Args:
            argtypes: numba types of the parameters (see :meth:`argtypes_for`).
            arch: ``sm_80``, ``sm_90``, ``sm_100``, ...
            nccl: NCCL release of the device ABI (default: the loaded libnccl).
            cuda: CUDA release of the linker, ``"13.3"`` (default: the installed nvJitLink's);
                gates features that need a newer one (CFT needs 13.3).
        """
        from .lowering.compiler import compile_kernel  # noqa: PLC0415
        from .lowering.target import Target  # noqa: PLC0415
        from .runtime import nccl as nccl_runtime  # noqa: PLC0415
        from .runtime.support import support_build_for  # noqa: PLC0415

        version = parse_version(nccl) if nccl is not None else nccl_runtime.loaded_version()
        support = support_build_for(version, arch)
        target = Target(version, arch, _cuda_version(cuda))
        return compile_kernel(self.py_func, tuple(argtypes), target, support.ltoir,
                              fastmath=self.fastmath, lineinfo=self.lineinfo, support_arch=support.arch,
                              max_registers=self.max_registers,
                              link_for_features=_feature_libraries(target))

    @staticmethod
    def argtypes_for(*args, nccl: str | tuple | None = None):
        """numba types of host arguments; ``"devcomm"``, ``("window", dtype)`` and ``("staging", dtype)``
        (a window from :func:`flowdsl.flow.staging`) stand in for objects."""
        import numpy as np  # noqa: PLC0415
        from numba.cuda.typing.typeof import Purpose, typeof  # noqa: PLC0415
        from numba.np.numpy_support import from_dtype  # noqa: PLC0415

        from .lowering.types import DevCommType, WindowType, devcomm_words  # noqa: PLC0415
        from .runtime import nccl as nccl_runtime  # noqa: PLC0415
        from .runtime.support import abi_layout  # noqa: PLC0415

        version = parse_version(nccl) if nccl is not None else nccl_runtime.loaded_version()
        out = []
        for arg in args:
            if isinstance(arg, str) and arg == "devcomm":
                out.append(DevCommType(version, devcomm_words(abi_layout(version)["dev_comm_size"])))
            elif isinstance(arg, tuple) and arg and isinstance(arg[0], str) and arg[0] in ("window", "staging"):
                out.append(WindowType(from_dtype(np.dtype(arg[1])), staging=arg[0] == "staging"))
            elif isinstance(arg, types.Type):
                out.append(arg)
            elif isinstance(arg, np.ndarray):  # stands for a device array of the same dtype and shape
                out.append(_array_type(arg.__array_interface__["typestr"], arg.ndim, arg.flags.c_contiguous))
            else:
                out.append(typeof(arg, Purpose.argument))
        return tuple(out)

    def _specialize(self, args, stream: int | None = None):
        """The loaded kernel for these launch arguments (compiled, or loaded from disk, once).

        ``stream``: the launch's stream handle; loading is refused while it captures a graph.
        """
        argtypes = tuple(_argument_type(self.__name__, i, arg) for i, arg in enumerate(args))
        ids = tuple(map(id, argtypes))
        loaded = self._loaded_by_ids.get(ids)
        if loaded is not None:
            return loaded
        loaded = self._loaded.get(argtypes)
        if loaded is None:
            if stream is not None:
                refuse_during_capture(stream, self._launch_operation, "its first launch for these argument "
                                      "types compiles or loads the kernel's module (not capturable)")
            target = _device_target()
            loaded = _Loaded(self._load_or_compile(argtypes, target), argtypes)
            self._loaded[argtypes] = loaded
        self._loaded_by_ids[ids] = loaded  # the argtypes key keeps the types (and their ids) alive
        return loaded

    def load(self, argtypes) -> str:
        """Load (or compile) the kernel for ``argtypes`` on this GPU now, not at first launch.

        Returns ``"disk"``, ``"compiled"`` or ``"loaded"`` (already in this process).
        """
        argtypes = tuple(argtypes)
        if argtypes in self._loaded:
            return "loaded"
        self._loaded[argtypes] = _Loaded(self._load_or_compile(argtypes, _device_target()), argtypes)
        return self.last_build["source"]

    def build(self, argtypes, target: Target) -> str:
        """Compile for ``argtypes`` and ``target`` into the disk cache unless it is there already.

        Needs no GPU. Returns ``"compiled"`` or ``"cached"``.
        """
        start = time.perf_counter()
        key, _, meta, source = self._cached_or_compiled(argtypes, target)
        self.last_build = {"source": source, "seconds": time.perf_counter() - start, "key": key,
                           "phases": meta.get("phases", {})}
        return "cached" if source == "disk" else "compiled"

    def cached(self, argtypes, target: Target) -> bool:
        """Whether the disk cache holds a sound entry for ``argtypes`` and ``target`` (compiles nothing)."""
        from .runtime.support import support_build_for  # noqa: PLC0415

        try:
            key = self._cache_key(argtypes, target, support_build_for(target.nccl, target.arch))
        except _cache.Uncacheable:
            return False
        return _cache.read_entry(_cache_root(), key) is not None

    def _cached_or_compiled(self, argtypes, target: Target):
        """``(key, cubin, meta, source)`` from the disk cache, or compiled and stored there.

        ``key`` is None for a kernel that cannot be cached (it reaches a value without a
        reliable hash): it is compiled in memory, with one warning per kernel.
        """
        from .runtime.support import support_build_for  # noqa: PLC0415

        support = support_build_for(target.nccl, target.arch)
        try:
            key, uncacheable = self._cache_key(argtypes, target, support), None
        except _cache.Uncacheable as exc:
            key, uncacheable = None, exc
        root = _cache_root()
        if key is not None:
            hit = _cache.read_entry(root, key)
            if hit is not None:
                return key, hit[0], hit[1], "disk"
        from .lowering.compiler import compile_kernel  # noqa: PLC0415 - binds numba-cuda: not for a disk hit

        compiled = compile_kernel(self.py_func, argtypes, target, support.ltoir, fastmath=self.fastmath,
                                  max_registers=self.max_registers,
                                  lineinfo=self.lineinfo, support_arch=support.arch,
                                  link_for_features=_feature_libraries(target))
        meta = {"entry_name": compiled.entry_name, "features": sorted(compiled.features), "phases": compiled.phases}
        if key is not None:
            _cache.write_entry(root, key, compiled.cubin, compiled.entry_name, compiled.features)
        elif not self.__dict__.get("_warned_uncacheable"):
            self._warned_uncacheable = True
            _cache.warn(f"Cannot cache kernel {self.py_func.__qualname__} on disk: {uncacheable}, whose value "
                        "flowdsl cannot hash reliably. It is compiled in memory in each process; make such values "
                        "numbers, tuples, NumPy scalars or arrays, or enums to cache it.")
        return key, compiled.cubin, meta, "compiled"

    def _load_or_compile(self, argtypes, target: Target):
        start = time.perf_counter()
        key, cubin, meta, source = self._cached_or_compiled(argtypes, target)
        loaded = _numba_kernel(meta["entry_name"], cubin, argtypes)
        loaded.bind()  # load the module now, so that the time below includes it
        loaded.flowdsl_features = frozenset(meta.get("features", ()))
        self.last_build = {"source": source, "seconds": time.perf_counter() - start, "key": key,
                           "phases": meta.get("phases", {})}
        return loaded


_DIGESTS: dict = {}


def _digest_of(data: bytes) -> str:
    """sha256 of a support build, once per process (it is megabytes, hashed per kernel otherwise)."""
    key = (id(data), len(data))
    hit = _DIGESTS.get(key)
    if hit is None or hit[0] is not data:
        hit = _DIGESTS[key] = (data, hashlib.sha256(data).hexdigest())
    return hit[1]


@functools.cache
def _versions() -> dict:
    """Versions of what compiles a kernel (what they key by name is theirs)."""
    import llvmlite  # noqa: PLC0415
    import numba  # noqa: PLC0415
    import numba_cuda  # noqa: PLC0415
    import numpy  # noqa: PLC0415

    from .lowering.target import linker_cuda_version  # noqa: PLC0415

    return {"numba_cuda": getattr(numba_cuda, "__version__", "?"), "numba": numba.__version__,
            "llvmlite": llvmlite.__version__, "numpy": numpy.__version__,
            "python": list(sys.version_info[:2]), "nvjitlink": list(linker_cuda_version())}


def _numba_config() -> list:
    """numba-cuda settings that change generated code (from NUMBA_* variables)."""
    from numba.cuda.core import config  # noqa: PLC0415

    return [str(config.OPT), bool(config.CUDA_DEBUGINFO_DEFAULT), bool(getattr(config, "CUDA_ENABLE_NRT", False))]


_SCALARS = {int: types.int64, float: types.float64, bool: types.boolean}


def _argument_type(kernel_name: str, index: int, arg):
    """numba type of a launch argument, cheaply for the common kinds (the launch hot path)."""
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
    cai = getattr(arg, "__cuda_array_interface__", None)
    if cai is not None:
        return _array_type(cai["typestr"], len(cai["shape"]), cai.get("strides") is None)
    from numba.cuda.typing.typeof import Purpose, typeof  # noqa: PLC0415

    try:
        ty = typeof(arg, Purpose.argument)
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"Cannot launch {kernel_name}: argument {index} ({type(arg).__name__}) has no "
                         f"kernel type: {exc}") from exc
    if ty is None:
        raise UsageError(f"Cannot launch {kernel_name}: argument {index} of type {type(arg).__name__} "
                         "cannot be passed to a kernel (pass device arrays, scalars, windows and "
                         "device communicators)")
    return ty


#: argument type -> a function giving its numba type without __cuda_array_interface__ (which
#: CuPy builds as a new dict at every access), or None for the general path.
_TYPER_OF: dict = {}
_unknown = object()


def _typer(kind):
    if (kind.__module__ or "").startswith("cupy") and hasattr(kind, "flags") and hasattr(kind, "data"):
        return lambda a: _array_type(a.dtype.str, a.ndim, a.flags.c_contiguous)
    return None


@functools.cache
def _array_type(typestr: str, ndim: int, c_contiguous: bool):
    import numpy as np  # noqa: PLC0415
    from numba.np.numpy_support import from_dtype  # noqa: PLC0415

    return types.Array(from_dtype(np.dtype(typestr)), ndim, "C" if c_contiguous else "A")


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
        self.cu_kernel = numba_kernel._codelibrary.get_cufunc().kernel if self.fast else None
        self.params = _ParameterBuffer(argtypes) if self.fast else None

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
        self.params.launch(self.cu_kernel.handle, args, grid, block, stream, shared)


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

    def launch(self, handle, args, grid, block, stream: int, shared):
        from cuda.bindings import driver  # noqa: PLC0415 - a cached module lookup

        values: list = []
        for pack, arg in zip(self.packers, args):
            pack(arg, values)
        hstream = _CU_STREAMS.get(stream) or _cu_stream(stream)
        with self.lock:
            try:
                self.layout.pack_into(self.buffer, 0, *values)
            except struct.error as exc:
                raise UsageError(f"Cannot launch: an argument does not fit its kernel parameter ({exc}). "
                                 "Pass values within the range of the kernel's argument types") from None
            err = driver.cuLaunchKernel(handle, *grid, *block, shared, hstream, self.address, 0)[0]
        if err:
            raise UsageError(f"Cannot launch: cuLaunchKernel returned {err.name}{_capture_hint(err.name)}")


_CU_STREAMS: dict = {}


def _cu_stream(handle: int):
    from cuda.bindings import driver  # noqa: PLC0415

    if len(_CU_STREAMS) > 256:  # handles of destroyed streams are reused: keep the cache small
        _CU_STREAMS.clear()
    stream = _CU_STREAMS[handle] = driver.CUstream(handle)
    return stream


def _value_packer(ty):
    """``(struct codes, pack(arg, values))`` of one argument's flattened parameters."""
    from .lowering.types import DevCommType, WindowType  # noqa: PLC0415

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

    def from_interface(a):
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
    return from_interface


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

        from cuda.bindings import driver  # noqa: PLC0415

        self.handle, self.keep_alive, self.shape = handle, keep_alive, shape
        self.stream, self.address = driver.CUstream(stream), ctypes.addressof(keep_alive[1])
        self.graph_exec = None  # made at the first launch outside capture; False: not available

    def __call__(self):
        from cuda.bindings import driver  # noqa: PLC0415 - a cached module lookup

        err, status = driver.cuStreamIsCapturing(self.stream)
        if not err and not status and self.graph_exec is not False:
            if self.graph_exec is None:
                self.graph_exec = self._instantiate()
                return self()
            err = driver.cuGraphLaunch(self.graph_exec, self.stream)[0]
        else:
            err = driver.cuLaunchKernel(self.handle, *self.shape, self.stream, self.address, 0)[0]
        if err:
            raise UsageError(f"Cannot launch: cuLaunchKernel returned {err.name}{_capture_hint(err.name)}")

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
        return graph_exec


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

        def pack_array(arg, flat):
            cai = arg.__cuda_array_interface__
            shape = cai["shape"]
            strides = cai.get("strides")
            if strides is None:
                strides, step = [], itemsize
                for dim in reversed(shape):
                    strides.append(step)
                    step *= dim
                strides.reverse()
            size = 1
            for dim in shape:
                size *= dim
            flat.extend((0, 0, size, itemsize, cai["data"][0]))
            flat.extend(shape)
            flat.extend(strides)
        return pack_array
    if isinstance(ty, types.Integer):
        ctype = getattr(ctypes, f"c_{ty}")
        return lambda arg, flat: flat.append(ctype(arg))
    if ty == types.float32:
        return lambda arg, flat: flat.append(ctypes.c_float(arg))
    if ty == types.float64:
        return lambda arg, flat: flat.append(ctypes.c_double(arg))
    return None


def _device_target() -> Target:
    from numba import cuda  # noqa: PLC0415

    from .lowering.target import Target  # noqa: PLC0415
    from .runtime import nccl as nccl_runtime  # noqa: PLC0415

    cc = cuda.get_current_device().compute_capability
    return Target(nccl_runtime.loaded_version(), f"sm_{cc[0]}{cc[1]}", _cuda_version(None))


def _cft_digest(target: Target):
    """sha256 of the CFT build a kernel for ``target`` would link, or None (part of the cache key)."""
    from .runtime.support import manifest  # noqa: PLC0415

    builds = manifest().get("cft", {}).get("abis", {}).get(format_version(target.nccl), {}).get("builds", {})
    return sorted(b["sha256"] for b in builds.values()) or None


def _cuda_version(cuda) -> tuple[int, int]:
    """``(major, minor)`` of ``cuda`` ("13.3", a tuple), or of the installed nvJitLink when None."""
    from .lowering.target import linker_cuda_version  # noqa: PLC0415

    if cuda is None:
        return linker_cuda_version()
    if isinstance(cuda, str):
        cuda = cuda.split(".")
    return int(cuda[0]), int(cuda[1])


def _feature_libraries(target: Target):
    """Libraries a kernel's features add to its link: the CFT build when it uses flowdsl.cft."""
    def libraries(features):
        from .lowering.cft_surface import CFT_FEATURE  # noqa: PLC0415
        from .runtime.support import cft_build_for  # noqa: PLC0415

        if CFT_FEATURE not in features:
            return []
        return [("flowdsl_cft", cft_build_for(target.nccl, target.arch).ltoir)]
    return libraries


def _numba_kernel(entry_name: str, cubin: bytes, argtypes):
    """A numba-cuda launchable kernel around an already linked cubin."""
    from cuda.core import ObjectCode  # noqa: PLC0415
    from numba.cuda.codegen import CUDACodeLibrary  # noqa: PLC0415
    from numba.cuda.descriptor import cuda_target  # noqa: PLC0415
    from numba.cuda.dispatcher import _Kernel  # noqa: PLC0415

    from .lowering.types import ArgumentMarshaller  # noqa: PLC0415

    codegen = cuda_target.target_context.codegen()
    library = CUDACodeLibrary._rebuild(codegen, entry_name, entry_name, [], {}, {}, {}, None, {}, False, False,
                                       False, True)
    library._cubin_cache[library._ensure_cc(None)] = ObjectCode.from_cubin(cubin, name=entry_name)
    return _Kernel._rebuild(False, entry_name, types.void(*argtypes), library, False, False, None,
                            [ArgumentMarshaller()])


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
    def __init__(self, kernel: FlowKernel, grid, block, stream, shared):
        self.kernel = kernel
        self.grid = tuple(grid) if isinstance(grid, list) else grid
        self.block = tuple(block) if isinstance(block, list) else block
        self.stream = stream
        self.shared = shared
        name = kernel.__name__
        self.dims = launch_shape(self.grid, self.block, name)  # CUDA's limits, on GPUs and the simulator

    def __call__(self, *args):
        # One resolution for the GPU and the simulator: both accept and refuse the same streams.
        stream = stream_handle(self.stream, args, self.kernel._launch_operation)
        if self._on_simulator(args):
            return _stubs._simulator_launch(self.kernel, self.grid, self.block, stream, self.shared, args)
        loaded, grid, block = self._checked(args, stream)
        loaded.launch(args, grid, block, stream, int(self.shared))

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
            check_features(name, loaded.features, args)
        return loaded, grid, block


@functools.cache
def _resource_type():
    from .runtime.memory import Resource  # noqa: PLC0415

    return Resource


def _check_resources(name: str, args) -> None:
    """Windows and device communicators must be open and belong to one communicator."""
    Resource = _resource_type()  # noqa: N806
    owners = set()
    for i, arg in enumerate(args):
        if isinstance(arg, Resource):
            arg._check_open(f"launch {name} (argument {i})")
            owners.add(id(arg.communicator))
    if len(owners) > 1:
        raise UsageError(f"Cannot launch {name}: its windows and device communicators come from different "
                         "communicators. Register windows and create the device communicator on the same "
                         "flowdsl communicator.")


def check_features(name: str, features, args) -> None:
    """Refuse a launch whose kernel needs what the device communicator's backend lacks."""
    from .lowering.gin_surface import STRONG_SIGNAL_FEATURE  # noqa: PLC0415

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
