"""Several GPUs, one rank each (launch with torchrun): the GENK collectives against NumPy, then a
bandwidth and latency sweep against NCCL's host collective on the same buffers, in one run.

    python -m flowdsl precompile          # once, so the ranks load instead of compiling
    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=8 scripts/multigpu_collectives.py --json out.json

Correctness: every collective, dtype and operator, in and out of place, every protocol,
at counts 1, 4099 and 2**20 + 3, outputs poisoned, each rank against its NumPy
reference. Sweep: 8 B to 1 GiB per rank (float32 sum, out of place); bus bandwidth as
nccl-tests defines it (from the whole buffer for all_gather and reduce_scatter) (all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n,
broadcast and reduce 1). Goals: flowdsl / NCCL >= 0.95 at >= 64 MiB, and time <= 1.2x
NCCL at <= 64 KiB. Rank 0 prints the table and writes the JSON (and a PNG plot with
``--plot``, where matplotlib is installed).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on shared machines

import cupy  # noqa: E402

import flowdsl  # noqa: E402
from flowdsl import Protocol  # noqa: E402
from flowdsl import collectives as coll  # noqa: E402
from flowdsl.collectives import check  # noqa: E402

CASES = [("ring", "all_reduce"), ("tree", "all_reduce"), ("ring", "all_gather"), ("ring", "reduce_scatter"),
         ("ring", "broadcast"), ("ring", "reduce")]
BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
       "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}


def correctness(comm) -> list[str]:
    n, r = comm.nranks, comm.rank
    failures = []
    counts = (1, 4099, (1 << 20) + 3)
    protocols = (None, Protocol.SIMPLE, Protocol.LL, Protocol.LL128)
    for i, ((alg, collective), dtype, inplace) in enumerate(
            itertools.product(CASES, coll.DTYPES, (False, True))):
        for op in (("sum", "prod", "min", "max", "avg") if collective in ("all_reduce", "reduce_scatter", "reduce")
                   else (None,)):
            count = counts[i % len(counts)]
            root = i % n
            rng = np.random.default_rng(1000 * i + len(op or ""))
            size_in = count * (n if collective == "reduce_scatter" else 1)
            size_out = count * (n if collective == "all_gather" else 1)
            ins = check.inputs(rng, dtype, op or "sum", n, size_in)
            expected = check.reference(collective, ins, dtype, op, root)[r]
            store = check.storage_dtype(dtype)
            src = comm.alloc(size_in, store)
            src.set(ins[r])
            if inplace and collective == "all_gather":
                out = comm.alloc(size_out, store)
                out[r * count:(r + 1) * count] = src
                args, view = (out[r * count:(r + 1) * count], out), out
            elif inplace and collective == "reduce_scatter":
                args, view = (src, src[r * count:(r + 1) * count]), src[r * count:(r + 1) * count]
            elif inplace:
                args, view = (src, None), src
            else:
                out = comm.alloc(size_out, store)
                if out.dtype.kind == "f":
                    out.fill(np.nan)
                else:
                    out.view(cupy.uint8).fill(0xA5)
                args, view = (src, out), out
            kwargs = {"algorithm": alg, "config": coll.FlowConfig(protocol=protocols[i % len(protocols)])}
            if op:
                kwargs["op"] = op
            if collective in ("broadcast", "reduce"):
                kwargs["root"] = root
            getattr(coll, collective)(comm, *args, **kwargs)
            comm.synchronize()
            if expected is None:
                continue  # reduce: a non-root rank's dst is not written
            label = f"{alg} {collective} {dtype} {op} inplace={inplace} count={count} rank={r}"
            try:
                check.compare(view.get(), expected, dtype, n, label)
            except AssertionError as exc:
                failures.append(str(exc))
    return failures


def _timed(fn, reps):
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    fn()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) * 1e3 / reps  # us


def sweep(comm, sizes, rounds=3):
    n = comm.nranks
    rows = []
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        for alg, collective in CASES:
            size_in = count * (n if collective == "reduce_scatter" else 1)
            size_out = count * (n if collective == "all_gather" else 1)
            src = comm.alloc(size_in, np.float32)
            src.fill(1)
            dst = comm.alloc(size_out, np.float32)
            f = getattr(coll, collective)
            kw = {"op": "sum"} if collective in ("all_reduce", "reduce_scatter", "reduce") else {}
            versions = {"flowdsl": lambda: f(comm, src, dst, algorithm=alg, **kw),
                        "nccl": lambda: f(comm, src, dst, algorithm="nccl", **kw)}
            reps = max(5, min(200, (256 << 20) // max(nbytes, 1)))
            times = {k: [] for k in versions}
            for _ in range(rounds):
                for k, fn in versions.items():
                    comm.synchronize()
                    times[k].append(_timed(fn, reps))
            med = {k: float(np.median(v)) for k, v in times.items()}
            # nccl-tests' size: the whole gathered / scattered buffer for all_gather and reduce_scatter.
            size = count * 4 * (n if collective in ("all_gather", "reduce_scatter") else 1)
            bus = {k: size * BUS[collective](n) / (v * 1e3) for k, v in med.items()}  # GB/s
            rows.append({"bytes": count * 4, "algorithm": alg, "collective": collective,
                         "flowdsl_us": med["flowdsl"], "nccl_us": med["nccl"],
                         "flowdsl_busbw": bus["flowdsl"], "nccl_busbw": bus["nccl"]})
            comm.free(src)
            comm.free(dst)
    return rows


def main() -> int:
    import torch.distributed as dist

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the sweep here (rank 0)")
    parser.add_argument("--plot", help="write a PNG plot of bus bandwidth here (rank 0, needs matplotlib)")
    parser.add_argument("--skip-correctness", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    ok = True
    with flowdsl.init(group=dist.group.WORLD) as comm:
        if not args.skip_correctness:
            failures = correctness(comm)
            ok = not failures
            print(f"[rank {comm.rank}] collectives x dtypes x ops x placements on {comm.nranks} GPUs: "
                  f"{'OK' if ok else f'{len(failures)} FAILED'}", flush=True)
            for line in failures[:10]:
                print("   ", line, flush=True)
        sizes = [8 << (3 * k) for k in range(10)]  # 8 B .. 1 GiB, x8 apart
        rows = sweep(comm, sizes)
        if comm.rank == 0:
            print(f"\n{comm.nranks} GPUs, bus bandwidth GB/s and time us per call")
            print(f"{'collective':<22}{'bytes':>12}{'flowdsl':>10}{'NCCL':>10}{'ratio':>8}{'flowdsl us':>12}"
                  f"{'NCCL us':>10}{'time ratio':>11}")
            for row in rows:
                name = f"{row['algorithm']} {row['collective']}"
                print(f"{name:<22}{row['bytes']:>12}{row['flowdsl_busbw']:>10.1f}{row['nccl_busbw']:>10.1f}"
                      f"{row['flowdsl_busbw'] / row['nccl_busbw']:>8.3f}{row['flowdsl_us']:>12.1f}"
                      f"{row['nccl_us']:>10.1f}{row['flowdsl_us'] / row['nccl_us']:>11.2f}")
            big = [r["flowdsl_busbw"] / r["nccl_busbw"] for r in rows if r["bytes"] >= 64 << 20]
            small = [r["flowdsl_us"] / r["nccl_us"] for r in rows if r["bytes"] <= 64 << 10]
            print(f"\nbandwidth ratio at >= 64 MiB: min {min(big):.3f} (goal >= 0.95); "
                  f"time ratio at <= 64 KiB: max {max(small):.2f} (goal <= 1.2)")
            if args.json:
                Path(args.json).write_text(json.dumps({"nranks": comm.nranks, "rows": rows}, indent=1))
            if args.plot:
                plot(rows, comm.nranks, args.plot)
    dist.destroy_process_group()
    return 0 if ok else 1


def plot(rows, nranks, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (the JSON has the numbers)")
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for alg, collective in CASES:
        pts = [r for r in rows if (r["algorithm"], r["collective"]) == (alg, collective)]
        line, = ax.plot([r["bytes"] for r in pts], [r["flowdsl_busbw"] for r in pts], marker="o",
                        label=f"flowdsl {alg} {collective}")
        ax.plot([r["bytes"] for r in pts], [r["nccl_busbw"] for r in pts], linestyle="--", color=line.get_color(),
                label=f"NCCL {collective}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"flowdsl collectives vs NCCL, {nranks} x H200")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    sys.exit(main())
