"""flowdsl's numba lowering: types, the extern table, inline PTX, and the kernel compiler.

Importing this package registers every overload of the device surface.
"""

from __future__ import annotations

from . import surface

surface.bind()
