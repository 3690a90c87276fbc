"""The GENK collectives on several GPUs, one rank each, through torchrun: the matrix of
:mod:`flowdsl.collectives.check` (the simulator's and the one-GPU tests' too), outputs poisoned.

One torchrun launch (``collectives_worker.py``, one process per GPU, or
``FLOWDSL_TEST_NPROC`` of them) runs every suite; each test below checks one suite in
every rank's report. The collectives library is precompiled first, so the ranks load
kernels from disk instead of each compiling all of them. ``FLOWDSL_MULTIGPU_TIMEOUT``
(seconds, default 900) bounds each step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.multigpu.launch import launch_timeout, nproc, rank_reports, run, torchrun, worker_env

pytestmark = pytest.mark.multigpu

WORKER = Path(__file__).resolve().parent / "collectives_worker.py"
SUITES = ("matrix", "protocols", "torch")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Every rank's report of one launch running every suite: ``(reports by rank, output)``."""
    pytest.importorskip("torch", reason="torchrun needs PyTorch, which is not installed")
    env = worker_env()
    timeout = launch_timeout("900")
    rc, out = run([sys.executable, "-m", "flowdsl", "precompile"], env, timeout)
    assert rc == 0, f"python -m flowdsl precompile failed (exit {rc}):\n{out[-4000:]}"
    ranks = nproc()
    out_dir = tmp_path_factory.mktemp("ranks")
    args = [a for name in SUITES for a in ("--suite", name)]
    rc, out = run(torchrun(ranks, WORKER, "--out", out_dir, *args), env, timeout)
    by_rank = rank_reports(out_dir)
    errors = [f"rank {r}: {rep['error']}" for r, rep in sorted(by_rank.items()) if rep["error"]]
    assert not errors, "a rank raised:\n" + "\n".join(errors[:2])
    assert len(by_rank) == ranks, (f"{len(by_rank)} of {ranks} ranks reported (torchrun exit {rc}); "
                                   f"output:\n{out[-4000:]}")
    assert rc in (0, 1), f"torchrun exit {rc}; output:\n{out[-4000:]}"
    return by_rank, out


def _assert_suite(reports, suite):
    by_rank, _ = reports
    failures = [f for r in sorted(by_rank) for f in by_rank[r]["suites"][suite]["failures"]]
    calls = by_rank[0]["suites"][suite]["calls"]
    assert not failures, (f"{suite}: {len(failures)} mismatches over {len(by_rank)} ranks x {calls} calls; "
                          "the first:\n" + "\n".join(failures[:20]))


def test_every_program_dtype_op_placement(reports):
    """Every program x dtype x op x placement, counts 1, 4099 and 2**20 + 3, protocols rotating
    (the cost model's choice, SIMPLE, LL, LL128)."""
    _assert_suite(reports, "matrix")


def test_each_protocol_forced(reports):
    """``FlowConfig(protocol=p)`` for each of SIMPLE, LL and LL128: float32, bfloat16 and fp8 e4m3 sums
    (and the copies) at 2**20 + 3 elements per rank."""
    _assert_suite(reports, "protocols")


def test_torch_tensors(reports):
    """torch.float8_e4m3fn and torch.bfloat16 tensors: the element type comes from the tensor (no dtype=)."""
    _assert_suite(reports, "torch")
