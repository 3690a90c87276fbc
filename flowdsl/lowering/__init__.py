"""flowdsl's numba lowering: types, the extern table, inline PTX, and the kernel compiler.

Importing this package registers every overload of the device surface.
"""

from __future__ import annotations

from numba.cuda.extending import typeof_impl
from numba.core import types

from ..enums import MemoryOrder, ThreadScope
from . import surface


# Orders and scopes are compile-time constants in kernels: type their members as int literals
# so that inline PTX can spell the right instruction.
@typeof_impl.register(MemoryOrder)
@typeof_impl.register(ThreadScope)
def _typeof_enum_literal(val, c):
    return types.IntegerLiteral(int(val))


surface.bind()
