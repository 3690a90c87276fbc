"""Run the examples once on one GPU and check them; meant to run under compute-sanitizer.

The LSA examples, Flow's three protocols through a real connection (a rank sending
to itself), and the ring and tree all-reduce.

    compute-sanitizer --tool memcheck python3 scripts/sanitize_examples.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flowdsl  # noqa: E402
from flowdsl import Protocol, collectives  # noqa: E402
from flowdsl.collectives import check  # noqa: E402
from flowdsl.examples import allgather_lsa, flow_loopback, rmsnorm_lsa  # noqa: E402

with flowdsl.init() as comm:
    result, reference = rmsnorm_lsa.run(comm, tokens_per_rank=8, hidden=384, seed=3)
    np.testing.assert_allclose(result, reference, rtol=2e-5, atol=2e-5)
    result, reference = allgather_lsa.run(comm, count=5000, seed=4)
    np.testing.assert_array_equal(result, reference)
    for protocol in Protocol:
        result, reference = flow_loopback.run(comm, protocol, "float32", "sum", n=20011, slot_bytes=2048)
        check.compare(result, reference, "float32", 2, f"loopback {protocol.name}")
    x = comm.alloc(30011, np.float32)
    x.set(np.arange(30011, dtype=np.float32))
    for algorithm in ("ring", "tree"):
        y = comm.alloc(30011, np.float32)
        collectives.all_reduce(comm, x, y, algorithm=algorithm)
        comm.synchronize()
        np.testing.assert_array_equal(y.get(), x.get())
print("examples OK")
