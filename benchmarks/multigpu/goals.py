"""The GOALS block: each goal of docs/performance.md as PASS, MISS or n/a, from the records."""

from __future__ import annotations

from .records import (COLLECTIVES, KiB, MiB, best_program, by_key, family, fmt_bytes, label, measured, sizes_of,
                      versions_of)

# Goals (docs/performance.md).
GOAL_BW_RATIO = 0.95          # flowdsl / NCCL bus bandwidth at >= 64 MiB
GOAL_TIME_RATIO = 1.0         # flowdsl / NCCL time, 64 KiB .. 64 MiB
GOAL_SYMM_RATIO = 1.0         # flowdsl / SymmetricMemory time at <= 1 MiB
GOAL_B2B_8B_US = 8.0          # all_reduce 8 B back to back
GOAL_GRAPH_8B_US = 6.0        # all_reduce 8 B replayed from a graph
GOAL_AUTO = 1.10              # auto / best flowdsl program, every size


def _goal(name, value, ok, detail="", target=""):
    status = "n/a" if value is None else ("PASS" if ok else "MISS")
    return {"name": name, "value": value, "status": status, "detail": detail, "target": target}


def goals(data) -> list[dict]:
    """Every goal line: name, value, PASS / MISS / n/a, where."""
    records = data.get("records", [])
    return (_nccl_goals(records) + _symm_goals(records) + _smallest_goals(records) + [_auto_goal(records)]
            + [_check_goal(records)])


def _ratio_rows(records, idx, collective, lo, hi, pick):
    """(ratio, bytes, version) per size in [lo, hi] from pick(nbytes) -> (version, us) vs NCCL."""
    rows = []
    for nbytes in sizes_of(records, "b2b", collective):
        if not lo <= nbytes <= hi:
            continue
        nccl = idx.get(("b2b", collective, nbytes, "nccl"))
        v, us = pick(nbytes)
        if measured(nccl) and us:
            rows.append((nccl["us"] / us, nbytes, v))
    return rows


def _nccl_goals(records) -> list[dict]:
    """Per collective, against NCCL: the ring's and the best program's bandwidth from 64 MiB, the best time
    from 64 KiB to 64 MiB."""
    idx = by_key(records)
    out = []
    big = (64 * MiB, 1 << 62)
    for collective in COLLECTIVES:
        if not versions_of(records, "b2b", collective):
            continue

        def ring(nbytes, c=collective):
            r = idx.get(("b2b", c, nbytes, "ring"))
            return ("ring", r["us"]) if measured(r) else (None, None)

        def best(nbytes, c=collective):
            return best_program(records, "b2b", c, nbytes)

        rows = _ratio_rows(records, idx, collective, *big, ring)
        low = min(rows) if rows else None
        out.append(_goal(f"{collective} ring bw/NCCL, >= 64 MiB (min)",
                         low[0] if low else None, bool(low) and low[0] >= GOAL_BW_RATIO,
                         f"at {fmt_bytes(low[1])}" if low else "no data", f">= {GOAL_BW_RATIO}"))
        rows = _ratio_rows(records, idx, collective, *big, best)
        low = min(rows) if rows else None
        out.append(_goal(f"{collective} best bw/NCCL, >= 64 MiB (min)",
                         low[0] if low else None, bool(low) and low[0] >= GOAL_BW_RATIO,
                         f"at {fmt_bytes(low[1])} ({low[2]})" if low else "no data", f">= {GOAL_BW_RATIO}"))
        rows = [(1 / r, b, v) for r, b, v in _ratio_rows(records, idx, collective, 64 * KiB, 64 * MiB, best)]
        high = max(rows) if rows else None
        out.append(_goal(f"{collective} best time/NCCL, 64 KiB..64 MiB (max)",
                         high[0] if high else None, bool(high) and high[0] <= GOAL_TIME_RATIO,
                         f"at {fmt_bytes(high[1])} ({high[2]})" if high else "no data", f"<= {GOAL_TIME_RATIO}"))
    return out


def _symm_goals(records) -> list[dict]:
    """all_reduce up to 1 MiB, back to back and from a graph: the best program's time against SymmetricMemory's."""
    idx = by_key(records)
    out = []
    for section, what in (("b2b", "b2b"), ("graph", "graph")):
        rows = []
        for nbytes in sizes_of(records, section, "all_reduce"):
            if nbytes > MiB:
                continue
            symm = [idx.get((section, "all_reduce", nbytes, v)) for v in ("symm_one_shot", "symm_two_shot")]
            symm = [r["us"] for r in symm if measured(r)]
            v, us = best_program(records, section, "all_reduce", nbytes)
            auto = idx.get((section, "all_reduce", nbytes, "auto"))
            if symm and us:
                rows.append((us / min(symm), nbytes, v, auto["us"] / min(symm) if measured(auto) else None))
        high = max(rows, key=lambda t: t[0]) if rows else None
        detail = "no data"
        if high:
            detail = f"at {fmt_bytes(high[1])} ({high[2]}" + (f"; auto {high[3]:.2f}" if high[3] else "") + ")"
        out.append(_goal(f"all_reduce <= 1 MiB {what}: best time/SymmMem (max)",
                         high[0] if high else None, bool(high) and high[0] <= GOAL_SYMM_RATIO, detail,
                         f"<= {GOAL_SYMM_RATIO}"))
    return out


def _smallest_goals(records) -> list[dict]:
    """all_reduce of 8 B, back to back and from a graph: the best program's time per call."""
    idx = by_key(records)
    out = []
    for section, what, limit in (("b2b", "b2b", GOAL_B2B_8B_US), ("graph", "graph", GOAL_GRAPH_8B_US)):
        v, us = best_program(records, section, "all_reduce", 8)
        auto = idx.get((section, "all_reduce", 8, "auto"))
        nccl = [r for r in records if r["section"] == section and r["collective"] == "all_reduce"
                and r["bytes"] == 8 and family(r["version"]) == "nccl" and measured(r)]
        extra = [f"auto {auto['us']:.1f}"] if measured(auto) else []
        extra += [f"{label(r['version'])} {r['us']:.1f}" for r in nccl]
        out.append(_goal(f"all_reduce 8 B {what}: best us/call", us, us is not None and us <= limit,
                         f"{v}" + (f"; {', '.join(extra)}" if extra else "") if us else "no data",
                         f"<= {limit} us"))
    return out


def _auto_goal(records) -> dict:
    """``algorithm="auto"`` against the best program, at its worst over every collective and size."""
    idx = by_key(records)
    worst = None
    for collective in COLLECTIVES:
        for nbytes in sizes_of(records, "b2b", collective):
            auto = idx.get(("b2b", collective, nbytes, "auto"))
            v, us = best_program(records, "b2b", collective, nbytes)
            if measured(auto) and us:
                item = (auto["us"] / us, collective, nbytes, auto.get("chose"), v)
                worst = item if worst is None or item[0] > worst[0] else worst
    return _goal("auto time/best program, every size (max)", worst[0] if worst else None,
                 bool(worst) and worst[0] <= GOAL_AUTO,
                 f"{worst[1]} at {fmt_bytes(worst[2])}: chose {worst[3]}, best {worst[4]}" if worst else "no data",
                 f"<= {GOAL_AUTO}")


def _check_goal(records) -> dict:
    """Outputs that the sampled check before timing found wrong."""
    bad = [r for r in records if r.get("check") not in (None, "ok")]
    checked = [r for r in records if r.get("check") is not None]
    return _goal("wrong outputs (sampled check before timing)", len(bad) if checked else None,
                 not bad, "; ".join(f"{r['section']} {r['collective']} {r['version']} {fmt_bytes(r['bytes'])}"
                                    for r in bad[:4]) or f"{len(checked)} checked", "0")


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
