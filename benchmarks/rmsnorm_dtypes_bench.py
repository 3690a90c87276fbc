"""The fused ReduceScatter + RMSNorm + AllGather kernel (flowdsl/examples/rmsnorm_lsa.py) in float32, float16 and
bfloat16, side by side in one run on the GPUs of one process group (one rank per process; at one rank the
collective parts are local, so one GPU gives the kernel's own time).

Each row: tokens x hidden, the element type, the median microseconds per launch (CUDA events around REPS
launches, the types interleaved round by round), the tensor's bytes per microsecond, and the time as a ratio of
float32's. Every launch's result is checked against NumPy within the type's rounding first.

    python benchmarks/rmsnorm_dtypes_bench.py [--json out.json]      (torchrun --nproc_per_node=N for N GPUs)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flowdsl  # noqa: E402
from flowdsl.examples import rmsnorm_lsa  # noqa: E402

SHAPES = ((8, 4096), (64, 4096), (256, 8192))  # tokens per rank, hidden


def bench(comm, tokens_per_rank: int, hidden: int, rounds: int, reps: int) -> list[dict]:
    launches, sizes = {}, {}
    resources = []
    for dtype in rmsnorm_lsa.ELEMENT_TYPES:
        result, reference = rmsnorm_lsa.run(comm, tokens_per_rank, hidden, seed=1, dtype=dtype)
        tol = rmsnorm_lsa.TOLERANCE[dtype]
        assert np.allclose(result, reference, rtol=tol, atol=tol), f"{dtype}: wrong result"
        element = np.uint16 if dtype == "bfloat16" else np.dtype(dtype)
        buf = comm.alloc((tokens_per_rank * comm.nranks, hidden), element)
        win = comm.register(buf)
        dcomm = comm.device_communicator(lsa_barrier_count=tokens_per_rank)
        resources += [dcomm, win]
        launch = rmsnorm_lsa.rmsnorm_lsa[tokens_per_rank, rmsnorm_lsa.THREADS]
        launches[dtype] = (lambda launch=launch, dcomm=dcomm, win=win:
                           launch(dcomm, win, hidden, np.float32(1e-6)))
        sizes[dtype] = buf.nbytes
    from lsa_bench import time_rounds  # noqa: PLC0415 - the benchmarks' one timing loop (CUDA events, interleaved)

    times = {dtype: ms * 1000 for dtype, ms in time_rounds(launches, rounds, reps).items()}
    for r in resources:
        r.close()
    base = times["float32"]
    return [{"tokens": tokens_per_rank * comm.nranks, "hidden": hidden, "dtype": dtype, "ranks": comm.nranks,
             "us": us, "bytes_per_us": sizes[dtype] / us, "vs_float32": us / base} for dtype, us in times.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows = []
    with flowdsl.init() as comm:
        for tokens_per_rank, hidden in SHAPES:
            rows += bench(comm, tokens_per_rank, hidden, args.rounds, args.reps)
        if comm.rank != 0:
            return 0
    print(f"fused RS + RMSNorm + AG, {rows[0]['ranks']} rank(s): median us per launch, bytes/us, time / float32's")
    print(f"{'tokens x hidden':>16} {'dtype':>9} {'us':>9} {'B/us':>9} {'/ f32':>7}")
    for r in rows:
        print(f"{r['tokens']:>7} x {r['hidden']:<6} {r['dtype']:>9} {r['us']:9.2f} {r['bytes_per_us']:9.0f} "
              f"{r['vs_float32']:7.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
