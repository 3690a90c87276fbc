"""The target a kernel is compiled for at launch (the current GPU and loaded NCCL), or the one named.

:class:`flowdsl.lowering.target.Target` says what a target is; this module finds it on the host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._release import arch_cc
from .errors import UsageError

if TYPE_CHECKING:
    from .lowering.target import Target

__all__ = ["device_target", "cuda_version", "gin_backend_named", "gin_backend_of"]


def checked_arch(arch, operation: str) -> str:
    """``arch`` if it names a GPU architecture as nvcc and numba do (``sm_90``, ``sm_100``, ``sm_90a``), else a
    UsageError saying how to write it (a bare ``90`` or ``sm90`` reached nvJitLink's option parser)."""
    import re  # noqa: PLC0415

    if not isinstance(arch, str) or re.fullmatch(r"sm_[1-9][0-9]{1,2}a?", arch) is None:
        raise UsageError(f"Cannot {operation} for arch {arch!r}: name the GPU architecture as sm_ and its compute "
                         "capability's digits, e.g. sm_80, sm_90, sm_100 (sm_90a for its arch-specific features)")
    if arch_cc(arch) < (8, 0):  # every release's support build, prebuilt or built at first use, alike
        raise UsageError(f"Cannot {operation} for {arch}: flowdsl's kernels need sm_80 or newer. Compile for sm_80 "
                         "or newer (arch='sm_90', flowdsl precompile --arch sm_90); older GPUs cannot run them")
    return arch


def device_target() -> Target:
    from numba import cuda  # noqa: PLC0415

    from .lowering.target import Target  # noqa: PLC0415
    from .runtime import nccl as nccl_runtime  # noqa: PLC0415

    cc = cuda.get_current_device().compute_capability
    return Target(nccl_runtime.loaded_version(), f"sm_{cc[0]}{cc[1]}", cuda_version(None))


def cuda_version(cuda) -> tuple[int, int]:
    """``(major, minor)`` of ``cuda`` ("13.3", a tuple), or of the installed nvJitLink when None."""
    from .lowering.target import linker_cuda_version  # noqa: PLC0415

    if cuda is None:
        return linker_cuda_version()
    if isinstance(cuda, str):
        cuda = cuda.split(".")
    return int(cuda[0]), int(cuda[1])


def gin_backend_named(name, kernel_name: str):
    """``name`` as a :class:`flowdsl.GinBackend` (None stays None), or a UsageError naming the choices."""
    from .enums import GinBackend  # noqa: PLC0415

    if name is None:
        return None
    backend = GinBackend.from_option(name)
    if backend is None:
        raise UsageError(f"Cannot compile {kernel_name} for gin_backend={name!r}: it is not a GIN backend. "
                         f"Use one of {', '.join(b.option for b in GinBackend)}, or None for every backend")
    return backend


def gin_backend_of(args):
    """The GIN backend of the first device communicator among launch ``args`` (None: none, or not one)."""
    for arg in args:
        backend = getattr(arg, "gin_backend", None)
        if backend is not None:
            return backend
    return None
