"""Choosing the support-library build for the loaded NCCL and a target arch.

Contents: :func:`manifest`, :func:`support_build_for`, :func:`cft_build_for`,
:func:`abi_layout`, :func:`cache_dir`.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from .._release import format_version

__all__ = ["manifest", "support_build_for", "cft_build_for", "abi_layout", "cache_dir", "SupportBuild"]


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


def _arch_number(arch: str) -> int:
    return int(arch.removeprefix("sm_").rstrip("a"))


def _pick_arch(target_arch: str, available) -> str | None:
    """The newest built arch not newer than the target (LTO-IR is forward-compatible)."""
    fits = [a for a in available if _arch_number(a) <= _arch_number(target_arch)]
    return max(fits, key=_arch_number) if fits else None


@functools.cache
def support_build_for(nccl: tuple[int, int, int], arch: str) -> SupportBuild:
    """The support build for NCCL ``nccl`` and ``arch``: checked in, or built at first use."""
    from . import support_build  # noqa: PLC0415

    version = format_version(nccl)
    entry = manifest()["abis"].get(version)
    if entry is not None:
        chosen = _pick_arch(arch, entry["builds"])
        if chosen is None:
            raise RuntimeError(f"Cannot compile for {arch}: the flowdsl support library is built for "
                               f"{', '.join(sorted(entry['builds']))} only. Use a GPU of sm_80 or newer.")
        path = support_build.PREBUILT_DIR / entry["builds"][chosen]["file"]
        return SupportBuild(path, nccl, chosen, entry["layout"])
    chosen = _pick_arch(arch, support_build.ARCHS) or arch
    path, layout = support_build.build_for_installed(version, chosen, cache_dir() / "support")
    return SupportBuild(path, nccl, chosen, layout)


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
        raise RuntimeError(f"Cannot link flowdsl.cft for NCCL {version}: flowdsl has CFT builds for NCCL {have} "
                           "only. Install nvidia-nccl-cu13==2.32.3, or build one with "
                           f"`python -m flowdsl.runtime.support_build --cft --version {version}`.")
    chosen = _pick_arch(arch, entry["builds"])
    if chosen is None:
        raise RuntimeError(f"Cannot link flowdsl.cft for {arch}: the CFT library is built for "
                           f"{', '.join(sorted(entry['builds']))} only.")
    path = support_build.PREBUILT_DIR / entry["builds"][chosen]["file"]
    return SupportBuild(path, nccl, chosen, support_build_for(nccl, "sm_90").layout)


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
