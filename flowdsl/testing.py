"""Helpers for writing multi-rank tests of flowdsl programs on the CPU simulator.

Example (a test file; ``@pytest.mark.sim`` too if your pytest configuration
registers a ``sim`` marker)::

    from flowdsl.examples import allgather_lsa
    from flowdsl.testing import assert_ranks_close, for_seeds, run_ranks

    @for_seeds(8)
    def test_allgather(seed):
        assert_ranks_close(run_ranks(allgather_lsa.run, nranks=4, seed=seed))
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

__all__ = ["run_ranks", "for_seeds", "run_seeds", "assert_ranks_close"]


def run_ranks(main: Callable[[Any], Any], nranks: int = 4, seed: int = 0, nodes: int = 1,
              **options) -> list:
    """Run ``main(comm)`` on ``nranks`` simulated ranks; return the results by rank.

    Args:
        main: The host program of one rank.
        nranks: Number of simulated ranks.
        seed: Scheduler seed (the same seed replays the same interleaving).
        nodes: Number of simulated nodes (the LSA team is a node).
        **options: Passed to :func:`flowdsl.sim.spawn`.
    """
    from flowdsl import sim
    return sim.spawn(main, nranks=nranks, seed=seed, nodes=nodes, **options)


def for_seeds(n: int, start: int = 0):
    """Pytest decorator: run the test once per seed ``start .. start+n-1`` (argument ``seed``).

    Each seed is its own test case (``test_x[seed=3]``), so a failure names the
    seed that reproduces it.
    """
    import pytest
    return pytest.mark.parametrize("seed", list(range(start, start + n)),
                                   ids=[f"seed={s}" for s in range(start, start + n)])


def run_seeds(main: Callable[[Any], Any], nranks: int = 4, seeds: Iterable[int] = range(8),
              nodes: int = 1, progress: bool | None = None, **options) -> dict:
    """Run ``main`` under every seed; return ``{seed: results}``.

    An exception names the seed that raised it (as a note, and in simulator
    errors' messages).

    Args:
        progress: Draw a progress bar with an ETA over the seeds on stderr; default:
            when stderr is a terminal.
    """
    from ._progress import ProgressBar  # noqa: PLC0415

    seeds = list(seeds)
    bar = ProgressBar(len(seeds), f"run_seeds {getattr(main, '__name__', 'main')} x{nranks} ranks",
                      enabled=progress)
    out = {}
    try:
        for done, s in enumerate(seeds):
            bar.update(done, f"seed {s}")
            try:
                out[s] = run_ranks(main, nranks=nranks, seed=s, nodes=nodes, **options)
            except Exception as e:
                e.add_note(f"flowdsl.testing.run_seeds: failed with seed={s}")
                raise
        bar.update(len(seeds), "done")
    finally:
        bar.close()
    return out


def assert_ranks_close(results, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Assert every rank's ``(result, reference)`` pair matches (``numpy.testing.assert_allclose``)."""
    import numpy as np
    for rank, (result, ref) in enumerate(results):
        np.testing.assert_allclose(result, ref, rtol=rtol, atol=atol, err_msg=f"rank {rank}")
