"""Sizes, names and the arithmetic of one measurement record (no GPU, no torch).

A record is a dict: ``section`` ("b2b", "graph" or "budget"), ``collective``, ``bytes`` per rank,
``version`` (a flowdsl program, "auto", "nccl", "nccl_torch" or "symm_*"; in "budget": "auto@N" and
"nccl@N", N the CTAs each may use), ``us`` per call, ``busbw`` and ``check``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

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
#: The CTA budgets compared with NCCL (``--budgets``): flowdsl with ``FlowConfig(channels=N)``, NCCL held to
#: N CTAs (``ncclConfig`` minCTAs = maxCTAs = N, what NCCL_MIN_CTAS / NCCL_MAX_CTAS set), 1 MiB to 1 GiB.
BUDGETS = (8, 16, 32)
BUDGET_SIZES = [MiB, 8 * MiB, 64 * MiB, 512 * MiB, GiB]
QUICK_BUDGET_SIZES = [MiB, 64 * MiB]
SYMM_MAX = 16 * MiB      # SymmetricMemory rows up to here
GRAPH_MAX = 16 * MiB     # CUDA-graph rows up to here
GRAPH_CALLS = 32         # calls captured in one graph
#: Programs the benchmark expects to find (a missing one is reported, not fatal).
EXPECTED_PROGRAMS = {"all_reduce": ("ring", "tree", "one_shot", "two_shot"), "all_gather": ("ring",),
                     "reduce_scatter": ("ring",), "broadcast": ("ring",), "reduce": ("ring",)}


def fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def at_bytes(nbytes) -> str:
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
    if "@" in version:  # the budget section's "auto@N" and "nccl@N"
        who, ctas = version.split("@")
        return f"{'NCCL' if who == 'nccl' else 'flowdsl auto'}, {ctas} CTAs"
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


def by_key(records):
    return {(r["section"], r["collective"], r["bytes"], r["version"]): r for r in records}


def versions_of(records, section, collective):
    """Versions present, in the order they were measured."""
    seen = []
    for r in records:
        if r["section"] == section and r["collective"] == collective and r["version"] not in seen:
            seen.append(r["version"])
    return seen


def sizes_of(records, section, collective):
    return sorted({r["bytes"] for r in records if r["section"] == section and r["collective"] == collective})


def measured(r) -> bool:
    return r is not None and r.get("us") is not None and r["us"] == r["us"]


def best_program(records, section, collective, nbytes):
    """(version, us) of the fastest flowdsl program (not auto) at this size, or (None, None)."""
    idx = by_key(records)
    best = (None, None)
    for v in versions_of(records, section, collective):
        r = idx.get((section, collective, nbytes, v))
        if family(v) == "flowdsl" and measured(r) and (best[1] is None or r["us"] < best[1]):
            best = (v, r["us"])
    return best


def write_json(data, path):
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)
