"""scripts/try_numba_cuda_mlir.py, the prototype of docs/backends.md, runs as the page says.

numba-cuda-mlir replaces numba-cuda, so it lives in an environment of its own: point
``FLOWDSL_MLIR_PYTHON`` at that environment's python to run the prototype there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.compile
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "try_numba_cuda_mlir.py"


def _run(python: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_without_numba_cuda_mlir_it_says_so_and_succeeds():
    proc = subprocess.run([sys.executable, "-c", "import numba_cuda_mlir"], capture_output=True)
    if proc.returncode == 0:
        pytest.skip("numba-cuda-mlir is installed in this environment: the message for its absence cannot show")
    proc = _run(sys.executable)
    assert proc.returncode == 0, proc.stderr
    assert "numba-cuda-mlir is not installed in this environment" in proc.stdout


@pytest.mark.parametrize("arch,nccl", [("sm_90", "2.28.9"), ("sm_100", "2.32.3")])
def test_prototype_links_an_lsa_kernel_with_the_support_build(arch, nccl):
    python = os.environ.get("FLOWDSL_MLIR_PYTHON")
    if not python:
        pytest.skip("set FLOWDSL_MLIR_PYTHON to a python with numba-cuda-mlir[cu13] installed (docs/backends.md)")
    proc = _run(python, "--arch", arch, "--nccl", nccl)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-3000:]}"
    assert f"[ ok ] nvJitLink (cuda.core) with prebuilt/build/nccl-{nccl}/{arch}.ltoir" in proc.stdout
    assert "ld.acquire.sys.global.u64 kept: True; support calls left after LTO: []" in proc.stdout
