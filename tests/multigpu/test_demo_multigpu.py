"""``flowdsl demo`` under torchrun: one rank per GPU, and rank 0 reports how many ran.

Run on a machine with 2 or more GPUs: ``python -m pytest tests/multigpu/test_demo_multigpu.py``
(``FLOWDSL_TEST_NPROC`` picks the number of ranks, default every GPU).
"""

from __future__ import annotations

import subprocess

import pytest

from tests.multigpu.launch import nproc, torchrun, worker_env

pytestmark = pytest.mark.multigpu


def test_demo_under_torchrun_reports_every_rank(tmp_path):
    pytest.importorskip("torch", reason="torchrun needs PyTorch, which is not installed")
    ranks = nproc()
    proc = subprocess.run(torchrun(ranks, "-m", "flowdsl", "demo", "--tokens", "4"),
                          env=worker_env(), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert f"{ranks} rank(s) on GPU" in out and f"4 tokens per rank ({4 * ranks} in all)" in out, out[-4000:]
    assert "->  OK" in out, out[-4000:]
