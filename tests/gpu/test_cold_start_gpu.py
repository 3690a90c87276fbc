"""A fresh process's first collective on a real GPU (one rank): compiled with a cold cache, then, in
another fresh process, loaded from the disk cache without binding numba-cuda's compiler.

Each call's output is poisoned first and compared with NumPy; the seconds each first call took
are printed (``pytest -s``; ``benchmarks/cold_compile.py --gpu`` measures them properly).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_FIRST_CALLS = """
import json, sys, time
import numpy as np
start = time.perf_counter()
import flowdsl
comm = flowdsl.init()
from flowdsl import RedOp, collectives
from flowdsl.collectives import _library
rng = np.random.default_rng(11)
n = 4099
x = rng.standard_normal(n).astype(np.float32)
src, dst = comm.alloc(n, "float32"), comm.alloc(n, "float32")
src.set(x)
seconds = {}
for algorithm in ("ring", "tree"):
    dst.fill(np.nan)
    comm.synchronize()
    began = time.perf_counter()
    collectives.all_reduce(comm, src, dst, op="sum", algorithm=algorithm)
    comm.synchronize()
    seconds[algorithm] = time.perf_counter() - began
    assert np.array_equal(dst.get(), x), algorithm  # one rank: the sum is the input
    seconds[algorithm + " source"] = _library.kernel_for(algorithm, "all_reduce", RedOp.SUM).last_build["source"]
comm.close()
seconds["bound numba-cuda's compiler"] = "flowdsl.lowering.bindings" in sys.modules
seconds["imported torch"] = "torch" in sys.modules
print(json.dumps(seconds))
"""


def _fresh(cache) -> dict:
    env = dict(os.environ, FLOWDSL_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", _FIRST_CALLS], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_first_collectives_compile_cold_then_load_warm_without_the_compiler(tmp_path):
    cold = _fresh(tmp_path)
    assert cold["ring source"] == cold["tree source"] == "compiled", cold
    assert cold["bound numba-cuda's compiler"] is True
    warm = _fresh(tmp_path)
    assert warm["ring source"] == warm["tree source"] == "disk", warm
    assert warm["bound numba-cuda's compiler"] is False, "a kernel loaded from disk bound the compiler"
    assert cold["imported torch"] is warm["imported torch"] is False, "a collective imported PyTorch (seconds)"
    print(f"\nfirst all_reduce, cold cache: ring {cold['ring']:.2f} s, tree {cold['tree']:.2f} s; "
          f"warm cache: ring {warm['ring']:.3f} s, tree {warm['tree']:.3f} s")
