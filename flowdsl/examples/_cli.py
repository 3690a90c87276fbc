"""``python -m flowdsl.examples.<name>``: run an example's ``run(comm)`` and say whether it matched NumPy.

On GPUs one rank per process (``torchrun --nproc_per_node=N``); without a GPU, or with ``--sim``, on simulated
ranks on the CPU (the example's own default shape: ``--ranks``, ``--nodes``). Every example's ``run`` returns
``(result, reference)`` for its rank (or a list of them, one per call).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

__all__ = ["main", "parser", "checked", "run_somewhere", "entry", "at_least_one"]


def _pairs(returned):
    """The ``(result, reference)`` pairs a rank's ``run`` returned."""
    return list(returned) if isinstance(returned, list) else [returned]


def run_somewhere(run, sim: bool, ranks: int, nodes: int = 1, multimem: bool = False):
    """``run(comm)`` on this process's GPU rank, or (no GPU, or ``sim``) on ``ranks`` simulated ranks over
    ``nodes`` (with an NVLink SHARP switch in each node where ``multimem``, as an example over multimem needs):
    ``(results by rank here, ranks, where it ran)``."""
    import flowdsl  # noqa: PLC0415

    if not sim:
        try:
            with flowdsl.init() as comm:
                return ([run(comm)], comm.nranks,
                        f"on GPU (NCCL {'.'.join(map(str, comm.nccl_version))}, rank {comm.rank} shown)")
        except flowdsl.NoDeviceError:
            pass
    return (flowdsl.sim.spawn(run, nranks=ranks, nodes=nodes, multimem=multimem), ranks,
            f"on the CPU simulator ({nodes} node{'s' if nodes > 1 else ''}{', --sim' if sim else ', no GPU found'})")


def at_least_one(text: str) -> int:
    """A count on a command line (``--ranks``, ``--tokens``, ...), refused with argparse's one-line message
    unless it is a whole number of 1 or more: the rule of the flowdsl command and of every example."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of 1 or more, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def parser(name: str, what: str, ranks: int, nodes: int = 1) -> argparse.ArgumentParser:
    """The command line every example takes (``--sim``, ``--ranks``, ``--nodes``; counts of 1 or more, refused
    with the parser's one-line message otherwise); an example may add its own options."""
    p = argparse.ArgumentParser(prog=f"python -m flowdsl.examples.{name}",
                                description=f"{name}: {what}. Checked against NumPy: on the GPU(s), or on "
                                            "simulated ranks on the CPU without one.")
    p.add_argument("--sim", action="store_true", help="run on the CPU simulator even if a GPU is present")
    p.add_argument("--ranks", type=at_least_one, default=ranks, help=f"simulated ranks (default {ranks})")
    p.add_argument("--nodes", type=at_least_one, default=nodes, help=f"simulated nodes (default {nodes})")
    return p


def checked(name: str, body) -> int:
    """``body()``'s status; a refusal of flowdsl's (ranks that do not split over the nodes, ...) one line on
    stderr and status 2, as the flowdsl command says it, not a traceback."""
    import flowdsl  # noqa: PLC0415

    try:
        return body()
    except flowdsl.FlowDSLError as exc:
        print(f"python -m flowdsl.examples.{name}: error: {exc}", file=sys.stderr)  # as argparse says its own
        return 2


def main(name: str, run, what: str, argv=None, ranks: int = 4, nodes: int = 1, tolerance: float = 1e-5,
         multimem: bool = False) -> int:
    """Run ``run(comm)`` and print one line: where it ran and whether every result matched its reference
    (within ``tolerance``, relative and absolute). ``what``: what the example does, for that line. ``multimem``:
    the example needs NVLink SHARP (the simulator models a switch for it)."""
    args = parser(name, what, ranks, nodes).parse_args(argv)

    def body():
        results, nranks, where = run_somewhere(run, args.sim, args.ranks, args.nodes, multimem)
        ok = all(np.allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=tolerance,
                             atol=tolerance)
                 for returned in results for got, want in _pairs(returned))
        print(f"{name}: {nranks} rank(s) {where}: {what}; every result equal to NumPy's: {'OK' if ok else 'MISMATCH'}")
        return 0 if ok else 1
    return checked(name, body)


def entry(name: str, run, what: str, **kwargs) -> None:
    """An example's ``if __name__ == "__main__"``: :func:`main` on the command line's arguments, its status the
    process's."""
    sys.exit(main(name, run, what, **kwargs))
