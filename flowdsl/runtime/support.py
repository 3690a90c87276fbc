"""Choosing the support-library builds for the loaded NCCL, a target arch and a GIN backend.

Every kernel links the support build of its NCCL release and arch; a kernel that uses
GIN also links a GIN build: the one of its device communicator's backend when the
target names it (:class:`~flowdsl.lowering.target.Target` ``gin_backend``), else the one
with every backend (:func:`gin_build_for`); a kernel that uses CFT the CFT build.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from .._release import format_version
from .._release import arch_cc
from .._targets import checked_arch
from ..enums import GinBackend
from ..errors import SupportLibraryError

__all__ = ["manifest", "support_build_for", "gin_build_for", "gin_backends", "gin_digest", "cft_build_for", "cft_missing",
           "abi_layout", "cache_dir", "SupportBuild", "feature_libraries"]


def cache_dir() -> Path:
    """Root of flowdsl's disk cache (``$FLOWDSL_CACHE_DIR``, default ``~/.cache/flowdsl``)."""
    root = os.environ.get("FLOWDSL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "flowdsl")
    return Path(root)


@functools.cache
def manifest() -> dict:
    from . import support_build  # noqa: PLC0415 - the build tools (subprocess, zipfile) at first use

    path = support_build.PREBUILT_DIR / "build" / "manifest.json"
    if not path.exists():
        return {"abis": {}}
    return json.loads(path.read_text())


class SupportBuild:
    """One LTO-IR build of the support library: its bytes, what it was built for, its layout."""

    def __init__(self, path: Path, nccl: tuple[int, int, int], arch: str, layout: dict):
        self.path = path
        self.nccl = nccl
        self.arch = arch
        self.layout = layout

    @functools.cached_property
    def ltoir(self) -> bytes:
        return self.path.read_bytes()

    def __repr__(self):
        return f"SupportBuild(nccl={format_version(self.nccl)}, arch={self.arch}, path={self.path})"


def _pick_arch(target_arch: str, available) -> str | None:
    """The newest built arch not newer than the target (LTO-IR is forward-compatible)."""
    fits = [a for a in available if arch_cc(a) <= arch_cc(target_arch)]
    return max(fits, key=arch_cc) if fits else None


@functools.cache
def support_build_for(nccl: tuple[int, int, int], arch: str) -> SupportBuild:
    """The support build for NCCL ``nccl`` and ``arch``: checked in, or built at first use."""
    from . import support_build  # noqa: PLC0415

    checked_arch(arch, "compile")  # every compile comes here: no build for a malformed arch, or one below sm_80
    version = format_version(nccl)
    entry = manifest()["abis"].get(version)
    if entry is not None:
        chosen = _pick_arch(arch, entry["builds"])  # every release has sm_80 and up: checked_arch's floor
        path = support_build.PREBUILT_DIR / entry["builds"][chosen]["file"]
        return SupportBuild(path, nccl, chosen, entry["layout"])
    chosen = _pick_arch(arch, support_build.ARCHS) or arch
    path, layout = support_build.build_for_installed(version, chosen, cache_dir() / "support")
    return SupportBuild(path, nccl, chosen, layout)


@functools.cache
def gin_backends(nccl: tuple[int, int, int]) -> tuple[GinBackend, ...]:
    """The GIN backends whose device code NCCL release ``nccl`` has (each has a GIN build)."""
    from . import support_build  # noqa: PLC0415 - the build tools at first use
    version = format_version(nccl)
    entry = manifest()["abis"].get(version)
    if entry is not None:
        return tuple(GinBackend.from_option(name) for name in entry["gin"]["backends"])
    include_dir = support_build.installed_include_dir()
    if include_dir is None:
        return ()
    return support_build.installed_gin_backends(version, include_dir, cache_dir() / "support")


@functools.cache
def gin_build_for(nccl: tuple[int, int, int], arch: str, backend: GinBackend | None = None) -> SupportBuild:
    """The GIN library build for NCCL ``nccl``, ``arch`` and ``backend`` (None: every backend).

    Raises:
        UsageError: NCCL ``nccl`` has no device code for ``backend``.
    """
    from . import support_build  # noqa: PLC0415 - the build tools at first use
    from ..errors import UsageError  # noqa: PLC0415

    checked_arch(arch, "compile")
    version = format_version(nccl)
    name = "all" if backend is None else backend.option
    entry = manifest()["abis"].get(version)
    if backend is not None and backend not in gin_backends(nccl):
        raise UsageError(f"Cannot compile for GIN backend {backend.option}: NCCL {version} has device code "
                           f"for {', '.join(b.option for b in gin_backends(nccl)) or 'no GIN backend'} only.")
    if entry is not None:
        builds = entry["gin"]["builds"][name]
        chosen = _pick_arch(arch, builds)
        return SupportBuild(support_build.PREBUILT_DIR / builds[chosen]["file"], nccl, chosen, entry["layout"])
    chosen = _pick_arch(arch, support_build.ARCHS) or arch
    path, layout = support_build.build_for_installed(version, chosen, cache_dir() / "support", gin=name)
    return SupportBuild(path, nccl, chosen, layout)


@functools.cache
def gin_digest(nccl: tuple[int, int, int]) -> str | None:
    """One digest of every checked-in GIN build of ``nccl`` (part of the kernel cache key), or None."""
    entry = manifest()["abis"].get(format_version(nccl))
    if entry is None:
        return None
    return ",".join(sorted(b["sha256"] for builds in entry["gin"]["builds"].values() for b in builds.values()))


def feature_libraries(target):
    """``features -> [(name, LTO-IR)]``: the builds a kernel for ``target`` links beyond the support
    build (``link_for_features`` of :func:`flowdsl.lowering.compiler.compile_kernel`)."""
    def libraries(features):
        from ..lowering.cft import CFT_FEATURE  # noqa: PLC0415
        from ..lowering.gin import GIN_FEATURE  # noqa: PLC0415

        out = []
        if GIN_FEATURE in features:
            out.append(("flowdsl_gin", gin_build_for(target.nccl, target.arch, target.gin_backend).ltoir))
        if CFT_FEATURE in features:
            out.append(("flowdsl_cft", cft_build_for(target.nccl, target.arch).ltoir))
        return out
    return libraries


@functools.cache
def cft_build_for(nccl: tuple[int, int, int], arch: str) -> SupportBuild:
    """The CFT library build for NCCL ``nccl`` and ``arch`` (checked in; see ``build_cft``).

    Raises:
        RuntimeError: No CFT build fits (the compile-time gates refuse older NCCL
            releases and archs first, so this names a release flowdsl has no build for).
    """
    from . import support_build  # noqa: PLC0415

    version = format_version(nccl)
    entry = manifest().get("cft", {}).get("abis", {}).get(version)
    if entry is None:
        have = ", ".join(sorted(manifest().get("cft", {}).get("abis", {}))) or "none"
        raise SupportLibraryError(f"Cannot link flowdsl.cft for NCCL {version}: flowdsl has CFT builds for NCCL {have} "
                                  "only. Install nvidia-nccl-cu13==2.32.3, or build one with "
                                  f"`python -m flowdsl.runtime.support_build --cft --version {version}`.")
    chosen = _pick_arch(arch, entry["builds"])
    if chosen is None:
        raise SupportLibraryError(f"Cannot link flowdsl.cft for {arch}: the CFT library is built for "
                                  f"{', '.join(sorted(entry['builds']))} only.")
    path = support_build.PREBUILT_DIR / entry["builds"][chosen]["file"]
    return SupportBuild(path, nccl, chosen, support_build_for(nccl, "sm_90").layout)


def cft_missing(nccl: tuple[int, ...] | None, arch: str | None, linker: tuple[int, int] | None) -> list[str]:
    """What kernels using :mod:`flowdsl.cft` (counted writes included) lack to run with NCCL ``nccl`` on a GPU
    of ``arch`` linked by nvJitLink ``linker`` (``[]``: nothing), each item naming what is needed: NCCL >=
    2.32, flowdsl's CFT build for that release and arch, nvJitLink >= 13.3 (CUDA 13.3 LTO-IR), an sm_100 or
    newer GPU. ``flowdsl info`` prints them; the communicator's ``cft_missing`` joins them."""
    from ..cft import COUNTED_GATE  # noqa: PLC0415 - counted writes: NCCL 2.32, sm_100, CUDA 13.3

    missing = []
    builds = manifest().get("cft", {}).get("abis", {})
    if nccl is None or tuple(nccl) < COUNTED_GATE.nccl:
        have = "" if nccl is None else f", loaded {format_version(tuple(nccl))}"
        missing.append(f"NCCL >= 2.32 (counted writes{have}: install nvidia-nccl-cu13>=2.32.3)")
    elif format_version(tuple(nccl)) not in builds:
        have = f"built for NCCL {', '.join(builds)} only" if builds else "none built"
        missing.append(f"the CFT library for the loaded NCCL {format_version(tuple(nccl))} ({have}: install "
                       f"nvidia-nccl-cu13=={' or =='.join(builds) or '2.32.3'}, or build it with `python -m "
                       "flowdsl.runtime.support_build --cft`)")
    if linker is None or tuple(linker) < COUNTED_GATE.cuda:
        have = "" if linker is None else f", have {'.'.join(map(str, linker))}"
        missing.append(f"nvJitLink >= 13.3 (CUDA 13.3 LTO-IR{have}: install nvidia-nvjitlink-cu13>=13.3)")
    if arch is None or arch_cc(arch) < COUNTED_GATE.min_cc:
        missing.append("an sm_100 or newer GPU" + ("" if arch is None else f" (this one is {arch})"))
    return missing


def abi_layout(nccl: tuple[int, int, int]) -> dict:
    """Struct layout of NCCL release ``nccl`` (from the manifest or a first-use build).

    For a release with a CFT build, the CFT requirement fields (``cftCaps``,
    ``cftBarrierCount``) read by that build are added to ``requirements_fields``.
    """
    layout = support_build_for(nccl, "sm_90").layout
    cft = manifest().get("cft", {}).get("abis", {}).get(format_version(nccl), {})
    if cft.get("requirements_fields"):
        layout = dict(layout, requirements_fields={**layout["requirements_fields"], **cft["requirements_fields"]})
    return layout
