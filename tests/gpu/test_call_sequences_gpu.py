"""A seeded call sequence on one GPU through real NCCL: a smoke test of the generator and runner of
:mod:`flowdsl.collectives.sequences` on the device (at one rank every collective is its local copy,
so the orders of combines are not exercised here: the simulator and the several-GPU tests do that).

It runs the code path the simulator tests run (``run_sequence``): views at offsets inside larger
allocations with guard bytes, poisoned outputs, repeated calls on the same arrays (the planned
fast path and its one-node CUDA graph), every allocation compared bit for bit after every call.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_call_sequence_on_one_gpu(comm):
    import cupy

    from flowdsl.collectives import sequences

    calls = sequences.generate(sequences.CI_SEED, sequences.DEFAULT_CALLS, comm.nranks,
                               protocols=sequences.GPU_PROTOCOLS, large=1 << 16)
    failures = sequences.run_sequence(comm, calls)
    cupy.get_default_memory_pool().free_all_blocks()
    assert not failures, f"{len(failures)} wrong results of {len(calls)} calls:\n" + "\n".join(map(str, failures[:10]))
