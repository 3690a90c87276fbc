"""Planted hangs on 2 GPUs end on every rank within the limit, with the diagnosis; an abort
from a host thread ends a spinning kernel.

Each test runs ``timeouts_worker.py`` under torchrun (one process per GPU, at most 2):
the programs of ``tests/planted_hangs.py``, whose waits give up after
``planted_hangs.TIMEOUT`` seconds; the simulator runs the same programs in
``tests/sim/test_timeouts.py``. ``FLOWDSL_MULTIGPU_TIMEOUT`` (seconds, default 600)
bounds each launch, compilation included.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import planted_hangs
from tests.multigpu.launch import launch_timeout, nproc, rank_reports, run, torchrun, worker_env

pytestmark = pytest.mark.multigpu

WORKER = Path(__file__).resolve().parent / "timeouts_worker.py"
#: What a rank may take past the limit: the host notices within 50 ms; kernels leave at their next check.
SLACK = 15.0
FLOW_WAITS = ("flow ready flag", "flow credit", "LL line flag", "LL128 line flag")


def _launch(program: str, tmp_path) -> dict:
    pytest.importorskip("torch", reason="torchrun needs PyTorch, which is not installed")
    ranks = min(nproc(), 2)
    rc, out = run(torchrun(ranks, WORKER, "--program", program, "--out", tmp_path), worker_env(),
                  launch_timeout("600"))
    reports = rank_reports(tmp_path)
    assert rc == 0 and len(reports) == ranks, f"torchrun exit {rc}, {len(reports)} reports; output:\n{out[-4000:]}"
    errors = [r["message"] for r in reports.values() if r["outcome"] == "error"]
    assert not errors, errors[0]
    return reports


@pytest.mark.parametrize("program", ["skip_collective", "skip_flow_step"])
def test_a_rank_that_skips_the_collective_leaves_its_peer_with_the_diagnosis(tmp_path, program):
    """``skip_collective``: the second all_reduce (no check_collectives: the device waits);
    ``skip_flow_step``: a ring step's kernel on Flow (the program the simulator test runs)."""
    reports = _launch(program, tmp_path)
    waiter, skipper = reports[0], reports[1]
    assert skipper["outcome"] == "ok"
    assert waiter["outcome"] == "timeout", waiter
    fields = waiter["fields"]
    assert fields["rank"] == 0 and fields["peer"] == 1
    assert fields["primitive"].startswith(FLOW_WAITS), fields
    assert fields["seen"] != fields["expected"]
    assert planted_hangs.TIMEOUT <= fields["waited_s"] < planted_hangs.TIMEOUT + SLACK
    assert waiter["seconds"] < planted_hangs.TIMEOUT + SLACK
    assert "Cannot synchronize: a device-side wait on rank 0 gave up after" in waiter["message"]
    assert "from peer rank 1" in waiter["message"]


def test_a_rank_that_never_arrives_at_a_barrier_leaves_its_peer_with_the_diagnosis(tmp_path):
    reports = _launch("skip_barrier", tmp_path)
    assert reports[1]["outcome"] == "ok"
    waiter = reports[0]
    assert waiter["outcome"] == "timeout", waiter
    fields = waiter["fields"]
    assert (fields["rank"], fields["peer"], fields["index"]) == (0, 1, 0)
    assert fields["primitive"] == "lsa barrier wait, barrier"
    assert (fields["expected"], fields["seen"]) == (1, 0)  # a fresh device communicator's epochs
    assert waiter["seconds"] < planted_hangs.TIMEOUT + SLACK


def test_ranks_waiting_for_each_other_all_end_with_the_diagnosis(tmp_path):
    reports = _launch("everyone_waits", tmp_path)
    nranks = len(reports)
    for rank, report in reports.items():
        assert report["outcome"] == "timeout", report
        fields = report["fields"]
        assert (fields["rank"], fields["peer"], fields["thread"]) == (rank, (rank + 1) % nranks, 0)
        assert fields["primitive"] == "a kernel's own wait (flowdsl.wait.poll), index"
        assert (fields["expected"], fields["seen"]) == (1, 0)
        assert report["seconds"] < planted_hangs.TIMEOUT + SLACK


def test_an_abort_from_a_host_thread_ends_a_kernel_that_spins_without_a_limit(tmp_path):
    reports = _launch("abort_from_thread", tmp_path)
    for report in reports.values():
        assert report["outcome"] == "aborted", report
        assert "the communicator was aborted" in report["message"]
        assert 1.0 <= report["seconds"] < 1.0 + SLACK
