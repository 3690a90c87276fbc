"""One rank of the several-GPU call sequences: :func:`flowdsl.collectives.sequences.run_sequence`.

Launched by ``tests/multigpu/test_sequences_multigpu.py`` (the CI seed) and by
``scripts/gpu_all.sh`` (more seeds, a summary line) through torchrun, one process per GPU::

    NCCL_NVLS_ENABLE=0 python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        tests/multigpu/sequences_worker.py --seeds 20261203,7 --out /tmp/ranks --summary /tmp/sequences.txt

Each seed is one sequence of ``--calls`` calls on one communicator, made by the generator and
runner the simulator tests use (the same calls for the same seed and ranks), every allocation
compared bit for bit after every call. LL128 is left out unless ``--protocols`` names it: the
library is precompiled without LL128's code, and each (program, dtype, op) asking for it compiles
at first use (~5 s each, hundreds in a sequence). Rank 0 prints one summary line (seeds, calls,
ranks, wrong results) and writes it to ``--summary``; with ``--out DIR`` each rank writes
``DIR/rank<r>.json`` (``{"rank", "nranks", "seeds": {seed: {"calls", "failures"}}, "error"}``).
A wrong result is reproduced on the simulator with the same seed and ranks
(``python -m flowdsl.collectives.sequences --seed S --ranks N --large L``). Exit status: 0 when
every call matched, 1 on wrong results, 2 when a call raised (torchrun then ends the other ranks).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on the shared machines
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's flowdsl, installed or not
from tests.multigpu.rank_report import record_calls, run_reported  # noqa: E402 - found through the line above

#: The largest count on GPUs: enough for several channels (a channel per 2 KiB of LL, 16 KiB of SIMPLE).
LARGE = 1 << 15


def main(argv=None) -> int:
    from flowdsl.collectives import sequences

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default=str(sequences.CI_SEED), help="comma-separated sequence seeds")
    parser.add_argument("--calls", type=int, default=sequences.DEFAULT_CALLS)
    parser.add_argument("--large", type=int, default=LARGE, help="the largest count")
    parser.add_argument("--protocols", default="auto,SIMPLE,LL",
                        help="comma-separated: auto (the cost model's), SIMPLE, LL, LL128")
    parser.add_argument("--out", type=Path, help="write rank<r>.json here")
    parser.add_argument("--summary", type=Path, help="rank 0 writes the summary line here")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    protocols = sequences.parse_protocols(args.protocols)

    import torch
    import torch.distributed as dist

    import flowdsl
    from flowdsl._flow_staging import lsa_team_size

    dist.init_process_group("gloo")
    report = {"rank": dist.get_rank(), "nranks": dist.get_world_size(), "seeds": {}, "error": None}
    comm = None
    wrong = 0

    def run_seeds() -> int:
        nonlocal comm, wrong
        comm = flowdsl.init(group=dist.group.WORLD)
        status = 0
        for seed in seeds:
            calls = sequences.generate(seed, args.calls, comm.nranks, lsa_team_size(comm), protocols=protocols,
                                       large=args.large, cft=comm.cft_missing is None)
            failures = [str(f) for f in sequences.run_sequence(comm, calls)]
            wrong += len(failures)
            status |= record_calls(comm, report["seeds"], str(seed), f"sequence seed {seed}", len(calls), failures, 3)
        return status

    status = run_reported(args.out, report, run_seeds)
    total = torch.tensor([wrong])
    dist.all_reduce(total)
    if comm.rank == 0:
        nodes = comm.nranks // lsa_team_size(comm)
        line = (f"seeds {','.join(map(str, seeds))} x {args.calls} calls on {comm.nranks} ranks "
                f"(protocols {args.protocols}): {int(total)} wrong results"
                + ("" if not int(total) else f"; rerun on the simulator: python -m flowdsl.collectives.sequences "
                                             f"--seed S --ranks {comm.nranks} --nodes {nodes} --large {args.large} "
                                             f"--protocols {args.protocols}"))
        print(f"call sequences: {line}", flush=True)
        if args.summary is not None:
            args.summary.parent.mkdir(parents=True, exist_ok=True)
            args.summary.write_text(line + "\n")
    comm.close()
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
