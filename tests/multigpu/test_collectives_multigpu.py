"""The GENK collectives on several GPUs, one rank each, through torchrun: the matrix of
:mod:`flowdsl.collectives.check` (the simulator's and the one-GPU tests' too), outputs poisoned.

One torchrun launch (``collectives_worker.py``, one process per GPU, or
``FLOWDSL_TEST_NPROC`` of them) runs every suite; each test below checks one suite in
every rank's report. The collectives library is precompiled first, so the ranks load
kernels from disk instead of each compiling all of them. ``FLOWDSL_MULTIGPU_TIMEOUT``
(seconds, default 900) bounds each step.
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
WORKER = HERE / "collectives_worker.py"
SUITES = ("matrix", "protocols", "torch")


def _nproc() -> int:
    if os.environ.get("FLOWDSL_TEST_NPROC"):
        return int(os.environ["FLOWDSL_TEST_NPROC"])
    from cuda.bindings import driver

    driver.cuInit(0)
    return int(driver.cuDeviceGetCount()[1])


def _run(cmd, env, timeout):
    """Run ``cmd`` in its own process group; on timeout end the whole group (torchrun's ranks too)."""
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(map(str, cmd))} ran past {timeout} s (FLOWDSL_MULTIGPU_TIMEOUT); "
                    f"its output ended with:\n{out[-4000:]}")
    return proc.returncode, out


def command(nproc: int, out_dir: Path, *worker_args) -> list[str]:
    """The torchrun command line of the worker (``--standalone``: a free local port)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(WORKER),
            "--out", str(out_dir), *worker_args]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Every rank's report of one launch running every suite: ``(reports by rank, output)``."""
    pytest.importorskip("torch", reason="torchrun needs PyTorch, which is not installed")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0",  # never NVLink multicast on the shared machines
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    timeout = float(os.environ.get("FLOWDSL_MULTIGPU_TIMEOUT", "900"))
    rc, out = _run([sys.executable, "-m", "flowdsl", "precompile"], env, timeout)
    assert rc == 0, f"python -m flowdsl precompile failed (exit {rc}):\n{out[-4000:]}"
    nproc = _nproc()
    out_dir = tmp_path_factory.mktemp("ranks")
    args = [a for name in SUITES for a in ("--suite", name)]
    rc, out = _run(command(nproc, out_dir, *args), env, timeout)
    by_rank = {}
    for path in sorted(out_dir.glob("rank*.json")):
        report = json.loads(path.read_text())
        by_rank[report["rank"]] = report
    errors = [f"rank {r}: {rep['error']}" for r, rep in sorted(by_rank.items()) if rep["error"]]
    assert not errors, "a rank raised:\n" + "\n".join(errors[:2])
    assert len(by_rank) == nproc, (f"{len(by_rank)} of {nproc} ranks reported (torchrun exit {rc}); "
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
