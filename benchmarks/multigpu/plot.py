"""The PNG: bus bandwidth per collective, and small all_reduce latency (needs matplotlib)."""

from __future__ import annotations

from .records import COLLECTIVES, GiB, KiB, MiB, family, fmt_bytes, label, measured, sizes_of, versions_of


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
        for v in versions_of(records, "b2b", collective):
            pts = sorted((r["bytes"], r["busbw"]) for r in records
                         if r["section"] == "b2b" and r["collective"] == collective and r["version"] == v and measured(r))
            if not pts:
                continue
            fam = family(v)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=_STYLE[fam], color=colors[v],
                    marker="o" if fam in ("flowdsl", "auto") else ".", markersize=3,
                    linewidth=2.2 if fam == "auto" else 1.4, alpha=0.8 if fam == "auto" else 1.0, label=label(v))
        ax.set_title(collective)
        ax.set_ylabel("bus bandwidth (GB/s)")
        xaxis(ax, sizes_of(records, "b2b", collective) or [8, GiB])
        ax.legend(fontsize=7, loc="upper left")
    ax = axes.flat[5]
    graph_sizes = sizes_of(records, "graph", "all_reduce")
    limit = max(graph_sizes) if graph_sizes else 16 * MiB
    for section, marker, suffix in (("b2b", "o", ""), ("graph", "s", " (graph)")):
        for v in versions_of(records, section, "all_reduce"):
            pts = sorted((r["bytes"], r["us"]) for r in records if r["section"] == section
                         and r["collective"] == "all_reduce" and r["version"] == v and r["bytes"] <= limit and measured(r))
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
