"""numba-cuda's internals, reached from one place.

flowdsl types and lowers kernels with numba-cuda, through its public extension API
(``numba.cuda.extending``: ``intrinsic``, ``overload``, ``register_model``, ...) where
lowering code is written. What that API does not offer — compiling a kernel to LTO-IR for
an explicit target without a GPU, reading the lowered IR and the entry symbol, keeping a
device function out of line, wrapping a linked cubin as a launchable kernel, typing host
values, the settings that change generated code — is done here with numba-cuda's private
or undocumented names, and nowhere else. ``tests/compile/test_backend_adapter.py`` checks
each of them against the installed numba-cuda; docs/backends.md says why, and what a
successor backend (numba-cuda-mlir) offers instead.

Importing this module imports nothing of numba: the simulator uses :data:`Stub` and
:func:`type_to_numpy` without binding a compiler.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import threading
from types import SimpleNamespace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # handed on at first use (below), so that importing this module imports no numba
    from numba.cuda.np.arrayobj import populate_array
    from numba.cuda.stubs import Stub

__all__ = ["Lowered", "lower_kernel", "explicit_target", "load_kernel", "kernel_function", "stream_from_handle",
           "argument_type", "numpy_to_type", "type_to_numpy", "versions", "codegen_settings", "Stub",
           "populate_array"]


# -- compiling for an explicit target -----------------------------------------------------------

_override = threading.local()  # .cc: the compute capability a flowdsl compile on this thread targets
_override_lock = threading.Lock()
_override_users = 0
_real_get_current_device = None


def _get_current_device():
    """numba-cuda's ``get_current_device``, except inside :func:`explicit_target` on this thread."""
    cc = getattr(_override, "cc", None)
    if cc is None:
        return _real_get_current_device()
    return SimpleNamespace(compute_capability=cc)


@contextlib.contextmanager
def explicit_target(cc: tuple[int, int]):
    """Compile overload implementations for compute capability ``cc`` without asking the driver.

    numba-cuda compiles each ``@overload`` implementation (a device function) for the *current
    device's* compute capability (``CUDADispatcher.compile_device`` calls
    ``numba.cuda.dispatcher.get_current_device``), and offers no argument to say another; flowdsl
    compiles for an explicit target, on machines with or without a GPU. So, while any flowdsl
    compile runs, that module's ``get_current_device`` is replaced by one that answers ``cc`` on the
    compiling thread only, and the driver's answer on every other thread; the last compile to
    finish puts numba-cuda's own back.
    """
    global _override_users, _real_get_current_device
    from numba.cuda import dispatcher  # noqa: PLC0415

    previous = getattr(_override, "cc", None)
    with _override_lock:
        if _override_users == 0:
            _real_get_current_device = dispatcher.get_current_device
            dispatcher.get_current_device = _get_current_device
        _override_users += 1
    _override.cc = tuple(cc)
    try:
        yield
    finally:
        _override.cc = previous
        with _override_lock:
            _override_users -= 1
            if _override_users == 0:
                dispatcher.get_current_device = _real_get_current_device
                _real_get_current_device = None


class Lowered:
    """A kernel typed and lowered by numba-cuda: its LLVM IR, entry symbol, and LTO-IR on demand.
    ``exceptions``: with ``debug=True``, numba's table of the exceptions the kernel raises (code ->
    ``(class, args, location)``), which a launch reads back by code; empty otherwise."""

    def __init__(self, library, exceptions=None):
        self._library = library
        self.exceptions = dict(exceptions or {})

    @property
    def entry_name(self) -> str:
        """The kernel's symbol (what the linked cubin exports)."""
        return self._library._entry_name

    @property
    def cooperative(self) -> bool:
        """Whether the kernel syncs its grid (numba-cuda then launches it cooperatively)."""
        return bool(getattr(self._library, "use_cooperative", False))

    @functools.cached_property
    def ir_text(self) -> str:
        """The LLVM IR of the kernel and every device function it links (read for calls and markers)."""
        return self._library.get_llvm_str()

    def ltoir(self, cc: tuple[int, int]) -> bytes:
        """NVVM's LTO-IR of the IR, for compute capability ``cc``."""
        return self._library.get_ltoir(cc=cc)

    def calls_nrt(self) -> bool:
        """Whether the kernel's code declares functions of numba's runtime (``NUMBA_CUDA_ENABLE_NRT``: arrays made
        or reduced in the kernel), which numba-cuda's dispatcher links from its own source then."""
        return "NRT_" in self.ir_text and re.search(r'^declare [^\n]*@"?NRT_\w+"?\(', self.ir_text,
                                                    re.MULTILINE) is not None

    def linked_code(self, cc: tuple[int, int], extra=()) -> list:
        """What numba-cuda links beside the kernel, as cuda.core ``ObjectCode``: its C++ shims (float16 and
        bfloat16 arithmetic, ``cuda.fp16``), ``cuda.declare_device(..., link=)`` files, cudadevrt for
        cooperative launches, then ``extra`` (a kernel's ``link=``: paths or numba ``LinkableCode``). A kernel
        that needs none of it gets an empty list (nothing more to compile)."""
        files = list(self._library._linking_files) + list(extra) + _numba_helpers_called(self.ir_text)
        if self.calls_nrt():  # numba's runtime, linked from numba-cuda's source unless its library listed it
            from numba.cuda.memory_management.nrt import NRT_LIBRARY  # noqa: PLC0415

            files += [NRT_LIBRARY] if NRT_LIBRARY not in files else []
        if getattr(self._library, "needs_cudadevrt", False) or self.cooperative:  # a grid sync calls into it
            from numba.cuda.cudadrv.libs import get_cudalib  # noqa: PLC0415

            files.append(get_cudalib("cudadevrt", static=True))
        if not files:
            return []
        from numba.cuda.cudadrv import driver  # noqa: PLC0415

        # numba-cuda's own linker front end turns each kind (.cu through NVRTC to LTO-IR, .ptx, .ltoir, .o,
        # .a, LinkableCode) into ObjectCode; flowdsl links those with its support build.
        linker = driver._Linker(cc=cc, lto=True)
        for item in sorted(files, key=str):  # one order, so that equal kernels link equal cubins
            linker.add_file_guess_ext(item)
        return list(linker._object_codes)


def _numba_helpers_called(ir_text: str) -> list:
    """numba-cuda's C helpers that its lowering calls (``reshape_funcs.cu``: an array's ``reshape``), as its
    dispatcher links them: the file, when the code names one of its functions."""
    from numba.cuda import dispatcher  # noqa: PLC0415

    if not any(name in ir_text for name in dispatcher.reshape_funcs):
        return []
    return [os.path.join(os.path.dirname(os.path.abspath(dispatcher.__file__)), "reshape_funcs.cu")]


def lower_kernel(pyfunc, argtypes, cc: tuple[int, int], *, fastmath: bool, lineinfo: bool,
                 out_of_line=(), launch_bounds=None, debug: bool = False, opt: bool = True) -> Lowered:
    """Type and lower ``pyfunc`` as a kernel over ``argtypes`` for ``cc``, for link-time optimisation.

    ``out_of_line``: ``module.qualname`` of device functions NVVM must not inline. ``launch_bounds``:
    numba-cuda's (NVVM annotations that become ``.maxntid`` and the rest in the PTX). ``debug`` and
    ``opt``: numba-cuda's (debug information, and a kernel that stores the code of an exception it raises
    for the launch to read; NVVM at ``-O3`` or ``-O0``).
    The public ``numba.cuda.compile(output="ltoir")`` returns bytes only; flowdsl also needs the IR
    (features, CFT gate), the entry symbol and the exception table, so this makes the steps of the function
    that ``compile`` wraps (``_compile_pyfunc_with_fixup``) for a kernel.
    """
    from numba.core import types  # noqa: PLC0415
    from numba.cuda import compiler  # noqa: PLC0415
    from numba.cuda.cudadrv import nvvm  # noqa: PLC0415

    from ..errors import KernelTypingError, kernel_feature_error, numba_error_classes  # noqa: PLC0415

    TypingError = numba_error_classes("TypingError")  # numba-cuda raises its own class or numba's  # noqa: N806

    from .devices import register_called_kernels  # noqa: PLC0415

    register_called_kernels(pyfunc)  # kernels it calls are device functions there, as numba-cuda's are
    try:
        nvvm_options = {"fastmath": fastmath, "opt": 3 if opt else 0, "gen-lto": None}
        if debug:
            nvvm_options["g"] = None
        with explicit_target(cc):
            cres = compiler.compile_cuda(pyfunc, types.void, tuple(argtypes), debug=debug, lineinfo=lineinfo,
                                         fastmath=fastmath, nvvm_options=nvvm_options, cc=cc, abi="numba")
            library = cres.library
            kernel = library.get_function(cres.fndesc.llvm_func_name)
            library._entry_name = cres.fndesc.llvm_func_name
            compiler.kernel_fixup(kernel, debug)  # with debug: the exception's code, thread and block to globals
            nvvm.set_launch_bounds(kernel, launch_bounds)
    except TypingError as exc:  # a flowdsl error, as the simulator's for the same mistake; numba's words
        if isinstance(exc, KernelTypingError):
            raise
        head, unavailable = _primitive_arity(str(exc)), False
        if not head:
            head, unavailable = _first_refusal(exc, pyfunc)
        cls = kernel_feature_error() if unavailable else KernelTypingError
        raise cls(f"{head}{exc}{_in_kernel(pyfunc)}") from exc
    except NotImplementedError as exc:  # numba-cuda typed it and has no code for it: the user's mistake
        from numba.cuda.vector_types import vector_types  # noqa: PLC0415

        from .._spec import vector_write_refusal  # noqa: PLC0415

        written = _VECTOR_WRITE.match(str(exc))
        if written is None or written.group(1) not in vector_types:
            raise
        raise KernelTypingError(f"{vector_write_refusal(written.group(1), written.group(2))}{_in_kernel(pyfunc)}") \
            from exc
    modules = _unique_modules(library)
    _mark_never_inline(modules, out_of_line)
    from .declarations import inline_bodies_called_once  # noqa: PLC0415

    inline_bodies_called_once(modules)
    library._llvm_strs = [str(mod) for mod in modules]  # what get_ltoir hands NVVM
    return Lowered(library, cres.call_helper.exceptions if debug else None)


def type_annotation(pyfunc, argtypes, cc: tuple[int, int], *, fastmath: bool, lineinfo: bool):
    """numba's ``TypeAnnotation`` of the kernel (its ``typemap``; as text, ``inspect_types``'s source annotated
    with its IR and types), from a typing of its own."""
    from numba.core import types  # noqa: PLC0415
    from numba.cuda import compiler  # noqa: PLC0415

    with explicit_target(cc):
        cres = compiler.compile_cuda(pyfunc, types.void, tuple(argtypes), lineinfo=lineinfo, fastmath=fastmath,
                                     cc=cc, lto=True, abi="numba")
    return cres.type_annotation


def ptx_modules(lowered: Lowered, cc: tuple[int, int]) -> list[str]:
    """The kernel's own PTX from NVVM, before anything is linked: the library's NVVM options without ``gen-lto``
    (with it NVVM writes LTO-IR). One PTX for the library, or one per module for a kernel compiled with
    debug information (``-g``: NVVM does not link such modules; numba-cuda compiles them apart too)."""
    from numba.cuda.cudadrv import nvrtc, nvvm  # noqa: PLC0415

    library = lowered._library
    options = {k: v for k, v in library._nvvm_options.items() if k != "gen-lto"}
    options["arch"] = nvrtc.get_arch_option(*cc)
    irs = library.llvm_strs
    groups = [[ir] for ir in irs] if "g" in options else [irs]
    return [nvvm.compile_ir(group, **options).decode().strip("\x00").strip() for group in groups]


def ptx_of(lowered: Lowered, cc: tuple[int, int]) -> str:
    """The kernel's own PTX (``inspect_asm``): :func:`ptx_modules`, joined as numba-cuda joins them."""
    return "\n".join(ptx_modules(lowered, cc))


def has_debug_info(lowered: Lowered) -> bool:
    """Whether the kernel's code carries debug information (its own ``debug=True``, or a device function's):
    such code is compiled to PTX module by module, as NVVM neither links it nor writes LTO-IR nvJitLink links
    beside the support build (their 'Debug Info Version' flags conflict)."""
    return "!llvm.dbg.cu" in lowered.ir_text


def dump_assembly(lowered: Lowered, cc: tuple[int, int], name: str) -> None:
    """numba's ``NUMBA_DUMP_ASSEMBLY``: the kernel's PTX printed as numba-cuda's code library prints it (flowdsl
    links the kernel itself, so numba's own print never runs)."""
    from numba.cuda.core import config  # noqa: PLC0415

    if config.DUMP_ASSEMBLY:
        print(f"ASSEMBLY {name}".center(80, "-"))
        print(ptx_of(lowered, cc))
        print("=" * 80)


def compile_device(pyfunc, argtypes, cc: tuple[int, int], return_type=None, *, fastmath: bool = False,
                   debug: bool = False, opt: bool = True, lineinfo: bool = False):
    """numba's compile result of device function ``pyfunc`` alone for ``argtypes`` on ``cc`` (numba-cuda's
    device dispatcher's ``compile_device``: its ``library`` gives the PTX and LLVM IR, ``signature`` the
    return type, inferred unless ``return_type`` is given), with the function's own options."""
    from numba.cuda.compiler import compile_cuda  # noqa: PLC0415

    with explicit_target(cc):
        return compile_cuda(pyfunc, return_type, tuple(argtypes), debug=debug, lineinfo=lineinfo, fastmath=fastmath,
                            cc=cc, nvvm_options={"opt": 3 if opt else 0, "fastmath": fastmath})


def disassemble(cubin: bytes) -> str:
    """SASS of ``cubin`` with line information (``inspect_sass``), by numba-cuda's nvdisasm runner."""
    from cuda.core import ObjectCode  # noqa: PLC0415
    from numba.cuda.codegen import disassemble_cubin  # noqa: PLC0415

    return disassemble_cubin(ObjectCode.from_cubin(cubin))  # it reads the cubin's bytes as ObjectCode.code


#: numba's words for an overload whose parameters do not bind a call's arguments (Python's ``bind`` messages),
#: after the function it typed: ``Function(<function barrier at 0x7f...>)``.
_ARITY = re.compile(r"Function\(<function \w+ at (0x[0-9a-f]+)>\)(?s:.*?)TypingError: (too many positional arguments|"
                    r"missing a required argument: '\w+'|got an unexpected keyword argument '\w+'|"
                    r"multiple values for argument '\w+')")


def _primitive_arity(message: str) -> str:
    """The simulator's refusal of a primitive called with arguments its stub does not take
    (:meth:`flowdsl._spec.Spec.refusal_arity`), as the first line of numba's, or "" when numba refused
    something else. numba names the function by its address, which identifies the stub."""
    from .._stubs import PRIMITIVES  # noqa: PLC0415
    from ..errors import without_colours  # noqa: PLC0415

    found = _ARITY.search(without_colours(message))
    if found is None:
        return ""
    stub = next((s for s in PRIMITIVES.values() if id(s) == int(found.group(1), 16)), None)
    return "" if stub is None else f"{stub.__flowdsl_spec__.refusal_arity(found.group(2))}\n\n"


def _in_kernel(pyfunc) -> str:
    """The line a typing refusal ends with: the kernel and where it is defined."""
    code = getattr(pyfunc, "__code__", None)
    return f"\n  in kernel {pyfunc.__qualname__} ({code.co_filename}:{code.co_firstlineno})" if code else ""


#: numba-cuda's lowering error for ``v.x = value`` of a vector value, which its typing let through.
_VECTOR_WRITE = re.compile(r"No definition for lowering (\w+)\.(\w+) = ")
#: numba's words for the function it could not type a call of, and the refusals inside them (with where raised).
_CALLEE = re.compile(r"No implementation of function Function\(<(?:built-in )?function (\w+)")
_REFUSAL = re.compile(r"(NumbaTypeError|TypingError|FeatureUnavailableError): ([^\n]+)\n\s*raised from ([^\n]+)")


_WINDOW_INDEXED = ("Cannot index a window in a kernel: a kernel reads and writes a window through a view "
                   "(lsa.local_view(win), lsa.lsa_view(win, peer)), not by index. If an array was meant, check the "
                   "order of the launch's arguments against the kernel's parameters")


def _first_refusal(exc, pyfunc) -> tuple[str, bool]:
    """What a user needs first of numba's report of a call it could not type, or "": the refusal of flowdsl's
    own checks (numba tries each call with and without its literal arguments and reports both, the one without
    them, "requires ... a compile-time constant", first), and the user's line of the failing call (numba-cuda's
    report names none; its type inference has it, in the traceback of the error). With it, whether that
    refusal is of a feature the target lacks (a :class:`flowdsl.FeatureUnavailableError`)."""
    from ..errors import without_colours  # noqa: PLC0415

    text = without_colours(str(exc))
    refusals = [(m.strip(), kind == "FeatureUnavailableError") for kind, m, where in _REFUSAL.findall(text)
                if f"{os.sep}flowdsl{os.sep}" in where]
    specific = [r for r in refusals if "compile-time constant" not in r[0]] or refusals
    callee = _CALLEE.search(text)
    if not specific and callee is None:
        return "", False
    loc = _failing_line(exc)
    at = f"\n  at {os.path.basename(loc[0])}:{loc[1]} in kernel {pyfunc.__qualname__}" if loc else ""
    from .._spec import NUMPY_ALLOCATING, numpy_allocation_refusal  # noqa: PLC0415

    name = callee.group(1) if callee else ""
    head = specific[-1][0] if specific else numpy_allocation_refusal(name) if name in NUMPY_ALLOCATING else \
        _WINDOW_INDEXED if name in ("getitem", "setitem") and "(Window(" in text else \
        f"Cannot type the call of {name} with these arguments"
    return f"{head}{at}\n\nnumba's report:\n", bool(specific) and specific[-1][1]


def _failing_line(exc):
    """``(file, line)`` of the statement numba's type inference was typing when ``exc`` was raised: the
    innermost ``loc`` (numba's ``ir.Loc``) in the frames of its traceback, outside numba and flowdsl."""
    found = None
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            frame_locals = tb.tb_frame.f_locals
            loc = frame_locals.get("loc") or getattr(frame_locals.get("self"), "loc", None)
            name = getattr(loc, "filename", None)
            if name and isinstance(getattr(loc, "line", None), int) and f"{os.sep}numba" not in name \
                    and f"{os.sep}flowdsl{os.sep}" not in name:
                found = (name, loc.line)
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__
    return found


def _unique_modules(library) -> list:
    """The library's LLVM modules, each once.

    numba-cuda lists a device function's module once per caller that links it (487
    entries for 79 modules in a ring all-reduce): NVVM would parse and drop the
    copies, and the IR text would be made for each. The copies are the same objects,
    so the first of each is kept, in numba's order (the linked code is the same).
    """
    seen: set[int] = set()
    unique = []
    for mod in library.modules:
        if id(mod) not in seen:
            seen.add(id(mod))
            unique.append(mod)
    return unique


def _mangled_prefix(qualified_name: str) -> str:
    return "_ZN" + "".join(f"{len(p)}{p}" for p in qualified_name.split("."))


def _mark_never_inline(modules, qualified_names) -> None:
    """Add ``noinline`` and ``noduplicate`` to the definitions of the named device functions (numba
    mangles them as ``_ZN<len><part>...`` followed by ``B`` (ABI tags) or ``E``).

    ``noduplicate``: the link's optimiser must not copy a call to one. It unswitched and
    unrolled the ring programs' loops around their step calls (15 call sites of 5 steps in a
    ring all-reduce, each passing some fifty words), which ran nothing faster and made the
    entry the largest function of the link; one call site per call in the source is what an
    out-of-line function is for. The functions themselves compile as before."""
    prefixes = [_mangled_prefix(name) for name in sorted(qualified_names)]
    if not prefixes:
        return
    for mod in modules:
        for fn in mod.functions:
            name = fn.name
            if not fn.is_declaration and name.startswith("_ZN") and any(
                    name.startswith(prefix) and name[len(prefix)] in "BE" for prefix in prefixes
                    if len(name) > len(prefix)):
                fn.attributes.add("noinline")
                fn.attributes.add("noduplicate")


# -- a linked cubin as a launchable kernel ---------------------------------------------------------

def load_kernel(entry_name: str, cubin: bytes, argtypes, extensions=(), cooperative: bool = False,
                debug: bool = False, exceptions=None):
    """A numba-cuda kernel object around an already linked ``cubin`` (launched by numba-cuda's
    launcher for argument kinds flowdsl does not pack itself). ``debug``: compiled with ``debug=True``, its
    exception table ``exceptions`` (:attr:`Lowered.exceptions`), read by :class:`ExceptionRecord`.

    numba-cuda makes such objects only by unpickling: its ``_rebuild`` class methods are the way in.
    """
    from cuda.core import ObjectCode  # noqa: PLC0415
    from numba.core import types  # noqa: PLC0415
    from numba.cuda.codegen import CUDACodeLibrary  # noqa: PLC0415
    from numba.cuda.core.callconv import _MinimalCallHelper  # noqa: PLC0415
    from numba.cuda.descriptor import cuda_target  # noqa: PLC0415
    from numba.cuda.dispatcher import _Kernel  # noqa: PLC0415

    codegen = cuda_target.target_context.codegen()
    library = CUDACodeLibrary._rebuild(codegen, entry_name, entry_name, [], {}, {}, {}, None, {}, False, False,
                                       False, True)
    library._cubin_cache[library._ensure_cc(None)] = ObjectCode.from_cubin(cubin, name=entry_name)
    helper = None
    if debug:
        helper = _MinimalCallHelper()
        helper.exceptions = dict(exceptions or {})
    # numba-cuda's own debug handling off (flowdsl's launch reads the record: ExceptionRecord), the table kept
    kernel = _Kernel._rebuild(cooperative, entry_name, types.void(*argtypes), library, False, False, helper,
                              list(extensions))
    kernel.flowdsl_debug = debug
    return kernel


class ExceptionRecord:
    """Where a kernel compiled with ``debug=True`` records the first exception one of its threads raises
    (numba-cuda's ``kernel_fixup``: globals beside the kernel for the exception's code and that thread's and
    block's indices), read back after a launch."""

    def __init__(self, numba_kernel):
        cufunc = numba_kernel._codelibrary.get_cufunc()
        self._module, self._name = cufunc.module, cufunc.name
        self._table = numba_kernel.call_helper
        self._code = self._global("errcode")

    def _global(self, what: str):
        return self._module.get_global_symbol(f"{self._name}__{what}__")[0]

    def clear(self, stream: int) -> None:
        """Forget an earlier launch's exception, in stream order before the launch."""
        from numba.cuda.cudadrv import driver  # noqa: PLC0415

        driver.device_memset(self._code, 0, 4, stream=stream_from_handle(stream) if stream else 0)

    def raised(self, stream: int):
        """The exception the launch on ``stream`` raised (waits for it), or None: the class and arguments the
        kernel raised, its message led by the thread's and block's indices as the simulator leads it
        (``tid=[3, 0, 0] ctaid=[0, 0, 0]: ...``, x first), a note naming the line."""
        import ctypes  # noqa: PLC0415

        from numba.cuda.cudadrv import driver  # noqa: PLC0415

        if stream:
            stream_from_handle(stream).synchronize()

        def read(mem) -> int:
            value = ctypes.c_int()
            driver.device_to_host(ctypes.addressof(value), mem, 4)
            return value.value

        code = read(self._code)
        if code == 0:
            return None
        tid = [read(self._global(f"tid{d}")) for d in "xyz"]
        ctaid = [read(self._global(f"ctaid{d}")) for d in "xyz"]
        cls, args, loc = self._table.get_exception(code)
        lead = f"tid={tid} ctaid={ctaid}"
        try:
            text = str(cls(*(args or ())))
            exc = cls(f"{lead}: {text}" if text else lead)
        except Exception:  # noqa: BLE001 - a class that takes other arguments: it, as raised, the place in a note
            exc = cls(*(args or ()))
            exc.add_note(lead)
        if loc is not None:
            function, path, line = loc
            exc.add_note(f"flowdsl: raised in {function} at {path}:{line} (the first thread to raise: "
                         "the kernel was compiled with debug=True)")
        return exc


def kernel_function(numba_kernel):
    """The ``cuda.core`` kernel of a loaded numba-cuda kernel (its module loaded on the current device)."""
    return numba_kernel._codelibrary.get_cufunc().kernel


def stream_from_handle(handle: int):
    """A stream object over a driver stream handle, of the kind numba-cuda's launcher takes."""
    from numba.cuda.cudadrv import driver  # noqa: PLC0415

    return driver.ExperimentalStream.from_handle(handle)


# -- types -----------------------------------------------------------------------------------

def argument_type(value):
    """numba-cuda's type of ``value`` passed as a kernel argument (a ValueError: it has none)."""
    from numba.cuda.typing.typeof import Purpose, typeof  # noqa: PLC0415

    return typeof(value, Purpose.argument)


def numpy_to_type(dtype):
    """The numba scalar type of NumPy ``dtype`` (numba-cuda's mapping: ml_dtypes' bfloat16 is its bfloat16)."""
    from numba.cuda.np.numpy_support import from_dtype  # noqa: PLC0415

    return from_dtype(dtype)


def type_to_numpy(ty):
    """The NumPy dtype of numba scalar type ``ty``."""
    from numba.np.numpy_support import as_dtype  # noqa: PLC0415

    return as_dtype(ty)


# -- what is bound ---------------------------------------------------------------------------------

def resolve_stub(stub) -> bool:
    """Whether numba-cuda's typing binds ``stub`` (an ``@overload`` of it is registered): tests check every
    primitive has a lowering."""
    from numba.cuda.descriptor import cuda_target  # noqa: PLC0415

    context = cuda_target.typing_context
    context.refresh()
    try:
        return context.resolve_value_type(stub) is not None
    except ValueError:  # "Cannot determine Numba type of <class 'function'>"
        return False


def overloaded_methods():
    """``(numba type class, method name, overload function)`` of every ``@overload_method`` registered for
    the CUDA target (read from numba-cuda's typing registry, whose method templates say ``is_method`` and keep
    the function as ``_overload_func``)."""
    from numba.cuda.typing.templates import builtin_registry  # noqa: PLC0415

    for template in builtin_registry.attributes:
        fn = getattr(template, "_overload_func", None)
        if fn is not None and getattr(template, "is_method", False) and isinstance(getattr(template, "key", None), type):
            yield template.key, template._attr, fn


def overloaded_stubs():
    """``(stub, overload function)`` of every ``@overload`` of a flowdsl primitive registered for the CUDA target
    (numba-cuda's typing registry keeps each as a global whose templates hold ``_overload_func``)."""
    from numba.cuda.typing.templates import builtin_registry  # noqa: PLC0415

    for value, typ in builtin_registry.globals:
        if getattr(value, "__flowdsl_primitive__", None) is None:
            continue
        for template in getattr(typ, "templates", ()):
            fn = getattr(template, "_overload_func", None)
            if fn is not None:
                yield value, fn


# -- what the disk cache keys by -----------------------------------------------------------------

def versions() -> dict:
    """Versions of what types, lowers and compiles a kernel to LTO-IR."""
    import llvmlite  # noqa: PLC0415
    import numba  # noqa: PLC0415
    import numba_cuda  # noqa: PLC0415

    return {"numba_cuda": getattr(numba_cuda, "__version__", "?"), "numba": numba.__version__,
            "llvmlite": llvmlite.__version__}


def codegen_settings() -> list:
    """numba-cuda settings that change generated code or what its compile warns (from ``NUMBA_*`` variables)."""
    from numba.cuda.core import config  # noqa: PLC0415

    return [str(config.OPT), bool(config.CUDA_DEBUGINFO_DEFAULT), bool(getattr(config, "CUDA_ENABLE_NRT", False)),
            # and what numba's compile warns (its warnings are kept with the entry and said again at each load)
            bool(config.ALWAYS_WARN_UNINIT_VAR), bool(config.DISABLE_PERFORMANCE_WARNINGS)]


# -- names imported at first use ---------------------------------------------------------------------

#: name -> (module, attribute): numba-cuda internals handed on as they are.
_FORWARDED = {
    # The base class of numba.cuda's device-only functions (the simulator replaces those).
    "Stub": ("numba.cuda.stubs", "Stub"),
    # Fills an array structure from a data pointer, shape and strides (typed views over windows).
    "populate_array": ("numba.cuda.np.arrayobj", "populate_array"),
}


def __getattr__(name: str):
    where = _FORWARDED.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib  # noqa: PLC0415

    value = getattr(importlib.import_module(where[0]), where[1])
    setattr(sys.modules[__name__], name, value)
    return value
