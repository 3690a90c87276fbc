"""Every GIN primitive compiles and links (sm_90, sm_100) against the support builds, with its gates."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from numba.core.errors import TypingError

import flowdsl
from flowdsl import GinFenceLevel, MemoryOrder, coop, gin, team

pytestmark = pytest.mark.compile


@flowdsl.kernel
def gin_legacy(comm, win, out):
    """Every GIN primitive of NCCL 2.28."""
    ctx = gin.context(comm, 0)
    ctx1 = gin.context(comm)
    world = team.world(comm)
    rail = team.rail(comm)
    peer = (comm.rank + 1) % comm.nranks
    gin.put(ctx, world, peer, win, 0, win, 64, 64)
    gin.put(ctx, world, peer, win, 0, win, 64, 64, remote=gin.signal_inc(0))
    gin.put(ctx, rail, 0, win, 0, win, 64, 64, remote=gin.signal_add(1, 5), local=gin.counter_inc(0),
            coop=coop.warp())
    gin.put(ctx1, world, peer, win, 0, win, 64, 64, local=gin.counter_inc(1), coop=coop.cta())
    gin.put_value(ctx, world, peer, win, 128, np.uint64(7), remote=gin.signal_inc(2))
    gin.put_value(ctx, world, peer, win, 136, np.float32(1.5))
    gin.signal(ctx, world, peer, gin.signal_add(3, 2), coop=coop.lanes(0xFF))
    gin.flush(ctx, coop.cta())
    gin.flush(ctx, coop.warp(), MemoryOrder.RELAXED)
    gin.wait_signal(ctx, coop.cta(), 0, 1)
    gin.wait_signal(ctx, coop.thread(), 1, 5, 32, MemoryOrder.ACQUIRE)
    out[0] = gin.read_signal(ctx, 2) + gin.read_signal(ctx, 3, 32, MemoryOrder.RELAXED)
    gin.wait_counter(ctx, coop.warp_span(0, 2, 3), 0, 1)
    out[1] = gin.read_counter(ctx, 1)
    out[2] = comm.gin_context_count
    gin.reset_signal(ctx, 0)
    gin.reset_counter(ctx, 0)
    # NCCL 2.28's barriers have fence level None (its Relaxed) only, and its sync requires it
    gin.rail_barrier(ctx, coop.cta(), cuda.blockIdx.x).sync(MemoryOrder.ACQ_REL, GinFenceLevel.NONE)
    bar = gin.hybrid_barrier(ctx, coop.cta(), cuda.blockIdx.x)
    bar.sync(MemoryOrder.ACQ_REL, fence=GinFenceLevel.NONE)
    bar.lsa_barrier().sync(MemoryOrder.ACQ_REL)  # its parts (ncclBarrierSession::lsaBarrier(), ::ginBarrier())
    bar.gin_barrier().sync(MemoryOrder.ACQUIRE, GinFenceLevel.NONE)


@flowdsl.kernel
def gin_2_32(comm, win, out):
    """The primitives of NCCL 2.32: strong/weak and VA signals, get (and NCCL 2.30's world GIN barrier)."""
    ctx = gin.context(comm, 1)
    world = team.world(comm)
    peer = (comm.rank + 1) % comm.nranks
    gin.put(ctx, world, peer, win, 0, win, 64, 64, remote=gin.strong_signal_inc(0))
    gin.put(ctx, world, peer, win, 0, win, 64, 64, remote=gin.weak_signal_inc(1))
    gin.put(ctx, world, peer, win, 0, win, 64, 64, remote=gin.strong_signal_add(2, 3))
    gin.put(ctx, world, peer, win, 0, win, 64, 64, remote=gin.weak_signal_add(3, 3), local=gin.counter_inc(0))
    gin.put(ctx, world, peer, win, 0, win, 64, 64, remote=gin.strong_va_signal_inc(win, 256))
    gin.put(ctx, world, peer, win, 0, win, 64, 64, remote=gin.weak_va_signal_inc(win, 264))
    gin.signal(ctx, world, peer, gin.strong_va_signal_add(win, 272, 4))
    gin.put_value(ctx, world, peer, win, 128, np.int32(-1), remote=gin.weak_va_signal_add(win, 280, 2))
    gin.get(ctx, world, peer, win, 0, win, 512, 64, coop=coop.warp())
    gin.flush(ctx, coop.warp())
    out[0] = gin.read_signal(ctx, 0)
    gin.world_barrier(ctx, coop.cta(), cuda.blockIdx.x).sync(MemoryOrder.ACQ_REL)  # NCCL 2.30's; 2.32's PUT_GET
    gin.world_barrier(ctx, coop.warp(), 0).sync(MemoryOrder.RELAXED, GinFenceLevel.GET)
    gin.rail_barrier(ctx, coop.cta(), 1).sync(MemoryOrder.ACQ_REL, fence=GinFenceLevel.PUT)
    bar = gin.hybrid_barrier(ctx, coop.cta(), cuda.blockIdx.x)
    bar.sync(MemoryOrder.ACQ_REL)  # PUT: over every GIN-connected rank where GIN reaches beyond the rail team
    bar.gin_barrier().sync(MemoryOrder.ACQUIRE, GinFenceLevel.PUT_GET)


ARGS = ("devcomm", ("window", np.uint64), np.zeros(4, np.uint64))


@pytest.mark.parametrize("nccl", ["2.28.9", "2.32.3"])
@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_gin_of_nccl_2_28_compiles_links_and_inlines(nccl, arch):
    compiled = gin_legacy.compile(flowdsl.FlowKernel.argtypes_for(*ARGS, nccl=nccl), arch=arch, nccl=nccl)
    assert not [s for s in compiled.function_symbols() if s.startswith("flowdsl_")]
    assert "gin.strong_signals" not in compiled.features


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_gin_of_nccl_2_32_compiles_and_states_its_strong_signals(arch):
    compiled = gin_2_32.compile(flowdsl.FlowKernel.argtypes_for(*ARGS, nccl="2.32.3"), arch=arch, nccl="2.32.3")
    assert not [s for s in compiled.function_symbols() if s.startswith("flowdsl_")]
    assert "gin.strong_signals" in compiled.features


def test_gin_of_nccl_2_32_is_refused_for_nccl_2_28():
    with pytest.raises(TypingError, match=r"flowdsl.gin.strong_signal_inc requires NCCL >= 2.32.0, but this "
                                          r"kernel is compiled for NCCL 2.28.9"):
        gin_2_32.compile(flowdsl.FlowKernel.argtypes_for(*ARGS, nccl="2.28.9"), arch="sm_90", nccl="2.28.9")

    @flowdsl.kernel
    def only_get(comm, win, out):
        gin.get(gin.context(comm), team.world(comm), 0, win, 0, win, 64, 64)

    with pytest.raises(TypingError, match=r"flowdsl.gin.get requires NCCL >= 2.32.0.*Install "
                                          r"nvidia-nccl-cu13>=2.32.0"):
        only_get.compile(flowdsl.FlowKernel.argtypes_for(*ARGS, nccl="2.28.9"), arch="sm_90", nccl="2.28.9")


def test_gin_typing_errors_name_the_argument():
    @flowdsl.kernel
    def wrong_remote(comm, win, out):
        gin.put(gin.context(comm), team.world(comm), 0, win, 0, win, 64, 64, remote=gin.counter_inc(0))

    with pytest.raises(TypingError, match=r"flowdsl.gin.put requires a signal action"):
        wrong_remote.compile(flowdsl.FlowKernel.argtypes_for(*ARGS, nccl="2.32.3"), arch="sm_90", nccl="2.32.3")

    @flowdsl.kernel
    def no_context(comm, win, out):
        gin.flush(comm, coop.cta())

    with pytest.raises(TypingError, match=r"flowdsl.gin.flush requires a GIN context, got DevComm"):
        no_context.compile(flowdsl.FlowKernel.argtypes_for(*ARGS, nccl="2.32.3"), arch="sm_90", nccl="2.32.3")


def test_the_world_gin_barrier_is_refused_for_nccl_2_28():
    @flowdsl.kernel
    def world_barrier(comm, win, out):
        gin.world_barrier(gin.context(comm), coop.cta(), 0).sync(MemoryOrder.ACQ_REL)

    with pytest.raises(TypingError, match=r"flowdsl.gin.world_barrier requires NCCL >= 2.30.0, but this kernel is "
                                          r"compiled for NCCL 2.28.9"):
        world_barrier.compile(flowdsl.FlowKernel.argtypes_for(*ARGS, nccl="2.28.9"), arch="sm_90", nccl="2.28.9")


def test_a_fence_level_is_refused_for_nccl_2_28_naming_the_level_it_has():
    """NCCL 2.28's barriers have fence level None only: a sync that leaves the fence out (NCCL 2.32's PUT_GET)
    or names PUT or GET is refused there, saying what to pass."""
    @flowdsl.kernel
    def default_fence(comm, win, out):
        gin.rail_barrier(gin.context(comm), coop.cta(), 0).sync(MemoryOrder.ACQ_REL)

    with pytest.raises(TypingError, match=r"A GIN barrier's fence level PUT or GET \(sync's fence; left out it is NCCL "
                                          r"2.32's default, PUT_GET, and NCCL 2.28's barriers have NONE only: pass "
                                          r"fence=flowdsl.GinFenceLevel.NONE there\) requires NCCL >= 2.32.0, but this "
                                          r"kernel is compiled for NCCL 2.28.9"):
        default_fence.compile(flowdsl.FlowKernel.argtypes_for(*ARGS, nccl="2.28.9"), arch="sm_90", nccl="2.28.9")


def _refused_on_both_paths(kernel, text):
    """``kernel(comm, win, out)`` refused by the GPU's typing (sm_90, NCCL 2.32.3) and by the simulator, in words
    that match ``text`` on both."""
    import flowdsl.sim

    with pytest.raises(flowdsl.KernelTypingError, match=text):
        kernel.compile(flowdsl.FlowKernel.argtypes_for(*ARGS, nccl="2.32.3"), arch="sm_90", nccl="2.32.3")

    def main(comm):
        buf, out = comm.alloc(64, np.uint64), comm.alloc(4, np.uint64)
        with comm.register(buf) as win, comm.device_communicator(rail_gin_barrier_count=1) as dc:
            kernel[1, 32](dc, win, out)
            comm.synchronize()

    with pytest.raises(flowdsl.KernelTypingError, match=text):
        flowdsl.sim.spawn(main, nranks=2, nodes=2)


@pytest.mark.parametrize("fence", [7, MemoryOrder.SEQ_CST])
def test_a_fence_level_outside_nccls_is_refused_on_both_paths(fence):
    """A kernel sees another enum's member as its value: both paths name the value."""
    @flowdsl.kernel
    def bad_fence(comm, win, out):
        gin.rail_barrier(gin.context(comm, 0), coop.cta(), 0).sync(MemoryOrder.ACQ_REL, fence)

    _refused_on_both_paths(bad_fence, rf"A GIN barrier's sync requires fence to be a flowdsl.GinFenceLevel \(NONE, "
                                      rf"PUT, GET or PUT_GET\), got {int(fence)}. Pass one of them, or leave fence out "
                                      r"for NCCL's default, PUT_GET")


def test_only_a_hybrid_barrier_session_has_parts_on_both_paths():
    """``lsa_barrier()`` of a rail session: the GPU's typing refuses it, and the simulator in the same words."""
    @flowdsl.kernel
    def part_of_a_rail_session(comm, win, out):
        gin.rail_barrier(gin.context(comm, 0), coop.cta(), 0).lsa_barrier().sync(MemoryOrder.ACQ_REL)

    _refused_on_both_paths(part_of_a_rail_session, r"Cannot take lsa_barrier\(\) of a flowdsl.gin.rail_barrier "
                                                   r"session: only a hybrid barrier session")
