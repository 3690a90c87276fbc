"""Host cost of a launch and of a small collective call, on one GPU, side by side in one run.

Each version is called back to back ``--calls`` times between two host clocks (an empty or
tiny kernel: the host is the bottleneck), versions interleaved round by round; the median
over rounds is printed, in microseconds per call, with its ratio to CuPy's ``RawKernel``
launch of a kernel with as many arguments. The versions:

- ``cuLaunchKernel`` alone, parameters packed once (the floor of any launch from Python), through
  cuda.bindings and through CuPy's wrapper (which flowdsl's launches call);
- flowdsl's prepared launch (what a repeated collective call makes: it replays a one-node
  CUDA graph), and the same launch captured by CuPy in a graph and replayed;
- a direct launch ``k[grid, block](dcomm, window, array, n)`` with the same arguments each call
  (from the second call on, a replay of the prepared launch), and with one of 16 arrays in turn
  (more than a launch remembers: typed, checked and packed at every call);
- CuPy ``RawKernel`` with four arguments (two pointers, two integers);
- ``flowdsl.collectives.all_reduce`` of 8 bytes, repeated (the planned fast path), one rank;
- the fast path's parts: stream resolution and the plan lookup.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import cupy  # noqa: E402

import flowdsl  # noqa: E402
from flowdsl import _launch_params  # noqa: E402
from flowdsl import collectives as coll  # noqa: E402
from flowdsl.collectives import _host  # noqa: E402
from flowdsl.host.streams import stream_handle  # noqa: E402

RAW = r"""
extern "C" __global__ void empty4(const float* a, float* b, long long n, int m) {
    if (n < 0 && m < 0) b[0] = a[0];
}
"""


@flowdsl.kernel
def empty4(dcomm, window, x, n):
    if n < 0:
        x[0] = 0.0


def _time(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    cupy.cuda.runtime.deviceSynchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()

    import ctypes  # noqa: PLC0415

    from cuda.bindings import driver  # noqa: PLC0415

    with flowdsl.init() as comm:
        x = comm.alloc(1024, np.float32)
        y = comm.alloc(1024, np.float32)
        small_x, small_y = x[:2], y[:2]
        small_x.set(np.ones(2, np.float32))
        raw = cupy.RawKernel(RAW, "empty4")
        with comm.register(x) as window, comm.device_communicator() as dcomm:
            empty4[1, 32](dcomm, window, y, 1024)
            launch = empty4[1, 32].prepare(dcomm, window, y, 1024)
            loaded = next(iter(empty4._loaded.values()))
            flat: list = []
            for pack, arg in zip(loaded.packers, (dcomm, window, y, 1024)):
                pack(arg, flat)
            holders = [v if isinstance(v, ctypes._SimpleCData) else ctypes.c_uint64(v) for v in flat]
            params = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
            handle, legacy, address = loaded.cu_kernel.handle, driver.CUstream(0), ctypes.addressof(params)
            side = cupy.cuda.Stream(non_blocking=True)
            captured = empty4[1, 32, side].prepare(dcomm, window, y, 1024)
            side.begin_capture()
            captured()
            graph = side.end_capture()
            stream = cupy.cuda.get_current_stream()
            rotation = itertools.cycle([comm.alloc(1024, np.float32) for _ in range(16)])
            for algorithm in ("ring", "one_shot"):
                coll.all_reduce(comm, small_x, small_y, algorithm=algorithm)
            key = ("all_reduce", id(small_x), id(small_y), "sum", 0, "one_shot", stream.ptr, None, None)
            versions = {
                "cuLaunchKernel alone (cuda.bindings, parameters packed once)": lambda: driver.cuLaunchKernel(
                    handle, 1, 1, 1, 32, 1, 1, 0, legacy, address, 0),
                "cuLaunchKernel alone (CuPy's wrapper, as flowdsl calls it)": lambda: _launch_params._launch_kernel(
                    loaded.handle, 1, 1, 1, 32, 1, 1, 0, 0, address),
                "flowdsl prepared launch (k[1, 32].prepare(...)(), a graph replay)": launch,
                "CuPy: a CUDA graph of that launch, replayed (cudaGraphLaunch)": lambda: graph.launch(side),
                "CuPy RawKernel, 4 arguments": lambda: raw((1,), (32,), (x, y, np.int64(1024), np.int32(1))),
                "flowdsl direct launch k[1, 32](dcomm, window, array, n)": lambda: empty4[1, 32](dcomm, window, y,
                                                                                              1024),
                "  same, one of 16 arrays in turn (not replayed)": lambda: empty4[1, 32](dcomm, window,
                                                                                        next(rotation), 1024),
                "all_reduce 8 B, one_shot, repeated (1 rank)": lambda: coll.all_reduce(
                    comm, small_x, small_y, algorithm="one_shot"),
                "all_reduce 8 B, ring, repeated (1 rank)": lambda: coll.all_reduce(
                    comm, small_x, small_y, algorithm="ring"),
                "  part: stream resolution (stream=None, CuPy)": lambda: stream_handle(None, (small_x,),
                                                                                        "all_reduce"),
                "  part: plan lookup and validation": lambda: _host._planned(comm, key, small_x, small_y),
            }
            times = {name: [] for name in versions}
            for fn in versions.values():  # warm-up
                _time(fn, 200)
            for _ in range(args.rounds):
                for name, fn in versions.items():
                    times[name].append(_time(fn, args.calls))
    raw_us = statistics.median(times["CuPy RawKernel, 4 arguments"])
    rows = []
    print(f"{'host us per call (median of rounds)':<58}{'us':>8}{'/ RawKernel':>13}   min..max")
    for name, t in times.items():
        us = statistics.median(t)
        rows.append({"name": name, "us": us, "min": min(t), "max": max(t), "ratio_raw_kernel": us / raw_us})
        print(f"{name:<58}{us:8.2f}{us / raw_us:13.2f}   {min(t):.2f}..{max(t):.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
