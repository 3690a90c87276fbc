"""``flowdsl demo`` under torchrun: one rank per GPU, and rank 0 reports how many ran.

Run on a machine with 2 or more GPUs: ``python -m pytest tests/multigpu/test_demo_multigpu.py``
(``FLOWDSL_TEST_NPROC`` picks the number of ranks, default every GPU).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multigpu
ROOT = Path(__file__).resolve().parents[2]


def _nproc() -> int:
    if os.environ.get("FLOWDSL_TEST_NPROC"):
        return int(os.environ["FLOWDSL_TEST_NPROC"])
    from cuda.bindings import driver

    driver.cuInit(0)
    return int(driver.cuDeviceGetCount()[1])


def test_demo_under_torchrun_reports_every_rank(tmp_path):
    pytest.importorskip("torch", reason="torchrun needs PyTorch, which is not installed")
    nproc = _nproc()
    env = dict(os.environ, NCCL_NVLS_ENABLE="0",  # never NVLink multicast on the shared machines
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={nproc}", "-m", "flowdsl", "demo", "--tokens", "4"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert f"{nproc} rank(s) on GPU" in out and f"4 tokens per rank ({4 * nproc} in all)" in out, out[-4000:]
    assert "->  OK" in out, out[-4000:]
