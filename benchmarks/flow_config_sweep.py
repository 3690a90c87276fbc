"""Sweep FlowConfig (channels, threads, slot size, slots, protocol) for one collective against NCCL,
on several GPUs (one rank each): what the defaults and the cost model's constants come from.

    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=2 benchmarks/flow_config_sweep.py \\
        --collective all_reduce --algorithm ring --sizes 16M,256M --json sweep.json

Every configuration runs on the same buffers (float32 sum, out of place), alternating with
NCCL's host collective on those buffers; times are medians of 3 rounds of back-to-back calls
between CUDA events. Rank 0 prints one row per (size, configuration): time, bus bandwidth,
ratio to NCCL. ``--check`` first compares each configuration's result with NumPy.
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

BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
       "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}


def _bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def _timed(cupy, fn, reps):
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    fn()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) * 1e3 / reps  # us


def _drop_state(comm, config):
    """Close the staging window of ``config`` (the sweep would otherwise keep one per configuration)."""
    comm.synchronize()
    states = comm.__dict__.get("_flowdsl_collectives", {})
    st = states.pop(config, None)
    if st is not None:
        st.close()


def main() -> int:
    import cupy
    import torch.distributed as dist

    import flowdsl
    from flowdsl import Protocol
    from flowdsl import collectives as coll

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--collective", default="all_reduce")
    p.add_argument("--algorithm", default="ring")
    p.add_argument("--sizes", default="16M,256M", help="bytes per rank, comma separated (K/M/G)")
    p.add_argument("--channels", default="16,24,32,48,64")
    p.add_argument("--threads", default="256,512")
    p.add_argument("--slot-bytes", default="64K,128K,256K")
    p.add_argument("--nslots", default="4")
    p.add_argument("--protocols", default="SIMPLE")
    p.add_argument("--check", action="store_true", help="compare each configuration's result with NumPy")
    p.add_argument("--json")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rows = []
    with flowdsl.init(group=dist.group.WORLD) as comm:
        n = comm.nranks
        f = getattr(coll, args.collective)
        kw = {"op": "sum"} if args.collective in ("all_reduce", "reduce_scatter", "reduce") else {}
        grid = list(itertools.product([int(c) for c in args.channels.split(",")],
                                      [int(t) for t in args.threads.split(",")],
                                      [_bytes(s) for s in args.slot_bytes.split(",")],
                                      [int(s) for s in args.nslots.split(",")],
                                      [Protocol[x] for x in args.protocols.split(",")]))
        for nbytes in [_bytes(s) for s in args.sizes.split(",")]:
            count = max(1, nbytes // 4)
            size_in = count * (n if args.collective == "reduce_scatter" else 1)
            size_out = count * (n if args.collective == "all_gather" else 1)
            src = comm.alloc(size_in, np.float32)
            src.set(np.random.default_rng(comm.rank).standard_normal(size_in).astype(np.float32))
            dst = comm.alloc(size_out, np.float32)
            reps = max(3, min(200, (512 << 20) // max(nbytes, 1)))
            nccl = [_timed(cupy, lambda: f(comm, src, dst, algorithm="nccl", **kw), reps) for _ in range(3)]
            expected = dst.get() if args.check else None
            for channels, threads, slot_bytes, nslots, protocol in grid:
                config = coll.FlowConfig(channels=channels, threads=threads, slot_bytes=slot_bytes, nslots=nslots,
                                         protocol=protocol)
                ok = ""
                if args.check:
                    dst.fill(np.nan)
                    f(comm, src, dst, algorithm=args.algorithm, config=config, **kw)
                    comm.synchronize()
                    got = dst.get()
                    ok = "ok" if np.allclose(got, expected, rtol=1e-5, atol=1e-5 * n) else "WRONG"
                times = []
                for _ in range(3):
                    times.append(_timed(cupy, lambda: f(comm, src, dst, algorithm=args.algorithm, config=config,
                                                         **kw), reps))
                    nccl.append(_timed(cupy, lambda: f(comm, src, dst, algorithm="nccl", **kw), reps))
                us, nccl_us = float(np.median(times)), float(np.median(nccl))
                size = count * 4 * (n if args.collective in ("all_gather", "reduce_scatter") else 1)
                bus = size * BUS[args.collective](n) / (us * 1e3)
                nccl_bus = size * BUS[args.collective](n) / (nccl_us * 1e3)
                rows.append({"bytes": count * 4, "channels": channels, "threads": threads, "slot_bytes": slot_bytes,
                             "nslots": nslots, "protocol": protocol.name, "us": us, "nccl_us": nccl_us,
                             "busbw": bus, "nccl_busbw": nccl_bus, "check": ok})
                if comm.rank == 0:
                    print(f"{count * 4:>11} ch={channels:<3} thr={threads:<4} slot={slot_bytes >> 10:>4}K "
                          f"nslots={nslots} {protocol.name:<6} {us:9.1f} us {bus:7.1f} GB/s  NCCL {nccl_us:9.1f} us "
                          f"{nccl_bus:7.1f} GB/s  ratio {bus / nccl_bus:5.2f} {ok}", flush=True)
                _drop_state(comm, config)
            comm.free(src)
            comm.free(dst)
        if comm.rank == 0 and args.json:
            Path(args.json).write_text(json.dumps({"nranks": n, "collective": args.collective,
                                                   "algorithm": args.algorithm, "rows": rows}, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
