"""Speed of the CPU simulator: the RMSNorm example (flowdsl/examples/rmsnorm_lsa.py) at 4 ranks,
and the GIN MoE example (flowdsl/examples/moe_gin.py) at 2 nodes x 4 ranks.

Prints wall time, scheduler steps (a step = one simulated thread running from one
synchronisation/spin point to the next), simulated thread-steps per second and
simulated threads per second. Run: ``python benchmarks/sim_speed.py [nranks] [repeats]``
(RMSNorm) or ``python benchmarks/sim_speed.py moe [repeats]`` (MoE, ordered and reordered delivery).
"""

from __future__ import annotations

import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import flowdsl.sim as sim  # noqa: E402
from flowdsl.examples import moe_gin, rmsnorm_lsa  # noqa: E402


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


def moe(repeats: int = 3) -> None:
    """The MoE dispatch/combine example on 2 nodes x 4 ranks, under both GIN delivery orders."""
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    for delivery in ("ordered", "reordered"):
        best = None
        for _ in range(repeats):
            t0 = time.perf_counter()
            results = sim.spawn(moe_gin.run, nranks=8, nodes=2, seed=0, gin_delivery=delivery)
            wall = time.perf_counter() - t0
            for result, ref in results:
                np.testing.assert_allclose(result, ref, rtol=1e-6)
            if best is None or wall < best[0]:
                best = (wall, sim.last_stats())
        wall, stats = best
        print(f"moe_gin 2x4 ranks, 8 blocks x 32 threads, 12 tokens x 32 hidden, {delivery}: "
              f"{wall:.2f} s, {stats['threads']} threads, {stats['steps']} steps, "
              f"{stats['steps'] / wall:,.0f} steps/s (best of {repeats})")


if __name__ == "__main__":
    if sys.argv[1:2] == ["moe"]:
        moe(*(int(a) for a in sys.argv[2:3]))
    else:
        main(*(int(a) for a in sys.argv[1:3]))
