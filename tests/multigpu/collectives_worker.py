"""One rank of the several-GPU collectives tests: the matrix of :mod:`flowdsl.collectives.check`.

Launched by ``tests/multigpu/test_collectives_multigpu.py`` through torchrun, one
process per GPU; it can also be launched by hand, or under compute-sanitizer with
the small matrix::

    NCCL_NVLS_ENABLE=0 python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        tests/multigpu/collectives_worker.py --out /tmp/ranks
    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 --no-python \\
        compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \\
        python3 tests/multigpu/collectives_worker.py --small

(API errors off: NCCL probes the driver at start and expects refusals. Precompile first,
``python -m flowdsl precompile``, so nothing compiles under the tool.)

Each rank prints one line per suite and, with ``--out DIR``, writes ``DIR/rank<r>.json``
(``{"rank", "nranks", "suites": {name: {"calls", "failures"}}, "error"}``). The exit
status is 0 when every call matched, 1 on mismatches, 2 when a call raised (torchrun then
ends the other ranks, which may be waiting inside the collective).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on the shared machines
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's flowdsl, installed or not
from tests.multigpu.rank_report import record_calls, run_reported  # noqa: E402 - found through the line above

BIG = (1 << 20) + 3  # a prime-ish count past every chunk and channel boundary
SUITES = ("matrix", "protocols", "torch", "small")


def suite_cases(name: str, nranks: int, lsa_size: int | None = None) -> list:
    """The cases of a suite (the same list on every rank; ``lsa_size``: ranks per node)."""
    from flowdsl import Protocol
    from flowdsl import collectives as coll
    from flowdsl.collectives import check

    forced = (Protocol.SIMPLE, Protocol.LL, Protocol.LL128)
    if name == "matrix":  # everything, the protocol rotating over the calls (None: the cost model's)
        return check.cases(nranks, lsa_size=lsa_size, counts=(1, 4099, BIG), dtypes=coll.DTYPES,
                           protocols=check.PROTOCOLS)
    if name == "protocols":  # each protocol forced for every call
        out = []
        for protocol in forced:
            out += check.cases(nranks, lsa_size=lsa_size, counts=(BIG,),
                               dtypes=("float32", "bfloat16", "float8_e4m3fn"), ops=("sum",), protocols=(protocol,),
                               start=len(out))
        return out
    if name == "torch":  # torch tensors of the element type itself: no dtype= in the call
        return check.cases(nranks, lsa_size=lsa_size, counts=(1, 4099, BIG),
                           dtypes=("float8_e4m3fn", "bfloat16", "int8", "uint32", "uint64"), like="torch")
    if name == "small":  # for compute-sanitizer: one count, every program, the three protocols
        return check.cases(nranks, lsa_size=lsa_size, counts=(4099,), dtypes=("float32", "float8_e4m3fn"),
                           ops=("sum", "avg"), protocols=forced)
    raise SystemExit(f"Cannot run suite {name!r}: the suites are {', '.join(SUITES)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", action="append", choices=SUITES,
                        help="suite to run (repeatable; default: matrix, protocols, torch)")
    parser.add_argument("--small", action="store_true", help="the small matrix only (for compute-sanitizer)")
    parser.add_argument("--out", type=Path, help="write rank<r>.json here")
    args = parser.parse_args(argv)
    suites = ["small"] if args.small else (args.suite or ["matrix", "protocols", "torch"])

    import torch.distributed as dist

    import flowdsl
    from flowdsl.collectives import check

    dist.init_process_group("gloo")
    report = {"rank": dist.get_rank(), "nranks": dist.get_world_size(), "suites": {}, "error": None}
    comm = None

    def run_suites() -> int:
        nonlocal comm
        comm = flowdsl.init(group=dist.group.WORLD)
        status = 0
        for name in suites:
            matrix = suite_cases(name, comm.nranks, getattr(comm, "lsa_size", None))
            status |= record_calls(comm, report["suites"], name, name, len(matrix), check.run_matrix(comm, matrix), 5)
        return status

    status = run_reported(args.out, report, run_suites)
    comm.close()
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
