"""Kernels that use what NCCL 2.28.9 lacks, for the tests that simulate a release (``spawn(nccl=...)``) and
compile for one: both must refuse them in the same words."""

from __future__ import annotations

import flowdsl
from flowdsl import GinFenceLevel, MemoryOrder, coop, gin, team


@flowdsl.kernel
def get_from_peer(comm, win, out):
    gin.get(gin.context(comm), team.world(comm), 1 - comm.rank, win, 0, win, 64, 64)
    gin.flush(gin.context(comm), coop.cta(), MemoryOrder.ACQUIRE)


@flowdsl.kernel
def put_strong_signal(comm, win, out):
    gin.put(gin.context(comm), team.world(comm), 1 - comm.rank, win, 0, win, 64, 64,
            remote=gin.strong_signal_inc(0))


@flowdsl.kernel
def rail_barrier_default_fence(comm, win, out):
    gin.rail_barrier(gin.context(comm), coop.cta(), 0).sync(MemoryOrder.ACQ_REL)


@flowdsl.kernel
def rail_barrier_no_fence(comm, win, out):
    gin.rail_barrier(gin.context(comm), coop.cta(), 0).sync(MemoryOrder.ACQ_REL, GinFenceLevel.NONE)


#: (kernel, the feature its refusal names, the release that has it, device communicator requirements)
REFUSED_ON_2_28 = [
    (get_from_peer, "flowdsl.gin.get", (2, 32, 0), {"gin_signal_count": 1}),
    (put_strong_signal, "flowdsl.gin.strong_signal_inc", (2, 32, 0), {"gin_signal_count": 1}),
    (rail_barrier_default_fence, gin.FENCE_FEATURE, gin.FENCE_NCCL, {"rail_gin_barrier_count": 1}),
]
