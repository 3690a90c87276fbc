"""numba-cuda's own tests through ``@flowdsl.kernel`` on the simulator (scripts/numba_cuda_compat.py): for the
modules CI runs, one or more per feature family that flowdsl's simulator covers in full, flowdsl passes at least
as many of each module's tests as numba-cuda's own simulator does. The whole suite and its ratios are
docs/support.md's."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.sim,
              pytest.mark.skipif(importlib.util.find_spec("filecheck") is None,
                                 reason="numba-cuda's test suite imports filecheck: install the test extra "
                                        "(pip install -e '.[test]')")]

ROOT = Path(__file__).resolve().parents[2]
#: Atomics, barriers and warp votes, math, complex numbers, forall, a stencil with shared memory and streams,
#: arrays, constant memory and records, iterators, closures and globals.
CI_MODULES = ("test_atomics", "test_sync", "test_math", "test_complex", "test_forall", "test_laplace", "test_array",
              "test_constmem", "test_iterators", "test_freevar", "test_globals")


def test_flowdsl_passes_what_numba_cudas_simulator_passes(tmp_path):
    out = tmp_path / "compat.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/numba_cuda_compat.py"), "--modules", *CI_MODULES,
                           "--timeout", "300", "--json", str(out)], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["module"] for r in rows] == list(CI_MODULES)
    for r in rows:
        numba, mine = r["numba"], r["flowdsl"]
        assert "passed" in numba and "passed" in mine, r  # neither timed out nor failed to import
        assert numba["passed"] > 0, r
        assert mine["passed"] >= numba["passed"], (r["module"], mine, numba)
