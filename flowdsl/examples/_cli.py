"""``python -m flowdsl.examples.<name>``: run an example's ``run(comm)`` and say whether it matched NumPy.

On GPUs one rank per process (``torchrun --nproc_per_node=N``); without a GPU, or with ``--sim``, on simulated
ranks on the CPU (the example's own default shape: ``--ranks``, ``--nodes``). Every example's ``run`` returns
``(result, reference)`` for its rank (or a list of them, one per call).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

__all__ = ["main", "run_somewhere"]


def _pairs(returned):
    """The ``(result, reference)`` pairs a rank's ``run`` returned."""
    return list(returned) if isinstance(returned, list) else [returned]


def run_somewhere(run, sim: bool, ranks: int, nodes: int = 1):
    """``run(comm)`` on this process's GPU rank, or (no GPU, or ``sim``) on ``ranks`` simulated ranks over
    ``nodes``: ``(results by rank here, ranks, where it ran)``."""
    import flowdsl  # noqa: PLC0415

    if not sim:
        try:
            with flowdsl.init() as comm:
                return ([run(comm)], comm.nranks,
                        f"on GPU (NCCL {'.'.join(map(str, comm.nccl_version))}, rank {comm.rank} shown)")
        except flowdsl.NoDeviceError:
            pass
    return (flowdsl.sim.spawn(run, nranks=ranks, nodes=nodes), ranks,
            f"on the CPU simulator ({nodes} node{'s' if nodes > 1 else ''}{', --sim' if sim else ', no GPU found'})")


def main(name: str, run, what: str, argv=None, ranks: int = 4, nodes: int = 1, tolerance: float = 1e-5) -> int:
    """Run ``run(comm)`` and print one line: where it ran and whether every result matched its reference
    (within ``tolerance``, relative and absolute). ``what``: what the example does, for that line."""
    parser = argparse.ArgumentParser(prog=f"python -m flowdsl.examples.{name}",
                                     description=f"{name}: {what}. Checked against NumPy: on the GPU(s), or on "
                                                 "simulated ranks on the CPU without one.")
    parser.add_argument("--sim", action="store_true", help="run on the CPU simulator even if a GPU is present")
    parser.add_argument("--ranks", type=int, default=ranks, help=f"simulated ranks (default {ranks})")
    parser.add_argument("--nodes", type=int, default=nodes, help=f"simulated nodes (default {nodes})")
    args = parser.parse_args(argv)
    results, nranks, where = run_somewhere(run, args.sim, args.ranks, args.nodes)
    ok = all(np.allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=tolerance,
                         atol=tolerance)
             for returned in results for got, want in _pairs(returned))
    print(f"{name}: {nranks} rank(s) {where}: {what}; every result equal to NumPy's: {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def entry(name: str, run, what: str, **kwargs) -> None:
    """An example's ``if __name__ == "__main__"``: :func:`main` on the command line's arguments, its status the
    process's."""
    sys.exit(main(name, run, what, **kwargs))
