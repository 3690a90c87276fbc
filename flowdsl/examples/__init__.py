"""Reference flowdsl programs, each runnable on a GPU or on the simulator.

Each module is one program (most are ports of NCCL's device-API examples, named in its
docstring) with a ``run(comm, ...)`` that returns ``(result, reference)`` for its rank.
"""
