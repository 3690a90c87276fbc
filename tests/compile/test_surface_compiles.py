"""Every device-surface primitive compiles and links (sm_90, sm_100) against both NCCL ABIs' builds.

Linking fails on an unresolved extern, so a successful link is the "no unresolved
externs" check; the support calls must also be inlined into the kernel.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from numba import cuda, float32, int32, uint32, uint64
from numba.core.types import float16

import flowdsl
from flowdsl import MemoryOrder, RedOp, ThreadScope, coop, lsa, mem, team
from flowdsl._stubs import PRIMITIVES

pytestmark = pytest.mark.compile


@flowdsl.kernel
def every_primitive(comm, win, flags, out):
    t = coop.thread()
    w = coop.warp()
    lanes = coop.lanes(0xFFFF)
    span = coop.warp_span(0, 2, 1)
    cta = coop.cta()
    acc = comm.rank + comm.nranks + comm.lsa_rank + comm.lsa_size
    acc += coop.thread_rank(cta) + coop.size(w) + t.size() + lanes.thread_rank() + span.size()
    acc += coop.lane_mask(lanes) + coop.is_thread(t) + coop.within_warp(span) + coop.coalesced(span).size()
    acc += coop.lane_mask(coop.coalesced()) + coop.tile(4).size() + coop.lane_mask(coop.tile(1))
    acc += coop.bcast(w, acc, 3) + coop.bcast(cta, acc, 0) + coop.bcast(span, acc, 1, False)
    coop.sync(w)
    lanes.sync()
    span.sync()
    t.sync()

    world = team.world(comm)
    local = team.lsa(comm)
    rail = team.rail(comm)
    acc += world.nranks + local.rank + rail.stride
    acc += team.rank_to_world(comm, local, 0) + team.rank_to_lsa(comm, world, 0)
    acc += team.rank_to_team(world, local, 0) + team.rank_in_difference(world, local, 0)
    if team.rank_is_member(world, local, 0):
        acc += 1
    acc += team.inner_factor(world, 1).nranks + team.outer_factor(world, 1).nranks

    p0 = lsa.get_local_pointer(win, 0)
    p1 = lsa.get_lsa_pointer(win, 4, 0)
    p2 = lsa.get_peer_pointer(win, 8, comm.rank)
    p3 = lsa.get_team_pointer(win, 12, local, 0)
    out[0] = p0[0] + p1[0] + p2[0] + p3[0]
    v = lsa.local_view(win)
    v2 = lsa.lsa_view(win, 0, 4, 8)
    v3 = lsa.peer_view(win, comm.rank, count=4)
    v4 = lsa.team_view(win, local, 0, 0, 4, dtype=int32)
    out[1] = v[0] + v2[1] + v3[2] + float32(v4[3])

    bar = lsa.barrier(comm, cta, cuda.blockIdx.x)
    bar.arrive(MemoryOrder.RELEASE)
    bar.wait(MemoryOrder.ACQUIRE)
    bar.sync(MemoryOrder.ACQ_REL)
    warp_bar = lsa.barrier(comm, w, 1)
    lsa.sync(warp_bar, MemoryOrder.RELAXED)
    lsa.arrive(warp_bar, MemoryOrder.RELEASE)
    lsa.wait(warp_bar, MemoryOrder.ACQUIRE)
    lsa.barrier(comm, t, 2).sync(MemoryOrder.SEQ_CST)
    lsa.barrier(comm, lanes, 3).sync(MemoryOrder.ACQ_REL)
    lsa.barrier(comm, span, 4).sync(MemoryOrder.ACQ_REL)

    lsa.reduce_sum(cta, comm, win, 0, out, 8)
    lsa.copy(cta, comm, out, win, 0, 8)
    lsa.reduce_sum_copy(cta, comm, win, 0, win, 16, 8)

    flag = mem.load_acquire(flags, 0, ThreadScope.SYSTEM)
    flag += mem.load_relaxed(flags, 1, ThreadScope.DEVICE)
    mem.store_release(flags, 2, flag, ThreadScope.SYSTEM)
    mem.store_relaxed(flags, 3, uint32(acc), ThreadScope.BLOCK)
    mem.fence(MemoryOrder.ACQ_REL, ThreadScope.SYSTEM)
    mem.fence(MemoryOrder.SEQ_CST, ThreadScope.DEVICE)
    flag += mem.atomic_add(flags, 4, 1, MemoryOrder.RELAXED, ThreadScope.DEVICE)
    flag += mem.atomic_cas(flags, 5, 0, 1, MemoryOrder.ACQ_REL, ThreadScope.SYSTEM)
    flag += mem.atomic_exch(flags, 6, 7, MemoryOrder.ACQUIRE, ThreadScope.DEVICE)
    mem.red_add(flags, 7, flag, MemoryOrder.RELEASE, ThreadScope.SYSTEM)
    mem.red_add(out, 9, float32(1.0), MemoryOrder.RELAXED, ThreadScope.DEVICE)
    vec = mem.load_vec(v, 16)
    mem.store_vec(v, 20, vec)
    polled = mem.load_vec_relaxed(v, 24, ThreadScope.SYSTEM)  # LL lines: one 16-byte poll, one store
    lo, hi = mem.vec_to_bits(polled)
    mem.store_vec_relaxed(v, 28, mem.vec_from_bits(hi, lo, float32), ThreadScope.SYSTEM)
    mem.warp_store_vec(v, 32 + 4 * (cuda.threadIdx.x % 32), vec, ThreadScope.SYSTEM)  # a converged warp
    four = mem.load_vector(v, 2)  # a numba-cuda float32x4, indexed by vector
    mem.store_vector(v, 3, cuda.float4(four.w, four.z, four.y, four.x))
    mem.store_vector_relaxed(v, 4, mem.load_vector_relaxed(v, 5, ThreadScope.SYSTEM), ThreadScope.SYSTEM)
    halves = lsa.local_view(win, 0, 32, dtype=float16)  # narrow lanes travel in 32-bit registers
    mem.store_vec(halves, 8, mem.load_vec(halves, 0))
    out[10] = mem.from_bits(mem.to_bits(out[11]) ^ uint64(1 << 31), float32)
    flags[8] = uint32(mem.address(out, 3) & uint64(15))  # 16-byte alignment of an element
    flags[9] = uint32(mem.globaltimer() & uint64(1))
    flags[10] = uint32(16 // mem.itemsize(out))  # a constant of the code, no division

    mm = lsa.multimem_view(comm, win, 0, 16)  # NVLink SHARP: the LSA team's window through its multicast address
    both = mem.multimem_ld_reduce_vec(mm, 0, RedOp.SUM)
    mem.multimem_store_vec(mm, 4, both)
    mem.multimem_store_vec_relaxed(mm, 4, both, ThreadScope.SYSTEM)  # 16 bytes a peer polls
    mem.multimem_red_vec(mm, 8, both, RedOp.SUM)
    mem.multimem_store(mm, 12, mem.multimem_ld_reduce(mm, 13, RedOp.SUM))
    mem.multimem_red(mm, 14, float32(1.0), RedOp.SUM)
    flags[11] = uint32(mem.multimem_address(mm, 4) & uint64(15))
    lsa.multimem_reduce_sum(cta, mm, out, 8)
    lsa.multimem_copy(cta, out, mm, 8)
    lsa.multimem_reduce_sum_copy(cta, mm, lsa.multimem_view(comm, win, 16, 16), 8)
    if flag == 12345:
        lsa.multimem_partial_vectors(4, 7, 8)


ARGS = ("devcomm", ("window", np.float32), np.zeros(8, np.uint32), np.zeros(16, np.float32))


@pytest.mark.parametrize("nccl", ["2.28.9", "2.32.3"])
@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_every_primitive_compiles_links_and_inlines(nccl, arch):
    argtypes = flowdsl.FlowKernel.argtypes_for(*ARGS, nccl=nccl)
    compiled = every_primitive.compile(argtypes, arch=arch, nccl=nccl)
    assert compiled.cubin[:4] == b"\x7fELF"
    leftover = [s for s in compiled.function_symbols() if s.startswith("flowdsl_")]
    assert leftover == [], f"support functions not inlined: {leftover}"


def test_the_kernel_above_uses_every_primitive():
    source = inspect.getsource(every_primitive.py_func)
    unused = [name for name in PRIMITIVES
              if name.startswith(("flowdsl.coop.", "flowdsl.team.", "flowdsl.lsa.", "flowdsl.mem."))
              and name.split(".", 1)[1] not in source
              and f".{name.rsplit('.', 1)[1]}(" not in source]
    assert unused == []


def test_ptx_spells_the_memory_model():
    from cuda.core import Linker, LinkerOptions, ObjectCode
    from numba.core import types

    from flowdsl.lowering import backend
    from flowdsl.lowering.target import Target, compiling_for

    def k(flags, out):
        out[0] = mem.load_acquire(flags, 0, ThreadScope.SYSTEM)
        mem.store_release(flags, 1, 5, ThreadScope.DEVICE)
        mem.fence(MemoryOrder.SEQ_CST, ThreadScope.SYSTEM)
        out[1] = mem.atomic_add(flags, 2, 1, MemoryOrder.ACQ_REL, ThreadScope.SYSTEM)
        mem.red_add(flags, 3, 1, MemoryOrder.RELEASE, ThreadScope.BLOCK)
        mem.store_vec(out, 4, mem.load_vec(out, 8))

    target = Target((2, 28, 9), "sm_90")
    argtypes = (types.uint32[::1], types.uint32[::1])
    with compiling_for(target):
        lowered = backend.lower_kernel(k, argtypes, (9, 0), fastmath=False, lineinfo=False)
    linker = Linker(ObjectCode.from_ltoir(lowered.ltoir((9, 0)), name="k"),
                    options=LinkerOptions(arch="sm_90", link_time_optimization=True, ptx=True))
    ptx = linker.link("ptx").code.decode()
    for instruction in ("ld.acquire.sys.u32", "st.release.gpu.u32", "fence.sc.sys", "atom.acq_rel.sys.add.u32",
                        "red.release.cta.add.u32", "ld.v4.b32", "st.v4.b32"):
        assert instruction in ptx, instruction
    # Enum arguments are constants: every other (order, scope) variant and the trap fold away.
    for absent in ("ld.acquire.gpu", "ld.acquire.cta", "st.release.sys", "fence.acq_rel", "trap"):
        assert absent not in ptx, absent


@flowdsl.device
def _scaled_sum(view, n, scale):
    acc = float32(0.0)
    for i in range(n):
        acc += view[i]
    return acc * scale


@flowdsl.kernel
def uses_device_function(comm, win, out):
    out[0] = _scaled_sum(lsa.local_view(win), 4, float32(2.0))


def test_device_functions_compile_into_kernels():
    argtypes = flowdsl.FlowKernel.argtypes_for("devcomm", ("window", np.float32), np.zeros(1, np.float32),
                                               nccl="2.28.9")
    compiled = uses_device_function.compile(argtypes, arch="sm_90", nccl="2.28.9")
    assert not [s for s in compiled.function_symbols() if s.startswith("flowdsl_")]
