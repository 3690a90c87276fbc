"""One rank of the bootstrap test: ``flowdsl.init()`` shares NCCL's unique id without pickle.

``--via store``: under torchrun with no process group, through the job's TCP store;
``--via group``: through a gloo ``torch.distributed`` group (a tensor broadcast). Then an
all-reduce of seeded random arrays, compared with NumPy; ``DIR/rank<r>.json`` holds
``{"rank", "nranks", "max_error", "error"}``.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on the shared machines
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's flowdsl, installed or not
from tests.multigpu.rank_report import write_report  # noqa: E402 - found through the line above

COUNT = 4099


def _inputs(rank: int):
    import numpy as np

    return np.random.default_rng(1000 + rank).standard_normal(COUNT).astype(np.float32)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--via", choices=("store", "group"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import numpy as np

    import flowdsl
    from flowdsl import collectives as coll

    rank = int(os.environ["RANK"])
    report = {"rank": rank, "nranks": None, "max_error": None, "error": None}
    try:
        if args.via == "group":
            import torch.distributed as dist

            dist.init_process_group("gloo")
            comm = flowdsl.init(group=dist.group.WORLD)
        else:
            comm = flowdsl.init()
        with comm:
            report["nranks"] = comm.nranks
            src = comm.alloc(COUNT, np.float32)
            src.set(_inputs(comm.rank))
            dst = comm.alloc(COUNT, np.float32)
            dst.fill(np.nan)  # poisoned: an element the collective misses fails the comparison
            coll.all_reduce(comm, src, dst)
            comm.synchronize()
            expected = np.sum([_inputs(r) for r in range(comm.nranks)], axis=0, dtype=np.float64)
            report["max_error"] = float(np.max(np.abs(dst.get() - expected)))
    except Exception:  # noqa: BLE001 - reported to the test
        report["error"] = traceback.format_exc()
    write_report(args.out, report)
    return 0 if report["error"] is None else 2


if __name__ == "__main__":
    sys.exit(main())
