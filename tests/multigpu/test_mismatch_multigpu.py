"""``flowdsl.init(check_collectives=True)`` on several GPUs: a call that differs raises on every rank.

One torchrun launch of ``mismatch_worker.py`` (one process per GPU, or ``FLOWDSL_TEST_NPROC``)
with ``FLOWDSL_CHECK_COLLECTIVES=1``; each test reads every rank's report. Without the check
a mismatched call hangs in the collective, so a failing check shows as the launch running past
``FLOWDSL_MULTIGPU_TIMEOUT`` (seconds, default 600).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.multigpu.launch import launch_timeout, nproc, rank_reports, run, torchrun, worker_env

pytestmark = pytest.mark.multigpu

WORKER = Path(__file__).resolve().parent / "mismatch_worker.py"


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Every rank's report: ``{rank: report}``."""
    pytest.importorskip("torch", reason="torchrun needs PyTorch, which is not installed")
    out_dir = tmp_path_factory.mktemp("mismatch")
    rc, out = run(torchrun(nproc(), WORKER, "--out", out_dir), worker_env(), launch_timeout("600"),
                  past_timeout=": a mismatched call was not caught and hangs")
    by_rank = rank_reports(out_dir)
    errors = [f"rank {r}: {rep['error']}" for r, rep in sorted(by_rank.items()) if rep["error"]]
    assert not errors, "a rank failed:\n" + "\n".join(errors[:2])
    assert len(by_rank) == nproc() and rc == 0, f"torchrun exit {rc}:\n{out[-4000:]}"
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
