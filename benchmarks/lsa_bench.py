"""LSA benchmarks on one GPU, all versions side by side in one run.

1. DSL tax: the same LSA reduce+copy kernel in flowdsl and in CUDA C++ against
   ``nccl_device.h`` (benchmarks/reduce_copy_cpp.cu, built here with nvcc):
   time(flowdsl) / time(C++), goal <= 1.05.
2. Bandwidth of the reduce/copy path against a device-to-device copy of the
   same bytes in the same run (goal >= 0.9).
3. Cold compile of the RMSNorm kernel (empty cache, fresh process) and warm
   load from the disk cache (fresh process).

Timing: CUDA events around each launch after warm-up; versions interleaved
round by round; the median over rounds is reported. Prints a table, and with
``--json PATH`` writes the rows for scripts/summary.py.
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
from numba import cuda  # noqa: E402

import flowdsl  # noqa: E402
from flowdsl import lsa, mem  # noqa: E402
from flowdsl.runtime.support_build import installed_include_dir, nvcc_path  # noqa: E402


@flowdsl.kernel
def reduce_copy_flowdsl(comm, src, dst, count):
    """dst@p[i] = sum over LSA ranks q of src@q[i], for every LSA rank p (grid-stride loop)."""
    npeers = comm.lsa_size
    stride = cuda.gridDim.x * cuda.blockDim.x
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    while i < count:
        acc = lsa.lsa_view(src, 0)[i]
        for p in range(1, npeers):
            acc += lsa.lsa_view(src, p)[i]
        for p in range(npeers):
            lsa.lsa_view(dst, p)[i] = acc
        i += stride


@flowdsl.kernel
def reduce_copy_vec_flowdsl(comm, src, dst, count):
    """The same with 16-byte accesses: mem.load_vec / mem.store_vec."""
    npeers = comm.lsa_size
    stride = cuda.gridDim.x * cuda.blockDim.x
    v = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    nvec = count // 4
    while v < nvec:
        acc = mem.load_vec(lsa.lsa_view(src, 0), 4 * v)
        for p in range(1, npeers):
            x = mem.load_vec(lsa.lsa_view(src, p), 4 * v)
            acc = (acc[0] + x[0], acc[1] + x[1], acc[2] + x[2], acc[3] + x[3])
        for p in range(npeers):
            mem.store_vec(lsa.lsa_view(dst, p), 4 * v, acc)
        v += stride


@flowdsl.kernel
def reduce_copy_slices(comm, src, dst, count):
    """lsa.reduce_sum_copy with one contiguous slice per block (kept to show the difference)."""
    per_block = ((count + cuda.gridDim.x - 1) // cuda.gridDim.x + 3) // 4 * 4
    start = cuda.blockIdx.x * per_block
    n = min(per_block, count - start)
    if n > 0:
        lsa.reduce_sum_copy(flowdsl.coop.cta(), comm, src, start, dst, start, n)


@flowdsl.kernel
def empty_flowdsl(src, count):
    pass


CHUNK = 16384  # elements per block and step: 64 KiB of float32, a multiple of 4 (16-byte vectors)


@flowdsl.kernel
def reduce_copy_helper(comm, src, dst, count):
    """The same operation through flowdsl's own helper, lsa.reduce_sum_copy, chunk by chunk.

    Blocks take chunks round-robin (chunk b, b + grid, ...), so that the grid streams
    through memory together; the helper splits each chunk over the block's threads.
    """
    start = cuda.blockIdx.x * CHUNK
    while start < count:
        lsa.reduce_sum_copy(flowdsl.coop.cta(), comm, src, start, dst, start, min(CHUNK, count - start))
        start += cuda.gridDim.x * CHUNK


def build_cpp(workdir: Path) -> Path:
    include = installed_include_dir()
    nvcc = nvcc_path()
    if include is None or nvcc is None:
        raise SystemExit("the C++ baseline needs nvcc and the nvidia-nccl-cu13 headers")
    out = workdir / "reduce_copy_cpp.cubin"
    cc = cuda.get_current_device().compute_capability
    subprocess.run([nvcc, "-std=c++17", "-O3", "-cubin", f"-arch=sm_{cc[0]}{cc[1]}", "-I", str(include),
                    str(ROOT / "benchmarks" / "reduce_copy_cpp.cu"), "-o", str(out)], check=True)
    return out


def time_rounds(fns: dict, rounds: int, reps: int) -> dict:
    """Median milliseconds per call of each fn, interleaved round by round."""
    times = {name: [] for name in fns}
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(2):  # warm-up: compile, load, first touch
        for fn in fns.values():
            fn()
    cupy.cuda.Device().synchronize()
    for _ in range(rounds):
        for name, fn in fns.items():
            start.record()
            for _ in range(reps):
                fn()
            stop.record()
            stop.synchronize()
            times[name].append(cupy.cuda.get_elapsed_time(start, stop) / reps)
    return {name: float(np.median(t)) for name, t in times.items()}


COMPILE_PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, {root!r})
import numpy as np, flowdsl
from flowdsl.examples.rmsnorm_lsa import rmsnorm_lsa, THREADS
t1 = time.perf_counter()
with flowdsl.init() as comm:
    buf = comm.alloc((8, 1024), np.float32)
    buf.set(np.random.default_rng(0).standard_normal((8, 1024)).astype(np.float32))
    with comm.register(buf) as win, comm.device_communicator(lsa_barrier_count=8) as dcomm:
        t2 = time.perf_counter()
        rmsnorm_lsa[8, THREADS](dcomm, win, 1024, np.float32(1e-6))
        comm.synchronize()
        t3 = time.perf_counter()
print(json.dumps({{"build": rmsnorm_lsa.last_build, "import_s": t1 - t0, "first_launch_s": t3 - t2}}))
"""


def compile_times() -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, FLOWDSL_CACHE_DIR=cache)
        runs = []
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", COMPILE_PROBE.format(root=str(ROOT))], env=env,
                                 capture_output=True, text=True, check=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["build"]["source"] == "compiled" and warm["build"]["source"] == "disk", runs
    return {"cold": cold, "warm": warm}


def reduce_copy_rows(comm, src, dst, module, count: int, rounds: int, reps: int) -> list[dict]:
    """Every reduce+copy version checked (outputs poisoned first), timed and printed; the summary rows."""
    plain = cupy.empty(count, np.float32)
    cpp = module.get_function("reduce_copy_cpp")
    cpp_vec = module.get_function("reduce_copy_vec_cpp")
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    grid, block = sms * 8, 256
    with comm.register(src) as src_win, comm.register(dst) as dst_win, \
            comm.device_communicator() as dcomm:
        lsa_size = comm.nranks  # one node: every rank is an LSA peer
        cpp_args = (np.uint64(src_win.handle), np.uint64(dst_win.handle), np.int64(count), np.int32(lsa_size))
        fns = {
            "flowdsl scalar": lambda: reduce_copy_flowdsl[grid, block](dcomm, src_win, dst_win, count),
            "C++ scalar": lambda: cpp((grid,), (block,), cpp_args),
            "flowdsl 16-byte": lambda: reduce_copy_vec_flowdsl[grid, block](dcomm, src_win, dst_win, count),
            "C++ 16-byte (float4)": lambda: cpp_vec((grid,), (block,), cpp_args),
            "flowdsl lsa.reduce_sum_copy": lambda: reduce_copy_helper[grid, block](dcomm, src_win, dst_win,
                                                                                   count),
            "flowdsl lsa.reduce_sum_copy, 1 slice per block": lambda: reduce_copy_slices[grid, block](
                dcomm, src_win, dst_win, count),
            "device-to-device copy": lambda: plain.__setitem__(slice(None), src),
        }
        # Check every version's output before timing it (poisoned first).
        reference = src.get()
        for name in [n for n in fns if n != "device-to-device copy"]:
            dst.fill(np.nan)
            fns[name]()
            comm.synchronize()
            np.testing.assert_array_equal(dst.get(), reference, err_msg=name)
        ms = time_rounds(fns, rounds, reps)
    nbytes = 2 * count * 4  # read once, write once
    print(f"\nLSA reduce+copy, 1 rank, {count * 4 >> 20} MiB float32, grid {grid}x{block}, median of "
          f"{rounds} rounds x {reps}")
    print(f"{'version':<30}{'ms':>9}{'GB/s':>9}{'vs C++ 16B':>11}{'copy/this':>10}")
    for name, t in ms.items():
        print(f"{name:<30}{t:9.3f}{nbytes / t / 1e6:9.0f}{t / ms['C++ 16-byte (float4)']:11.3f}"
              f"{ms['device-to-device copy'] / t:10.3f}")
    copy_ms = ms["device-to-device copy"]
    return [
        {"name": "DSL tax, scalar: flowdsl / C++ time (goal <= 1.05)",
         "value": f"{ms['flowdsl scalar'] / ms['C++ scalar']:.3f}"},
        {"name": "DSL tax, 16-byte: flowdsl / C++ time (goal <= 1.05)",
         "value": f"{ms['flowdsl 16-byte'] / ms['C++ 16-byte (float4)']:.3f}"},
        {"name": "lsa.reduce_sum_copy bandwidth / D2D copy (goal >= 0.9)", "value":
            f"{copy_ms / ms['flowdsl lsa.reduce_sum_copy']:.3f} ({nbytes / ms['flowdsl lsa.reduce_sum_copy'] / 1e6:.0f}"
            f" vs {nbytes / copy_ms / 1e6:.0f} GB/s)"},
        {"name": "flowdsl 16-byte bandwidth / D2D copy", "value": f"{copy_ms / ms['flowdsl 16-byte']:.3f}"},
    ]


def launch_cost_rows(comm, module, src, count: int) -> list[dict]:
    """Host-side launch cost: an empty kernel launched back to back, flowdsl's and CuPy's; printed and as rows."""
    empty = module.get_function("empty_cpp")
    launches = {"flowdsl launch": lambda: empty_flowdsl[1, 32](src, count),
                "CuPy RawKernel launch": lambda: empty((1,), (32,), (np.uint64(src.data.ptr), np.int64(count)))}
    rows = []
    for name, fn in launches.items():
        for _ in range(100):
            fn()
        comm.synchronize()
        t0 = time.perf_counter()
        for _ in range(2000):
            fn()
        comm.synchronize()
        us = (time.perf_counter() - t0) / 2000 * 1e6
        print(f"{name:<30}{us:9.1f} us per launch (host)")
        rows.append({"name": name + " (host, us)", "value": f"{us:.1f}"})
    return rows


def compile_time_rows() -> list[dict]:
    """The RMSNorm kernel's cold compile and warm disk-cache load, printed and as rows."""
    times = compile_times()
    print(f"\nRMSNorm kernel: cold compile+link+load {times['cold']['build']['seconds']:.2f} s "
          f"(first launch {times['cold']['first_launch_s']:.2f} s); warm disk-cache load "
          f"{times['warm']['build']['seconds'] * 1e3:.1f} ms (first launch {times['warm']['first_launch_s']:.3f} s); "
          f"import flowdsl {times['warm']['import_s']:.2f} s")
    return [
        {"name": "RMSNorm cold compile+link+load", "value": f"{times['cold']['build']['seconds']:.2f} s"},
        {"name": "RMSNorm warm load (disk cache)", "value": f"{times['warm']['build']['seconds'] * 1e3:.1f} ms"},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=4096, help="buffer size in MiB (default 4096)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", help="write the summary rows here")
    args = parser.parse_args()

    count = args.mib * (1 << 20) // 4
    with flowdsl.init() as comm, tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(1)
        src = comm.alloc(count, np.float32)
        dst = comm.alloc(count, np.float32)
        src.set(rng.standard_normal(count).astype(np.float32))
        module = cupy.RawModule(path=str(build_cpp(Path(tmp))))
        rows = reduce_copy_rows(comm, src, dst, module, count, args.rounds, args.reps)
        rows += launch_cost_rows(comm, module, src, count)
    rows += compile_time_rows()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
