"""What ``flowdsl.init(check_collectives=True)`` costs per collective call, on several GPUs.

    python -m flowdsl precompile      # once, so that the ranks load the kernels instead of compiling them
    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=2 benchmarks/check_collectives_bench.py [--json out.json]

Two communicators on the same GPUs, one with the check and one without, run the same planned
all_reduce (float32 sum, out of place, buffers from ``comm.alloc``) at each size: R calls back
to back, timed on the host from the first call to the stream's end (what a user sees: the
check waits for the stream on every call, so calls no longer queue ahead of the GPU). Also
timed alone: the check itself (the NCCL all-gather of the 128-byte signatures and the read
back), R times. Ranks meet before each measurement; 5 rounds, the versions alternating;
the slowest rank's time of a round; the median of the rounds. Rank 0 prints a table (us per
call) and, with ``--json``, writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on the shared machines
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = (8, 4096, 65536, 1 << 20, 16 << 20)  # bytes per rank


def _slowest(comm, value: float) -> float:
    """The largest ``value`` over the ranks (an NCCL all-reduce of one float64 on the comm's stream)."""
    import cupy
    from nccl.core import NcclRedOp

    buf = cupy.asarray([value], cupy.float64)
    comm.nccl.allreduce(buf, buf, NcclRedOp.MAX, stream=cupy.cuda.get_current_stream().ptr)
    return float(buf.get()[0])


def _timed(comm, fn, calls: int) -> float:
    """us per call of ``calls`` back-to-back calls, host to stream end, the slowest rank's."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    _slowest(comm, 0.0)  # ranks line up
    stream.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    stream.synchronize()
    return _slowest(comm, (time.perf_counter() - start) * 1e6 / calls)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per measurement (default 200)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the table here (rank 0)")
    args = parser.parse_args(argv)

    import cupy
    import numpy as np

    import flowdsl
    from flowdsl import collectives as coll
    from flowdsl.collectives import _agree

    import torch.distributed as dist

    dist.init_process_group("gloo")  # shares each communicator's NCCL id in order
    plain = flowdsl.init(group=dist.group.WORLD, check_collectives=False)
    checked = flowdsl.init(group=dist.group.WORLD, check_collectives=True)
    rows = []
    for nbytes in SIZES:
        count = max(nbytes // 4, 1)
        arrays = {}
        for name, comm in (("off", plain), ("on", checked)):
            src, dst = comm.alloc(count, np.float32), comm.alloc(count, np.float32)
            src.set(np.ones(count, np.float32))
            arrays[name] = (comm, src, dst)
            coll.all_reduce(comm, src, dst)  # warm up: plan (and compile or load)
            comm.synchronize()
            assert float(dst.get()[0]) == comm.nranks
        agree = _agree.agreement(checked)
        sig = _agree.signature("all_reduce", count, "float32", flowdsl.RedOp.SUM, None, "auto", None)
        handle = cupy.cuda.get_current_stream().ptr
        times = {"off": [], "on": [], "check alone": []}
        for _ in range(args.rounds):
            for name in ("off", "on"):
                comm, src, dst = arrays[name]
                times[name].append(_timed(comm, lambda c=comm, s=src, d=dst: coll.all_reduce(c, s, d), args.calls))
            times["check alone"].append(_timed(checked, lambda: agree(sig, handle, True), args.calls))
        row = {"bytes": nbytes, **{k: statistics.median(v) for k, v in times.items()}}
        row["cost"] = row["on"] - row["off"]
        rows.append(row)
    if plain.rank == 0:
        print(f"check_collectives on {plain.nranks} GPUs: us per all_reduce call (float32, back to back, "
              f"{args.calls} calls, median of {args.rounds} rounds, slowest rank)")
        print(f"{'bytes/rank':>12} {'check off':>10} {'check on':>10} {'cost':>10} {'check alone':>12}")
        for r in rows:
            print(f"{r['bytes']:>12} {r['off']:>10.2f} {r['on']:>10.2f} {r['cost']:>10.2f} {r['check alone']:>12.2f}")
        if args.json:
            args.json.write_text(json.dumps({"nranks": plain.nranks, "calls": args.calls, "rows": rows}, indent=1))
    checked.close()
    plain.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
