"""``debug=True`` (and ``opt=``), numba-cuda's options, through ``@flowdsl.kernel``: debug information, and a kernel
that records the first exception one of its threads raises for the launch to raise on the host. No GPU: what the
compile and link make (the GPU's launch is tested in tests/gpu/test_numba_features_gpu.py)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from numba import cuda
from numba.cuda.core import config
from numba.cuda.core.errors import NumbaInvalidConfigWarning

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
    """numba-cuda's cuda.jit rules, in its warning class, when the decorator is made (numba-cuda's test_warning and
    test_lineinfo): debug with opt (given, or numba's default opt), debug with lineinfo; neither for debug without
    opt; a device function likewise."""
    with pytest.warns(NumbaInvalidConfigWarning, match="debug=True with opt=True is not supported by CUDA"):
        flowdsl.kernel(_raising, debug=True)
    with pytest.warns(NumbaInvalidConfigWarning, match="debug=True with opt=True is not supported by CUDA"):
        flowdsl.kernel(debug=True, opt=True)  # the decorator alone, as cuda.jit(debug=True, opt=True)
    with pytest.warns(NumbaInvalidConfigWarning, match="debug and lineinfo are mutually exclusive"):
        flowdsl.kernel(debug=True, opt=False, lineinfo=True)
    with pytest.warns(NumbaInvalidConfigWarning, match="not supported by CUDA"):
        flowdsl.device(debug=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flowdsl.kernel(_raising, debug=True, opt=False)
        flowdsl.kernel(_raising)


def test_debug_and_opt_default_to_numbas_configuration(monkeypatch):
    """None takes numba's NUMBA_CUDA_DEBUGINFO and NUMBA_OPT as numba-cuda's cuda.jit does."""
    monkeypatch.setattr(config, "CUDA_DEBUGINFO_DEFAULT", 1)
    monkeypatch.setattr(config, "OPT", config._OptLevel(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        k = flowdsl.kernel(_raising)
    assert (k.debug, k.opt) == (True, False)
    monkeypatch.setattr(config, "OPT", config._OptLevel(3))
    with pytest.warns(NumbaInvalidConfigWarning, match="not supported by CUDA"):
        assert flowdsl.kernel(_raising).debug


def test_a_debug_kernel_is_compiled_in_each_process_not_kept_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWDSL_CACHE_DIR", str(tmp_path))
    k = flowdsl.kernel(_raising, debug=True, opt=False)
    target = Target(parse_version(NCCL), "sm_90")
    assert k.build(_args(), target) == "compiled"
    assert not k.cached(_args(), target)
    assert not list(tmp_path.rglob("*.cubin"))


def _plus_one_and_a_half(a, b):
    i = cuda.grid(1)
    b[i] = a[i] + 1.5


@pytest.mark.parametrize(("flag", "printed"), [("DUMP_IR", "--IR DUMP: _plus_one_and_a_half--"),
                                               ("DUMP_LLVM", '!"kernel", i32 1'),
                                               ("DUMP_ASSEMBLY", "--ASSEMBLY _plus_one_and_a_half")])
def test_numbas_dumps_print_for_each_compile(flag, printed, capsys, monkeypatch, tmp_path):
    """numba-cuda's NUMBA_DUMP_* flags print what a kernel's compile makes (numba-cuda's test_debug), every time
    it is asked: the kernel is compiled in the process then, never taken from the disk cache, where a compile
    without the flag stored it (the assembly is flowdsl's print of the PTX, as flowdsl links the kernel itself)."""
    from numba import float64

    monkeypatch.setenv("FLOWDSL_CACHE_DIR", str(tmp_path))
    args = (float64[::1], float64[::1])
    flowdsl.kernel(args)(_plus_one_and_a_half).compile(args, arch="sm_90", nccl=NCCL)  # now on disk
    capsys.readouterr()
    monkeypatch.setattr(config, flag, 1)
    flowdsl.kernel(args)(_plus_one_and_a_half).compile(args, arch="sm_90", nccl=NCCL)
    out = capsys.readouterr().out
    assert printed in out


def _plus_one(x):
    return x + 1


@pytest.mark.parametrize(("kernel_debug", "f1_debug", "f2_debug"),
                         [(k, a, b) for k in (True, False) for a in (True, False) for b in (True, False)])
def test_debug_kernels_and_debug_device_functions_link_in_any_mix(kernel_debug, f1_debug, f2_debug):
    """numba-cuda's test_chained_device_function: a kernel and the device functions it calls, each with or without
    debug information, compile and link beside the support build (code with debug information goes as PTX,
    module by module under the kernel's -g, as NVVM links no such modules and nvJitLink no such LTO-IR)."""
    from numba import int32

    f2 = flowdsl.device(_plus_one, debug=f2_debug, opt=False)

    def f1(x, y):
        return x - f2(y)

    f1 = flowdsl.device(f1, debug=f1_debug, opt=False)

    def chained(x, y):
        f1(x, y)
        f2(x)

    k = flowdsl.kernel((int32, int32), debug=kernel_debug, opt=False)(chained)
    compiled = k.compile((int32, int32), arch="sm_90", nccl=NCCL)
    assert compiled.cubin


def test_the_collectives_are_compiled_optimised_whatever_numbas_configuration(monkeypatch):
    """NUMBA_OPT=0 and NUMBA_CUDA_DEBUGINFO=1 default a user's kernels, as numba-cuda's; the library's kernels
    keep optimisation and no debug information."""
    from flowdsl.collectives import programs

    monkeypatch.setattr(config, "CUDA_DEBUGINFO_DEFAULT", 1)
    monkeypatch.setattr(config, "OPT", config._OptLevel(0))
    factory = programs.PROGRAMS[("ring", "all_gather")]
    factory.cache_clear()
    try:
        kernel = factory()
        assert (kernel.debug, kernel.opt) == (False, True)
    finally:
        factory.cache_clear()  # none made under the patched configuration outlives the test
