"""Seeded call sequences on several GPUs, one rank each, through torchrun: the generator and runner of
:mod:`flowdsl.collectives.sequences` (the simulator's too), every allocation bit for bit after every call.

One torchrun launch of ``sequences_worker.py`` (one process per GPU, or ``FLOWDSL_TEST_NPROC``)
runs the CI seed; ``scripts/gpu_all.sh`` runs more seeds after the tests and prints their summary
line. The library is precompiled first (kernels already cached are skipped).
``FLOWDSL_MULTIGPU_TIMEOUT`` (seconds, default 900) bounds each step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.multigpu.launch import launch_timeout, nproc, rank_reports, run, torchrun, worker_env

pytestmark = pytest.mark.multigpu

WORKER = Path(__file__).resolve().parent / "sequences_worker.py"


def test_call_sequence_on_every_gpu(tmp_path):
    """The CI seed's 200 calls on one communicator over every GPU: no wrong result on any rank."""
    pytest.importorskip("torch", reason="torchrun needs PyTorch, which is not installed")
    from flowdsl.collectives import sequences

    env, timeout = worker_env(), launch_timeout("900")
    rc, out = run([sys.executable, "-m", "flowdsl", "precompile"], env, timeout)
    assert rc == 0, f"python -m flowdsl precompile failed (exit {rc}):\n{out[-4000:]}"
    ranks = nproc()
    rc, out = run(torchrun(ranks, WORKER, "--seeds", sequences.CI_SEED, "--out", tmp_path), env, timeout)
    by_rank = rank_reports(tmp_path)
    errors = [f"rank {r}: {rep['error']}" for r, rep in sorted(by_rank.items()) if rep["error"]]
    assert not errors, "a rank raised:\n" + "\n".join(errors[:2])
    assert len(by_rank) == ranks, f"{len(by_rank)} of {ranks} ranks reported (torchrun exit {rc}):\n{out[-4000:]}"
    seed = str(sequences.CI_SEED)
    calls = by_rank[0]["seeds"][seed]["calls"]
    failures = [f for r in sorted(by_rank) for f in by_rank[r]["seeds"][seed]["failures"]]
    assert calls == sequences.DEFAULT_CALLS
    assert not failures, (f"{len(failures)} wrong results over {ranks} ranks x {calls} calls; the first:\n"
                          + "\n".join(failures[:10]))
    assert rc == 0, f"torchrun exit {rc}:\n{out[-4000:]}"
