"""Bounded waits compile: the spin loops read ``%globaltimer``, and everything still inlines.

The linked code is read back as PTX (nvJitLink links the same LTO-IR to PTX as to
the cubin): after LTO the support library's check is inlined into every wait loop,
so each loop brings its own ``%globaltimer`` read.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from numba import cuda, uint64

import flowdsl
from flowdsl import GinBackend, GinFenceLevel, MemoryOrder, RedOp, cft, coop, gin, lsa, mem
from flowdsl.collectives import _library
from flowdsl.lowering.target import linker_cuda_version
from flowdsl.lowering.types import devcomm_words
from flowdsl.runtime.support import abi_layout
from tests import planted_hangs

pytestmark = pytest.mark.compile


@flowdsl.kernel
def read_timer(out):
    out[0] = mem.globaltimer()


def test_globaltimer_is_the_ptx_special_register(linked_ptx):
    ptx = linked_ptx(read_timer, flowdsl.FlowKernel.argtypes_for(np.zeros(1, np.uint64), nccl="2.28.9"))
    assert "%globaltimer" in ptx


def test_the_device_communicator_carries_the_wait_record_after_nccl_s_struct():
    for nccl in ("2.28.9", "2.32.3"):
        (ty,) = flowdsl.FlowKernel.argtypes_for("devcomm", nccl=nccl)
        size = abi_layout(tuple(int(x) for x in nccl.split(".")))["dev_comm_size"]
        assert ty.nwords == devcomm_words(size) == -(-size // 8) + 1


def test_every_flow_wait_of_the_ring_all_reduce_polls_the_timer(linked_ptx):
    kernel = _library.kernel_for("ring", "all_reduce", RedOp.SUM, gin_peers=False, ll128=True)
    ptx = linked_ptx(kernel, _library._argtypes("float32", "2.28.9"))
    # credit and ready (SIMPLE), the LL line and the LL128 flag: four loops, each with its check
    assert ptx.count("%globaltimer") >= 4, ptx.count("%globaltimer")


def test_the_one_shot_all_reduce_polls_the_timer(linked_ptx):
    kernel = _library.kernel_for("one_shot", "all_reduce", RedOp.SUM, gin_peers=False)
    ptx = linked_ptx(kernel, _library._argtypes("float32", "2.28.9"))
    assert "%globaltimer" in ptx


def test_a_kernel_s_own_loop_with_wait_poll_compiles_and_inlines(linked_ptx):
    argtypes = flowdsl.FlowKernel.argtypes_for("devcomm", ("window", np.uint64), nccl="2.28.9")
    assert "%globaltimer" in linked_ptx(planted_hangs.wait_for_next, argtypes)


@flowdsl.kernel
def barriers_and_signals(comm, flags):
    cta = coop.cta()
    lsa.barrier(comm, cta, 0).sync(MemoryOrder.ACQ_REL)
    ctx = gin.context(comm, 0)
    gin.wait_signal(ctx, cta, 0, uint64(flags[0]))
    gin.wait_counter(ctx, cta, 0, uint64(flags[1]))
    gin.rail_barrier(ctx, cta, 0).sync(MemoryOrder.ACQ_REL, GinFenceLevel.NONE)  # NCCL 2.28's only level
    gin.hybrid_barrier(ctx, cta, 0).sync(MemoryOrder.ACQ_REL, GinFenceLevel.NONE)


@pytest.mark.parametrize("nccl", ["2.28.9", "2.32.3"])
def test_support_library_waits_poll_the_timer(linked_ptx, nccl):
    argtypes = flowdsl.FlowKernel.argtypes_for("devcomm", np.zeros(2, np.uint64), nccl=nccl)
    ptx = linked_ptx(barriers_and_signals, argtypes, nccl=nccl)
    # LSA barrier, signal, counter, the GIN barrier, the hybrid barrier's LSA and GIN stages: on
    # every release flowdsl's own loops, none of NCCL's timeout forms (which count clock64 cycles)
    assert ptx.count("%globaltimer") >= 6, ptx.count("%globaltimer")
    assert "%clock64" not in ptx


@flowdsl.kernel
def rail_barrier(comm):
    gin.rail_barrier(gin.context(comm, 0), coop.cta(), 0).sync(MemoryOrder.ACQ_REL, GinFenceLevel.NONE)


@flowdsl.kernel
def hybrid_barrier(comm):
    gin.hybrid_barrier(gin.context(comm, 0), coop.cta(), 0).sync(MemoryOrder.ACQ_REL, GinFenceLevel.NONE)


#: NCCL's abort test (nccl::utility::testAbort), in its plain barrier form: a load every 10000 spins.
_NCCL_ABORT_TEST = re.compile(r"\b(9999|10000)\b")


@pytest.mark.parametrize("backend", list(GinBackend), ids=lambda b: b.option)
@pytest.mark.parametrize("kernel,loops", [(rail_barrier, 1), (hybrid_barrier, 2)], ids=["rail", "hybrid"])
def test_gin_barriers_of_nccl_2_32_compile_once_with_the_wait_check(linked_ptx, kernel, loops, backend):
    """One form of each barrier: flowdsl's bounded loop (one wait check, so one %globaltimer, per
    stage), neither NCCL's timeout form (clock64) nor its plain one (the abort flag every 10000 spins)."""
    ptx = linked_ptx(kernel, flowdsl.FlowKernel.argtypes_for("devcomm", nccl="2.32.3"), nccl="2.32.3",
                     gin_backend=backend)
    assert ptx.count("%globaltimer") == loops, ptx.count("%globaltimer")
    assert "%clock64" not in ptx
    assert not _NCCL_ABORT_TEST.search(ptx)


@flowdsl.kernel
def cft_waits(comm, counted):
    state = cuda.shared.array(4, uint64, alignment=16)
    s = cft.session(comm, coop.warp(), state)
    cft.wait_counted(s, counted, 8, 64)
    cft.close(s)
    cft.barrier(comm, coop.cta(), 0).sync(MemoryOrder.ACQ_REL)
    bar = cft.barrier(comm, coop.warp(), 0)
    bar.arrive(MemoryOrder.RELEASE)
    bar.wait(MemoryOrder.ACQUIRE)


@pytest.mark.skipif(linker_cuda_version() < (13, 3), reason="linking CFT needs nvJitLink >= 13.3 (CUDA 13.3 LTO-IR)")
def test_cft_waits_for_sm_100_link_with_the_wait_check(linked_ptx):
    ptx = linked_ptx(cft_waits, flowdsl.FlowKernel.argtypes_for("devcomm", ("window", np.uint64), nccl="2.32.3"),
                     nccl="2.32.3", arch="sm_100")
    # wait_counted, the sync's wait and the wait of its own: flowdsl's loops, not NCCL's (which
    # watch only NCCL's abort flag, every 10000 spins)
    assert ptx.count("%globaltimer") >= 3, ptx.count("%globaltimer")
    assert not _NCCL_ABORT_TEST.search(ptx)
