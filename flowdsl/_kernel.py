"""``@flowdsl.kernel`` (and ``@flowdsl.device``, made in :mod:`flowdsl._devices`).

A :class:`FlowKernel` is compiled per (argument types, NCCL release, arch) at
first launch: numba lowers it to LTO-IR, nvJitLink links it with the support
build of the loaded NCCL, and the cubin is cached on disk (keyed by what the
kernel's code depends on — see :mod:`flowdsl._cache` — the argument types, the NCCL
release, the arch, the support build and the compilers' versions) so that a second
process loads it instead of compiling. Launching is :mod:`flowdsl._launch`.

Contents: :func:`kernel`, :func:`device`, :class:`FlowKernel`, :func:`check_features`.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from numba.core import types

from . import _cache
from ._devices import device
from ._launch import _argument_type, _array_type, _config_key, _Launch, _Loaded, check_features
from ._release import format_version, parse_version
from ._version import __version__
from .errors import UsageError
from .runtime.streams import refuse_during_capture

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
    A launch repeated with the same arguments on the same stream (a loop) replays a CUDA graph
    of its first such launch, which costs less host time; what it packs is checked to be
    unchanged first: the same objects (held weakly), array layouts and scalars.
    ``k[grid, block].prepare(*args)`` returns such a launch as a callable without the checks.
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
        self._loaded_for_backends: dict = {}  # (argtypes, GIN backend) -> loaded, beside the first one
        self._launches: dict = {}
        #: Last compile/load: {"source": "compiled"|"disk", "seconds": float, "key": str,
        #: "phases": CPU seconds per compile step (numba, nvvm, link; empty from disk)}
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
            "support": _digest_of(support.ltoir), "cft": _cft_digest(target), "gin": _gin_digest(target),
            "options": [self.fastmath, self.lineinfo, self.max_registers],
        }, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    def compile(self, argtypes, *, arch: str = "sm_90", nccl: str | tuple | None = None,
                cuda: str | tuple | None = None, gin_backend=None) -> CompiledKernel:
        """Compile and link for explicit argument types and target; needs no GPU.

        Args:
            argtypes: numba types of the parameters (see :meth:`argtypes_for`).
            arch: ``sm_80``, ``sm_90``, ``sm_100``, ...
            nccl: NCCL release of the device ABI (default: the loaded libnccl).
            cuda: CUDA release of the linker, ``"13.3"`` (default: the installed nvJitLink's);
                gates features that need a newer one (CFT needs 13.3).
            gin_backend: ``"proxy"``, ``"gdaki"``, ``"gpi"``, ``"efa_gda"`` (or a
                :class:`flowdsl.GinBackend`): link GIN for that backend only, as a launch does
                for its device communicator's backend (default: every backend).
        """
        from .lowering.compiler import compile_kernel  # noqa: PLC0415
        from .lowering.target import Target  # noqa: PLC0415
        from .runtime import nccl as nccl_runtime  # noqa: PLC0415
        from .runtime.support import support_build_for  # noqa: PLC0415

        version = parse_version(nccl) if nccl is not None else nccl_runtime.loaded_version()
        support = support_build_for(version, arch)
        target = Target(version, arch, _cuda_version(cuda), _gin_backend_named(gin_backend, self.__name__))
        return compile_kernel(self.py_func, tuple(argtypes), target, support.ltoir,
                              fastmath=self.fastmath, lineinfo=self.lineinfo, support_arch=support.arch,
                              max_registers=self.max_registers,
                              link_for_features=_feature_libraries(target))

    @staticmethod
    def argtypes_for(*args, nccl: str | tuple | None = None):
        """numba types of host arguments; ``"devcomm"``, ``("window", dtype)`` and ``("staging", dtype)``
        (a window from :func:`flowdsl.flow.staging`) stand in for objects."""
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
                out.append(_array_type(arg.__array_interface__["typestr"], arg.ndim, arg.flags.c_contiguous))
            else:
                out.append(argument_type(arg))
        return tuple(out)

    def _specialize(self, args, stream: int | None = None):
        """The loaded kernel for these launch arguments (compiled, or loaded from disk, once).

        ``stream``: the launch's stream handle; loading is refused while it captures a graph.
        """
        argtypes = tuple([_argument_type(self.__name__, i, arg) for i, arg in enumerate(args)])
        ids = tuple(map(id, argtypes))
        loaded = self._loaded_by_ids.get(ids)
        if loaded is not None:
            return loaded
        loaded = self._loaded.get(argtypes)
        if loaded is None:
            if stream is not None:
                refuse_during_capture(stream, self._launch_operation, "its first launch for these argument "
                                      "types compiles or loads the kernel's module (not capturable)")
            # GIN kernels are linked for the backend of the device communicator they are launched with:
            # known only now, and NCCL's code for the other backends is most of their compile time.
            target = replace(_device_target(), gin_backend=_gin_backend_of(args))
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

    def _for_gin_backend(self, loaded, args, stream: int | None):
        """``loaded``, or, when it was linked for another GIN backend than that of ``args``' device
        communicator, the kernel linked for that one (compiled or loaded once; the same argument
        types on communicators of two backends in one process)."""
        from .lowering.gin_surface import linked_backend  # noqa: PLC0415 - a cached module lookup

        linked = linked_backend(loaded.features)
        if linked is None:
            return loaded
        backend = _gin_backend_of(args)
        if backend == linked:
            return loaded
        other = self._loaded_for_backends.get((loaded.argtypes, backend))
        if other is None:
            if stream is not None:
                refuse_during_capture(stream, self._launch_operation, "its first launch on a device communicator "
                                      "of this GIN backend compiles or loads the kernel's module (not capturable)")
            target = replace(_device_target(), gin_backend=backend)
            other = _Loaded(self._load_or_compile(loaded.argtypes, target), loaded.argtypes)
            self._loaded_for_backends[(loaded.argtypes, backend)] = other
        return other

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
        # A GIN kernel linked for one backend is stored under a key of its own; the plain key holds
        # kernels that run with any backend (without GIN, or linked with every backend).
        backend_key = _backend_key(key, target)
        for k in (backend_key, key):
            hit = _cache.read_entry(root, k) if k is not None else None
            if hit is not None:
                return k, hit[0], hit[1], "disk"
        from .lowering.compiler import compile_kernel  # noqa: PLC0415 - binds numba-cuda: not for a disk hit

        compiled = compile_kernel(self.py_func, argtypes, target, support.ltoir, fastmath=self.fastmath,
                                  max_registers=self.max_registers,
                                  lineinfo=self.lineinfo, support_arch=support.arch,
                                  link_for_features=_feature_libraries(target))
        meta = {"entry_name": compiled.entry_name, "features": sorted(compiled.features), "phases": compiled.phases}
        from .lowering.gin_surface import linked_backend  # noqa: PLC0415

        if key is not None and linked_backend(compiled.features) is not None:
            key = backend_key
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
    import numpy  # noqa: PLC0415

    from .lowering import backend  # noqa: PLC0415
    from .lowering.target import linker_cuda_version  # noqa: PLC0415

    return {**backend.versions(), "numpy": numpy.__version__, "python": list(sys.version_info[:2]),
            "nvjitlink": list(linker_cuda_version())}


def _numba_config() -> list:
    """numba-cuda settings that change generated code (from NUMBA_* variables)."""
    from .lowering.backend import codegen_settings  # noqa: PLC0415

    return codegen_settings()


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
    """Libraries a kernel's features add to its link: a GIN build for GIN, the CFT build for flowdsl.cft."""
    from .runtime.support import feature_libraries  # noqa: PLC0415

    return feature_libraries(target)


def _gin_digest(target: Target):
    """Digest of the GIN builds a kernel for ``target`` may link (part of the cache key)."""
    from .runtime import support, support_build  # noqa: PLC0415

    return support.gin_digest(target.nccl) or "sources:" + ",".join(support_build.source_digest().values())


def _backend_key(key, target: Target):
    """The cache key of a GIN kernel linked for ``target``'s backend only (None: no backend named)."""
    if key is None or target.gin_backend is None:
        return None
    return hashlib.sha256(f"{key} gin:{target.gin_backend.option}".encode()).hexdigest()[:32]


def _gin_backend_named(name, kernel_name: str):
    """``name`` as a :class:`flowdsl.GinBackend` (None stays None), or a UsageError naming the choices."""
    from .enums import GinBackend  # noqa: PLC0415

    if name is None:
        return None
    backend = GinBackend.from_option(name)
    if backend is None:
        raise UsageError(f"Cannot compile {kernel_name} for gin_backend={name!r}: it is not a GIN backend. "
                         f"Use one of {', '.join(b.option for b in GinBackend)}, or None for every backend")
    return backend


def _gin_backend_of(args):
    """The GIN backend of the first device communicator among launch ``args`` (None: none, or not one)."""
    for arg in args:
        backend = getattr(arg, "gin_backend", None)
        if backend is not None:
            return backend
    return None


def _numba_kernel(entry_name: str, cubin: bytes, argtypes):
    """A numba-cuda launchable kernel around an already linked cubin."""
    from .lowering.backend import load_kernel  # noqa: PLC0415
    from .lowering.types import ArgumentMarshaller  # noqa: PLC0415

    return load_kernel(entry_name, cubin, argtypes, [ArgumentMarshaller()])
