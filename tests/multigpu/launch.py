"""The several-GPU tests' side of a torchrun launch: how many ranks, the command, the run, the reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def nproc() -> int:
    """Ranks to launch: ``FLOWDSL_TEST_NPROC``, else one per GPU."""
    if os.environ.get("FLOWDSL_TEST_NPROC"):
        return int(os.environ["FLOWDSL_TEST_NPROC"])
    from cuda.bindings import driver

    driver.cuInit(0)
    return int(driver.cuDeviceGetCount()[1])


def launch_timeout(default: str) -> float:
    """Seconds one launch may take: ``FLOWDSL_MULTIGPU_TIMEOUT``, else ``default``."""
    return float(os.environ.get("FLOWDSL_MULTIGPU_TIMEOUT", default))


def worker_env() -> dict:
    """The ranks' environment: this checkout's flowdsl first on the path, and never NVLink multicast
    on the shared machines."""
    return dict(os.environ, NCCL_NVLS_ENABLE="0",
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def torchrun(ranks: int, *args) -> list[str]:
    """The torchrun command line running ``args`` on ``ranks`` ranks (``--standalone``: a free local port)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
            *map(str, args)]


def run(cmd, env, timeout, past_timeout: str = "") -> tuple[int, str]:
    """Run ``cmd`` in its own process group; on timeout end the whole group (torchrun's ranks too)
    and fail, saying ``past_timeout`` (what running long means) and how the output ended."""
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(map(str, cmd))} ran past {timeout} s (FLOWDSL_MULTIGPU_TIMEOUT){past_timeout}; "
                    f"its output ended with:\n{out[-4000:]}")
    return proc.returncode, out


def rank_reports(out_dir: Path) -> dict[int, dict]:
    """Every rank's report (``rank<r>.json`` in ``out_dir``), by rank."""
    reports = (json.loads(path.read_text()) for path in sorted(out_dir.glob("rank*.json")))
    return {report["rank"]: report for report in reports}
