"""One rank of the several-GPU test of ``flowdsl.init(check_collectives=True)``.

Launched by ``tests/multigpu/test_mismatch_multigpu.py`` through torchrun (one process per
GPU, at least 2); by hand::

    NCCL_NVLS_ENABLE=0 python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        tests/multigpu/mismatch_worker.py --out /tmp/mismatch

Every rank runs the same cases in the same order, each a collective call that agrees or not,
and records what it raised. ``DIR/rank<r>.json``: ``{"rank", "nranks", "cases": {name:
{"raised": class name or null, "message", "ok": result matched NumPy or null}}, "env_flag",
"error"}``. A case that hangs (a check that does not catch a mismatch) ends the run by the
launcher's timeout.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on the shared machines
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's flowdsl, installed or not
from tests.multigpu.rank_report import record_error, write_report  # noqa: E402 - found through the line above

N = 4099


def _cases(comm, np, coll):
    """name -> call(): the same list on every rank; ``rank`` makes some calls differ."""
    rank, n = comm.rank, comm.nranks
    rng = np.random.default_rng(11)
    inputs = rng.standard_normal((n, N + 1)).astype(np.float32)
    expected = inputs[:, :N].sum(0)

    def array(count=N, fill=None):
        a = comm.alloc(count, np.float32)
        a.set(inputs[rank, :count] if fill is None else np.full(count, fill, np.float32))
        return a

    def agreeing():
        dst = array(fill=np.nan)
        coll.all_reduce(comm, array(), dst)
        return bool(np.allclose(dst.get(), expected, rtol=1e-5, atol=1e-5))

    def count_differs():
        coll.all_reduce(comm, array(N + 1 if rank == 1 else N))

    def op_differs():
        coll.all_reduce(comm, array(), op="max" if rank == 1 else "sum")

    def root_refused_on_rank_1():  # rank 1 raises its UsageError, the others hear of it
        coll.broadcast(comm, array(), root=n if rank == 1 else 0)

    src, dst = array(), array(fill=np.nan)

    def planned_again():  # the same arrays twice: the second call takes the plan, checked again
        coll.all_reduce(comm, src, dst)
        coll.all_reduce(comm, src, dst)
        return bool(np.allclose(dst.get(), expected, rtol=1e-5, atol=1e-5))

    def planned_then_op_differs():
        coll.all_reduce(comm, src, dst, op="min" if rank == 0 else "sum")

    return {"agreeing": agreeing, "count_differs": count_differs, "op_differs": op_differs,
            "root_refused_on_rank_1": root_refused_on_rank_1, "agreeing_after_mismatches": agreeing,
            "planned_again": planned_again, "planned_then_op_differs": planned_then_op_differs}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write rank<r>.json here")
    args = parser.parse_args(argv)

    import numpy as np

    import flowdsl
    from flowdsl import collectives as coll

    rank = int(os.environ.get("RANK", "0"))
    report = {"rank": rank, "nranks": int(os.environ.get("WORLD_SIZE", "1")), "cases": {}, "env_flag": None,
              "error": None}
    comm = None
    try:
        import torch.distributed as dist

        dist.init_process_group("gloo")  # shares NCCL's unique id, as collectives_worker.py
        os.environ["FLOWDSL_CHECK_COLLECTIVES"] = "1"
        comm = flowdsl.init(group=dist.group.WORLD)
        report["env_flag"] = comm.check_collectives  # the environment variable turned it on
        for name, case in _cases(comm, np, coll).items():
            entry = {"raised": None, "message": None, "ok": None}
            try:
                entry["ok"] = case()
                comm.synchronize()
            except flowdsl.FlowDSLError as e:
                entry["raised"], entry["message"] = type(e).__name__, str(e)
            report["cases"][name] = entry
            print(f"[rank {rank}] {name}: {entry['raised'] or 'ok'} {entry['message'] or ''}", flush=True)
    except Exception:  # noqa: BLE001 - reported to the launcher, then the rank exits
        record_error(report)
        write_report(args.out, report)
        os._exit(2)  # another rank may wait inside NCCL: exiting lets torchrun end it
    write_report(args.out, report)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
