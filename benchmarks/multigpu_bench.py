"""Several GPUs, one rank each: the collectives side by side with NCCL and PyTorch SymmetricMemory.

    python -m flowdsl precompile      # once, so that the ranks load the kernels instead of compiling them
    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=N benchmarks/multigpu_bench.py --json out.json --plot out.png [--quick]
    python benchmarks/multigpu_bench.py --from-json out.json --plot out.png   # re-print and re-plot, no GPU

Every rank makes the same calls in the same order; rank 0 prints. In one run, interleaved
at each size:

1. Back to back, 8 B to 1 GiB per rank (x8 steps, plus 64 KiB, 1 MiB and 64 MiB; float32
   sum, out of place, buffers from ``comm.alloc``): for all_reduce, all_gather,
   reduce_scatter, broadcast and reduce, every flowdsl program that exists for it
   (``flowdsl.collectives.programs.PROGRAMS``), ``algorithm="auto"`` (and what it chose),
   and NCCL's host collective on the same buffers (``algorithm="nccl"``, nccl4py).
   For all_reduce up to 16 MiB, also PyTorch SymmetricMemory one-shot and two-shot
   (``torch.ops.symm_mem``, multicast off).
2. Replayed from a CUDA graph (``torch.cuda.graph``, 32 calls captured on a side stream
   after a warm-up there), all_reduce 8 B to 16 MiB: the flowdsl programs, auto, NCCL
   through nccl4py and through ``torch.distributed`` on an NCCL process group (labelled
   apart; the latter also back to back), and SymmetricMemory.

Timing: CUDA events around R calls launched back to back (host included: what a user
sees at small sizes), R chosen per version and size from a probe so that a measurement
holds about ``--target-ms`` of work (at least 2 calls) and agreed across ranks; ranks
meet at a barrier before each measurement; 3 rounds, the versions alternating within
each round; the slowest rank's time of a round; the median of the rounds. Each
version's output is checked on a sample of elements before it is timed.

Bus bandwidth as nccl-tests defines it: all_reduce 2(n-1)/n of the buffer;
all_gather and reduce_scatter (n-1)/n of the whole gathered / scattered buffer
(n x the bytes per rank); broadcast and reduce 1.

Output: a table per collective, the graph-replay table, then the GOALS block, printed
last. ``--json`` writes every measurement and the machine's versions; ``--plot`` a PNG
(needs matplotlib).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

# Before torch or NCCL are imported: no NVLink multicast anywhere (shared machines).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

ROOT = Path(__file__).resolve().parents[1]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
REDUCING = ("all_reduce", "reduce_scatter", "reduce")
ROOTED = ("broadcast", "reduce")
#: nccl-tests' bus-bandwidth factor, applied to the whole buffer (n x the bytes per rank for
#: all_gather and reduce_scatter).
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}
FULL_SIZES = sorted({8 << (3 * k) for k in range(10)} | {64 * KiB, MiB, 64 * MiB})  # 8 B .. 1 GiB
QUICK_SIZES = [8, 4 * KiB, 64 * KiB, MiB, 16 * MiB, 64 * MiB]
QUICK_GRAPH_SIZES = [8, 64 * KiB, MiB]
SYMM_MAX = 16 * MiB      # SymmetricMemory rows up to here
GRAPH_MAX = 16 * MiB     # CUDA-graph rows up to here
GRAPH_CALLS = 32         # calls captured in one graph
#: Programs the benchmark expects to find (a missing one is reported, not fatal).
EXPECTED_PROGRAMS = {"all_reduce": ("ring", "tree", "one_shot", "two_shot"), "all_gather": ("ring",),
                     "reduce_scatter": ("ring",), "broadcast": ("ring",), "reduce": ("ring",)}

# Goals (docs/performance.md).
GOAL_BW_RATIO = 0.95          # flowdsl / NCCL bus bandwidth at >= 64 MiB
GOAL_TIME_RATIO = 1.0         # flowdsl / NCCL time, 64 KiB .. 64 MiB
GOAL_SYMM_RATIO = 1.0         # flowdsl / SymmetricMemory time at <= 1 MiB
GOAL_B2B_8B_US = 8.0          # all_reduce 8 B back to back
GOAL_GRAPH_8B_US = 6.0        # all_reduce 8 B replayed from a graph
GOAL_AUTO = 1.10              # auto / best flowdsl program, every size


# ---- pure helpers (no GPU, no torch): naming, bandwidth, tables, goals, plot ---------------------

def fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def _at(nbytes) -> str:
    return "every size" if nbytes is None else fmt_bytes(nbytes)


def fmt_num(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 0.1:
        return f"{v:.2f}"
    return f"{v:.2g}"


def family(version: str) -> str:
    """``flowdsl`` (a program), ``auto``, ``nccl`` or ``symm``."""
    if version == "auto":
        return "auto"
    if version.startswith("nccl"):
        return "nccl"
    if version.startswith("symm"):
        return "symm"
    return "flowdsl"


def label(version: str) -> str:
    return {"auto": "flowdsl auto", "nccl": "NCCL (nccl4py)", "nccl_torch": "NCCL (torch.distributed)",
            "symm_one_shot": "SymmMem one-shot", "symm_two_shot": "SymmMem two-shot"}.get(version,
                                                                                      f"flowdsl {version}")


def bus_bandwidth(collective: str, nranks: int, nbytes: int, us: float) -> float:
    """GB/s, nccl-tests' definition; ``nbytes`` per rank (the chunk of all_gather / reduce_scatter)."""
    if not us or us != us:
        return float("nan")
    whole = nbytes * (nranks if collective in ("all_gather", "reduce_scatter") else 1)
    return whole / (us * 1e3) * BUS_FACTOR[collective](nranks)


def reps_for(us_per_call: float, target_ms: float, lo: int = 2, hi: int = 5000) -> int:
    """Calls in one measurement: about ``target_ms`` of work, within [lo, hi]."""
    if not us_per_call or us_per_call != us_per_call or us_per_call <= 0:
        return lo
    return int(min(hi, max(lo, math.ceil(target_ms * 1e3 / us_per_call))))


def probe_calls(nbytes: int) -> int:
    """Calls in the probe that sizes R (a function of the size only: every rank makes the same calls)."""
    return max(1, min(64, (4 * MiB) // max(nbytes, 1)))


def warm_calls(nbytes: int) -> int:
    return 20 if nbytes <= MiB else (5 if nbytes <= 64 * MiB else 2)


def expected_values(collective: str, nranks: int, count: int, idx):
    """What dst holds at positions ``idx`` (a NumPy int array) when rank r's src is all r + 1 (root 0)."""
    import numpy as np  # noqa: PLC0415

    idx = np.asarray(idx)
    if collective in REDUCING:
        return np.full(idx.shape, nranks * (nranks + 1) / 2, dtype=np.float32)
    if collective == "all_gather":
        return (idx // count + 1).astype(np.float32)
    return np.ones(idx.shape, dtype=np.float32)  # broadcast from root 0


def _index(records):
    return {(r["section"], r["collective"], r["bytes"], r["version"]): r for r in records}


def _versions(records, section, collective):
    """Versions present, in the order they were measured."""
    seen = []
    for r in records:
        if r["section"] == section and r["collective"] == collective and r["version"] not in seen:
            seen.append(r["version"])
    return seen


def _sizes(records, section, collective):
    return sorted({r["bytes"] for r in records if r["section"] == section and r["collective"] == collective})


def _ok(r) -> bool:
    return r is not None and r.get("us") is not None and r["us"] == r["us"]


def best_program(records, section, collective, nbytes):
    """(version, us) of the fastest flowdsl program (not auto) at this size, or (None, None)."""
    idx = _index(records)
    best = (None, None)
    for v in _versions(records, section, collective):
        r = idx.get((section, collective, nbytes, v))
        if family(v) == "flowdsl" and _ok(r) and (best[1] is None or r["us"] < best[1]):
            best = (v, r["us"])
    return best


def format_tables(data) -> list[str]:
    """The per-collective tables (back to back) and the graph-replay table."""
    meta, records = data.get("meta", {}), data.get("records", [])
    n = meta.get("nranks", "?")
    idx = _index(records)
    lines = []
    for collective in COLLECTIVES:
        versions = _versions(records, "b2b", collective)
        if not versions:
            continue
        lines.append("")
        lines.append(f"{collective} on {n} GPUs: float32 sum, out of place, back to back "
                     "(median of rounds; bw/NCCL = NCCL time / this time)")
        lines.append(f"{'bytes/rank':>10}  {'version':<26}{'us/call':>10}{'busbw GB/s':>12}{'bw/NCCL':>9}  note")
        for nbytes in _sizes(records, "b2b", collective):
            nccl = idx.get(("b2b", collective, nbytes, "nccl"))
            best_v, best_us = best_program(records, "b2b", collective, nbytes)
            first = True
            for v in versions:
                r = idx.get(("b2b", collective, nbytes, v))
                if r is None:
                    continue
                ratio = nccl["us"] / r["us"] if _ok(r) and _ok(nccl) else None
                notes = []
                if v == "auto" and r.get("chose"):
                    notes.append(f"chose {r['chose']}")
                if v == "auto" and _ok(r) and best_us:
                    notes.append(f"{r['us'] / best_us:.2f} x best ({best_v})")
                if r.get("check") not in (None, "ok"):
                    notes.append(f"CHECK {r['check']}")
                lines.append(f"{fmt_bytes(nbytes) if first else '':>10}  {label(v):<26}{fmt_num(r.get('us')):>10}"
                             f"{fmt_num(r.get('busbw')):>12}{fmt_num(ratio):>9}  {'; '.join(notes)}".rstrip())
                first = False
    graph_versions = _versions(records, "graph", "all_reduce")
    if graph_versions:
        calls = next((r.get("calls_per_graph") for r in records if r["section"] == "graph"), GRAPH_CALLS)
        lines.append("")
        lines.append(f"all_reduce on {n} GPUs, small sizes: us per call back to back and replayed from a CUDA graph "
                     f"({calls} calls per graph)")
        lines.append(f"{'bytes/rank':>10}  {'version':<26}{'b2b us':>10}{'graph us':>10}  note")
        for nbytes in _sizes(records, "graph", "all_reduce"):
            first = True
            for v in graph_versions:
                g = idx.get(("graph", "all_reduce", nbytes, v))
                if g is None:
                    continue
                b = idx.get(("b2b", "all_reduce", nbytes, v))
                note = f"CHECK {g['check']}" if g.get("check") not in (None, "ok") else ""
                lines.append(f"{fmt_bytes(nbytes) if first else '':>10}  {label(v):<26}"
                             f"{fmt_num(b.get('us') if b else None):>10}{fmt_num(g.get('us')):>10}  {note}".rstrip())
                first = False
    errors = data.get("errors", [])
    if errors:
        lines.append("")
        lines.append("not measured (the reason, once per version and reason):")
        seen = set()
        for e in errors:
            key = (e["section"], e["collective"], e["version"], e["reason"])
            if key in seen:
                continue
            seen.add(key)
            at = [_at(x["bytes"]) for x in errors
                  if (x["section"], x["collective"], x["version"], x["reason"]) == key]
            lines.append(f"  {e['section']} {e['collective']} {label(e['version'])} at {', '.join(at)}: {e['reason']}")
    return lines


def _goal(name, value, ok, detail="", target=""):
    status = "n/a" if value is None else ("PASS" if ok else "MISS")
    return {"name": name, "value": value, "status": status, "detail": detail, "target": target}


def goals(data) -> list[dict]:
    """Every goal line: name, value, PASS / MISS / n/a, where."""
    records = data.get("records", [])
    idx = _index(records)
    out = []

    def ratio_rows(collective, lo, hi, pick):
        """(ratio, bytes, version) per size in [lo, hi] from pick(nbytes) -> (version, us) vs NCCL."""
        rows = []
        for nbytes in _sizes(records, "b2b", collective):
            if not lo <= nbytes <= hi:
                continue
            nccl = idx.get(("b2b", collective, nbytes, "nccl"))
            v, us = pick(nbytes)
            if _ok(nccl) and us:
                rows.append((nccl["us"] / us, nbytes, v))
        return rows

    big = (64 * MiB, 1 << 62)
    for collective in COLLECTIVES:
        if not _versions(records, "b2b", collective):
            continue

        def ring(nbytes, c=collective):
            r = idx.get(("b2b", c, nbytes, "ring"))
            return ("ring", r["us"]) if _ok(r) else (None, None)

        def best(nbytes, c=collective):
            return best_program(records, "b2b", c, nbytes)

        rows = ratio_rows(collective, *big, ring)
        low = min(rows) if rows else None
        out.append(_goal(f"{collective} ring bw/NCCL, >= 64 MiB (min)",
                         low[0] if low else None, bool(low) and low[0] >= GOAL_BW_RATIO,
                         f"at {fmt_bytes(low[1])}" if low else "no data", f">= {GOAL_BW_RATIO}"))
        rows = ratio_rows(collective, *big, best)
        low = min(rows) if rows else None
        out.append(_goal(f"{collective} best bw/NCCL, >= 64 MiB (min)",
                         low[0] if low else None, bool(low) and low[0] >= GOAL_BW_RATIO,
                         f"at {fmt_bytes(low[1])} ({low[2]})" if low else "no data", f">= {GOAL_BW_RATIO}"))
        rows = [(1 / r, b, v) for r, b, v in ratio_rows(collective, 64 * KiB, 64 * MiB, best)]
        high = max(rows) if rows else None
        out.append(_goal(f"{collective} best time/NCCL, 64 KiB..64 MiB (max)",
                         high[0] if high else None, bool(high) and high[0] <= GOAL_TIME_RATIO,
                         f"at {fmt_bytes(high[1])} ({high[2]})" if high else "no data", f"<= {GOAL_TIME_RATIO}"))

    for section, what in (("b2b", "b2b"), ("graph", "graph")):
        rows = []
        for nbytes in _sizes(records, section, "all_reduce"):
            if nbytes > MiB:
                continue
            symm = [idx.get((section, "all_reduce", nbytes, v)) for v in ("symm_one_shot", "symm_two_shot")]
            symm = [r["us"] for r in symm if _ok(r)]
            v, us = best_program(records, section, "all_reduce", nbytes)
            auto = idx.get((section, "all_reduce", nbytes, "auto"))
            if symm and us:
                rows.append((us / min(symm), nbytes, v, auto["us"] / min(symm) if _ok(auto) else None))
        high = max(rows, key=lambda t: t[0]) if rows else None
        detail = "no data"
        if high:
            detail = f"at {fmt_bytes(high[1])} ({high[2]}" + (f"; auto {high[3]:.2f}" if high[3] else "") + ")"
        out.append(_goal(f"all_reduce <= 1 MiB {what}: best time/SymmMem (max)",
                         high[0] if high else None, bool(high) and high[0] <= GOAL_SYMM_RATIO, detail,
                         f"<= {GOAL_SYMM_RATIO}"))

    for section, what, limit in (("b2b", "b2b", GOAL_B2B_8B_US), ("graph", "graph", GOAL_GRAPH_8B_US)):
        v, us = best_program(records, section, "all_reduce", 8)
        auto = idx.get((section, "all_reduce", 8, "auto"))
        nccl = [r for r in records if r["section"] == section and r["collective"] == "all_reduce"
                and r["bytes"] == 8 and family(r["version"]) == "nccl" and _ok(r)]
        extra = [f"auto {auto['us']:.1f}"] if _ok(auto) else []
        extra += [f"{label(r['version'])} {r['us']:.1f}" for r in nccl]
        out.append(_goal(f"all_reduce 8 B {what}: best us/call", us, us is not None and us <= limit,
                         f"{v}" + (f"; {', '.join(extra)}" if extra else "") if us else "no data",
                         f"<= {limit} us"))

    worst = None
    for collective in COLLECTIVES:
        for nbytes in _sizes(records, "b2b", collective):
            auto = idx.get(("b2b", collective, nbytes, "auto"))
            v, us = best_program(records, "b2b", collective, nbytes)
            if _ok(auto) and us:
                item = (auto["us"] / us, collective, nbytes, auto.get("chose"), v)
                worst = item if worst is None or item[0] > worst[0] else worst
    out.append(_goal("auto time/best program, every size (max)", worst[0] if worst else None,
                     bool(worst) and worst[0] <= GOAL_AUTO,
                     f"{worst[1]} at {fmt_bytes(worst[2])}: chose {worst[3]}, best {worst[4]}" if worst else "no data",
                     f"<= {GOAL_AUTO}"))

    bad = [r for r in records if r.get("check") not in (None, "ok")]
    checked = [r for r in records if r.get("check") is not None]
    out.append(_goal("wrong outputs (sampled check before timing)", len(bad) if checked else None,
                     not bad, "; ".join(f"{r['section']} {r['collective']} {r['version']} {fmt_bytes(r['bytes'])}"
                                        for r in bad[:4]) or f"{len(checked)} checked", "0"))
    return out


def format_goals(goal_list, meta) -> list[str]:
    head = (f"GOALS ({meta.get('nranks', '?')} x {meta.get('gpu', '?')}, NCCL {meta.get('nccl', '?')}, "
            f"flowdsl {meta.get('flowdsl', '?')}{', quick' if meta.get('quick') else ''})")
    lines = ["", head]
    width = max((len(g["name"]) for g in goal_list), default=40)
    for g in goal_list:
        v = g["value"]
        value = "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
        lines.append(f"  [{g['status']:>4}] {g['name']:<{width}}  {value:>8}  (goal {g['target']})  {g['detail']}")
    counts = {s: sum(g["status"] == s for g in goal_list) for s in ("PASS", "MISS", "n/a")}
    lines.append(f"GOALS: {counts['PASS']} PASS, {counts['MISS']} MISS, {counts['n/a']} n/a")
    return lines


_STYLE = {"flowdsl": "-", "auto": "-", "nccl": "--", "symm": ":"}


def _colors(versions):
    palette = ["C0", "C1", "C2", "C3", "C4", "C5", "C6", "C8", "C9"]
    fixed = {"auto": "black", "nccl": "C7", "nccl_torch": "tab:brown"}
    out, i = {}, 0
    for v in versions:
        if v in fixed:
            out[v] = fixed[v]
        else:
            out[v] = palette[i % len(palette)]
            i += 1
    return out


def plot(data, path) -> bool:
    """One panel per collective (bus bandwidth vs bytes per rank) and one of small all_reduce latency."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
        from matplotlib.ticker import FixedLocator, NullLocator  # noqa: PLC0415
    except ImportError:
        print("matplotlib is not installed: no plot (the JSON has the numbers)")
        return False
    meta, records = data.get("meta", {}), data.get("records", [])
    all_versions = []
    for r in records:
        if r["version"] not in all_versions:
            all_versions.append(r["version"])
    colors = _colors(all_versions)

    def xaxis(ax, sizes):
        ax.set_xscale("log", base=2)
        ticks = [s for s in sizes if s in (8, 512, 32 * KiB, MiB, 64 * MiB, GiB)] or sizes
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([fmt_bytes(s) for s in ticks], fontsize=7)
        ax.set_xlabel("bytes per rank")
        ax.grid(True, which="major", alpha=0.3)

    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5))
    for ax, collective in zip(axes.flat, COLLECTIVES):
        for v in _versions(records, "b2b", collective):
            pts = sorted((r["bytes"], r["busbw"]) for r in records
                         if r["section"] == "b2b" and r["collective"] == collective and r["version"] == v and _ok(r))
            if not pts:
                continue
            fam = family(v)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=_STYLE[fam], color=colors[v],
                    marker="o" if fam in ("flowdsl", "auto") else ".", markersize=3,
                    linewidth=2.2 if fam == "auto" else 1.4, alpha=0.8 if fam == "auto" else 1.0, label=label(v))
        ax.set_title(collective)
        ax.set_ylabel("bus bandwidth (GB/s)")
        xaxis(ax, _sizes(records, "b2b", collective) or [8, GiB])
        ax.legend(fontsize=7, loc="upper left")
    ax = axes.flat[5]
    graph_sizes = _sizes(records, "graph", "all_reduce")
    limit = max(graph_sizes) if graph_sizes else 16 * MiB
    for section, marker, suffix in (("b2b", "o", ""), ("graph", "s", " (graph)")):
        for v in _versions(records, section, "all_reduce"):
            pts = sorted((r["bytes"], r["us"]) for r in records if r["section"] == section
                         and r["collective"] == "all_reduce" and r["version"] == v and r["bytes"] <= limit and _ok(r))
            if not pts:
                continue
            fam = family(v)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=_STYLE[fam], color=colors[v], marker=marker,
                    markersize=3.5, markerfacecolor="none" if section == "graph" else colors[v],
                    alpha=0.55 if section == "graph" else 1.0, linewidth=1.2, label=label(v) + suffix)
    ax.set_yscale("log")
    ax.set_title("all_reduce, small sizes: time per call (graph: hollow, faint)")
    ax.set_ylabel("us per call")
    xaxis(ax, sorted({r["bytes"] for r in records if r["collective"] == "all_reduce" and r["bytes"] <= limit})
          or [8, MiB])
    ax.legend(fontsize=6, loc="upper left", ncol=2)
    fig.suptitle(f"flowdsl collectives vs NCCL {meta.get('nccl', '?')} and PyTorch SymmetricMemory: "
                 f"{meta.get('nranks', '?')} x {meta.get('gpu', '?')}, float32 sum, out of place "
                 f"({meta.get('date', '')[:10]})", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def report(data) -> list[str]:
    """Tables, then GOALS last."""
    goal_list = goals(data)
    data["goals"] = goal_list
    return format_tables(data) + format_goals(goal_list, data.get("meta", {}))


def write_json(data, path):
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


# ---- the GPU side ------------------------------------------------------------------------------

class _Watchdog:
    """Ends the process when one block of work does not finish in time (a hung collective)."""

    def __init__(self, seconds, rank, on_fire):
        self.seconds, self.rank, self.on_fire, self.timer = seconds, rank, on_fire, None

    def arm(self, what):
        self.disarm()
        if self.seconds > 0:
            self.timer = threading.Timer(self.seconds, self._fire, args=(what,))
            self.timer.daemon = True
            self.timer.start()

    def disarm(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fire(self, what):
        print(f"[rank {self.rank}] HANG: {what} did not finish in {self.seconds:.0f} s; exiting "
              "(partial results are in the JSON)", flush=True)
        try:
            self.on_fire()
        finally:
            os._exit(3)


class Bench:
    """One rank's side of the benchmark."""

    def __init__(self, args):
        import cupy  # noqa: PLC0415
        import numpy as np  # noqa: PLC0415
        import torch  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415

        sys.path.insert(0, str(ROOT))
        import flowdsl  # noqa: PLC0415
        from flowdsl import collectives as coll  # noqa: PLC0415

        self.args, self.np, self.cupy, self.torch, self.dist, self.coll = args, np, cupy, torch, dist, coll
        self.flowdsl = flowdsl
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        self.device = torch.device("cuda", local)
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.hang_timeout + 300))
        self.world = dist.group.WORLD
        self.comm = flowdsl.init(group=self.world)
        self.rank, self.n = self.comm.rank, self.comm.nranks
        self.stream = torch.cuda.Stream()        # back-to-back timing
        self.graph_stream = torch.cuda.Stream()  # warm-up and capture of the graphs
        self.records, self.errors = [], []
        self._reported, self._missing = set(), set()
        self.nccl_group, self.nccl_ok = None, False
        self.meta = self._meta()
        self.watchdog = _Watchdog(args.hang_timeout, self.rank, self.save)
        self.t0 = time.perf_counter()

    # -- agreement between ranks (gloo, CPU): every rank takes the same branches ------------------
    def all_ok(self, ok: bool) -> bool:
        t = self.torch.tensor([1 if ok else 0], dtype=self.torch.int32)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MIN, group=self.world)
        return bool(t.item())

    def max_floats(self, values):
        if not values:
            return []
        t = self.torch.tensor([float(v) for v in values], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.world)
        return t.tolist()

    def barrier(self):
        self.dist.barrier(group=self.world)

    def say(self, *parts):
        if self.rank == 0:
            print(*parts, flush=True)

    def _meta(self):
        torch = self.torch
        meta = {"nranks": self.n, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "gpu": torch.cuda.get_device_name(self.device), "torch": torch.__version__,
                "cupy": self.cupy.__version__, "flowdsl": getattr(self.flowdsl, "__version__", "?"),
                "quick": bool(self.args.quick), "argv": sys.argv[1:], "target_ms": self.args.target_ms,
                "rounds": self.args.rounds, "dtype": "float32", "op": "sum", "placement": "out of place",
                "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")}}
        try:
            from flowdsl.runtime.nccl import loaded_version  # noqa: PLC0415

            meta["nccl"] = ".".join(map(str, loaded_version()))
        except Exception as exc:  # noqa: BLE001
            meta["nccl"] = f"? ({exc})"
        try:
            meta["torch_nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001
            pass
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader",
                                  "-i", str(self.device.index)], capture_output=True, text=True, timeout=20)
            meta["driver"] = out.stdout.strip() or "?"
        except Exception:  # noqa: BLE001
            meta["driver"] = "?"
        try:
            from flowdsl.collectives import _host  # noqa: PLC0415

            meta["lsa_size"] = int(_host._lsa_size(self.comm))
        except Exception:  # noqa: BLE001
            pass
        return meta

    def data(self, complete=False):
        return {"meta": self.meta, "complete": complete, "records": list(self.records), "errors": list(self.errors)}

    def save(self, complete=False):
        if self.rank == 0 and self.args.json:
            write_json(self.data(complete), self.args.json)

    def fail(self, section, collective, nbytes, version, reason):
        self.errors.append({"section": section, "collective": collective, "bytes": nbytes, "version": version,
                            "reason": reason})
        key = (section, collective, version, reason)
        if key not in self._reported:
            self._reported.add(key)
            self.say(f"  skip {section} {collective} {label(version)} at {_at(nbytes)}: {reason}")

    # -- timing ------------------------------------------------------------------------------------
    def _events(self):
        return (self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True))

    def time_calls(self, fn, calls, stream):
        """us per call of ``calls`` back-to-back calls on ``stream`` (ranks lined up first)."""
        self.comm.synchronize()
        self.barrier()
        start, stop = self._events()
        with self.torch.cuda.stream(stream):
            start.record(stream)
            for _ in range(calls):
                fn()
            stop.record(stream)
        stop.synchronize()
        return start.elapsed_time(stop) * 1e3 / calls

    def time_graph(self, graph, replays, stream):
        """us per replay of ``graph``."""
        self.comm.synchronize()
        self.barrier()
        start, stop = self._events()
        with self.torch.cuda.stream(stream):
            start.record(stream)
            for _ in range(replays):
                graph.replay()
            stop.record(stream)
        stop.synchronize()
        return start.elapsed_time(stop) * 1e3 / replays

    def measure(self, section, collective, nbytes, entries, timer):
        """Set up, check, size and time every entry, interleaved round by round.

        ``entries``: version -> dict(setup=callable returning the thing ``timer`` runs,
        check=callable(thing) -> bool or None, per_call=calls per timed unit).
        ``timer(thing, units)`` -> us per unit. Appends records; returns nothing.
        """
        args = self.args
        live = {}
        for version, e in entries.items():
            # Set up (warm up, capture), agree, then check, agree: a failure anywhere skips the
            # version on every rank, so that the ranks keep making the same calls.
            thing, reason = self._attempt(e["setup"])
            if not self.all_ok(reason is None):
                self.fail(section, collective, nbytes, version, reason or "failed on another rank")
                continue
            good = None
            if e.get("check"):
                good, reason = self._attempt(lambda e=e, thing=thing: e["check"](thing))
                if not self.all_ok(reason is None):
                    self.fail(section, collective, nbytes, version, f"check: {reason or 'failed on another rank'}")
                    continue
            checked = None if good is None else ("ok" if self.all_ok(bool(good)) else "BAD")
            live[version] = (thing, checked, e)
        if not live:
            return
        names = list(live)
        first = []
        for v in names:  # the probe that sizes R
            thing, _, e = live[v]
            us, _ = self._attempt(lambda thing=thing, e=e: timer(thing, e.get("probe", 1)) / e.get("per_call", 1))
            first.append(float("nan") if us is None else us)
        first = self.max_floats(first)
        units = {}
        for v, us in zip(names, first):
            per = live[v][2].get("per_call", 1)
            units[v] = max(1, -(-reps_for(us, args.target_ms, lo=2, hi=5000) // per))
        times = {v: [] for v in names}
        for _ in range(args.rounds):
            this = []
            for v in names:
                try:
                    us = timer(live[v][0], units[v]) / live[v][2].get("per_call", 1)
                except Exception as exc:  # noqa: BLE001
                    self.fail(section, collective, nbytes, v, f"while timing: {type(exc).__name__}: {exc}")
                    us = float("nan")
                this.append(us)
            for v, us in zip(names, self.max_floats(this)):
                times[v].append(us)
        for v in names:
            rounds = times[v]
            us = statistics.median(rounds) if all(x == x for x in rounds) else float("nan")
            thing, checked, e = live[v]
            rec = {"section": section, "collective": collective, "bytes": nbytes, "version": v, "family": family(v),
                   "us": us, "rounds_us": rounds, "calls": units[v] * e.get("per_call", 1),
                   "busbw": bus_bandwidth(collective, self.n, nbytes, us), "check": checked}
            if e.get("per_call", 1) > 1:
                rec["calls_per_graph"] = e["per_call"]
            if e.get("chose"):
                rec["chose"] = e["chose"]()
            self.records.append(rec)

    @staticmethod
    def _attempt(fn):
        """(fn(), None) or (None, the reason it raised)."""
        try:
            return fn(), None
        except Exception as exc:  # noqa: BLE001
            text = str(exc).strip().splitlines()
            return None, f"{type(exc).__name__}: {text[0][:200] if text else ''}".rstrip(": ")

    # -- the callables ------------------------------------------------------------------------------
    def call(self, collective, src, dst, algorithm, stream):
        f = getattr(self.coll, collective)
        kw = {"algorithm": algorithm, "stream": stream}
        if collective in REDUCING:
            kw["op"] = "sum"
        if collective in ROOTED:
            kw["root"] = 0
        comm = self.comm
        return lambda: f(comm, src, dst, **kw)

    def programs(self, collective):
        """The flowdsl programs of a collective (the keys of PROGRAMS); expected ones missing are reported once."""
        from flowdsl.collectives.programs import PROGRAMS  # noqa: PLC0415

        found = [alg for (alg, c) in PROGRAMS if c == collective]
        for alg in EXPECTED_PROGRAMS.get(collective, ()):
            if alg not in found and (collective, alg) not in self._missing:
                self._missing.add((collective, alg))
                self.fail("b2b", collective, None, alg, "no such program in flowdsl.collectives.programs.PROGRAMS")
        return found

    def auto_choice(self, collective, nbytes, src, dst, stream):
        """What algorithm="auto" runs: the plan's, if it says; else cost.choose's."""
        plans = self.comm.__dict__.get("_flowdsl_plans") or {}
        for key, plan in list(plans.items()):  # plans are keyed by call (the stream's handle at [6])
            if (isinstance(key, tuple) and len(key) > 6 and key[0] == collective and key[1] == id(src)
                    and key[2] == id(dst) and key[5] == "auto"):
                for attr in ("algorithm", "chose", "choice"):
                    alg = getattr(plan, attr, None)
                    if isinstance(alg, str):
                        return alg
        try:
            from flowdsl.collectives import _host, cost  # noqa: PLC0415

            return cost.choose(collective, self.n, _host._lsa_size(self.comm), nbytes) + " (cost.choose)"
        except Exception as exc:  # noqa: BLE001
            return f"? ({type(exc).__name__})"

    def checker(self, collective, count, fn, dst, root_only):
        """Poison dst, run fn once, compare a sample of dst (on the root only for reduce)."""
        np, cupy = self.np, self.cupy

        def check(_thing):
            dst.fill(np.nan)
            self.comm.synchronize()
            self.barrier()
            with self.torch.cuda.stream(self.stream):
                fn()
            self.comm.synchronize()
            if root_only and self.rank != 0:
                return True
            idx = np.unique(np.linspace(0, dst.size - 1, num=min(dst.size, 4097)).astype(np.int64))
            got = cupy.asnumpy(dst[cupy.asarray(idx)])
            return bool(np.array_equal(got, expected_values(collective, self.n, count, idx)))
        return check

    def symm(self):
        """(module, group name, {version: op}) or a reason string."""
        if getattr(self, "_symm", None) is not None:
            return self._symm
        try:
            import torch.distributed._symmetric_memory as symm_mem  # noqa: PLC0415
        except Exception as exc:  # noqa: BLE001
            self._symm = f"torch.distributed._symmetric_memory: {type(exc).__name__}: {exc}"
            return self._symm
        ops = self.torch.ops.symm_mem
        table = {}
        for version, names in (("symm_one_shot", ("one_shot_all_reduce_out", "one_shot_all_reduce")),
                               ("symm_two_shot", ("two_shot_all_reduce_out", "two_shot_all_reduce_"))):
            for name in names:
                if hasattr(ops, name):
                    table[version] = name
                    break
        self._symm = (symm_mem, table)
        return self._symm

    def _symm_groups(self):
        """Groups to rendezvous over, in order: the gloo world, then the NCCL group."""
        names = [self.world.group_name]
        if self.nccl_group is not None and not isinstance(self.nccl_group, str):
            names.append(self.nccl_group.group_name)
        return names

    def symm_entry(self, version, count, stream_for_ops, cache):
        """A setup that returns the SymmetricMemory call (buffers shared by the versions at a size)."""
        torch = self.torch

        def setup():
            got = self.symm()
            if isinstance(got, str):
                raise RuntimeError(got)
            symm_mem, table = got
            if version not in table:
                raise RuntimeError(f"torch.ops.symm_mem has none of the {version[5:]} all-reduce ops "
                                   f"(torch {torch.__version__})")
            if "t" not in cache:
                t = symm_mem.empty(count, dtype=torch.float32, device=self.device)
                t.zero_()  # two-shot reduces in place: zeros stay zeros
                self.comm.synchronize()
                reasons = []
                for name in self._symm_groups():
                    _, reason = self._attempt(lambda name=name: symm_mem.rendezvous(t, name))
                    if reason is None:
                        cache["group"] = name
                        break
                    reasons.append(reason)
                else:
                    raise RuntimeError(f"symm_mem.rendezvous: {'; '.join(reasons)}")
                cache["t"], cache["out"] = t, torch.empty_like(t)
            t, out, group, name = cache["t"], cache["out"], cache["group"], table[version]
            op = getattr(torch.ops.symm_mem, name)
            fn = (lambda: op(t, "sum", group, out)) if name.endswith("_out") else (lambda: op(t, "sum", group))
            with torch.cuda.stream(stream_for_ops):
                for _ in range(5):
                    fn()
            self.comm.synchronize()
            return fn
        return setup

    def eager_entry(self, fn, nbytes, stream):
        def setup():
            with self.torch.cuda.stream(stream):
                for _ in range(warm_calls(nbytes)):
                    fn()
            self.comm.synchronize()
            return fn
        return setup

    # -- sections ----------------------------------------------------------------------------------
    def back_to_back(self, sizes, collectives):
        np = self.np
        stream = self.stream
        progs = {c: self.programs(c) for c in collectives}
        for nbytes in sizes:
            count = max(1, nbytes // 4)
            self.watchdog.arm(f"back-to-back sweep at {fmt_bytes(nbytes)}")
            bufs, reason = [], None
            for _ in range(2):  # src and dst: n x the bytes per rank each (all_gather's out, reduce_scatter's in)
                buf, reason = self._attempt(lambda: self.comm.alloc(self.n * count, np.float32))
                if buf is None:
                    break
                bufs.append(buf)
            if not self.all_ok(len(bufs) == 2):
                for c in collectives:
                    self.fail("b2b", c, nbytes, "all", f"alloc: {reason or 'failed on another rank'}")
                for buf in bufs:
                    self.comm.free(buf)
                self.watchdog.disarm()
                continue
            src, dst = bufs
            src.fill(self.rank + 1)
            self.comm.synchronize()
            views = {"all_reduce": (src[:count], dst[:count]), "all_gather": (src[:count], dst),
                     "reduce_scatter": (src, dst[:count]), "broadcast": (src[:count], dst[:count]),
                     "reduce": (src[:count], dst[:count])}
            symm_cache = {}
            for collective in collectives:
                s, d = views[collective]
                entries = {}
                for alg in progs[collective] + ["auto", "nccl"]:
                    fn = self.call(collective, s, d, alg, stream)
                    entries[alg] = {"setup": self.eager_entry(fn, nbytes, stream),
                                    "check": self.checker(collective, count, fn, d, collective == "reduce"),
                                    "probe": probe_calls(nbytes)}
                    if alg == "auto":
                        entries[alg]["chose"] = (lambda c=collective, s=s, d=d:
                                                 self.auto_choice(c, nbytes, s, d, stream))
                if collective == "all_reduce" and nbytes <= SYMM_MAX and not self.args.no_symm:
                    for v in ("symm_one_shot", "symm_two_shot"):
                        entries[v] = {"setup": self.symm_entry(v, count, stream, symm_cache),
                                      "probe": probe_calls(nbytes)}
                self.measure("b2b", collective, nbytes, entries,
                             lambda fn, calls: self.time_calls(fn, calls, stream))
            symm_cache.clear()
            self.comm.synchronize()
            self.comm.free(src)
            self.comm.free(dst)
            self.watchdog.disarm()
            self.say(f"[{time.perf_counter() - self.t0:6.1f} s] back to back, {fmt_bytes(nbytes)} per rank: done")
            self.save()

    def make_nccl_group(self):
        """An NCCL process group (torch.distributed's all_reduce in the graph section; SymmetricMemory's
        second choice of group), on every rank; NCCL itself starts at its first use."""
        group, reason = self._attempt(lambda: self.dist.new_group(backend="nccl"))
        self.nccl_ok = self.all_ok(reason is None)
        self.nccl_group = group if self.nccl_ok else None
        if not self.nccl_ok:
            self.fail("graph", "all_reduce", None, "nccl_torch",
                      f"dist.new_group(backend='nccl'): {reason or 'failed on another rank'}")

    def graphs(self, sizes):
        torch, np = self.torch, self.np
        cs = self.graph_stream
        progs = self.programs("all_reduce")
        group, ok = self.nccl_group, self.nccl_ok
        for nbytes in sizes:
            count = max(1, nbytes // 4)
            self.watchdog.arm(f"graph replay at {fmt_bytes(nbytes)}")
            src = self.comm.alloc(count, np.float32)
            dst = self.comm.alloc(count, np.float32)
            src.fill(self.rank + 1)
            self.comm.synchronize()
            graphs = []

            def capture(fn, nbytes=nbytes):
                with torch.cuda.stream(cs):  # warm up on the side stream first
                    for _ in range(warm_calls(nbytes)):
                        fn()
                self.comm.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=cs, capture_error_mode="thread_local"):
                    for _ in range(GRAPH_CALLS):
                        fn()
                self.comm.synchronize()
                graphs.append(g)
                return g

            def graph_check(g):
                dst.fill(np.nan)
                self.comm.synchronize()
                self.barrier()
                with torch.cuda.stream(cs):
                    g.replay()
                self.comm.synchronize()
                idx = np.unique(np.linspace(0, dst.size - 1, num=min(dst.size, 4097)).astype(np.int64))
                got = self.cupy.asnumpy(dst[self.cupy.asarray(idx)])
                return bool(np.array_equal(got, expected_values("all_reduce", self.n, count, idx)))

            entries, eager = {}, {}
            for alg in progs + ["auto", "nccl"]:
                fn = self.call("all_reduce", src, dst, alg, cs)
                entries[alg] = {"setup": (lambda fn=fn: capture(fn)), "check": graph_check,
                                "per_call": GRAPH_CALLS}
                if alg == "auto":
                    entries[alg]["chose"] = lambda: self.auto_choice("all_reduce", nbytes, src, dst, cs)
            if ok:
                t = torch.zeros(count, dtype=torch.float32, device=self.device)
                fn = (lambda t=t: self.dist.all_reduce(t, group=group))
                entries["nccl_torch"] = {"setup": (lambda fn=fn: capture(fn)), "per_call": GRAPH_CALLS}
                eager["nccl_torch"] = {"setup": self.eager_entry(fn, nbytes, cs), "probe": probe_calls(nbytes)}
            if nbytes <= SYMM_MAX and not self.args.no_symm:
                cache = {}
                for v in ("symm_one_shot", "symm_two_shot"):
                    setup = self.symm_entry(v, count, cs, cache)
                    entries[v] = {"setup": (lambda setup=setup: capture(setup())), "per_call": GRAPH_CALLS}
            self.measure("graph", "all_reduce", nbytes, entries, lambda g, n: self.time_graph(g, n, cs))
            if eager:  # torch.distributed back to back, for the graph table's other column
                self.measure("b2b", "all_reduce", nbytes, eager, lambda fn, calls: self.time_calls(fn, calls, cs))
            self.comm.synchronize()
            del graphs[:]
            self.comm.free(src)
            self.comm.free(dst)
            self.watchdog.disarm()
            self.say(f"[{time.perf_counter() - self.t0:6.1f} s] graph replay, {fmt_bytes(nbytes)} per rank: done")
            self.save()

    def run(self):
        args = self.args
        self.say(f"{self.n} ranks on {self.meta['gpu']}, NCCL {self.meta['nccl']}, torch {self.meta['torch']}, "
                 f"flowdsl {self.meta['flowdsl']}; target {args.target_ms} ms per measurement, {args.rounds} rounds")
        if args.precompile:
            if self.rank == 0:  # one compiler for all ranks; the others wait at the barrier below
                from flowdsl.enums import RedOp  # noqa: PLC0415

                got = self.coll.precompile(dtypes=("float32",), ops=(RedOp.SUM,), progress=False)
                self.say(f"precompile: {got}")
            self.barrier()
        try:  # load (or compile) the float32 sum kernels now, outside the timed blocks
            from flowdsl.enums import RedOp  # noqa: PLC0415

            got = self.coll.load(dtypes=("float32",), ops=(RedOp.SUM,))
            self.say(f"[{time.perf_counter() - self.t0:6.1f} s] kernels loaded: {got}")
        except Exception as exc:  # noqa: BLE001
            self.say(f"collectives.load failed ({type(exc).__name__}: {exc}); kernels load at first use")
        self.make_nccl_group()
        self.barrier()
        sizes = [s for s in (QUICK_SIZES if args.quick else FULL_SIZES) if s <= args.max_bytes]
        collectives = [c for c in COLLECTIVES if c in args.collectives]
        self.back_to_back(sizes, collectives)
        if not args.no_graph and "all_reduce" in collectives:
            gsizes = [s for s in (QUICK_GRAPH_SIZES if args.quick else sizes) if s <= GRAPH_MAX]
            self.graphs(gsizes)
        self.meta["seconds"] = round(time.perf_counter() - self.t0, 1)

    def close(self):
        self.watchdog.disarm()
        self.comm.synchronize()
        self.barrier()
        self._symm = None
        self.comm.close()
        self.dist.destroy_process_group()


def _parse(argv):
    p = argparse.ArgumentParser(
        description="flowdsl collectives vs NCCL and PyTorch SymmetricMemory on several GPUs "
                    "(run under torchrun, one process per GPU; or --from-json to re-print and re-plot).",
        epilog="NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=2 benchmarks/multigpu_bench.py "
               "--json out.json --plot out.png [--quick]")
    p.add_argument("--json", help="write every measurement here (rank 0; also after each size)")
    p.add_argument("--plot", help="write a PNG here (rank 0; needs matplotlib)")
    p.add_argument("--quick", action="store_true", help="6 sizes, 10 ms per measurement, 3 graph sizes")
    p.add_argument("--from-json", metavar="IN", help="no GPU: read a JSON from an earlier run, print its "
                                                    "tables and goals, and plot it with --plot")
    p.add_argument("--target-ms", type=float, default=None,
                   help="timed work per measurement (default 30, --quick 10)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, versions alternating (default 3)")
    p.add_argument("--max-bytes", type=int, default=GiB, help="largest size per rank (default 1 GiB)")
    p.add_argument("--collectives", default=",".join(COLLECTIVES), help="comma-separated subset")
    p.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph replay section")
    p.add_argument("--no-symm", action="store_true", help="skip PyTorch SymmetricMemory")
    p.add_argument("--precompile", action="store_true",
                   help="rank 0 compiles the float32 sum kernels in parallel first (else they load from the "
                        "disk cache, compiling what is missing)")
    p.add_argument("--hang-timeout", type=float, default=120.0,
                   help="seconds one size may take before the run is ended as hung (0: never)")
    args = p.parse_args(argv)
    if args.target_ms is None:
        args.target_ms = 10.0 if args.quick else 30.0
    args.collectives = [c.strip() for c in args.collectives.split(",") if c.strip()]
    unknown = set(args.collectives) - set(COLLECTIVES)
    if unknown:
        p.error(f"unknown collective(s) {', '.join(sorted(unknown))}; choose from {', '.join(COLLECTIVES)}")
    return args


def main(argv=None) -> int:
    args = _parse(argv)
    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
        if args.plot and plot(data, args.plot):
            print(f"wrote {args.plot}")
        print("\n".join(report(data)))
        return 0
    bench = Bench(args)
    try:
        bench.run()
    finally:
        bench.watchdog.disarm()
        bench.save()  # what there is, also when the run failed
    data = bench.data(complete=True)
    _, reason = bench._attempt(bench.close)
    if reason:
        print(f"[rank {bench.rank}] close: {reason}", flush=True)
    if bench.rank != 0:
        return 0
    lines = report(data)  # also puts the goals into data
    if args.json:
        write_json(data, args.json)
        print(f"wrote {args.json}")
    if args.plot and plot(data, args.plot):
        print(f"wrote {args.plot}")
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
