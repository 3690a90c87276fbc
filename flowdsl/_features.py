"""Names of what a compiled kernel needs of its launch beyond its arguments, recorded by the lowering on the
compiled kernel and read by the launch (both import it from here: the lowering never imports the launch)."""

from __future__ import annotations

__all__ = ["COOPERATIVE"]

#: Recorded on a compiled kernel that syncs its whole grid (``cuda.cg.this_grid().sync()``): it must be
#: launched cooperatively (every block resident at once), which numba-cuda's launcher does.
COOPERATIVE = "cooperative"
