"""Reference flowdsl programs, each runnable on a GPU or on the simulator.

Contents:
:mod:`flowdsl.examples.rmsnorm_lsa` (fused ReduceScatter + RMSNorm + AllGather over LSA, a port
of NCCL's ``07_kernel_fusion/01_rmsnorm_lsa``), :mod:`flowdsl.examples.allgather_lsa` (an LSA
all-gather), :mod:`flowdsl.examples.alltoall_gin` (all-to-all over GIN, after NCCL's
``06_device_api/02_alltoall_gin``), :mod:`flowdsl.examples.alltoall_hybrid` (LSA inside a node, GIN
across, after ``03_alltoall_hybrid``) and :mod:`flowdsl.examples.moe_gin` (MoE dispatch + combine
over GIN put + signal). Each module has a ``run(comm, ...)`` returning ``(result, reference)``
for its rank.
"""
