"""Run the LSA examples once on one GPU and check them; meant to run under compute-sanitizer.

    compute-sanitizer --tool memcheck python3 scripts/sanitize_examples.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flowdsl  # noqa: E402
from flowdsl.examples import allgather_lsa, rmsnorm_lsa  # noqa: E402

with flowdsl.init() as comm:
    result, reference = rmsnorm_lsa.run(comm, tokens_per_rank=8, hidden=384, seed=3)
    np.testing.assert_allclose(result, reference, rtol=2e-5, atol=2e-5)
    result, reference = allgather_lsa.run(comm, count=5000, seed=4)
    np.testing.assert_array_equal(result, reference)
print("examples OK")
