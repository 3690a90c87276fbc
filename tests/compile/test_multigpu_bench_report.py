"""The several-GPU benchmark's report, from records alone (no GPU): the CTA-budget tables put flowdsl
at ``FlowConfig(channels=N)`` beside NCCL held to N CTAs, with the ratio of their bus bandwidths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.compile

ROOT = Path(__file__).resolve().parents[2]


def _report(records, nranks=2):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from multigpu.tables import report
    finally:
        sys.path.pop(0)
    return report({"meta": {"nranks": nranks}, "records": records, "errors": []})


def _record(collective, nbytes, version, busbw, check="ok", us=None):
    """A budget record; its time is what the bus bandwidth implies unless given (at one rank busbw is 0)."""
    return {"section": "budget", "collective": collective, "bytes": nbytes, "version": version,
            "us": us if us is not None else 3600.0 / busbw, "busbw": busbw, "check": check}


def test_budget_tables_give_each_budget_flowdsl_nccl_and_their_ratio():
    mib = 1 << 20
    records = [_record("all_reduce", mib, "auto@8", 40.0), _record("all_reduce", mib, "nccl@8", 50.0),
               _record("all_reduce", mib, "auto@16", 90.0), _record("all_reduce", mib, "nccl@16", 60.0, "BAD"),
               _record("all_gather", 64 * mib, "auto@8", 100.0)]
    lines = _report(records)
    at = lines.index(next(line for line in lines if line.startswith("all_reduce on 2 GPUs at equal CTA budgets")))
    assert lines[at + 1].split() == ["bytes/rank", "N", "=", "8", "N", "=", "16"]
    assert lines[at + 2].split() == ["1", "MiB", "40.0", "/", "50.0", "(0.80)", "90.0", "/", "60.0", "(1.50)", "CHECK"]
    gather = lines[lines.index(next(line for line in lines if line.startswith("all_gather on 2 GPUs at equal"))) + 2]
    assert gather.split() == ["64", "MiB", "100", "/", "-", "(-)"]


def test_at_one_rank_the_ratio_comes_from_the_times():
    # One rank moves nothing between ranks: busbw is 0 on both sides (a division by it failed on the H100).
    records = [_record("all_reduce", 1 << 20, "auto@8", 0.0, us=50.0),
               _record("all_reduce", 1 << 20, "nccl@8", 0.0, us=40.0)]
    lines = _report(records, nranks=1)
    at = lines.index(next(line for line in lines if line.startswith("all_reduce on 1 GPUs at equal CTA budgets")))
    assert lines[at + 2].split() == ["1", "MiB", "0", "/", "0", "(0.80)"]


def test_budgets_are_checked_before_any_gpu_work():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/multigpu_bench.py"), "--budgets", "8,x"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "--budgets takes comma-separated CTA counts such as 8,16,32, got '8,x'" in out.stderr
