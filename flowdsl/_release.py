"""NCCL release numbers: ``(2, 28, 9)`` and ``"2.28.9"``.

Host code (the runtime, the kernel cache) names releases and archs without importing numba; the GPU's compile
path and the simulator refuse what a release or an arch lacks in the same words (:func:`nccl_refusal`,
:func:`arch_refusal`).
"""

from __future__ import annotations

__all__ = ["SUPPORTED_RELEASES", "parse_version", "format_version", "nccl_refusal", "arch_refusal", "arch_cc"]

#: NCCL releases flowdsl has support builds for: what PyTorch 2.11 pins, and the newest.
SUPPORTED_RELEASES = ("2.28.9", "2.32.3", "2.32.6")


def parse_version(text: str | tuple) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of ``"2.28.9"`` (or of a tuple)."""
    if isinstance(text, tuple):
        return tuple(int(x) for x in text)  # type: ignore[return-value]
    try:
        major, minor, patch = (int(x) for x in str(text).split(".")[:3])
    except ValueError:
        from .errors import UsageError  # noqa: PLC0415

        raise UsageError(f"Cannot read the NCCL release {text!r}: give it as major.minor.patch, e.g. 2.28.9") \
            from None
    return major, minor, patch


def format_version(version: tuple[int, ...]) -> str:
    """``"2.28.9"`` of ``(2, 28, 9)``."""
    return ".".join(str(x) for x in version)


def nccl_refusal(feature: str, needs: tuple[int, ...], has: tuple[int, ...], simulated: bool = False) -> str:
    """The refusal of ``feature``, which needs NCCL ``needs``, in a kernel made for NCCL ``has``: compiled for
    it on the GPU path, simulated as it (``flowdsl.sim.spawn(nccl=...)``) on the simulator."""
    made = (f"simulated for NCCL {format_version(has)} (flowdsl.sim.spawn(nccl='{format_version(has)}'))"
            if simulated else f"compiled for NCCL {format_version(has)}")
    return f"{feature} requires NCCL >= {format_version(needs)}, but this kernel is {made}. " \
           f"Install nvidia-nccl-cu13>={format_version(needs)}."


def arch_refusal(feature: str, min_cc: tuple[int, int], arch: str, simulated: bool = False) -> str:
    """The refusal of ``feature``, which needs compute capability ``min_cc``, in a kernel made for ``arch``:
    compiled for it on the GPU path, simulated as it (``flowdsl.sim.spawn(arch=...)``) on the simulator."""
    made = f"simulated for {arch} (flowdsl.sim.spawn(arch='{arch}'))" if simulated else f"compiled for {arch}"
    return f"{feature} requires sm_{min_cc[0]}{min_cc[1]} or newer, but this kernel is {made}. Run it on a newer GPU."



def arch_cc(arch: str) -> tuple[int, int]:
    """The compute capability ``(9, 0)`` of ``"sm_90"`` (``"sm_90a"``, ``"sm_100"``, ``"sm_100f"``)."""
    digits = arch.removeprefix("sm_").rstrip("af")
    return int(digits[:-1]), int(digits[-1])
