"""A collective without ``config=`` on the simulator takes a shape sized for a CPU
(:data:`flowdsl.collectives.SIMULATOR_CONFIG`), not the GPU's default (24 channels of 512 threads,
4 slots of 128 KiB: a 121 MiB staging window per rank, poisoned, for every simulated rank)."""

from __future__ import annotations

import types

import numpy as np
import pytest

pytestmark = pytest.mark.sim


def test_a_collective_without_config_takes_the_simulator_s_shape():
    import flowdsl.sim as sim
    from flowdsl import collectives as coll
    from flowdsl.collectives._host import launch_shape

    def main(comm):
        x = comm.alloc(4096, np.float32)
        x[:] = comm.rank + 1
        y = comm.alloc(4096, np.float32)
        coll.all_reduce(comm, x, y, algorithm="ring")
        comm.synchronize()
        states = comm.__dict__["_flowdsl_collectives"]
        shape = launch_shape("all_reduce", comm, 4096, "float32", "ring")
        return (list(states) == [coll.SIMULATOR_CONFIG], shape == launch_shape(
            "all_reduce", comm, 4096, "float32", "ring", coll.SIMULATOR_CONFIG), bool(np.all(y == 10)))

    assert sim.spawn(main, nranks=4) == [(True, True, True)] * 4


def test_the_gpu_default_is_unchanged():
    from flowdsl import collectives as coll
    from flowdsl.collectives._config import DEFAULT_CONFIG, default_config

    gpu = types.SimpleNamespace(memory_device="cuda")  # the host contract's member a GPU communicator has
    assert default_config(gpu) is DEFAULT_CONFIG == coll.FlowConfig()
    assert coll.SIMULATOR_CONFIG.channels * coll.SIMULATOR_CONFIG.slot_bytes < DEFAULT_CONFIG.channels * \
        DEFAULT_CONFIG.slot_bytes // 100
