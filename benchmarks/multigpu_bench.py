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
3. At equal CTA budgets (``--budgets``, default 8, 16, 32), 1 MiB to 1 GiB: flowdsl's
   ``algorithm="auto"`` with ``FlowConfig(channels=N)`` beside NCCL's host collective on a
   communicator split with ``ncclConfig`` minCTAs = maxCTAs = N (what ``NCCL_MIN_CTAS`` and
   ``NCCL_MAX_CTAS`` set for a process): what each moves when a fused kernel or a GEMM keeps
   the rest of the SMs.

Timing: CUDA events around R calls launched back to back (host included: what a user
sees at small sizes), R chosen per version and size from a probe so that a measurement
holds about ``--target-ms`` of work (at least 2 calls) and agreed across ranks; ranks
meet at a barrier before each measurement; 3 rounds, the versions alternating within
each round; the slowest rank's time of a round; the median of the rounds. Each
version's output is checked on a sample of elements before it is timed.

Bus bandwidth as nccl-tests defines it: all_reduce 2(n-1)/n of the buffer;
all_gather and reduce_scatter (n-1)/n of the whole gathered / scattered buffer
(n x the bytes per rank); broadcast and reduce 1.

Output: a table per collective, the graph-replay table, the CTA-budget tables, then the
GOALS block, printed last. ``--json`` writes every measurement and the machine's versions; ``--plot`` a PNG
(needs matplotlib).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# Before torch or NCCL are imported: no NVLink multicast anywhere (shared machines).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

from multigpu.records import BUDGETS, COLLECTIVES, GiB, write_json  # noqa: E402 - benchmarks/ is this script's path
from multigpu.plot import plot  # noqa: E402
from multigpu.tables import report  # noqa: E402


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
    p.add_argument("--budgets", default=",".join(map(str, BUDGETS)),
                   help="CTA budgets N compared with NCCL: flowdsl with FlowConfig(channels=N), NCCL with "
                        "minCTAs = maxCTAs = N, 1 MiB to 1 GiB (default 8,16,32; '' skips the section)")
    p.add_argument("--precompile", action="store_true",
                   help="rank 0 compiles the float32 sum kernels in parallel first (else they load from the "
                        "disk cache, compiling what is missing)")
    p.add_argument("--hang-timeout", type=float, default=120.0,
                   help="seconds one size may take before the run is ended as hung (0: never)")
    args = p.parse_args(argv)
    if args.target_ms is None:
        args.target_ms = 10.0 if args.quick else 30.0
    args.collectives = [c.strip() for c in args.collectives.split(",") if c.strip()]
    try:
        args.budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
    except ValueError:
        p.error(f"--budgets takes comma-separated CTA counts such as 8,16,32, got {args.budgets!r}")
    if any(b < 1 for b in args.budgets):
        p.error(f"--budgets: each CTA count must be at least 1, got {args.budgets}")
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
    from multigpu.bench import Bench  # noqa: PLC0415 - torch, CuPy and flowdsl: not for --from-json

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
