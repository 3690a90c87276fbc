"""Argument checks shared by the typing of every device-surface binding.

Messages read "``op`` requires ``what``, got ``type``".
"""

from __future__ import annotations

from numba.core import types
from numba.core.errors import NumbaTypeError

__all__ = ["expect", "expect_int", "is_omitted"]


def expect(op: str, what: str, ty, cls) -> None:
    """Raise a typing error unless ``ty`` is an instance of ``cls``."""
    if not isinstance(ty, cls):
        raise NumbaTypeError(f"{op} requires {what}, got {ty}")


def expect_int(op: str, what: str, ty) -> None:
    """Raise a typing error unless ``ty`` is an integer type."""
    if not isinstance(ty, (types.Integer, types.IntegerLiteral)):
        raise NumbaTypeError(f"{op} requires {what} to be an integer, got {ty}")


def is_omitted(ty) -> bool:
    """Whether an optional argument was left out (or passed as None)."""
    return ty is None or isinstance(ty, (types.Omitted, types.NoneType))
