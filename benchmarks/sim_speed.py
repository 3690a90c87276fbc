"""Speed of the CPU simulator, with data-race detection off and on, side by side in one run.

Workloads: the RMSNorm example (flowdsl/examples/rmsnorm_lsa.py) at 4 ranks, the GIN MoE example
(flowdsl/examples/moe_gin.py) at 2 nodes x 4 ranks under both delivery orders, Flow
(flowdsl/examples/flow_loopback.py: every protocol through a staged connection), and part of the
collectives' matrix (flowdsl.collectives.check: every program, float32, sum, at 4 ranks on one
node and on 2 nodes x 2 ranks, the simulator test's tiny staging). Each is run
``repeats`` times with detection off and on, interleaved (off, on, off, on, ...), and the best of
each is kept; both wall time and CPU time of the process are printed (the machine may be shared:
CPU time is the steadier of the two), with the cost of detection as on / off.

Run: ``python benchmarks/sim_speed.py [rmsnorm|moe|flow|collectives|all] [repeats]`` (default: all, 3).
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import flowdsl.sim as sim  # noqa: E402
from flowdsl import Protocol  # noqa: E402
from flowdsl.examples import flow_loopback, moe_gin, rmsnorm_lsa  # noqa: E402


def _rmsnorm(races):
    for result, ref in sim.spawn(rmsnorm_lsa.run, nranks=4, seed=0, races=races):
        np.testing.assert_allclose(result, ref, rtol=1e-5, atol=1e-5)


def _moe(delivery):
    def run(races):
        for result, ref in sim.spawn(moe_gin.run, nranks=8, nodes=2, seed=0, gin_delivery=delivery, races=races):
            np.testing.assert_allclose(result, ref, rtol=1e-6)
    return run


def _flow(races):
    for protocol in (Protocol.SIMPLE, Protocol.LL, Protocol.LL128):
        def main(comm, protocol=protocol):
            return flow_loopback.run(comm, protocol=protocol, n=2000, nslots=4, slot_bytes=512, threads=64)
        for result, ref in sim.spawn(main, nranks=1, seed=0, races=races):
            np.testing.assert_allclose(result, ref, rtol=1e-6)


def _collectives(nodes):
    from flowdsl import collectives as coll  # noqa: PLC0415
    from flowdsl.collectives import check  # noqa: PLC0415

    tiny = coll.FlowConfig(channels=2, nslots=2, slot_bytes=128, threads=64)

    def main(comm):
        return check.run_matrix(comm, check.cases(comm.nranks, counts=(37, 131), dtypes=("float32",), ops=("sum",),
                                                  protocols=(Protocol.SIMPLE, Protocol.LL, Protocol.LL128),
                                                  config=tiny, lsa_size=comm.lsa_size))

    def run(races):
        failures = [f for rank in sim.spawn(main, nranks=4, nodes=nodes, seed=1, races=races,
                                            gin_delivery="reordered") for f in rank]
        assert not failures, failures[:3]
    return run


WORKLOADS = {
    "rmsnorm": [("rmsnorm_lsa, 4 ranks x 8 blocks x 256 threads, hidden 512", _rmsnorm)],
    "moe": [(f"moe_gin, 2 nodes x 4 ranks, 8 blocks x 32 threads, {d}", _moe(d)) for d in ("ordered", "reordered")],
    "flow": [("flow_loopback, SIMPLE + LL + LL128, 2 blocks x 64 threads, 2000 float32", _flow)],
    "collectives": [(f"collectives matrix (float32, sum), 4 ranks on {n} node{'s' * (n > 1)}", _collectives(n))
                    for n in (1, 2)],
}


def measure(run, repeats):
    """Best (wall, cpu, steps) with detection off and on, runs interleaved."""
    best = {}
    for _ in range(repeats):
        for races in (False, True):
            w0, c0 = time.perf_counter(), time.process_time()
            run(races)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            old = best.get(races)
            if old is None or cpu < old[1]:
                best[races] = (wall, cpu, sim.last_stats().get("steps", 0))
    return best[False], best[True]


def main(which="all", repeats=3):
    names = list(WORKLOADS) if which == "all" else [which]
    print(f"{datetime.date.today()}  machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}; best of {repeats}, detection off/on interleaved")
    print("| workload | off: wall s | off: CPU s | on: wall s | on: CPU s | on / off (CPU) | on / off (wall) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in names:
        for label, run in WORKLOADS[name]:
            off, on = measure(run, repeats)
            print(f"| {label} | {off[0]:.2f} | {off[1]:.2f} | {on[0]:.2f} | {on[1]:.2f} | "
                  f"{on[1] / off[1]:.2f}x | {on[0] / off[0]:.2f}x |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "all", int(sys.argv[2]) if len(sys.argv) > 2 else 3)
