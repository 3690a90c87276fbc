"""The collectives on one GPU, side by side with NCCL's host collective and a device copy, in one run.

1. Bandwidth of every flowdsl collective (float32 sum, out of place) against
   NCCL's host collective on the same buffers (nccl4py) and against a
   device-to-device copy of the same bytes: algorithm bandwidth (bytes / time).
2. Latency of small all-reduce calls (8 B to 64 KiB): flowdsl (planned calls) vs
   NCCL's host all-reduce; time per call of a burst of back-to-back calls, host
   included (the goal is at most half of NCCL's one-rank floor).
3. A collective fused with computation (examples/allreduce_bias_gelu.py) against
   the all-reduce (flowdsl's or NCCL's) followed by a CuPy elementwise epilogue.
4. Cold compile of each collective (empty cache, one fresh process for all, so the
   first includes numba's start-up) and the warm load of the whole library from
   the disk cache (fresh process).

Timing: CUDA events; versions interleaved round by round; medians. Prints a table,
and with ``--json PATH`` appends the summary rows to that file (scripts/summary.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import cupy  # noqa: E402

import flowdsl  # noqa: E402
from flowdsl import collectives as coll  # noqa: E402

CASES = [("ring", "all_reduce"), ("tree", "all_reduce"), ("ring", "all_gather"), ("ring", "reduce_scatter"),
         ("ring", "broadcast"), ("ring", "reduce")]


def _timed(fn, reps, stream):
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    for _ in range(reps):
        fn()
    stop.record(stream)
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) * 1e3 / reps  # microseconds per call


def _call(comm, collective, src, dst, algorithm):
    f = getattr(coll, collective)
    if collective in ("all_reduce", "reduce_scatter", "reduce"):
        return lambda: f(comm, src, dst, op="sum", algorithm=algorithm)
    return lambda: f(comm, src, dst, algorithm=algorithm)


def bandwidth(comm, sizes, rounds):
    rows = []
    stream = cupy.cuda.get_current_stream()
    for nbytes in sizes:
        n = nbytes // 4
        src = comm.alloc(n, np.float32)
        src.set(np.random.default_rng(0).standard_normal(n).astype(np.float32))
        dst = comm.alloc(n, np.float32)
        reps = max(3, min(200, (1 << 30) // nbytes))
        for alg, collective in CASES:
            versions = {"flowdsl": _call(comm, collective, src, dst, alg),
                        "nccl": _call(comm, collective, src, dst, "nccl"),
                        "copy": lambda: cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, 3,
                                                                      stream.ptr)}
            for f in versions.values():
                f()
            times = {k: [] for k in versions}
            for _ in range(rounds):
                for k, f in versions.items():
                    times[k].append(_timed(f, reps, stream))
            med = {k: float(np.median(v)) for k, v in times.items()}
            rows.append({"bytes": nbytes, "algorithm": alg, "collective": collective,
                         **{f"{k}_us": v for k, v in med.items()},
                         **{f"{k}_GBps": nbytes / (v * 1e3) for k, v in med.items()}})
        comm.free(src)
        comm.free(dst)
    return rows


def latency(comm, sizes, rounds, reps=500):
    rows = []
    stream = cupy.cuda.get_current_stream()
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        src = comm.alloc(n, np.float32)
        dst = comm.alloc(n, np.float32)
        versions = {"flowdsl": _call(comm, "all_reduce", src, dst, "ring"),
                    "flowdsl_auto": _call(comm, "all_reduce", src, dst, "auto"),
                    "nccl": _call(comm, "all_reduce", src, dst, "nccl")}
        for f in versions.values():
            for _ in range(20):
                f()
        times = {k: [] for k in versions}
        host = {k: [] for k in versions}
        for _ in range(rounds):
            for k, f in versions.items():
                times[k].append(_timed(f, reps, stream))
                stream.synchronize()
                t = time.perf_counter()  # the host's share: calls enqueued, not waited for
                for _ in range(reps):
                    f()
                host[k].append((time.perf_counter() - t) * 1e6 / reps)
                stream.synchronize()
        rows.append({"bytes": nbytes, **{f"{k}_us": float(np.median(v)) for k, v in times.items()},
                     **{f"{k}_host_us": float(np.median(v)) for k, v in host.items()}})
        comm.free(src)
        comm.free(dst)
    return rows


def fused(comm, sizes, rounds):
    """The all-reduce + bias + GELU example, fused in one kernel, against an all-reduce (flowdsl's
    or NCCL's) followed by a CuPy elementwise kernel."""
    from flowdsl.examples.allreduce_bias_gelu import allreduce_bias_gelu
    from flowdsl.flow import staging

    epilogue = cupy.ElementwiseKernel(
        "float32 s, float32 b", "float32 y",
        "float v = s + b; y = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))",
        "bias_gelu")
    stream = cupy.cuda.get_current_stream()
    rows = []
    channels, nslots, slot_words = 32, 4, 8192
    config = coll.FlowConfig(channels=channels, nslots=nslots, slot_bytes=slot_words * 8)
    with staging(comm, config, gin=False) as win, comm.device_communicator() as dcomm:
        for nbytes in sizes:
            n = nbytes // 4
            x, b, y, tmp = (comm.alloc(n, np.float32) for _ in range(4))
            x.set(np.random.default_rng(1).standard_normal(n).astype(np.float32))
            b.set(np.random.default_rng(2).standard_normal(n).astype(np.float32))
            kernel = allreduce_bias_gelu(False)
            blocks = coll.cost.channels_for(nbytes, comm.nranks, coll.FlowConfig(channels=channels))
            versions = {
                "fused": lambda: kernel[blocks, 256](dcomm, win, x, b, y, n, channels, nslots, slot_words, 0),
                "flowdsl+cupy": lambda: (coll.all_reduce(comm, x, tmp, algorithm="ring"), epilogue(tmp, b, y)),
                "nccl+cupy": lambda: (coll.all_reduce(comm, x, tmp, algorithm="nccl"), epilogue(tmp, b, y)),
            }
            times = {k: [] for k in versions}
            for _ in range(rounds):
                for k, f in versions.items():
                    times[k].append(_timed(f, 20, stream))
            rows.append({"bytes": nbytes, **{k: float(np.median(v)) for k, v in times.items()}})
            for buf in (x, b, y, tmp):
                comm.free(buf)
    return rows


_COMPILE = r"""
import json, time, sys
import numpy as np
import flowdsl
from flowdsl.collectives import _library as L
from flowdsl.enums import RedOp
from numba import cuda
cuda.current_context()
out = {}
for alg, collective in json.loads(sys.argv[1]):
    t = time.perf_counter()
    source = L.kernel_for(alg, collective, RedOp.SUM).load(L._argtypes("float32", None))
    out[f"{alg} {collective}"] = (time.perf_counter() - t, source)
print(json.dumps(out))
"""

_LOAD = r"""
import json, time
t0 = time.perf_counter()
import flowdsl
from flowdsl import collectives
from numba import cuda
cuda.current_context()
t1 = time.perf_counter()
counts = collectives.load()
print(json.dumps({"import_s": t1 - t0, **counts}))
"""


def compile_and_load():
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as cold:
        env_cold = {**env, "FLOWDSL_CACHE_DIR": cold}
        res = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(CASES)], env=env_cold,
                             capture_output=True, text=True, cwd=ROOT)
        if res.returncode:
            raise RuntimeError(res.stderr[-3000:])
        compile_times = json.loads(res.stdout.strip().splitlines()[-1])
    res = subprocess.run([sys.executable, "-c", _LOAD], env=env, capture_output=True, text=True, cwd=ROOT)
    if res.returncode:
        raise RuntimeError(res.stderr[-3000:])
    load = json.loads(res.stdout.strip().splitlines()[-1])
    return compile_times, load


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="append summary rows to this JSON list file")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer sizes")
    args = parser.parse_args()
    big = [1 << 20, 1 << 24, 1 << 28] if args.quick else [1 << 20, 1 << 24, 1 << 28, 1 << 30]
    small = [8, 64, 512, 4096, 65536]
    summary = []
    with flowdsl.init() as comm:
        bw = bandwidth(comm, big, args.rounds)
        lat = latency(comm, small, args.rounds)
        fuse = fused(comm, [1 << 20, 1 << 26], args.rounds)
    print(f"\n{'collective':<22}{'bytes':>12}{'flowdsl GB/s':>14}{'NCCL GB/s':>11}{'copy GB/s':>11}"
          f"{'vs NCCL':>9}{'vs copy':>9}")
    for r in bw:
        name = f"{r['algorithm']} {r['collective']}"
        print(f"{name:<22}{r['bytes']:>12}{r['flowdsl_GBps']:>14.1f}{r['nccl_GBps']:>11.1f}{r['copy_GBps']:>11.1f}"
              f"{r['flowdsl_GBps'] / r['nccl_GBps']:>9.3f}{r['flowdsl_GBps'] / r['copy_GBps']:>9.3f}")
        if r["bytes"] == big[-1]:
            f, nc, cp = r["flowdsl_GBps"], r["nccl_GBps"], r["copy_GBps"]
            summary.append({"name": f"{name} @{r['bytes'] >> 20} MiB: flowdsl / NCCL, / copy (bandwidth)",
                            "value": f"{f / nc:.3f}, {f / cp:.3f} ({f:.0f} vs {nc:.0f} vs {cp:.0f} GB/s)"})
    print(f"\n{'all_reduce bytes':<18}{'flowdsl us':>12}{'auto us':>10}{'NCCL us':>10}{'ratio':>8}"
          f"{'host: flowdsl':>15}{'NCCL':>7}")
    for r in lat:
        print(f"{r['bytes']:<18}{r['flowdsl_us']:>12.2f}{r['flowdsl_auto_us']:>10.2f}{r['nccl_us']:>10.2f}"
              f"{r['flowdsl_us'] / r['nccl_us']:>8.3f}{r['flowdsl_host_us']:>15.2f}{r['nccl_host_us']:>7.2f}")
    worst = max(lat, key=lambda r: r["flowdsl_us"])
    summary.append({"name": "small all_reduce 8 B-64 KiB, worst: flowdsl vs NCCL us (goal <= half)",
                    "value": f"{worst['flowdsl_us']:.1f} vs {worst['nccl_us']:.1f} at {worst['bytes']} B "
                             f"({worst['flowdsl_us'] / worst['nccl_us']:.2f}x)"})
    print(f"\n{'all_reduce + bias + GELU':<26}{'fused us':>10}{'flowdsl+CuPy us':>17}{'NCCL+CuPy us':>14}"
          f"{'fused / NCCL+CuPy':>19}")
    for r in fuse:
        print(f"{r['bytes']:<26}{r['fused']:>10.1f}{r['flowdsl+cupy']:>17.1f}{r['nccl+cupy']:>14.1f}"
              f"{r['fused'] / r['nccl+cupy']:>19.3f}")
    summary.append({"name": "all_reduce + bias + GELU @64 MiB: fused / (NCCL + CuPy epilogue) time",
                    "value": f"{fuse[-1]['fused'] / fuse[-1]['nccl+cupy']:.3f} ({fuse[-1]['fused']:.0f} vs "
                             f"{fuse[-1]['nccl+cupy']:.0f} us)"})
    compile_times, load = compile_and_load()
    print("\ncold compile (fresh cache, one process; the first includes numba start-up):")
    for name, (seconds, source) in compile_times.items():
        print(f"  {name:<22}{seconds:>8.2f} s ({source})")
    print(f"warm load of the whole library: {load['kernels']} kernels in {load['seconds']:.3f} s "
          f"({load['disk']} from disk, {load['compiled']} compiled); import + context {load['import_s']:.2f} s")
    later = [s for s, _ in list(compile_times.values())[1:]]
    summary.append({"name": "cold compile per collective, s (goal <= 2)",
                    "value": f"first {list(compile_times.values())[0][0]:.1f}, then median {np.median(later):.1f}"})
    summary.append({"name": f"warm load of the library ({load['kernels']} kernels), s (goal <= 0.2)",
                    "value": f"{load['seconds']:.3f} ({load['disk']} from disk, {load['compiled']} compiled)"})
    for row in summary:
        print(f"{row['name']}: {row['value']}")
    if args.json:
        path = Path(args.json)
        rows = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps(rows + summary, indent=1))
    (Path(os.environ.get("OUT", "/tmp")) / "collectives_bench_raw.json").write_text(
        json.dumps({"bandwidth": bw, "latency": lat, "fused": fuse, "compile": compile_times, "load": load},
                   indent=1))


if __name__ == "__main__":
    main()
