"""What ``import flowdsl`` and a simulator run load: no compiler, no GPU driver or stack.

Each case runs in a fresh interpreter and reads its ``sys.modules`` (and, on Linux, the
shared libraries mapped into it) afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.sim

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Shared libraries a simulator run must not load: the compilers, the driver, NCCL. (The CUDA
#: runtime, libcudart, comes with ``import numba.cuda``, which kernels written for numba-cuda do.)
_LIBRARIES = ("libnvJitLink", "libnvvm", "libcuda.so", "libnccl")

_REPORT = """
import json, sys
mapped = []
if sys.platform.startswith("linux"):
    with open("/proc/self/maps") as maps:
        mapped = sorted({line.split()[-1].rsplit("/", 1)[-1] for line in maps
                         if any(lib in line for lib in %r)})
print(json.dumps({"modules": sorted(sys.modules), "libraries": mapped}))
""" % (_LIBRARIES,)


def _fresh(code: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", code + _REPORT], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _loaded(modules, *roots) -> list[str]:
    return [m for m in modules if m.split(".")[0] in roots]


def test_import_flowdsl_imports_neither_numba_nor_a_cuda_library():
    found = _fresh("import flowdsl")
    assert not _loaded(found["modules"], "numba", "numba_cuda", "llvmlite", "cuda", "cupy", "nccl", "torch")
    assert not [m for m in found["modules"] if m.startswith(("flowdsl.lowering", "flowdsl._kernel"))]
    assert found["libraries"] == []


def test_names_that_need_numba_resolve_at_first_use():
    code = ("import sys, flowdsl\n"
            "assert 'numba' not in sys.modules\n"
            "from numba.core.errors import NumbaTypeError\n"
            "from flowdsl.lowering.target import FeatureUnavailableError\n"
            "from flowdsl import _devices, _kernel\n"
            "assert flowdsl.kernel is _kernel.kernel and flowdsl.device is _devices.device is _kernel.device\n"
            "assert flowdsl.FlowKernel is _kernel.FlowKernel\n"
            "assert flowdsl.FeatureUnavailableError is FeatureUnavailableError\n"
            "assert issubclass(FeatureUnavailableError, NumbaTypeError)\n"
            "from flowdsl.errors import FeatureUnavailableError as again\n"
            "assert again is FeatureUnavailableError\n"
            "assert {'kernel', 'FlowKernel', 'FeatureUnavailableError'} <= set(dir(flowdsl))\n"
            "assert not [m for m in sys.modules if m.startswith('flowdsl.lowering.') and m != 'flowdsl.lowering.target']\n")
    _fresh(code)


def test_a_simulator_run_binds_no_compiler_and_loads_no_gpu_library():
    """Two examples on 3 simulated ranks, right against NumPy: an LSA all-gather, and a Flow all-reduce
    fused with a ``@flowdsl.device`` bias + GELU. With numba.cuda (the examples' ``from numba import
    cuda``) but not flowdsl's lowering, CuPy, nccl4py, the compilers or the driver."""
    code = ("import numpy as np\n"
            "import flowdsl, flowdsl.sim\n"
            "from flowdsl.examples import allgather_lsa, allreduce_bias_gelu\n"
            "out = flowdsl.sim.spawn(lambda comm: allgather_lsa.run(comm, count=96, seed=3), nranks=3)\n"
            "assert len(out) == 3 and all(np.array_equal(r, ref) for r, ref in out)\n"
            "out = flowdsl.sim.spawn(lambda comm: allreduce_bias_gelu.run(comm, count=300), nranks=3)\n"
            "assert len(out) == 3 and all(np.allclose(r, ref, rtol=1e-5, atol=1e-5) for r, ref in out)\n")
    found = _fresh(code)
    assert not _loaded(found["modules"], "cupy", "nccl", "torch")
    # The simulator imports nothing of flowdsl's compiler layer (tests/compile/test_layers.py reads the imports).
    assert [m for m in found["modules"] if m.startswith("flowdsl.lowering")] == []
    assert found["libraries"] == []


def test_nccl_buffer_calls_do_not_import_torch(monkeypatch):
    """nccl4py resolves buffers through its PyTorch interop first; while torch is not imported,
    flowdsl hides that interop around its nccl4py calls (importing torch costs seconds), and
    leaves it alone once torch is imported (tensors must then resolve)."""
    import importlib

    from flowdsl.runtime.nccl import without_torch_probe

    interop = "nccl.core.interop.torch"
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.delitem(sys.modules, interop, raising=False)
    with without_torch_probe():
        with pytest.raises(ImportError):
            importlib.import_module(interop)
    assert interop not in sys.modules, "the hidden interop outlived the call"

    fake_torch, fake_interop = type(sys)("torch"), type(sys)(interop)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setitem(sys.modules, interop, fake_interop)
    with without_torch_probe():
        assert importlib.import_module(interop) is fake_interop
    assert sys.modules[interop] is fake_interop
