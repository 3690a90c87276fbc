"""Test-only stand-in for ``import flowdsl`` while the package's ``__init__`` cannot import.

Contents: :func:`ensure_flowdsl` (make ``import flowdsl`` and ``flowdsl.kernel`` work for the
simulator tests; uses the real package when it imports).
"""

from __future__ import annotations

import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ensure_flowdsl():
    """Import the real ``flowdsl``; if that fails, install a minimal stand-in package."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    try:
        import flowdsl  # noqa: F401
    except Exception:  # the GPU path is still landing: fall back to a namespace stand-in
        for k in [k for k in sys.modules if k == "flowdsl" or k.startswith("flowdsl.")]:
            del sys.modules[k]
        pkg = types.ModuleType("flowdsl")
        pkg.__path__ = [os.path.join(ROOT, "flowdsl")]
        sys.modules["flowdsl"] = pkg
        from flowdsl import coop, enums, lsa, mem, team  # noqa: F401
        pkg.coop, pkg.lsa, pkg.mem, pkg.team = coop, lsa, mem, team
        pkg.MemoryOrder, pkg.ThreadScope, pkg.CoopKind = enums.MemoryOrder, enums.ThreadScope, enums.CoopKind
    import flowdsl
    import flowdsl.sim
    if not hasattr(flowdsl, "kernel"):
        flowdsl.kernel = flowdsl.sim.kernel
    return flowdsl
