"""Reference flowdsl programs, each runnable on a GPU or on the simulator.

Contents: :mod:`flowdsl.examples.rmsnorm_lsa` (fused ReduceScatter + RMSNorm +
AllGather over LSA, a port of NCCL's ``07_kernel_fusion/01_rmsnorm_lsa``) and
:mod:`flowdsl.examples.allgather_lsa` (an LSA all-gather). Each module has a
``run(comm, ...)`` returning ``(result, reference)`` for its rank.
"""
