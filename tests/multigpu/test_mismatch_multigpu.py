"""``flowdsl.init(check_collectives=True)`` on several GPUs: a call that differs raises on every rank.

One torchrun launch of ``mismatch_worker.py`` (one process per GPU, or ``FLOWDSL_TEST_NPROC``)
with ``FLOWDSL_CHECK_COLLECTIVES=1``; each test reads every rank's report. Without the check
a mismatched call hangs in the collective, so a failing check shows as the launch running past
``FLOWDSL_MULTIGPU_TIMEOUT`` (seconds, default 600).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multigpu

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _nproc() -> int:
    if os.environ.get("FLOWDSL_TEST_NPROC"):
        return int(os.environ["FLOWDSL_TEST_NPROC"])
    from cuda.bindings import driver

    driver.cuInit(0)
    return int(driver.cuDeviceGetCount()[1])


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Every rank's report: ``{rank: report}``."""
    pytest.importorskip("torch", reason="torchrun needs PyTorch, which is not installed")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0",  # never NVLink multicast on the shared machines
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    out_dir = tmp_path_factory.mktemp("mismatch")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={_nproc()}",
           str(HERE / "mismatch_worker.py"), "--out", str(out_dir)]
    timeout = float(os.environ.get("FLOWDSL_MULTIGPU_TIMEOUT", "600"))
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the ranks ran past {timeout} s: a mismatched call was not caught and hangs; output:\n"
                    f"{out[-4000:]}")
    by_rank = {r["rank"]: r for r in (json.loads(p.read_text()) for p in sorted(out_dir.glob("rank*.json")))}
    errors = [f"rank {r}: {rep['error']}" for r, rep in sorted(by_rank.items()) if rep["error"]]
    assert not errors, "a rank failed:\n" + "\n".join(errors[:2])
    assert len(by_rank) == _nproc() and proc.returncode == 0, f"torchrun exit {proc.returncode}:\n{out[-4000:]}"
    return by_rank


def _case(reports, name):
    return {r: rep["cases"][name] for r, rep in reports.items()}


def test_the_environment_variable_turns_the_check_on(reports):
    assert all(rep["env_flag"] is True for rep in reports.values())


@pytest.mark.parametrize("name", ["agreeing", "agreeing_after_mismatches", "planned_again"])
def test_agreeing_calls_compute_the_sum(reports, name):
    for rank, entry in _case(reports, name).items():
        assert entry["raised"] is None and entry["ok"] is True, (rank, entry)


def test_a_count_that_differs_raises_on_every_rank(reports):
    for rank, entry in _case(reports, "count_differs").items():
        assert entry["raised"] == "CollectiveMismatchError", (rank, entry)
        assert "all_reduce called differently across ranks: count is 4099 on rank" in entry["message"]
        assert "and 4100 on rank 1" in entry["message"]


def test_an_op_that_differs_raises_on_every_rank(reports):
    for rank, entry in _case(reports, "op_differs").items():
        assert entry["raised"] == "CollectiveMismatchError", (rank, entry)
        assert "op is sum on rank" in entry["message"] and "and max on rank 1" in entry["message"]


def test_a_planned_call_that_differs_raises_on_every_rank(reports):
    for rank, entry in _case(reports, "planned_then_op_differs").items():
        assert entry["raised"] == "CollectiveMismatchError", (rank, entry)
        assert "op is min on rank 0 and sum on rank" in entry["message"]


def test_a_rank_that_refuses_its_arguments_is_named_to_the_others(reports):
    for rank, entry in _case(reports, "root_refused_on_rank_1").items():
        if rank == 1:
            assert entry["raised"] == "UsageError" and "is not a rank of this communicator" in entry["message"]
        else:
            assert entry["raised"] == "CollectiveMismatchError", (rank, entry)
            assert "rank 1 refused its arguments" in entry["message"]
