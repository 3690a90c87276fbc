"""Compiling a flowdsl kernel: numba → LTO-IR, then nvJitLink with the support build → cubin.

This needs no GPU: the target (NCCL release, arch) is explicit, so CI compiles
and links every kernel for every supported target.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Callable

from cuda.core import Linker, LinkerOptions, ObjectCode

from .. import _devices
from ..errors import UsageError
from . import backend
from . import bindings  # noqa: F401 - the device surface is bound before anything compiles
from .elf import function_symbols
from .._features import COOPERATIVE
from .target import Target, compiling_for, noted_features

__all__ = ["CompiledKernel", "KernelCode", "compile_kernel", "elf_function_symbols"]


@dataclass
class CompiledKernel:
    """A kernel linked for one target.

    Attributes:
        entry_name: The kernel's symbol in ``cubin``.
        cubin: The linked machine code.
        target: What it was compiled for.
        argtypes: numba types of the kernel's parameters.
        link_log: nvJitLink's info log.
        seconds: Wall time spent compiling and linking.
    """

    entry_name: str
    cubin: bytes
    target: Target
    argtypes: tuple
    link_log: str = ""
    seconds: float = 0.0
    support_arch: str = ""
    #: What the kernel needs of the runtime (e.g. ``gin.strong_signals``), checked at launch.
    features: frozenset = field(default_factory=frozenset)
    #: CPU seconds of each step: ``numba`` (typing and lowering), ``nvvm`` (LLVM IR to LTO-IR),
    #: ``link`` (nvJitLink: link-time optimisation with the support build, then ptxas).
    phases: dict = field(default_factory=dict)
    #: With ``debug=True``: the exceptions the kernel raises by code (:class:`flowdsl.lowering.backend.Lowered`).
    exceptions: dict = field(default_factory=dict)

    def function_symbols(self) -> list[str]:
        """Every function symbol in the cubin (the kernel alone, once everything is inlined)."""
        return elf_function_symbols(self.cubin)


def never_inline(qualified_name: str) -> None:
    """Keep device function ``module.qualname`` out of line in every kernel that calls it."""
    _devices.OUT_OF_LINE.add(qualified_name)


def compile_kernel(pyfunc, argtypes, target: Target, support_ltoir: bytes, *, fastmath: bool = False,
                   lineinfo: bool = False, support_arch: str = "", max_registers: int | None = None,
                   link_for_features: Callable[[frozenset], list[tuple[str, bytes]]] | None = None,
                   link=(), launch_bounds=None, debug: bool = False, opt: bool = True) -> CompiledKernel:
    """Type, lower and link ``pyfunc`` for ``argtypes`` on ``target``.

    Typing errors (wrong argument types, a feature the target's NCCL lacks)
    are raised by numba with flowdsl's messages before anything is linked.
    ``link_for_features`` maps the features the kernel uses to further
    ``(name, LTO-IR)`` libraries to link (a GIN build for ``gin``, the CFT library
    for ``cft``: :func:`flowdsl.runtime.support.feature_libraries`), so a kernel
    without them links the support build alone. What numba-cuda links beside a kernel (its C++ shims
    for half precision, ``declare_device`` files) and ``link`` (the kernel's ``link=`` files) are linked
    in the same step. ``debug`` and ``opt`` are numba-cuda's (:func:`flowdsl.lowering.backend.lower_kernel`).
    """
    start = time.perf_counter()
    clock = _PhaseClock()
    lowered, features, objects = _lowered_for_link(pyfunc, argtypes, target, support_ltoir, fastmath=fastmath,
                                                   lineinfo=lineinfo, link=link, link_for_features=link_for_features,
                                                   clock=clock, launch_bounds=launch_bounds, debug=debug,
                                                   opt=opt)
    backend.dump_assembly(lowered, target.cc, pyfunc.__qualname__)
    linker = Linker(*objects, options=LinkerOptions(arch=target.arch, link_time_optimization=True,
                                                    lineinfo=lineinfo or None, max_register_count=max_registers))
    try:
        cubin = linker.link("cubin").code
        log = linker.get_info_log()
    finally:
        linker.close()
    clock.lap("link")
    return CompiledKernel(lowered.entry_name, bytes(cubin), target, tuple(argtypes), log,
                          time.perf_counter() - start, support_arch, features=features, phases=clock.phases,
                          exceptions=lowered.exceptions)


def _lowered_for_link(pyfunc, argtypes, target: Target, support_ltoir: bytes, *, fastmath: bool, lineinfo: bool,
                      link, link_for_features, clock=None, launch_bounds=None, debug=False, opt=True):
    """``(lowered, features, objects)``: ``pyfunc`` typed and lowered for ``target``, the features its code
    uses, and the objects its link takes (its LTO-IR, the support build, what numba-cuda links beside it,
    ``link``, the feature libraries). One path for a compile and for the inspection API."""
    with compiling_for(target):
        lowered = backend.lower_kernel(pyfunc, argtypes, target.cc, fastmath=fastmath, lineinfo=lineinfo,
                                       out_of_line=_devices.OUT_OF_LINE, launch_bounds=launch_bounds, debug=debug,
                                       opt=opt)
        features = noted_features() | features_in_code(lowered.ir_text)
        features = _check_cft(lowered.ir_text, target, features)
        features = _gin_backend_of(target, features)
        if lowered.cooperative:  # a grid sync: launched cooperatively
            features |= {COOPERATIVE}
    if clock is not None:
        clock.lap("numba")
    if backend.has_debug_info(lowered):  # debug information (the kernel's or a device function's): as PTX
        kernel_code = [ObjectCode.from_ptx(ptx.encode(), name=f"{pyfunc.__name__}_{i}")
                       for i, ptx in enumerate(backend.ptx_modules(lowered, target.cc))]
    else:
        kernel_code = [ObjectCode.from_ltoir(lowered.ltoir(target.cc), name=pyfunc.__name__)]
    if clock is not None:
        clock.lap("nvvm")
    objects = [*kernel_code,
               ObjectCode.from_ltoir(support_ltoir, name="flowdsl_support"),
               *lowered.linked_code(target.cc, link)]
    if link_for_features is not None:
        objects += [ObjectCode.from_ltoir(data, name=name) for name, data in link_for_features(features)]
    return lowered, features, objects


class KernelCode:
    """A kernel's code at each step, for numba-cuda's inspection API (``FlowKernel.inspect_*``): typed and
    lowered again in memory for ``target`` (inspection is rare; the launch path keeps only cubins)."""

    def __init__(self, pyfunc, argtypes, target: Target, support_ltoir: bytes, *, fastmath: bool = False,
                 lineinfo: bool = False, max_registers: int | None = None, link=(),
                 link_for_features: Callable[[frozenset], list[tuple[str, bytes]]] | None = None,
                 launch_bounds=None, debug: bool = False, opt: bool = True):
        self.pyfunc, self.argtypes, self.target = pyfunc, tuple(argtypes), target
        self.fastmath, self.lineinfo, self.max_registers = fastmath, lineinfo, max_registers
        self._lowered, _, self._objects = _lowered_for_link(pyfunc, self.argtypes, target, support_ltoir,
                                                            fastmath=fastmath, lineinfo=lineinfo, link=link,
                                                            link_for_features=link_for_features,
                                                            launch_bounds=launch_bounds, debug=debug, opt=opt)

    def llvm(self) -> str:
        """numba's LLVM IR of the kernel and the device functions it calls."""
        return self._lowered.ir_text

    def asm(self) -> str:
        """The kernel's PTX from NVVM, before linking (numba-cuda's ``inspect_asm``)."""
        return backend.ptx_of(self._lowered, self.target.cc)

    def lto_ptx(self) -> str:
        """The PTX after link-time optimisation with the support build: the code ptxas compiles."""
        return self._link("ptx").decode()

    def sass(self) -> str:
        """The linked cubin's SASS (needs nvdisasm)."""
        return backend.disassemble(self._link("cubin"))

    def types(self) -> str:
        """numba's annotated source (``inspect_types``)."""
        return str(self.type_annotation())

    def type_annotation(self):
        """numba's ``TypeAnnotation`` of the kernel (``typemap``: each variable's type)."""
        with compiling_for(self.target):
            return backend.type_annotation(self.pyfunc, self.argtypes, self.target.cc, fastmath=self.fastmath,
                                           lineinfo=self.lineinfo)

    def _link(self, output: str) -> bytes:
        linker = Linker(*self._objects, options=LinkerOptions(
            arch=self.target.arch, link_time_optimization=True, ptx=output == "ptx" or None,
            lineinfo=self.lineinfo or None, max_register_count=self.max_registers))
        try:
            code = linker.link(output).code
        finally:
            linker.close()
        return code if isinstance(code, bytes) else code.encode()


class _PhaseClock:
    """CPU seconds of this thread per phase (the compile runs in it: other threads' and processes' CPU
    does not count)."""

    def __init__(self):
        self.phases: dict[str, float] = {}
        self._last = time.thread_time()

    def lap(self, name: str) -> None:
        now = time.thread_time()
        self.phases[name] = now - self._last
        self._last = now


_STRONG_CALL = re.compile(r'@"?flowdsl_gin_\w*__strong_')
_GIN_CALL = re.compile(r'@"?flowdsl_(?:gin|hybrid)_')
_MARKER = re.compile(r"flowdsl-feature:([\w.]+)")


def features_in_code(llvm_ir: str) -> frozenset:
    """Launch-checked features the lowered code uses, read from the code itself.

    numba types and lowers each device function once per signature and process, so a
    note made while typing is missing from the next kernel that reuses the function;
    the calls (and markers, :func:`flowdsl.lowering.intrinsics.feature_marker`) stay.
    """
    from .gin import GIN_FEATURE, STRONG_SIGNAL_FEATURE  # noqa: PLC0415

    found = set(_MARKER.findall(llvm_ir))
    if _STRONG_CALL.search(llvm_ir):
        found.add(STRONG_SIGNAL_FEATURE)
    if _GIN_CALL.search(llvm_ir):
        found.add(GIN_FEATURE)
    return frozenset(found)


def _gin_backend_of(target: Target, features: frozenset) -> frozenset:
    """A GIN kernel for a target that names its backend links that backend's GIN build: record it."""
    from .gin import GIN_FEATURE, backend_feature  # noqa: PLC0415

    if GIN_FEATURE in features and target.gin_backend is not None:
        return features | {backend_feature(target.gin_backend)}
    return features


def _check_cft(ir_text: str, target: Target, features: frozenset) -> frozenset:
    """Gate and record CFT from the calls the code makes (the typers' own checks may have been cached)."""
    from .cft import CFT_FEATURE, cft_primitives_called  # noqa: PLC0415
    from .externs import CFT_CUDA, CFT_SINCE  # noqa: PLC0415
    from .target import require  # noqa: PLC0415

    used = cft_primitives_called(ir_text)
    if not used:
        return features
    require(used[0], nccl=CFT_SINCE, min_cc=(10, 0), cuda=CFT_CUDA)
    return features | {CFT_FEATURE}


def elf_function_symbols(elf: bytes, defined_only: bool = True) -> list[str]:
    """Names of the FUNC symbols of an ELF64 object such as a cubin.

    With ``defined_only`` (default), functions the driver provides (``vprintf``) are left out.
    """
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise UsageError("Cannot read the function symbols: the data is not an ELF64 object (a cubin)")
    return function_symbols(elf, defined_only)
