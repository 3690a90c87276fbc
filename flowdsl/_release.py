"""NCCL release numbers: ``(2, 28, 9)`` and ``"2.28.9"``.

Host code (the runtime, the kernel cache) names releases without importing numba.
"""

from __future__ import annotations

__all__ = ["parse_version", "format_version"]


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
