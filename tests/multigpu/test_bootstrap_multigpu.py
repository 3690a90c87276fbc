"""``flowdsl.init()`` on several GPUs under torchrun: NCCL's unique id travels as raw bytes through
the job's TCP store (no process group) or a gloo group's tensor broadcast, and the communicator works.

The CPU tests (tests/compile/test_bootstrap.py) feed malformed store values; this runs the real
``TCPStore`` and ``torch.distributed`` paths, then an all-reduce checked against NumPy.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.multigpu.launch import ROOT, launch_timeout, torchrun, worker_env

pytestmark = pytest.mark.multigpu

WORKER = Path(__file__).resolve().parent / "bootstrap_worker.py"


@pytest.mark.parametrize("via", ["store", "group"])
def test_init_shares_the_unique_id_and_the_communicator_works(tmp_path, via):
    pytest.importorskip("torch", reason="torchrun needs PyTorch, which is not installed")
    cmd = torchrun(2, WORKER, "--via", via, "--out", tmp_path)
    proc = subprocess.run(cmd, env=worker_env(), cwd=ROOT, capture_output=True, text=True,
                          timeout=launch_timeout("900"))
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert len(reports) == 2, f"torchrun exit {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}"
    for report in reports:
        assert report["error"] is None, f"rank {report['rank']}:\n{report['error']}"
        assert report["nranks"] == 2 and report["max_error"] < 1e-4, report
