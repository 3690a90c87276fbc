"""Print the summary table of a scripts/gpu_all.sh run (tests by group, then benchmark rows)."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def main(out: str) -> None:
    out_dir = Path(out)
    rows = []
    counts: dict[str, Counter] = {}
    for junit in (out_dir / "junit.xml", out_dir / "junit-multigpu.xml"):
        if not junit.exists():
            continue
        for case in ET.parse(junit).getroot().iter("testcase"):
            group = case.get("classname", "").split(".")[1] if "." in case.get("classname", "") else "?"
            state = "failed" if case.find("failure") is not None or case.find("error") is not None else (
                "skipped" if case.find("skipped") is not None else "passed")
            counts.setdefault(group, Counter())[state] += 1
    for group, c in sorted(counts.items()):
        rows.append((f"tests/{group}", f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"))
    bench = out_dir / "bench.json"
    if bench.exists():
        for row in json.loads(bench.read_text()):
            rows.append((row["name"], row["value"]))
    if (out_dir / "precompile.txt").exists():
        rows.append(("precompile (python -m flowdsl precompile)",
                     " ".join((out_dir / "precompile.txt").read_text().split())))
    for line in (out_dir / "sanitizer.txt").read_text().splitlines() if (out_dir / "sanitizer.txt").exists() else []:
        tool, _, verdict = line.partition(": ")
        rows.append((tool, verdict))
    sequences = out_dir / "sequences.txt"
    if sequences.exists():  # tests/multigpu/sequences_worker.py --summary: seeds, calls, ranks, wrong results
        rows.append(("call sequences (tests/multigpu/sequences_worker.py)", sequences.read_text().strip()))
    elif (out_dir / "sequences.log").exists():  # it ran but wrote no summary: a rank raised
        rows.append(("call sequences (tests/multigpu/sequences_worker.py)",
                     "no summary: see sequences.log (" + ((out_dir / "sequences.log").read_text().strip()
                                                         .splitlines() or ["empty"])[-1][:120] + ")"))
    multigpu = out_dir / "multigpu.json"
    if multigpu.exists():  # benchmarks/multigpu_bench.py: its goals, one row each
        for goal in json.loads(multigpu.read_text()).get("goals", []):
            value = goal.get("value")
            shown = "-" if value is None else (f"{value:.3f}" if isinstance(value, float) else str(value))
            verdict = f"{goal['status']}  {shown} ({goal.get('target', '')}) {goal.get('detail', '')}"
            rows.append((goal["name"], verdict))
    channel = out_dir / "channel.json"
    if channel.exists():  # benchmarks/flow_channel_bench.py: flowdsl / reference per protocol and channel count
        by_proto: dict[str, list] = {}
        for cell in json.loads(channel.read_text())["cells"]:
            ratio = "-" if cell["ratio"] is None else f"{cell['ratio']:.2f}"
            by_proto.setdefault(cell["proto"], []).append(f"{cell['channels']} ch {cell['flowdsl_gbps']:.1f} GB/s ({ratio})")
        for proto, cells in by_proto.items():
            rows.append((f"Flow {proto} per channel (÷ CUDA reference)", ", ".join(cells)))
    compat = out_dir / "compat.json"
    if compat.exists():  # scripts/numba_cuda_compat.py --target gpu: numba-cuda's own tests through @flowdsl.kernel
        totals = json.loads(compat.read_text())["totals"]
        n, f = totals["numba"]["passed"], totals["flowdsl"]["passed"]
        rows.append(("numba-cuda's tests through @flowdsl.kernel (goal 0.99x)",
                     f"flowdsl {f} of numba-cuda's {n} GPU passes ({f / n if n else float('nan'):.3f}x)"))
    for line in (out_dir / "coldstart.log").read_text().splitlines() if (out_dir / "coldstart.log").exists() else []:
        if line.startswith("warm load of the library"):  # benchmarks/cache_load.py --gpu
            rows.append(("warm load of the library (goal 0.2 s)", line.partition(": ")[2]))
    if (out_dir / "demo.log").exists():
        rows.append(("demo (python -m flowdsl demo)", (out_dir / "demo.log").read_text().strip().splitlines()[-1].strip()))
    if (out_dir / "notebooks.log").exists():  # scripts/run_notebooks.py: one line per notebook
        for line in (out_dir / "notebooks.log").read_text().splitlines():
            name, sep, verdict = line.partition(": ")
            if sep and name.endswith(".ipynb"):
                rows.append((f"notebook {name}", verdict))
            elif line.startswith("notebooks: "):
                rows.append(("notebooks", line.removeprefix("notebooks: ")))
    for name in ("gpu.txt", "versions.txt"):
        if (out_dir / name).exists():
            rows.append((name.split(".")[0], (out_dir / name).read_text().strip()))
    width = max((len(r[0]) for r in rows), default=10)
    print("\n" + "=" * 30 + " flowdsl GPU summary " + "=" * 30)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/flowdsl-out")
