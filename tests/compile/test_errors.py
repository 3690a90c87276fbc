"""User mistakes give readable errors that name the problem and the fix (CPU, no GPU needed)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from numba.core import types
from numba.core.errors import TypingError

import flowdsl
from flowdsl import MemoryOrder, ThreadScope, coop, lsa, mem

pytestmark = pytest.mark.compile


def compile_for(fn, *args, nccl="2.28.9", arch="sm_90"):
    kernel = flowdsl.kernel(fn)
    return kernel.compile(flowdsl.FlowKernel.argtypes_for(*args, nccl=nccl), arch=arch, nccl=nccl)


def test_barrier_needs_a_device_communicator():
    def k(win, n):
        lsa.barrier(win, coop.cta(), 0).sync(MemoryOrder.ACQUIRE)

    with pytest.raises(TypingError, match=r"flowdsl.lsa.barrier requires a device communicator, got Window"):
        compile_for(k, ("window", np.float32), 1)


def test_barrier_needs_a_coop():
    def k(comm, n):
        lsa.barrier(comm, n, 0).sync(MemoryOrder.ACQUIRE)

    with pytest.raises(TypingError, match=r"flowdsl.lsa.barrier requires a coop .*got int64"):
        compile_for(k, "devcomm", 1)


def test_view_of_a_non_window():
    def k(arr):
        lsa.local_view(arr)[0] = 1

    with pytest.raises(TypingError, match=r"flowdsl.lsa.local_view requires a window \(from comm.register"):
        compile_for(k, np.zeros(4, np.float32))


def test_view_with_a_bad_dtype():
    def k(win):
        lsa.local_view(win, dtype="float32")[0] = 1

    with pytest.raises(TypingError, match=r"flowdsl.lsa.local_view requires dtype to be a numba or NumPy "
                                          r"scalar type"):
        compile_for(k, ("window", np.float32))


def test_store_vec_of_the_wrong_width():
    def k(out):
        mem.store_vec(out, 0, (1.0, 2.0))

    with pytest.raises(TypingError, match=r"flowdsl.mem.store_vec requires a tuple of 4 float32 values"):
        compile_for(k, np.zeros(8, np.float32))


def test_primitives_called_from_host_code():
    # (once flowdsl.sim is imported, the simulator words the same refusal its own way)
    with pytest.raises(flowdsl.DeviceOnlyError, match=r"flowdsl.coop.cta\(\) is a device function: call it "
                                                      r"inside a"):
        coop.cta()


def test_kernel_called_without_a_launch_configuration():
    @flowdsl.kernel
    def k(out):
        out[cuda.threadIdx.x] = 1

    with pytest.raises(flowdsl.UsageError, match=r"the launch configuration was not specified. Launch it with "
                                                 r"k\[grid, block\]"):  # numba-cuda's words, then the fix
        k(np.zeros(4))
    with pytest.raises(flowdsl.UsageError, match=r"the block must be a positive int"):
        k[1, -32]
    with pytest.raises(TypeError, match=r"griddim must be a sequence of integers, got \[2.0\]"):  # as numba's
        k[2.0, 32]


def test_feature_gates_name_feature_version_and_arch():
    """A primitive newer than the target's NCCL, or than its arch, fails at compile time."""
    from numba.cuda.extending import overload

    from flowdsl._stubs import PRIMITIVES, primitive
    from flowdsl.lowering.target import require

    @primitive
    def needs_2_32():
        """A stand-in for a primitive of NCCL 2.32 (gin.get) and sm_100 (cft)."""

    del PRIMITIVES[needs_2_32.__flowdsl_primitive__]  # a test-only primitive: not part of the surface

    @overload(needs_2_32)
    def _typer():
        require("flowdsl.gin.get", nccl=(2, 32, 0))
        require("flowdsl.cft.put", min_cc=(10, 0))
        return lambda: None

    def k(out):
        needs_2_32()

    with pytest.raises(TypingError, match=r"flowdsl.gin.get requires NCCL >= 2.32.0, but this kernel is compiled "
                                          r"for NCCL 2.28.9. Install nvidia-nccl-cu13>=2.32.0"):
        compile_for(k, np.zeros(1, np.int32), nccl="2.28.9", arch="sm_100")
    with pytest.raises(TypingError, match=r"flowdsl.cft.put requires sm_100 or newer, but this kernel is "
                                          r"compiled for sm_90"):
        compile_for(k, np.zeros(1, np.int32), nccl="2.32.3", arch="sm_90")
    compile_for(k, np.zeros(1, np.int32), nccl="2.32.3", arch="sm_100")


def test_argtypes_for_rejects_unknown_values():
    with pytest.raises(flowdsl.UsageError, match=r"Cannot make the kernel argument type of object <object object "
                                                 r"at .*Cannot determine Numba type.*Pass a NumPy array"):
        flowdsl.FlowKernel.argtypes_for(object())


def test_argument_types_of_another_nccl_release_are_refused_naming_both():
    """A device communicator's layout is its NCCL release's: argument types made for 2.28.9 do not
    compile for 2.32.3 (they used to, silently, with another release's support build linked in)."""
    def k(comm, out):
        out[0] = 1

    kernel = flowdsl.kernel(k)
    old = flowdsl.FlowKernel.argtypes_for("devcomm", np.zeros(1, np.int32), nccl="2.28.9")
    with pytest.raises(flowdsl.UsageError, match=r"Cannot compile k: argument 0 is a device communicator of NCCL "
                                                 r"2\.28\.9, but the kernel is compiled for NCCL 2\.32\.3 .*"
                                                 r"argtypes_for\(\.\.\., nccl=\"2\.32\.3\"\), or compile with "
                                                 r"nccl=\"2\.28\.9\""):
        kernel.compile(old, arch="sm_90", nccl="2.32.3")


def test_a_typing_refusal_is_a_flowdsl_error_naming_the_kernel():
    def k(win, n):
        lsa.barrier(win, coop.cta(), 0).sync(MemoryOrder.ACQUIRE)

    with pytest.raises(flowdsl.KernelTypingError) as caught:
        compile_for(k, ("window", np.float32), 1)
    assert isinstance(caught.value, flowdsl.FlowDSLError) and isinstance(caught.value, TypingError)
    # numba's words (the primitive's refusal) and where the kernel is
    assert "flowdsl.lsa.barrier requires a device communicator, got Window" in str(caught.value)
    assert "in kernel test_a_typing_refusal_is_a_flowdsl_error_naming_the_kernel.<locals>.k (" in \
        str(caught.value) and "test_errors.py:" in str(caught.value)
    assert isinstance(caught.value.__cause__, TypingError) and type(caught.value.__cause__) is not type(caught.value)


def test_a_typing_refusal_leads_with_flowdsls_specific_words_and_the_kernels_line():
    """numba types a call with and without its literal arguments and reports both refusals, the general one
    ("a compile-time constant") first, and numba-cuda names no line: the error leads with the refusal that
    names the mistake and the kernel's line of the call, numba's report after."""
    def k(win, n):
        x = n + 1
        mem.fence(MemoryOrder.RELAXED, ThreadScope.SYSTEM)  # the mistake: a fence must order something
        return x

    with pytest.raises(flowdsl.KernelTypingError) as caught:
        compile_for(k, ("window", np.float32), 1)
    first, second = str(caught.value).splitlines()[:2]
    assert first == ("flowdsl.mem.fence requires order ACQUIRE, RELEASE, ACQ_REL, SEQ_CST, got RELAXED. Pass one of "
                     "flowdsl.MemoryOrder.ACQUIRE, RELEASE, ACQ_REL, SEQ_CST (the call is flowdsl.mem.fence(order, "
                     "scope))"), first  # the simulator's words too
    line = k.__code__.co_firstlineno + 2
    assert second == f"  at test_errors.py:{line} in kernel {k.__qualname__}", second
    assert "numba's report:\nNo implementation of function" in str(caught.value)


def test_a_typing_refusal_names_the_line_numba_was_typing_and_leads_with_a_checks_own_words():
    """numba-cuda's report of a call it cannot type names no line: the error names the statement's line (from
    numba's type inference), and a refusal made deep inside a primitive (a Flow processor over a window that
    flow.staging did not make) comes first, not numba's "Cannot type the call of processor"."""
    from flowdsl import flow

    def stores_an_array_into_an_element(a, b):
        x = 1
        a[0] = b  # the mistake
        return x

    with pytest.raises(flowdsl.KernelTypingError) as caught:
        flowdsl.kernel(stores_an_array_into_an_element).compile(
            flowdsl.FlowKernel.argtypes_for(np.zeros(4, np.float32), np.zeros(4, np.float32), nccl="2.32.3"),
            arch="sm_90", nccl="2.32.3")
    line = stores_an_array_into_an_element.__code__.co_firstlineno + 2
    assert str(caught.value).splitlines()[:2] == [
        "Cannot type the call of setitem with these arguments",
        f"  at test_errors.py:{line} in kernel {stores_an_array_into_an_element.__qualname__}"], str(caught.value)

    def processor_over_a_plain_window(comm, stage, x):
        proc = flow.processor(comm, stage, None, 1, 4, 64, 0)
        x[0] = proc.channel

    with pytest.raises(flowdsl.KernelTypingError) as caught:
        flowdsl.kernel(processor_over_a_plain_window).compile(
            flowdsl.FlowKernel.argtypes_for("devcomm", ("window", np.uint64), np.zeros(4, np.float32),
                                            nccl="2.32.3"), arch="sm_90", nccl="2.32.3")
    first, second = str(caught.value).splitlines()[:2]
    assert first.startswith("Cannot build a Flow processor over Window(uint64): its staging window must come from "
                            "flowdsl.flow.staging(comm, config)"), first
    assert second.startswith("  at test_errors.py:"), second


def test_a_numpy_allocation_in_a_kernel_is_refused_in_the_same_words_on_both_paths():
    import flowdsl.sim

    def allocates(out):
        tmp = np.zeros(4, np.float32)
        out[0] = tmp[0]

    kernel = flowdsl.kernel(allocates)
    with pytest.raises(flowdsl.KernelTypingError) as on_gpu:
        kernel.compile(flowdsl.FlowKernel.argtypes_for(np.zeros(4, np.float32), nccl="2.32.3"), arch="sm_90",
                       nccl="2.32.3")

    def main(comm):
        kernel[1, 1](comm.alloc(4, np.float32))
        comm.synchronize()
    with pytest.raises(flowdsl.KernelTypingError) as on_sim:
        flowdsl.sim.spawn(main, nranks=1)
    words = ("Cannot type the call of zeros in a kernel: numpy.zeros makes a new array, which a GPU kernel cannot "
             "allocate")
    assert str(on_gpu.value).startswith(words) and str(on_sim.value).startswith(words)
    assert f"at test_errors.py:{allocates.__code__.co_firstlineno + 1}" in str(on_gpu.value)


def test_an_undefined_name_is_numba_cudas_typing_error_and_a_flowdsl_error_on_both_paths():
    """numba-cuda raises its own TypingError class (numba.cuda.core.errors) for some refusals and numba's for
    others; its users catch either. flowdsl's is both, and the simulator refuses the same kernel, before the
    launch, with the same class and words."""
    import numba.cuda.core.errors as numba_cuda_errors

    import flowdsl.sim

    def k(out):
        out[0] = no_such_name + 1  # noqa: F821 - the mistake under test

    kernel = flowdsl.kernel(k)
    with pytest.raises(flowdsl.KernelTypingError) as caught:
        kernel.compile(flowdsl.FlowKernel.argtypes_for(np.zeros(1, np.float32), nccl="2.28.9"), arch="sm_90",
                       nccl="2.28.9")
    for cls in (TypingError, numba_cuda_errors.TypingError, flowdsl.FlowDSLError, flowdsl.UsageError):
        assert isinstance(caught.value, cls), cls
    assert "NameError: name 'no_such_name' is not defined" in str(caught.value)

    def main(comm):
        kernel[1, 1](comm.alloc(1, np.float32))
        comm.synchronize()
    with pytest.raises(flowdsl.KernelTypingError) as on_sim:
        flowdsl.sim.spawn(main, nranks=1)
    assert isinstance(on_sim.value, numba_cuda_errors.TypingError)
    assert "NameError: name 'no_such_name' is not defined" in str(on_sim.value) and "test_errors.py:" in str(on_sim.value)


def test_without_a_gpu_init_says_so():
    from tests.conftest import gpu_count

    if gpu_count():
        pytest.skip("this machine has a GPU")
    with pytest.raises(flowdsl.NoDeviceError, match=r"Cannot initialise a flowdsl communicator: no CUDA GPU is "
                                                    r"available.*flowdsl.sim.spawn"):
        flowdsl.init()


def test_types_are_exposed():
    assert flowdsl.FlowKernel.argtypes_for(np.float32(1), 3) == (types.float32, types.int64)


def test_requirements_are_derived_from_the_kernel():
    from flowdsl import gin

    @flowdsl.kernel
    def uses_all(comm, win):
        lsa.barrier(comm, coop.cta(), cuda.blockIdx.x).sync(MemoryOrder.ACQUIRE)
        ctx = gin.context(comm)
        gin.rail_barrier(ctx, coop.cta(), cuda.blockIdx.x).sync(MemoryOrder.ACQUIRE)
        gin.hybrid_barrier(ctx, coop.cta(), cuda.blockIdx.x).sync(MemoryOrder.ACQUIRE)

    @flowdsl.kernel
    def lsa_only(comm, win):
        lsa.barrier(comm, coop.warp(), 0).sync(MemoryOrder.ACQUIRE)

    assert uses_all.requirements((4, 2)) == {"lsa_barrier_count": 8, "rail_gin_barrier_count": 8,
                                             "barrier_count": 8,  # and GIN, which NCCL >= 2.29 enables when asked
                                             "gin_connection_type": flowdsl.GinConnectionType.FULL}
    assert lsa_only.requirements(16) == {"lsa_barrier_count": 16}


def test_strong_signals_are_refused_on_a_weak_only_backend():
    from types import SimpleNamespace

    from flowdsl._launch import check_features
    from flowdsl.runtime.memory import GIN_BACKENDS

    efa = SimpleNamespace(gin_backend=GIN_BACKENDS[5])
    proxy = SimpleNamespace(gin_backend=GIN_BACKENDS[2])
    check_features("k", frozenset({"gin.strong_signals"}), (proxy, 3))
    check_features("k", frozenset(), (efa,))
    with pytest.raises(flowdsl.UsageError, match=r"Cannot launch k: it issues strong GIN signals .* backend "
                                                 r"EFA_GDA offers weak signals only"):
        check_features("k", frozenset({"gin.strong_signals"}), (efa, 3))
