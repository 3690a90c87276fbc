"""Speed of the CPU simulator: the RMSNorm example (flowdsl/examples/rmsnorm_lsa.py) at 4 ranks.

Prints wall time, scheduler steps (a step = one simulated thread running from one
synchronisation/spin point to the next), simulated thread-steps per second and
simulated threads per second. Run: ``python benchmarks/sim_speed.py [nranks] [repeats]``.
"""

from __future__ import annotations

import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import flowdsl.sim as sim  # noqa: E402
from flowdsl.examples import rmsnorm_lsa  # noqa: E402


def main(nranks: int = 4, repeats: int = 3) -> None:
    best = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        results = sim.spawn(rmsnorm_lsa.run, nranks=nranks, seed=0)
        wall = time.perf_counter() - t0
        for result, ref in results:
            np.testing.assert_allclose(result, ref, rtol=1e-5, atol=1e-5)
        stats = sim.last_stats()
        if best is None or wall < best[0]:
            best = (wall, stats)
    wall, stats = best
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    print(f"rmsnorm_lsa: {nranks} ranks x {rmsnorm_lsa.THREADS} threads x 8 blocks, hidden 512 "
          f"(best of {repeats})")
    print(f"wall time:            {wall:.2f} s")
    print(f"simulated threads:    {stats['threads']}")
    print(f"scheduler steps:      {stats['steps']}")
    print(f"thread-steps per s:   {stats['steps'] / wall:,.0f}")
    print(f"threads per s:        {stats['threads'] / wall:,.0f}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
