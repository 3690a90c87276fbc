"""The target a kernel is being compiled for, and the gates that depend on it.

The compiler sets :func:`compiling_for` around each compilation; typing code
asks :func:`current` and raises :class:`FeatureUnavailableError` through
:func:`require` when the NCCL release or the arch lacks a feature.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass


from .._release import arch_cc, arch_refusal, format_version, nccl_refusal, parse_version
from ..errors import FeatureUnavailableError

__all__ = ["Target", "compiling_for", "current", "require", "FeatureUnavailableError",
           "parse_version", "format_version", "note_feature", "noted_features", "linker_cuda_version"]



@dataclass(frozen=True)
class Target:
    """What a kernel is compiled for: NCCL device ABI release, ``sm_XX`` arch, linking CUDA, GIN backend.

    ``cuda`` is the ``(major, minor)`` of the nvJitLink that links the kernel (it must
    read the LTO-IR of every support build linked in); ``None`` when not known.
    ``gin_backend`` (a :class:`flowdsl.enums.GinBackend`) is the backend of the device
    communicator the kernel will run with, when known: a kernel that uses GIN then links
    the GIN build of that backend only, and runs with no other. ``None``: the build with
    every backend the NCCL release has, which runs with any.
    """

    nccl: tuple[int, int, int]
    arch: str
    cuda: tuple[int, int] | None = None
    gin_backend: object = None

    @property
    def cc(self) -> tuple[int, int]:
        return arch_cc(self.arch)


_local = threading.local()


@contextlib.contextmanager
def compiling_for(target: Target):
    previous = getattr(_local, "target", None), getattr(_local, "features", None)
    _local.target = target
    _local.features = set()
    try:
        yield target
    finally:
        _local.target, _local.features = previous


def note_feature(name: str) -> None:
    """Record that the kernel being compiled uses ``name`` (checked against the runtime at launch)."""
    features = getattr(_local, "features", None)
    if features is not None:
        features.add(name)


def noted_features() -> frozenset:
    """Features recorded so far in the current compilation."""
    return frozenset(getattr(_local, "features", None) or ())


def current() -> Target | None:
    return getattr(_local, "target", None)


@functools.cache
def linker_cuda_version() -> tuple[int, int]:
    """``(major, minor)`` of the nvJitLink that links kernels here (loaded once a process)."""
    from cuda.bindings import nvjitlink  # noqa: PLC0415

    return tuple(nvjitlink.version())[:2]  # type: ignore[return-value]


def require(feature: str, *, nccl: tuple[int, int, int] | None = None, min_cc: tuple[int, int] | None = None,
            cuda: tuple[int, int] | None = None):
    """Raise at compile time when the current target lacks ``feature``.

    Checked in this order: the NCCL release, the arch, the linking CUDA (nvJitLink).
    """
    target = current()
    if target is None:
        return
    if nccl is not None and target.nccl < nccl:
        raise FeatureUnavailableError(nccl_refusal(feature, nccl, target.nccl))
    if min_cc is not None and target.cc < min_cc:
        raise FeatureUnavailableError(arch_refusal(feature, min_cc, target.arch))
    if cuda is not None and target.cuda is not None and target.cuda < cuda:
        found = format_version(target.cuda)
        raise FeatureUnavailableError(
            f"{feature} requires CUDA >= {format_version(cuda)} (nvJitLink), but this kernel is linked by "
            f"nvJitLink {found} (CUDA {found}). Install nvidia-nvjitlink>={format_version(cuda)} and a driver "
            f"of CUDA {format_version(cuda)} or newer."
        )
