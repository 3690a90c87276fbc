"""The report's tables: one per collective (back to back), the graph-replay table, the CTA-budget tables,
what was not measured."""

from __future__ import annotations

from .goals import format_goals, goals
from .records import (COLLECTIVES, GRAPH_CALLS, at_bytes, best_program, by_key, fmt_bytes, fmt_num, label, measured,
                      sizes_of, versions_of)


def format_tables(data) -> list[str]:
    """The per-collective tables (back to back) and the graph-replay table."""
    meta, records = data.get("meta", {}), data.get("records", [])
    n = meta.get("nranks", "?")
    idx = by_key(records)
    lines = []
    for collective in COLLECTIVES:
        versions = versions_of(records, "b2b", collective)
        if not versions:
            continue
        lines.append("")
        lines.append(f"{collective} on {n} GPUs: float32 sum, out of place, back to back "
                     "(median of rounds; bw/NCCL = NCCL time / this time)")
        lines.append(f"{'bytes/rank':>10}  {'version':<26}{'us/call':>10}{'busbw GB/s':>12}{'bw/NCCL':>9}  note")
        for nbytes in sizes_of(records, "b2b", collective):
            nccl = idx.get(("b2b", collective, nbytes, "nccl"))
            best_v, best_us = best_program(records, "b2b", collective, nbytes)
            first = True
            for v in versions:
                r = idx.get(("b2b", collective, nbytes, v))
                if r is None:
                    continue
                ratio = nccl["us"] / r["us"] if measured(r) and measured(nccl) else None
                notes = []
                if v == "auto" and r.get("chose"):
                    notes.append(f"chose {r['chose']}")
                if v == "auto" and measured(r) and best_us:
                    notes.append(f"{r['us'] / best_us:.2f} x best ({best_v})")
                if r.get("check") not in (None, "ok"):
                    notes.append(f"CHECK {r['check']}")
                lines.append(f"{fmt_bytes(nbytes) if first else '':>10}  {label(v):<26}{fmt_num(r.get('us')):>10}"
                             f"{fmt_num(r.get('busbw')):>12}{fmt_num(ratio):>9}  {'; '.join(notes)}".rstrip())
                first = False
    graph_versions = versions_of(records, "graph", "all_reduce")
    if graph_versions:
        calls = next((r.get("calls_per_graph") for r in records if r["section"] == "graph"), GRAPH_CALLS)
        lines.append("")
        lines.append(f"all_reduce on {n} GPUs, small sizes: us per call back to back and replayed from a CUDA graph "
                     f"({calls} calls per graph)")
        lines.append(f"{'bytes/rank':>10}  {'version':<26}{'b2b us':>10}{'graph us':>10}  note")
        for nbytes in sizes_of(records, "graph", "all_reduce"):
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
    lines += _budget_tables(data, idx)
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
            at = [at_bytes(x["bytes"]) for x in errors
                  if (x["section"], x["collective"], x["version"], x["reason"]) == key]
            lines.append(f"  {e['section']} {e['collective']} {label(e['version'])} at {', '.join(at)}: {e['reason']}")
    return lines


def _budget_tables(data, idx) -> list[str]:
    """Per collective: bus bandwidth of flowdsl (auto, ``FlowConfig(channels=N)``) and NCCL held to N CTAs."""
    records = data.get("records", [])
    n = data.get("meta", {}).get("nranks", "?")
    lines = []
    for collective in COLLECTIVES:
        versions = versions_of(records, "budget", collective)
        budgets = sorted({int(v.split("@")[1]) for v in versions})
        if not budgets:
            continue
        lines.append("")
        lines.append(f"{collective} on {n} GPUs at equal CTA budgets: busbw GB/s, flowdsl auto with "
                     "FlowConfig(channels=N) / NCCL with minCTAs = maxCTAs = N (ratio flowdsl / NCCL)")
        lines.append(f"{'bytes/rank':>10}" + "".join(f"  {f'N = {c}':>28}" for c in budgets))
        for nbytes in sizes_of(records, "budget", collective):
            cells = []
            for c in budgets:
                mine = idx.get(("budget", collective, nbytes, f"auto@{c}"))
                theirs = idx.get(("budget", collective, nbytes, f"nccl@{c}"))
                # NCCL's time / flowdsl's: the bus bandwidth ratio, and defined at one rank too (busbw 0 there)
                ratio = theirs["us"] / mine["us"] if measured(mine) and measured(theirs) else None
                bad = any(r is not None and r.get("check") not in (None, "ok") for r in (mine, theirs))
                cell = (f"{fmt_num(mine.get('busbw') if mine else None)} / {fmt_num(theirs.get('busbw') if theirs else None)}"
                        f" ({fmt_num(ratio)}){' CHECK' if bad else ''}")
                cells.append(f"  {cell:>28}")
            lines.append(f"{fmt_bytes(nbytes):>10}" + "".join(cells))
    return lines


def report(data) -> list[str]:
    """Tables, then GOALS last."""
    goal_list = goals(data)
    data["goals"] = goal_list
    return format_tables(data) + format_goals(goal_list, data.get("meta", {}))
