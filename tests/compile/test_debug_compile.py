"""``debug=True`` (and ``opt=``), numba-cuda's options, through ``@flowdsl.kernel``: debug information, and a kernel
that records the first exception one of its threads raises for the launch to raise on the host. No GPU: what the
compile and link make (the GPU's launch is tested in tests/gpu/test_numba_features_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from numba.core.errors import NumbaInvalidConfigWarning

import flowdsl
from flowdsl import MemoryOrder, coop, lsa
from flowdsl.lowering.elf import function_symbols, object_symbols
from flowdsl.lowering.target import Target, parse_version

pytestmark = pytest.mark.compile

NCCL = "2.28.9"


class IndexTooFar(Exception):
    pass


def _raising(a):
    i = cuda.grid(1)
    if i >= a.size:
        raise IndexTooFar("one thread past the array")
    a[i] = i


def _args():
    return flowdsl.FlowKernel.argtypes_for(np.zeros(8, np.float32), nccl=NCCL)


def test_a_debug_kernel_records_its_exceptions_and_carries_debug_information():
    k = flowdsl.kernel(_raising, debug=True, opt=False)
    compiled = k.compile(_args(), arch="sm_90", nccl=NCCL)
    records = [s for s in object_symbols(compiled.cubin) if s.endswith("__")]
    assert {s.rsplit("E__", 1)[-1] if "E__" in s else s for s in records} >= {
        "errcode__", "tidx__", "tidy__", "tidz__", "ctaidx__", "ctaidy__", "ctaidz__"}, records
    (code, (cls, args, where)), = compiled.exceptions.items()
    assert code > 0 and cls is IndexTooFar and args == ("one thread past the array",)
    assert where[0] == "_raising" and where[2] == _raising.__code__.co_firstlineno + 3
    llvm = flowdsl.kernel(_raising, signature=_args(), debug=True, opt=False).inspect_llvm(_args())
    assert "!DISubprogram" in llvm and "!DILocalVariable" in llvm


def test_a_kernel_without_debug_records_nothing():
    compiled = flowdsl.kernel(_raising).compile(_args(), arch="sm_90", nccl=NCCL)
    assert not [s for s in object_symbols(compiled.cubin) if "__errcode__" in s]
    assert compiled.exceptions == {}


def test_a_debug_kernel_that_calls_the_support_library_links():
    """The kernel's own code goes to the link as PTX (nvJitLink's reader refuses NVVM's LTO-IR with debug
    information), beside the support build's LTO-IR."""
    @flowdsl.kernel(debug=True, opt=False)
    def scaled(comm, win, n):
        bar = lsa.barrier(comm, coop.cta(), cuda.blockIdx.x)
        bar.sync(MemoryOrder.RELAXED)
        v = lsa.local_view(win)
        i = cuda.grid(1)
        if i < n:
            v[i] = v[i] * 2.0
        bar.sync(MemoryOrder.RELAXED)

    args = flowdsl.FlowKernel.argtypes_for("devcomm", ("window", np.float32), 8, nccl=NCCL)
    compiled = scaled.compile(args, arch="sm_90", nccl=NCCL)
    assert [s for s in object_symbols(compiled.cubin) if "__errcode__" in s]
    defined = set(function_symbols(compiled.cubin))
    assert "flowdsl_lsa_barrier_sync__cta" in defined  # the support build's function, linked beside it
    assert set(function_symbols(compiled.cubin, defined_only=False)) - defined <= {"vprintf", "__assertfail"}  # the driver's


def test_debug_with_opt_warns_as_numba_cuda_does():
    with pytest.warns(NumbaInvalidConfigWarning, match="debug=True with opt=True is not supported by CUDA"):
        flowdsl.kernel(_raising, debug=True)


def test_a_debug_kernel_is_compiled_in_each_process_not_kept_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWDSL_CACHE_DIR", str(tmp_path))
    k = flowdsl.kernel(_raising, debug=True, opt=False)
    target = Target(parse_version(NCCL), "sm_90")
    assert k.build(_args(), target) == "compiled"
    assert not k.cached(_args(), target)
    assert not list(tmp_path.rglob("*.cubin"))
