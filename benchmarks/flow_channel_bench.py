"""Flow's data path per channel, beside NCCL's protocol designs written in CUDA C++, on one GPU, in one run.

flowdsl's side: a rank sends to itself through its staging window. Channel ``c`` is blocks ``2c``
(``flow.send``) and ``2c + 1`` (``flow.recv``) of one launch, holding the two ends of connection 1 of
that channel, so the whole credit and flag protocol runs with HBM in place of NVLink.

The reference: ``protocols_ref.cu`` (``--ref PATH``; it lives in ``../shared/bench`` beside a checkout,
which does not travel to the GPU machine: copy it into an ignored folder that does). It is built with
nvcc and run for its ``simple``, ``ll``, ``ll128`` and ``slotcost`` suites; each cell takes the best
*safe* variant of its ``RES`` lines at that shape (correct, not aborted, never an ``UNSAFE`` one). A
second column takes the best of the variants that guarantee what flowdsl's wire formats do
(:func:`same_guarantees`: system-scope fences, as NCCL's and flowdsl's; LL128 lines loaded again after
their flags, as NCCL's); on one GPU the GPU-scope SIMPLE variants are safe too, and faster.

Timing: both sides time one launch between two CUDA events, median of 5. flowdsl's launch is queued while a
one-thread gate kernel holds the stream (:meth:`Loopback.gate`), so its time is the GPU's from the kernel's
start to its end; Python's launch (tens of µs, printed apart) would otherwise count as transfer time, and
the fewer steps a cell has (at 32 channels 17 to 64) the more. The reference's time includes its C++
launch latency (a few µs), so at 16 and 32 channels its cells read a little low against flowdsl's.

Every cell has one shape on both sides: 512 threads, 4 slots, slots of 128 KiB (SIMPLE, LL128) or 64 KiB
(LL), the reference's table; flowdsl runs the slot its layout gives for that request (LL and LL128
slots are capped at ``flowdsl.flow.LL_SLOT_BYTES`` and ``LL128_SLOT_BYTES``) and the table says which. The
payload per channel is the reference's (SIMPLE 256 MiB, LL and LL128 64 MiB over all channels). The fixed
cost per slot of each side comes from a least-squares fit of time per slot against slot size (1 and 16
channels) over the slot sizes the reference runs (:data:`FIT_SLOTS`). The loopback runs over HBM, not NVLink: it judges the data path, not the link.

    python benchmarks/flow_channel_bench.py --ref .bench/protocols_ref.cu [--json out.json] [--quick]

Prints each side's GB/s per channel and the ratio flowdsl / reference per protocol and channel count,
then the fixed costs; with ``--json`` writes every row.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROTOCOLS = ("SIMPLE", "LL", "LL128")
CHANNELS = (1, 4, 16, 32)
THREADS, NSLOTS = 512, 4
SLOT = {"SIMPLE": 128 * 1024, "LL": 64 * 1024, "LL128": 128 * 1024}
PAYLOAD = {"SIMPLE": 256 << 20, "LL": 64 << 20, "LL128": 64 << 20}
#: Slot sizes of the fixed-cost fit, per protocol: those the reference runs, so that both fits cover one range
#: (in smaller slots some of a block's 16 warps have no part and the fit would measure that).
FIT_SLOTS = {"SIMPLE": (32768, 131072, 524288), "LL": (16384, 32768, 65536), "LL128": (32768, 65536, 131072)}

_RES = re.compile(r"RES (?P<proto>\S+)\s+(?P<name>\S+)\s+(?P<shape>\S+) thr=(?P<thr>\d+)\s+C=(?P<c>\d+)\s+"
                  r"nslots=(?P<ns>\d+) slot=(?P<slot>\d+)\s+bpc=\d+\s+steps=(?P<steps>\d+)\s+ms=\s*(?P<ms>[\d.]+)\s+"
                  r"GBps/ch=\s*(?P<gbs>[\d.]+) us/slot=\s*(?P<us>[\d.]+) bad=(?P<bad>\d+) abort=(?P<abort>-?\d+)"
                  r".*?(?P<unsafe> UNSAFE)?$")


# ---- the reference ----------------------------------------------------------------------------------------

def reference_rows(source: Path, suites=("simple", "ll", "ll128", "slotcost")) -> list[dict]:
    """Build ``protocols_ref.cu`` and run its suites; every ``RES`` line as a dict."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    exe = Path(tempfile.mkdtemp()) / "protocols_ref"
    subprocess.run([nvcc, "-O3", "-std=c++17", "-arch=sm_90", str(source), "-o", str(exe)], check=True)
    rows = []
    for suite in suites:
        out = subprocess.run([str(exe), suite], check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = _RES.match(line.strip())
            if m:
                rows.append({"proto": m["proto"], "name": m["name"], "shape": m["shape"], "threads": int(m["thr"]),
                             "channels": int(m["c"]), "nslots": int(m["ns"]), "slot": int(m["slot"]),
                             "steps": int(m["steps"]), "gbps": float(m["gbs"]), "us_slot": float(m["us"]),
                             "ok": m["bad"] == "0" and m["abort"] == "0", "unsafe": bool(m["unsafe"])})
    return rows


def same_guarantees(row):
    """Whether the variant gives what flowdsl's wire formats guarantee: flags and credits that hold between
    two GPUs, and no line taken torn. SIMPLE variants name their fence (``.sys``: ``fence.acq_rel.sys``, what
    NCCL and flowdsl use; ``tf``, ``agpu``, ``rel``: GPU scope, enough for the loopback only). LL lines are
    one 16-byte ``volatile`` store and load each (system scope, whole). An LL128 receiver without ``.reload``
    takes a line's data from the same load that found its flag: whole only if the memory system delivers a
    128-byte line in one piece to a reader too, which no CUDA guarantee says; NCCL's LL128 loads the lines
    again once every flag is seen (NCCL 2.32's Flow as well), and so does flowdsl (its simulator can tear a
    line being written)."""
    if row["proto"] == "SIMPLE":
        return ".sys" in row["name"]
    if row["proto"] == "LL128":
        return ".reload" in row["name"]
    return True


def best_reference(rows, proto, channels, slot, nslots=NSLOTS, threads=THREADS, scope=None):
    """The fastest safe, correct variant at this shape (two CTAs per channel), or None; ``scope``:
    a further condition on the row (:func:`same_guarantees`)."""
    cells = [r for r in rows if r["proto"] == proto and r["channels"] == channels and r["slot"] == slot
             and r["nslots"] == nslots and r["threads"] == threads and r["shape"] == "2cta" and r["ok"]
             and not r["unsafe"] and (scope is None or scope(r))]
    return max(cells, key=lambda r: r["gbps"], default=None)


def fit(points):
    """Least squares ``us_per_slot = fixed + bytes / rate``: (fixed µs, marginal GB/s), or None."""
    if len(points) < 2:
        return None
    x = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    b, a = np.polyfit(x, y, 1)
    return float(a), (float(1e-3 / b) if b > 0 else float("inf"))


def reference_fixed_cost(rows, proto, channels, scope=None):
    """The fit over slot sizes of the variant that wins at this protocol's table shape (``scope``: among those
    that pass it, as :func:`best_reference`)."""
    best = (best_reference(rows, proto, channels, SLOT[proto], scope=scope)
            or best_reference(rows, proto, 1, SLOT[proto], scope=scope))
    if best is None:
        return None
    pts = sorted({r["slot"]: r["us_slot"] for r in rows if r["name"] == best["name"] and r["channels"] == channels
                  and r["nslots"] == NSLOTS and r["threads"] == THREADS and r["shape"] == "2cta" and r["ok"]}.items())
    result = fit(pts) if len(pts) >= 3 else None  # a line through two points fits their noise too
    return None if result is None else (best["name"], *result, [p[0] for p in pts])


# ---- flowdsl's loopback -----------------------------------------------------------------------------------

def _kernel():
    from numba import cuda

    import flowdsl
    from flowdsl import flow

    @flowdsl.kernel(max_registers=128)  # as the collectives' kernels: 512 threads a block must fit an SM
    def channel_loopback(comm, stage, src, dst, per_channel, channels, nslots, slot_words, protocol):
        c = cuda.blockIdx.x // 2
        proc = flow.processor(comm, stage, None, channels, nslots, slot_words, protocol, c)
        conn = flow.connect(proc, comm.rank, 1, 1)
        if cuda.blockIdx.x % 2 == 0:
            flow.send(proc, conn, src, c * per_channel, per_channel)
        else:
            flow.recv(proc, conn, dst, c * per_channel, per_channel)
    return channel_loopback


_GATE = r"""
extern "C" __global__ void gate(const volatile int* open, unsigned long long limit_ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (*open == 0 && t - t0 < limit_ns);
}
"""


class Loopback:
    """flowdsl's per-channel loopback on this GPU (one rank: ``flowdsl.init()``)."""

    def __init__(self, comm):
        import cupy

        self.comm, self.cupy, self.kernel = comm, cupy, _kernel()
        n = max(PAYLOAD.values()) // 4
        self.src = comm.alloc(n, np.float32)
        self.src.set(np.random.default_rng(0).standard_normal(n).astype(np.float32))
        self.dst = comm.alloc(n, np.float32)
        self.devcomm = comm.device_communicator()
        self.stages = {}
        self._gate = cupy.RawKernel(_GATE, "gate")
        self._flag = cupy.zeros(1, np.int32)
        self._opener = cupy.cuda.Stream(non_blocking=True)
        self.host_launch_us = []  # Python's launch of each cell (median over its reps)

    @contextlib.contextmanager
    def gate(self):
        """Hold the stream in a one-thread kernel until the block ends: what is queued inside runs back to
        back after it, so an event pair around a launch times the GPU, not Python's launch of it (tens of
        µs, where the reference's C++ launch costs a few). The gate is opened from a stream of its own, and
        gives up after a second: a launch that waited for the GPU would make that the time, and fail the check."""
        self._flag.fill(0)
        self._gate((1,), (1,), (self._flag, np.uint64(1_000_000_000)))
        try:
            yield
        finally:
            with self._opener:
                self._flag.fill(1)

    def stage(self, channels, slot_bytes):
        from flowdsl import flow
        from flowdsl.collectives import FlowConfig

        key = (channels, slot_bytes)
        if key not in self.stages:
            for old in self.stages.values():  # one at a time: 32 channels of 512 KiB slots are 0.4 GiB
                old.close()
                self.comm.free(old.flow_staging.buffer)
            self.stages = {key: flow.staging(self.comm, FlowConfig(channels=channels, nslots=NSLOTS,
                                                                   slot_bytes=slot_bytes, threads=THREADS), gin=False)}
        return self.stages[key]

    def run(self, proto, channels, slot_bytes, payload, reps=5):
        """(GB/s per channel, µs per slot, the slot flowdsl ran) of one cell, checked against ``src``."""
        from flowdsl import Protocol, flow

        cupy = self.cupy
        protocol = Protocol[proto]
        stage = self.stage(channels, slot_bytes)
        words = flow.protocol_slot_words(slot_bytes // 8, protocol)
        per_slot = {Protocol.SIMPLE: words * 2, Protocol.LL: words, Protocol.LL128: words // 16 * 15 * 2}[protocol]
        per = payload // 4 // channels // per_slot * per_slot  # whole slots per channel
        args = (self.devcomm, stage, self.src, self.dst, per, channels, NSLOTS, slot_bytes // 8, int(protocol))
        launch = self.kernel[2 * channels, THREADS]
        self.dst[: per * channels].fill(np.nan)
        launch(*args)
        self.comm.synchronize()
        if not bool(cupy.array_equal(self.dst[: per * channels], self.src[: per * channels])):
            raise AssertionError(f"flowdsl {proto} loopback, {channels} channels, slot {slot_bytes}: dst != src")
        times, host = [], []
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        for _ in range(reps):
            with self.gate():  # the stream waits until the launch is queued: its time is the GPU's alone
                start.record()
                t0 = time.perf_counter()
                launch(*args)
                host.append(time.perf_counter() - t0)
                stop.record()
            stop.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e-3)
        t = float(np.median(times))
        if t > 0.5:
            raise AssertionError(f"flowdsl {proto} loopback: {t:.2f} s a launch: did the launch wait for the GPU "
                                 "(held by the gate)? A launch must only queue work")
        self.host_launch_us.append(float(np.median(host)) * 1e6)
        return per * 4 / t / 1e9, t * 1e6 / (per // per_slot), words * 8


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", type=Path, help="protocols_ref.cu (default: ../shared/bench, then .bench/)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="1 and 16 channels only, no fixed-cost fit")
    ap.add_argument("--no-ref", action="store_true", help="flowdsl's side only")
    ap.add_argument("--tree", type=Path, help="run the flowdsl of this checkout (an earlier commit) instead")
    ap.add_argument("--ref-rows", type=Path, help="the reference's rows from an earlier --json of this run")
    args = ap.parse_args(argv)
    if args.tree is not None:
        sys.path.insert(0, str(args.tree.resolve()))
    ref = args.ref or next((p for p in (ROOT.parent / "shared/bench/protocols_ref.cu", ROOT / ".bench/protocols_ref.cu")
                            if p.exists()), None)
    if not args.no_ref and args.ref_rows is None and (ref is None or not ref.exists()):
        sys.exit("Cannot run the reference: protocols_ref.cu not found. Pass --ref PATH (copy ../shared/bench/"
                 "protocols_ref.cu into an ignored folder of the checkout on the GPU machine), or --no-ref")

    import cupy

    import flowdsl
    from flowdsl.runtime.nccl import loaded_version

    channels = (1, 16) if args.quick else CHANNELS
    if args.ref_rows is not None:
        rows = json.loads(args.ref_rows.read_text())["reference_rows"]
    else:
        rows = [] if args.no_ref else reference_rows(ref)
    comm = flowdsl.init()
    loop = Loopback(comm)
    table = []
    for proto in PROTOCOLS:
        for c in channels:
            gbps, us, slot = loop.run(proto, c, SLOT[proto], PAYLOAD[proto])
            best = best_reference(rows, proto, c, SLOT[proto])
            sys_best = best_reference(rows, proto, c, SLOT[proto], scope=same_guarantees)
            table.append({"proto": proto, "channels": c, "flowdsl_gbps": gbps, "flowdsl_us_slot": us,
                          "flowdsl_slot": slot, "ref_gbps": best and best["gbps"], "ref_variant": best and best["name"],
                          "ratio": (gbps / best["gbps"]) if best else None,
                          "sys_ref_gbps": sys_best and sys_best["gbps"], "sys_ref_variant": sys_best and sys_best["name"],
                          "sys_ratio": (gbps / sys_best["gbps"]) if sys_best else None})
    fits = []
    if not args.quick:
        for proto in PROTOCOLS:
            for c in (1, 16):
                pts = []
                for slot in FIT_SLOTS[proto]:
                    _, us, ran = loop.run(proto, c, slot, min(PAYLOAD[proto], 64 << 20), reps=3)
                    pts.append((ran, us))
                pts = sorted(dict(pts).items())  # a capped slot runs once
                mine, theirs = fit(pts), reference_fixed_cost(rows, proto, c)
                same = reference_fixed_cost(rows, proto, c, scope=same_guarantees)
                fits.append({"proto": proto, "channels": c, "flowdsl_fixed_us": mine and mine[0],
                             "flowdsl_marginal_gbps": mine and mine[1], "flowdsl_slots": [p[0] for p in pts],
                             "ref_variant": theirs and theirs[0], "ref_fixed_us": theirs and theirs[1],
                             "ref_marginal_gbps": theirs and theirs[2], "ref_slots": theirs and theirs[3],
                             "sys_ref_variant": same and same[0], "sys_ref_fixed_us": same and same[1],
                             "sys_ref_marginal_gbps": same and same[2]})
    host_us = float(np.median(loop.host_launch_us))
    comm.close()

    props = cupy.cuda.runtime.getDeviceProperties(0)
    tree = f" ({args.tree})" if args.tree else ""
    head = (f"{props['name'].decode()} · {datetime.date.today()} · flowdsl {flowdsl.__version__}{tree} · NCCL "
            f"{'.'.join(map(str, loaded_version()))} · {THREADS} threads, {NSLOTS} slots")
    print(f"\n== Flow per channel vs the CUDA C++ reference (payload GB/s per channel) · {head}")
    print("| protocol, slot | channels | reference (variant) | flowdsl (its slot) | flowdsl ÷ ref "
          "| reference with flowdsl's guarantees | flowdsl ÷ it |")
    print("| --- | ---: | --- | --- | ---: | --- | ---: |")
    for r in table:
        ref_s = f"{r['ref_gbps']:.2f} ({r['ref_variant']})" if r["ref_gbps"] else "—"
        ratio = f"{r['ratio']:.3f}" if r["ratio"] else "—"
        sys_s = ("same" if r.get("sys_ref_variant") == r["ref_variant"] else
                 f"{r['sys_ref_gbps']:.2f} ({r['sys_ref_variant']})" if r.get("sys_ref_gbps") else "—")
        sys_ratio = f"{r['sys_ratio']:.3f}" if r.get("sys_ratio") else "—"
        print(f"| {r['proto']} {SLOT[r['proto']] // 1024} KiB | {r['channels']} | {ref_s} | "
              f"{r['flowdsl_gbps']:.2f} ({r['flowdsl_slot'] // 1024} KiB) | {ratio} | {sys_s} | {sys_ratio} |")
    if fits:
        print("\n== Fixed cost per slot (fit of µs per slot against slot bytes) and marginal rate")
        print("| protocol | channels | reference: fixed µs, GB/s (variant) | flowdsl: fixed µs, GB/s | fixed ÷ ref "
              "| reference with flowdsl's guarantees | fixed ÷ it |")
        print("| --- | ---: | --- | --- | ---: | --- | ---: |")
        for f in fits:
            ref_s = (f"{f['ref_fixed_us']:.3f}, {f['ref_marginal_gbps']:.1f} ({f['ref_variant']})"
                     if f["ref_fixed_us"] is not None else "—")
            mine = (f"{f['flowdsl_fixed_us']:.3f}, {f['flowdsl_marginal_gbps']:.1f}"
                    if f["flowdsl_fixed_us"] is not None else "—")
            ratio = (f"{f['flowdsl_fixed_us'] / f['ref_fixed_us']:.2f}"
                     if f["ref_fixed_us"] and f["flowdsl_fixed_us"] is not None else "—")
            same = f.get("sys_ref_fixed_us")
            same_s = ("same" if f.get("sys_ref_variant") == f["ref_variant"] else
                      f"{same:.3f}, {f['sys_ref_marginal_gbps']:.1f} ({f['sys_ref_variant']})" if same else "—")
            same_ratio = f"{f['flowdsl_fixed_us'] / same:.2f}" if same and f["flowdsl_fixed_us"] is not None else "—"
            print(f"| {f['proto']} | {f['channels']} | {ref_s} | {mine} | {ratio} | {same_s} | {same_ratio} |")
    print(f"\nPython's launch of the loopback kernel (queued behind the gate, not counted above): median "
          f"{host_us:.1f} µs")
    if args.json:
        args.json.write_text(json.dumps({"head": head, "cells": table, "fits": fits, "host_launch_us": host_us,
                                         "reference_rows": rows},
                                        indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    sys.exit(main())
