"""``@flowdsl.kernel`` (and ``@flowdsl.device``, made in :mod:`flowdsl._devices`).

A :class:`FlowKernel` is compiled per (argument types, NCCL release, arch) at
first launch: numba lowers it to LTO-IR, nvJitLink links it with the support
build of the loaded NCCL, and the cubin is cached on disk (keyed by what the
kernel's code depends on, the argument types, the NCCL
release, the arch, the support build and the compilers' versions) so that a second
process loads it instead of compiling. The key is :mod:`flowdsl._cache`'s, argument types
:mod:`flowdsl._argtypes`', the target of a launch :mod:`flowdsl._targets`', and launching is
:mod:`flowdsl._launch`.
"""

from __future__ import annotations

import collections
import functools
import inspect
import sys
import time
import warnings
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from . import _argtypes, _cache, _launch, _stubs, _targets
from ._devices import debug_options, device, referenced_values
from ._launch import _config_key, _Launch, _Loaded, check_features
from ._release import format_version, parse_version
from .errors import AlreadySpecializedError, UsageError
from .host import checks
from .host.streams import refuse_during_capture

if TYPE_CHECKING:  # the compiler (numba-cuda, nvJitLink) is imported at the first compile
    from .lowering.compiler import CompiledKernel
    from .lowering.target import Target

__all__ = ["kernel", "device", "FlowKernel", "check_features"]


def kernel(fn=None, *, signature=None, fastmath: bool = False, lineinfo: bool = False,
           max_registers: int | None = None, link=(), extensions=(), launch_bounds=None,
           shared_memory_carveout=None, debug: bool | None = None, opt: bool | None = None, inline="never",
           forceinline: bool = False, cache: bool = False):
    """Make ``fn`` a flowdsl kernel; launch it as ``k[grid, block](*args)``.

    ``@flowdsl.kernel("void(int32[:], int32)")`` (or ``signature=``), as numba-cuda's ``cuda.jit`` takes
    it: the scalar arguments of a launch take the signature's types (a Python int passed for an ``int32``
    is an int32, on the GPU and the simulator alike); without one they are typed as numba types them
    (int64, float64). On a machine with a GPU a declared signature is compiled (or loaded from the disk
    cache) at decoration, as numba-cuda does: a typing error is raised there.

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
    ``launch_bounds``: numba-cuda's, ``max_threads`` or ``(max_threads, min_blocks_per_sm,
    max_blocks_per_cluster)`` (PTX ``.maxntid``, ``.minnctapersm``, ``.maxclusterrank``); a launch of
    more threads a block is refused. ``shared_memory_carveout``: numba-cuda's, the percent of the L1/shared
    memory preferred as shared memory (-1 to 100, ``"default"``, ``"MaxL1"``, ``"MaxShared"``), set when the
    kernel is loaded.
    ``link``: files (``.cu``, ``.ptx``, ``.ltoir``, ``.o``, ``.a``) or numba ``LinkableCode`` objects to
    link beside the kernel, as numba-cuda's ``cuda.jit(link=...)`` takes them (with
    ``cuda.declare_device`` for the functions they define); their contents are part of the cache key.
    ``extensions``: numba-cuda's argument hooks, objects with ``prepare_args(ty, val, stream=, retr=)``
    returning ``(ty, val)``, applied to each argument before a launch (``kernel.extensions.append``
    works too); callables they put in ``retr`` run after the launch.
    ``debug`` and ``opt``: numba-cuda's. ``debug=True`` compiles debug information (for cuda-gdb; with
    ``opt=False``, as numba-cuda warns otherwise) and a kernel that reports an exception it raises: on a GPU
    the launch waits for the kernel and raises it on the host, as numba-cuda's does, with the thread and
    block before the message (``tid=[..] ctaid=[..]: ``); without ``debug`` the GPU reports nothing and the
    thread that raised returns. Such a kernel is compiled in each process, not kept in the disk cache. Left None,
    both are numba-cuda's defaults (``NUMBA_CUDA_DEBUGINFO``, ``NUMBA_OPT``), with its warnings when this is called.
    ``inline`` and ``forceinline``: numba-cuda's, for where the kernel is called from another kernel (as a device
    function): ``inline`` ``"always"`` (or True) inlines the call in numba's IR, ``"never"`` (or False) does not, a
    cost-model function decides per call; ``forceinline=True`` marks its LLVM function ``alwaysinline``.
    ``cache=True``: numba-cuda's on-disk cache as well (``__pycache__`` beside the source, numba-cuda's files and
    keys: each loads the other's entries), with ``stats`` and ``recompile()``; flowdsl's own disk cache keeps every
    kernel whatever ``cache`` says. Refused, as numba-cuda refuses it, with ``link=`` files or for a kernel that
    reaches a device array.
    """
    debug, opt = debug_options(debug, opt, lineinfo)
    if isinstance(inline, bool):  # numba-cuda's older spelling
        inline = "always" if inline else "never"
    if fn is not None and not callable(fn):  # kernel("void(int32[:], int32)"), numba's first argument
        signature, fn = fn, None
    make = functools.partial(FlowKernel, signature=signature, fastmath=fastmath, lineinfo=lineinfo,
                             max_registers=max_registers, link=link, extensions=extensions, launch_bounds=launch_bounds,
                             shared_memory_carveout=shared_memory_carveout, debug=debug, opt=opt, inline=inline,
                             forceinline=forceinline, cache=cache)
    return make if fn is None else make(fn)


def _rebuilt_kernel(payload: bytes) -> FlowKernel:
    """A kernel unpickled (:meth:`FlowKernel.__reduce__`): made again from its function and options."""
    import pickle  # noqa: PLC0415

    py_func, options = pickle.loads(payload)
    return FlowKernel(py_func, **options)


#: numba's configuration flags that print what its compile makes (``NUMBA_DUMP_*``, ``NUMBA_DEBUG_*``).
_NUMBA_DUMPS = ("DUMP_BYTECODE", "DUMP_CFG", "DUMP_IR", "DUMP_SSA", "DUMP_LLVM", "DUMP_FUNC_OPT", "DUMP_OPTIMIZED",
                "DUMP_ASSEMBLY", "DEBUG_TYPEINFER", "DUMP_ANNOTATION", "ANNOTATE")


def _numba_dumps_asked() -> bool:
    """Whether numba-cuda's configuration asks its compile to print what it makes: such a compile runs here,
    not from the disk cache (numba-cuda's dispatcher compiles in each process too)."""
    config = sys.modules.get("numba.cuda.core.config")  # a compile has imported it; a disk hit need not
    return config is not None and any(getattr(config, flag, 0) for flag in _NUMBA_DUMPS)


def _launches_on_a_gpu() -> bool:
    """Whether kernels made in this process can be compiled for a GPU now: numba-cuda's driver finds one (never
    under numba-cuda's own simulator, ``NUMBA_ENABLE_CUDASIM=1``; flowdsl's simulator needs none)."""
    from numba import cuda  # noqa: PLC0415 - a declared signature: numba parsed it already
    from numba.cuda.core import config  # noqa: PLC0415

    return not config.ENABLE_CUDASIM and cuda.is_available()


def _declared_argtypes(signature, name: str):
    """The numba argument types of numba signature ``signature`` (None: none, or several: numba would choose
    among them by the arguments)."""
    if signature is None or (isinstance(signature, list) and len(signature) != 1):
        return None
    return _parsed(signature[0] if isinstance(signature, list) else signature, signature, name)


def _declared_candidates(signature, name: str) -> tuple:
    """The argument types of each signature of a list of two or more (numba-cuda chooses among them by a
    launch's arguments), else ()."""
    if not isinstance(signature, list) or len(signature) < 2:
        return ()
    return tuple(_parsed(one, signature, name) for one in signature)


def _parsed(one, signature, name: str) -> tuple:
    from numba.core import sigutils  # noqa: PLC0415 - numba's own parser of its signatures

    try:
        args, _ = sigutils.normalize_signature(one)
    except Exception as e:  # noqa: BLE001 - numba says what is wrong with it
        raise UsageError(f"Cannot make kernel {name} with signature {signature!r}: {e}. Write it as numba-cuda "
                         "takes it, e.g. \"void(float32[:], int32)\"") from None
    return tuple(args)


#: The barrier each ``(module, primitive)`` opens -> the device communicator's count of it (one per block).
_BARRIER_COUNTS = {("lsa", "barrier"): "lsa_barrier_count", ("gin", "rail_barrier"): "rail_gin_barrier_count",
                   ("gin", "world_barrier"): "world_gin_barrier_count", ("gin", "hybrid_barrier"): "barrier_count",
                   ("cft", "barrier"): "cft_barrier_count"}


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


def _refuse_another_abi(name: str, argtypes, version: tuple) -> None:
    """Refuse argument types made for another NCCL release than the one compiled for: a device
    communicator's layout is its release's, and the support build linked in is the target's."""
    for i, ty in enumerate(argtypes):
        abi = getattr(ty, "abi", None)
        if abi is not None and tuple(abi) != tuple(version):
            raise UsageError(f"Cannot compile {name}: argument {i} is a device communicator of NCCL "
                             f"{format_version(abi)}, but the kernel is compiled for NCCL {format_version(version)} "
                             "(the device communicator's layout and the support library are a release's own). "
                             f"Make the argument types for that release: FlowKernel.argtypes_for(..., "
                             f"nccl=\"{format_version(version)}\"), or compile with nccl=\"{format_version(abi)}\"")


class FlowKernel:
    """A flowdsl kernel: compiled at first launch per argument types, cached on disk."""

    __flowdsl_kernel__ = True  # how the lowering knows a kernel called from a kernel (lowering/devices.py)

    def __init__(self, py_func, *, signature=None, fastmath: bool = False, lineinfo: bool = False,
                 max_registers: int | None = None, link=(), extensions=(), launch_bounds=None,
                 shared_memory_carveout=None, debug: bool = False, opt: bool = True, inline="never",
                 forceinline: bool = False, cache: bool = False):
        # A kernel (flowdsl's or numba-cuda's dispatcher) made a kernel again is its function's, as numba-cuda's
        # cuda.jit takes a dispatcher
        py_func = getattr(py_func, "py_func", py_func)
        self.py_func = py_func
        self.debug, self.opt = bool(debug), bool(opt)  # resolved and warned about by kernel()
        #: How a kernel that calls this one (as a device function) compiles the call: numba's inline option and
        #: its own jit options there (numba-cuda's dispatcher's ``targetoptions``; part of the caller's cache key).
        self.inline = inline
        self.targetoptions = {"fastmath": bool(fastmath), "lineinfo": bool(lineinfo), "debug": self.debug,
                              "opt": self.opt, "forceinline": bool(forceinline), "inline": inline}
        self.launch_bounds = checks.launch_bounds(launch_bounds, py_func.__name__)
        #: Set on the function when it is loaded (not part of its code).
        self.shared_memory_carveout = checks.shared_memory_carveout(shared_memory_carveout, py_func.__name__)
        self.signature = signature
        #: The signature's NumPy scalar type per argument (None: no single signature), applied at launch.
        self._declared = _declared_argtypes(signature, py_func.__name__)
        #: A list of signatures: a launch takes the one its arguments match (:meth:`_matching`).
        self._candidates = _declared_candidates(signature, py_func.__name__)
        #: numba-cuda's: made with one signature (not a list of them), or by ``specialize``.
        self.specialized = signature is not None and not isinstance(signature, list)
        #: numba-cuda's: ``specialize``'s kernels by argument types (the same types give the same kernel).
        self.specializations: dict = {}
        self.scalar_types = _argtypes.scalar_types(self._declared)
        self.__name__ = py_func.__name__
        self.__doc__ = py_func.__doc__
        self.__wrapped__ = py_func
        self.fastmath = fastmath
        self.max_registers = max_registers
        self.lineinfo = lineinfo
        self.link = (link,) if isinstance(link, (str, bytes)) or not hasattr(link, "__iter__") else tuple(link)
        #: numba-cuda's argument hooks (``prepare_args``), applied at each launch.
        self.extensions = list(extensions)
        self._launch_operation = f"launch {py_func.__name__}"  # for errors; built once, not per launch
        self._loaded: dict = {}
        self._loaded_by_ids: dict = {}  # numba types are interned: their ids are a cheaper key
        self._loaded_for_backends: dict = {}  # (argtypes, GIN backend) -> loaded, beside the first one
        self._launches: dict = {}
        self._code: dict = {}  # argument types -> KernelCode, for the inspection API (made when asked)
        #: Last compile/load: {"source": "compiled"|"disk", "seconds": float, "key": str,
        #: "phases": CPU seconds per compile step (numba, nvvm, link; empty from disk)}
        self.last_build: dict = {}
        #: numba-cuda's disk cache (``cache=True``), and its counters by argument types (numba-cuda's ``stats``)
        self._numba_cache = None
        if cache:
            from . import _numba_cache  # noqa: PLC0415

            _numba_cache.refuse_linked_files(self.__name__, self.link)
            self._numba_cache = _numba_cache.NumbaDiskCache(py_func)
        self._cache_hits, self._cache_misses = collections.Counter(), collections.Counter()
        if (self._declared is not None or self._candidates) and _launches_on_a_gpu():
            self._compile_declared()

    def __reduce__(self):
        """numba-cuda's pickling of a dispatcher (``flowdsl._pickling``): the function and options, no code."""
        from . import _pickling  # noqa: PLC0415

        options = {"signature": self.signature, "extensions": self.extensions,
                   "shared_memory_carveout": self.shared_memory_carveout, "cache": self._numba_cache is not None,
                   **self._codegen, **self._as_callee}
        return _rebuilt_kernel, (_pickling.dumps((self.py_func, options)),)

    def _compile_declared(self) -> None:
        """Compile (or load) the declared signature for this GPU now, as numba-cuda's ``cuda.jit(signature)``
        compiles at decoration: a typing error is raised here, naming the kernel's line. Anything else that
        stops a compile here (no libnccl, ...) is left to the first launch, which says it."""
        from .errors import FlowDSLError, KernelTypingError  # noqa: PLC0415

        try:
            for argtypes in self._candidates or (self._declared,):
                self.load(argtypes)
        except KernelTypingError:
            raise
        except (FlowDSLError, OSError, RuntimeError):
            pass

    def __repr__(self):
        return f"<flowdsl.kernel {self.py_func.__module__}.{self.__name__}>"

    @property
    def _codegen(self) -> dict:
        """What the kernel's code is compiled with besides its argument types and target (one place for the
        compile, the inspection API and ``specialize``)."""
        return {"fastmath": self.fastmath, "lineinfo": self.lineinfo, "max_registers": self.max_registers,
                "link": self.link, "launch_bounds": self.launch_bounds, "debug": self.debug, "opt": self.opt}

    @property
    def _as_callee(self) -> dict:
        """What ``specialize`` keeps besides the code: how a calling kernel compiles this one."""
        return {"inline": self.inline, "forceinline": self.targetoptions["forceinline"]}

    def __call__(self, *args, **kwargs):
        raise UsageError(f"Cannot call kernel {self.__name__} directly: the launch configuration was not specified. "
                         f"Launch it with {self.__name__}[grid, block](...)")

    def specialize(self, *args):
        """numba-cuda's ``kernel.specialize(*args)``: the kernel with a signature of ``args``' numba types (its
        launches take their scalars as those types)."""
        if self.specialized:
            raise AlreadySpecializedError(f"Cannot specialize {self.__name__}: Dispatcher already specialized (it has "
                                          f"its one signature, {self._declared}). Specialize the kernel made "
                                          "without a signature")
        # Typed as a launch types them (CuPy arrays and PyTorch tensors, which numba's typeof does not know,
        # windows, device communicators), NumPy scalars by numba.
        types_ = tuple(_argtypes.argument_type(self.__name__, i, a, "specialize") for i, a in enumerate(args))
        made = self.specializations.get(types_)
        if made is None:
            made = self.specializations[types_] = FlowKernel(
                self.py_func, signature=types_, extensions=self.extensions,
                shared_memory_carveout=self.shared_memory_carveout, **self._codegen, **self._as_callee)
        return made

    def forall(self, ntasks: int, tpb: int = 0, stream=None, sharedmem: int = 0):
        """numba-cuda's ``kernel.forall(ntasks)``: a launch of ``ntasks`` threads at least, ``tpb`` a block
        (0: 128), as many blocks as that takes; the kernel guards ``cuda.grid(1) < ntasks`` itself. No tasks:
        a launcher that launches nothing, as numba-cuda's."""
        if not isinstance(ntasks, (int, np.integer)) or isinstance(ntasks, bool) or ntasks < 0:
            raise UsageError(f"Can't create ForAll with negative task count: {ntasks!r} for {self.__name__}. "
                             "Give the number of tasks, 0 or more")
        if ntasks == 0:
            return lambda *args: None
        tpb = tpb or 128
        return self[(ntasks + tpb - 1) // tpb, tpb, stream, sharedmem]

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
            # numba-cuda's advice, once per configuration (not per launch of a loop: launches stay cheap)
            if _low_occupancy_warnings() and not self._communicates:
                _warn_low_occupancy(launch.dims[0])
        return launch

    @functools.cached_property
    def _communicates(self) -> bool:
        """Whether the kernel names flowdsl's communication API (a module of flowdsl, or a function of one):
        such a kernel runs on few blocks by design, and numba-cuda's low-occupancy advice is not for it."""
        return any(getattr(v, "__name__", "").startswith("flowdsl") if inspect.ismodule(v) else
                   getattr(v, "__module__", "").startswith(_COMMUNICATION_MODULES)
                   for v in referenced_values(self.py_func))

    # -- numba-cuda's dispatcher API: the code of each signature ---------------------------------
    @property
    def signatures(self) -> list:
        """The argument types this kernel has been compiled for in this process (its declared signature's
        first), as numba-cuda's ``signatures`` lists them."""
        declared = list(self._candidates) or ([self._declared] if self._declared is not None else [])
        return declared + [argtypes for argtypes in self._loaded if argtypes not in declared]

    @property
    def overloads(self) -> dict:
        """``{argument types: loaded kernel}`` for each signature (numba-cuda's ``overloads``; a declared
        signature not launched yet is loaded on this GPU now). The values have numba-cuda's kernel attributes
        (``regs_per_thread``, ``shared_mem_per_block``, ...) and its typing (``_type_annotation.typemap``,
        typed again the first time it is read here). Inside a simulated rank, the simulator's: no GPU is asked
        (under numba-cuda's simulator that would be its stand-in device of sm_52, which flowdsl does not build
        for)."""
        if _stubs._simulator_active():
            return {argtypes: _stubs._simulator_overload(self, argtypes) for argtypes in self.signatures}
        kernels = self._loaded_kernels()
        for argtypes, kernel in kernels.items():
            if getattr(kernel, "_type_annotation", None) is None:  # a kernel loaded from its cubin: no typing kept
                kernel._type_annotation = self._kernel_code(argtypes).type_annotation()
                _answer_inspection(kernel, functools.partial(self._kernel_code, argtypes))
        return kernels

    def _loaded_kernels(self) -> dict:
        """``{argument types: loaded numba-cuda kernel}``, a declared signature not launched yet loaded now."""
        for argtypes in self._candidates or ((self._declared,) if self._declared is not None else ()):
            if argtypes not in self._loaded:
                self.load(argtypes)
        return {argtypes: loaded.numba_kernel for argtypes, loaded in self._loaded.items()}

    def _matching(self, args) -> tuple:
        """The declared signature (of a list) that ``args`` match, as numba-cuda's dispatcher chooses it: an
        exact match, else the best by numba's conversion rules; none or a tie is a TypeError in numba's words."""
        from numba.core import types, typing  # noqa: PLC0415
        # numba's conversion rules (numba.core.typeconv), which its CUDA typing context shares: the CPU
        # context's, which imports where numba-cuda's own simulator stands in for numba.cuda too.
        from numba.core.registry import cpu_target  # noqa: PLC0415

        from .errors import LaunchTypeError  # noqa: PLC0415

        argtypes = tuple(_argtypes.argument_type(self.__name__, i, a) for i, a in enumerate(args))
        if argtypes in self._candidates:
            return argtypes
        context = cpu_target.typing_context
        cases = [typing.signature(types.none, *c) for c in self._candidates]
        try:
            chosen = context.resolve_overload(self.py_func, cases, argtypes, {}, allow_ambiguous=False)
        except TypeError as e:  # numba's "Ambiguous overloading for ..."
            raise LaunchTypeError(f"{e}\nCannot launch {self.__name__}: pass arguments of one of its signatures' "
                                  "types exactly") from None
        if chosen is None:
            raise LaunchTypeError(f"No matching definition for argument type(s) {', '.join(map(str, argtypes))}: "
                                  f"cannot launch {self.__name__}, declared for "
                                  f"{', '.join(str(c) for c in self._candidates)}. Pass arguments of one of those "
                                  "types")
        return tuple(chosen.args)

    # inspect_llvm, inspect_asm, inspect_lto_ptx, inspect_sass: made below the class (_inspector)

    def inspect_types(self, file=None) -> None:
        """numba's source annotated with types, for each signature, written to ``file`` (default stdout)."""
        import sys  # noqa: PLC0415

        file = file or sys.stdout
        for argtypes in self.signatures:
            print(f"{self.__name__} {argtypes}", file=file)
            print("-" * 80, file=file)
            print(self._kernel_code(argtypes).types(), file=file)
            print("=" * 80, file=file)

    # get_regs_per_thread and numba-cuda's other resource getters: made below the class (_resource_getter)

    def _attribute(self, name: str, signature):
        """cuda.core's attribute of each loaded kernel under numba-cuda's ``name`` (``regs_per_thread``, ...)."""
        from ._launch import _kernel_function  # noqa: PLC0415

        kernels = self._loaded_kernels()  # not overloads: the getters need no typing
        attribute = _CORE_ATTRIBUTES[name]

        def value(kernel):
            return getattr(_kernel_function(kernel).attributes, attribute)
        if signature is not None:
            return value(kernels[self._signature_key(signature)])
        if self.specialized:  # numba-cuda: a specialized kernel's one value, not a dict
            return value(next(iter(kernels.values())))
        return {argtypes: value(k) for argtypes, k in kernels.items()}

    def _inspect(self, what: str, signature):
        if signature is not None:
            return getattr(self._kernel_code(self._signature_key(signature)), what)()
        return {argtypes: getattr(self._kernel_code(argtypes), what)() for argtypes in self.signatures}

    def _signature_key(self, signature) -> tuple:
        key = tuple(getattr(signature, "args", signature))  # a numba Signature, or argument types
        if key not in self.signatures:
            raise UsageError(f"Cannot inspect {self.__name__} for {key}: it is not compiled for those argument types "
                             f"(its signatures: {self.signatures}). Give it that signature (flowdsl.kernel(signature) "
                             "or k.specialize(*args)), or launch it on a GPU with such arguments first")
        return key

    def _kernel_code(self, argtypes):
        """The kernel's code for ``argtypes`` on this GPU's target (sm_90 and the loaded NCCL without one)."""
        code = self._code.get(argtypes)
        if code is None:
            from .lowering.compiler import KernelCode  # noqa: PLC0415
            from .lowering.target import Target  # noqa: PLC0415
            from .runtime import nccl as nccl_runtime  # noqa: PLC0415
            from .runtime.support import feature_libraries, support_build_for  # noqa: PLC0415

            try:
                target = _targets.device_target()
            except Exception:  # noqa: BLE001 - no GPU: inspect the code an sm_90 would run
                target = Target(nccl_runtime.loaded_version(), "sm_90", _targets.cuda_version(None))
            support = support_build_for(target.nccl, target.arch)
            code = self._code[argtypes] = KernelCode(
                self.py_func, argtypes, target, support.ltoir, link_for_features=feature_libraries(target),
                **self._codegen)
        return code

    # -- requirements ------------------------------------------------------------------------
    def requirements(self, grid) -> dict:
        """Device-communicator requirements this kernel implies for a launch over ``grid``.

        Barrier sessions get one barrier per block (the usual ``index=blockIdx.x``):
        ``lsa.barrier`` an LSA barrier, ``gin.rail_barrier`` a rail GIN barrier, ``gin.world_barrier`` a
        world GIN barrier,
        ``gin.hybrid_barrier`` both (``barrier_count``), ``cft.barrier`` a CFT barrier
        (``cft_barrier_count``); a kernel that makes a multimem view asks for ``lsa_multimem``; a kernel that
        makes a GIN context asks for GIN (``gin_connection_type`` FULL,
        unless another type is named). GIN signal and counter counts depend on run-time ids:
        pass ``gin_signal_count`` / ``gin_counter_count``.
        """
        pairs = _attribute_pairs(self.py_func.__code__)
        blocks = 1
        for dim in (grid if isinstance(grid, tuple) else (grid or 1,)):
            blocks *= int(dim)
        reqs = {count: blocks for pair, count in _BARRIER_COUNTS.items() if pair in pairs}
        if ("gin", "context") in pairs:  # NCCL >= 2.29 enables GIN only when asked
            from .enums import GinConnectionType  # noqa: PLC0415

            reqs["gin_connection_type"] = GinConnectionType.FULL
        if ("lsa", "multimem_view") in pairs:
            reqs["lsa_multimem"] = True
        return reqs

    # -- compilation ---------------------------------------------------------------------------
    def compile(self, argtypes, *, arch: str | None = None, nccl: str | tuple | None = None,
                cuda: str | tuple | None = None, gin_backend=None):
        """Compile and link for explicit argument types and target; needs no GPU.

        With argument types alone on a machine with a GPU it is numba-cuda's ``dispatcher.compile(signature)``:
        the kernel is compiled (or loaded from disk) for this GPU and joins :attr:`signatures` and
        :attr:`overloads`, and its loaded kernel is returned. Otherwise the compile for the target named here.

        Args:
            argtypes: numba types of the parameters (see :meth:`argtypes_for`), or a numba signature.
            arch: ``sm_80``, ``sm_90``, ``sm_100``, ... (default ``sm_90``).
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
        from .runtime.support import feature_libraries, support_build_for  # noqa: PLC0415

        argtypes = tuple(getattr(argtypes, "args", argtypes))
        if arch is None and nccl is None and cuda is None and gin_backend is None and _launches_on_a_gpu():
            self.load(argtypes)
            return self.overloads[argtypes]
        arch = arch or "sm_90"
        version = parse_version(nccl) if nccl is not None else nccl_runtime.loaded_version()
        _refuse_another_abi(self.__name__, argtypes, version)
        _targets.checked_arch(arch, f"compile {self.__name__}")
        support = support_build_for(version, arch)
        target = Target(version, arch, _targets.cuda_version(cuda), _targets.gin_backend_named(gin_backend, self.__name__))
        return compile_kernel(self.py_func, tuple(argtypes), target, support.ltoir, support_arch=support.arch,
                              link_for_features=feature_libraries(target), **self._codegen)

    @staticmethod
    def argtypes_for(*args, nccl: str | tuple | None = None):
        """numba types of host arguments; ``"devcomm"``, ``("window", dtype)`` and ``("staging", dtype)``
        (a window from :func:`flowdsl.flow.staging`) stand in for objects."""
        return _argtypes.argtypes_for(*args, nccl=nccl)

    def _specialize(self, args, stream: int | None = None):
        """The loaded kernel for these launch arguments (compiled, or loaded from disk, once).

        ``stream``: the launch's stream handle; loading is refused while it captures a graph.
        """
        argtypes = tuple([_argtypes.argument_type(self.__name__, i, arg) for i, arg in enumerate(args)])
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
            target = replace(_targets.device_target(), gin_backend=_targets.gin_backend_of(args))
            loaded = _Loaded(self._load_or_compile(argtypes, target), argtypes)
            self._loaded[argtypes] = loaded
        self._loaded_by_ids[ids] = loaded  # the argtypes key keeps the types (and their ids) alive
        return loaded

    def load(self, argtypes) -> str:
        """Load (or compile) the kernel for ``argtypes`` on this GPU now, not at first launch.

        Returns ``"disk"``, ``"compiled"`` or ``"loaded"`` (already in this process).
        """
        return self._load_for(tuple(argtypes), _targets.device_target())

    def _load_for(self, argtypes: tuple, target: Target) -> str:
        """:meth:`load` for ``target``, this GPU's (the library's load finds it once for every kernel)."""
        if argtypes in self._loaded:
            return "loaded"
        self._loaded[argtypes] = _Loaded(self._load_or_compile(argtypes, target), argtypes)
        return self.last_build["source"]

    def _for_gin_backend(self, loaded, args, stream: int | None):
        """``loaded``, or, when it was linked for another GIN backend than that of ``args``' device
        communicator, the kernel linked for that one (compiled or loaded once; the same argument
        types on communicators of two backends in one process)."""
        from .lowering.gin import linked_backend  # noqa: PLC0415 - a cached module lookup

        linked = linked_backend(loaded.features)
        if linked is None:
            return loaded
        backend = _targets.gin_backend_of(args)
        if backend == linked:
            return loaded
        other = self._loaded_for_backends.get((loaded.argtypes, backend))
        if other is None:
            if stream is not None:
                refuse_during_capture(stream, self._launch_operation, "its first launch on a device communicator "
                                      "of this GIN backend compiles or loads the kernel's module (not capturable)")
            target = replace(_targets.device_target(), gin_backend=backend)
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

        if self.debug:  # compiled in each process (its exception table is Python objects)
            return False
        try:
            key = _cache.kernel_key(self, argtypes, target, support_build_for(target.nccl, target.arch))
        except _cache.Uncacheable:
            return False
        return _cache.read_entry(_cache.kernel_root(), key) is not None

    def _cached_or_compiled(self, argtypes, target: Target):
        """``(key, cubin, meta, source)`` from the disk cache, or compiled and stored there.

        ``key`` is None for a kernel that cannot be cached (it reaches a value without a
        reliable hash): it is compiled in memory, with one warning per kernel.
        """
        from .runtime.support import feature_libraries, support_build_for  # noqa: PLC0415

        support = support_build_for(target.nccl, target.arch)
        try:
            # debug=True: compiled in each process (its exception table is Python objects), said in kernel()'s docs;
            # so is a kernel compiled while numba is asked for its dumps (NUMBA_DUMP_IR, ...), to print them
            in_process = self.debug or _numba_dumps_asked()
            key, uncacheable = (None, None) if in_process else (_cache.kernel_key(self, argtypes, target, support), None)
        except _cache.Uncacheable as exc:
            key, uncacheable = None, exc
        root = _cache.kernel_root()
        # A GIN kernel linked for one backend is stored under a key of its own; the plain key holds
        # kernels that run with any backend (without GIN, or linked with every backend).
        backend_key = _cache.backend_key(key, target)
        for k in (backend_key, key):
            hit = _cache.read_entry(root, k) if k is not None else None
            if hit is not None:
                _cache.warn_again(hit[1].get("warnings", ()))  # what numba's compile of it warned
                return k, hit[0], hit[1], "disk"
        from .lowering.compiler import compile_kernel  # noqa: PLC0415 - binds numba-cuda: not for a disk hit

        caught: list = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                compiled = compile_kernel(self.py_func, argtypes, target, support.ltoir, support_arch=support.arch,
                                          link_for_features=feature_libraries(target), **self._codegen)
        finally:  # said now (a compile that fails too), under the caller's filters; kept with the entry below
            caught = list({(str(w.message), w.category, w.filename, w.lineno): w for w in caught}.values())
            for w in caught:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        meta = {"entry_name": compiled.entry_name, "features": sorted(compiled.features), "phases": compiled.phases,
                "exceptions": compiled.exceptions}
        from .lowering.gin import linked_backend  # noqa: PLC0415

        if key is not None and linked_backend(compiled.features) is not None:
            key = backend_key
        if key is not None:
            _cache.write_entry(root, key, compiled.cubin, compiled.entry_name, compiled.features,
                               _cache.recorded_warnings(caught))
        elif uncacheable is not None and not self.__dict__.get("_warned_uncacheable"):
            self._warned_uncacheable = True
            _cache.warn(f"Cannot cache kernel {self.py_func.__qualname__} on disk: {uncacheable}, whose value "
                        "flowdsl cannot hash reliably. It is compiled in memory in each process; make such values "
                        "numbers, tuples, NumPy scalars or arrays, or enums to cache it.")
        return key, compiled.cubin, meta, "compiled"

    def _load_or_compile(self, argtypes, target: Target):
        start = time.perf_counter()
        linked_for = None
        if self._numba_cache is not None:  # numba-cuda's disk cache (cache=True) first: flowdsl's entry or its own
            from ._numba_cache import entry_features, stamp  # noqa: PLC0415

            stored = self._numba_cache.load(argtypes, target)
            if stored is not None:
                self._cache_hits[argtypes] += 1
                stored.flowdsl_debug = self.debug and getattr(stored, "call_helper", None) is not None
                return self._bound(stored, entry_features(stored), start, {"source": "disk", "key": None})
            linked_for = stamp(target)
        self._cache_misses[argtypes] += 1  # numba-cuda counts every compile of a kernel without its cache a miss
        key, cubin, meta, source = self._cached_or_compiled(argtypes, target)
        features = frozenset(meta.get("features", ()))
        loaded = _launch.numba_kernel(meta["entry_name"], cubin, argtypes, features, debug=self.debug,
                                      exceptions=meta.get("exceptions"), linked_for=linked_for)
        loaded = self._bound(loaded, features, start, {"source": source, "key": key, "phases": meta.get("phases", {})})
        if self._numba_cache is not None and target.gin_backend is None:  # numba-cuda's key knows no GIN backend
            self._numba_cache.save(argtypes, loaded)
        return loaded

    def _bound(self, loaded, features, start: float, build: dict):
        """``loaded`` with its module loaded on this GPU now (so that :attr:`last_build`'s time includes it)."""
        loaded.shared_memory_carveout = self.shared_memory_carveout  # numba-cuda's bind() sets it on the function
        loaded.bind()
        loaded.flowdsl_features = features
        self.last_build = {"phases": {}, **build, "seconds": time.perf_counter() - start}
        return loaded

    # -- numba-cuda's disk cache (cache=True) ----------------------------------------------------
    @property
    def stats(self):
        """numba-cuda's ``stats``: ``cache_path`` (numba-cuda's cache directory with ``cache=True``, else None),
        ``cache_hits`` and ``cache_misses`` of its disk cache by argument types (without ``cache=True``, every
        compile or load in this process is a miss)."""
        from numba.cuda.dispatcher import _CompileStats  # noqa: PLC0415

        path = self._numba_cache.cache_path if self._numba_cache is not None else None
        return _CompileStats(cache_path=path, cache_hits=self._cache_hits, cache_misses=self._cache_misses)

    def recompile(self) -> None:
        """numba-cuda's ``recompile()``: every signature loaded in this process compiled again, with the globals'
        values now, and numba-cuda's disk cache (``cache=True``) emptied and filled again."""
        signatures = list(self._loaded)
        for held in (self._loaded, self._loaded_by_ids, self._loaded_for_backends, self._launches):
            held.clear()
        if self._numba_cache is not None:
            self._numba_cache.flush()
        for argtypes in signatures:
            self.load(argtypes)


#: numba-cuda's name of a kernel's resource -> cuda.core's ``Kernel.attributes`` name.
_CORE_ATTRIBUTES = {"regs_per_thread": "num_regs", "shared_mem_per_block": "shared_size_bytes",
                    "local_mem_per_thread": "local_size_bytes", "max_threads_per_block": "max_threads_per_block",
                    "const_mem_size": "const_size_bytes"}


#: flowdsl's modules of device-side communication (a kernel calling one of their functions communicates).
_COMMUNICATION_MODULES = tuple(f"flowdsl.{m}" for m in ("lsa", "gin", "cft", "flow", "team", "mem", "wait", "coop",
                                                         "collectives"))


def _low_occupancy_warnings() -> bool:
    """numba-cuda's ``CUDA_LOW_OCCUPANCY_WARNINGS`` (on unless performance warnings are off), read at each
    configuration as numba-cuda reads it (``override_config`` changes it)."""
    config = sys.modules.get("numba.cuda.core.config")
    return config is not None and bool(config.CUDA_LOW_OCCUPANCY_WARNINGS) and not config.DISABLE_PERFORMANCE_WARNINGS


def _warn_low_occupancy(grid) -> None:
    """numba-cuda's warning for a grid of fewer than 128 blocks, in its words and class."""
    blocks = grid[0] * grid[1] * grid[2]
    if blocks < 128:
        from numba.cuda.core.errors import NumbaPerformanceWarning  # noqa: PLC0415

        warnings.warn(NumbaPerformanceWarning(f"Grid size {blocks} will likely result in GPU under-utilization due "
                                              "to low occupancy."), stacklevel=3)


def _answer_inspection(kernel, code) -> None:
    """A loaded kernel (its cubin alone: numba's code library holds no IR) answers numba-cuda's ``inspect_llvm``,
    ``inspect_asm(cc)`` and ``inspect_types`` from the kernel's code (``code()``, compiled again when asked)."""
    kernel.inspect_llvm = lambda: code().llvm()
    kernel.inspect_asm = lambda cc=None: code().asm()
    kernel.inspect_types = lambda file=None: print(code().types(), file=file or sys.stdout)


def _inspector(what: str, doc: str):
    """``FlowKernel.inspect_<what>(signature=None)``: the code for ``signature`` (a tuple of numba types), or
    ``{signature: code}`` for each, as numba-cuda's dispatcher gives it."""
    def inspect(self, signature=None):
        return self._inspect(what, signature)
    inspect.__name__ = inspect.__qualname__ = f"inspect_{what}"
    inspect.__doc__ = doc
    return inspect


def _resource_getter(attribute: str, what: str):
    """numba-cuda's ``get_<attribute>(signature=None)``: the loaded kernel's ``attribute`` for ``signature``, or
    ``{signature: value}`` for each."""
    def get(self, signature=None):
        return self._attribute(attribute, signature)
    get.__name__ = get.__qualname__ = f"get_{attribute}"
    get.__doc__ = f"{what} (numba-cuda's name), for ``signature`` or ``{{signature: value}}``."
    return get


for _what, _doc in (("llvm", "numba's LLVM IR, for ``signature`` or each."),
                    ("asm", "The kernel's PTX from NVVM before linking (numba-cuda's ``inspect_asm``)."),
                    ("lto_ptx", "The PTX after link-time optimisation with flowdsl's support build (what ptxas "
                                "compiles)."),
                    ("sass", "SASS of the linked kernel (needs nvdisasm, as numba-cuda's).")):
    setattr(FlowKernel, f"inspect_{_what}", _inspector(_what, _doc))
for _attribute, _what in (("regs_per_thread", "Registers per thread"),
                          ("shared_mem_per_block", "Static shared memory per block, bytes"),
                          ("local_mem_per_thread", "Local memory per thread, bytes"),
                          ("max_threads_per_block", "The most threads a block of it may have"),
                          ("const_mem_size", "Constant memory, bytes")):
    setattr(FlowKernel, f"get_{_attribute}", _resource_getter(_attribute, _what))
