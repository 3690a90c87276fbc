"""The several-GPU benchmark runs at one rank on one GPU (under torchrun), its CTA-budget section
included: so that its first run on two GPUs is not its first run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_runs_at_one_rank_with_its_cta_budgets(tmp_path):
    pytest.importorskip("torch", reason="PyTorch is not installed (the benchmark runs under torchrun)")
    out = tmp_path / "bench.json"
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                                                      os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                           str(ROOT / "benchmarks/multigpu_bench.py"), "--quick", "--budgets", "8",
                           "--collectives", "all_reduce,all_gather", "--max-bytes", str(1 << 20), "--no-graph",
                           "--no-symm", "--json", str(out)], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "all_reduce on 1 GPUs at equal CTA budgets" in proc.stdout
    records = [r for r in json.loads(out.read_text())["records"] if r["section"] == "budget"]
    assert {(r["collective"], r["version"]) for r in records} == {
        (c, v) for c in ("all_reduce", "all_gather") for v in ("auto@8", "nccl@8")}
    assert all(r["check"] == "ok" and r["us"] > 0 for r in records), records
