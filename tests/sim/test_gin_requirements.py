"""NCCL's rules for a device communicator's GIN requirements, one check for the GPU runtime and the simulator
(``flowdsl.host.checks.device_requirements``): NCCL >= 2.29 creates no GIN resources (signals, counters, rail,
world or hybrid barriers) unless GIN is enabled, so flowdsl enables it (``FULL``, what ``gin_force_enable`` asks)
where none is named, refuses an explicit ``NONE`` and a world GIN barrier over ``RAIL`` connections as NCCL does,
and refuses the connection type it cannot pass (``CUSTOM_ARRAY``)."""

from __future__ import annotations

import numpy as np
import pytest

import flowdsl
import flowdsl.sim as sim
from flowdsl import GinConnectionType

pytestmark = pytest.mark.sim


def _requirements(**requirements):
    def main(comm):
        with comm.device_communicator(**requirements) as dc:
            return dict(dc.group.reqs)
    return sim.spawn(main, nranks=2, nodes=2)[0]


@pytest.mark.parametrize("resource", ["gin_signal_count", "gin_counter_count", "barrier_count",
                                      "rail_gin_barrier_count", "world_gin_barrier_count"])
def test_gin_resources_enable_gin_where_no_connection_type_is_named(resource):
    assert _requirements(**{resource: 2})["gin_connection_type"] is GinConnectionType.FULL
    named = GinConnectionType.CUSTOM_STRIDE if resource == "world_gin_barrier_count" else GinConnectionType.RAIL
    assert _requirements(**{resource: 2, "gin_connection_type": named})["gin_connection_type"] is named


def test_no_gin_resources_leave_the_connection_type_unset():
    assert "gin_connection_type" not in _requirements(lsa_barrier_count=1)
    assert "gin_connection_type" not in _requirements(gin_force_enable=1, gin_signal_count=1)  # NCCL: FULL


def test_gin_resources_with_gin_off_are_refused_as_nccl_refuses_them():
    with pytest.raises(sim.UsageError, match=r"asks for GIN resources \(gin_signal_count=4\) with gin_connection_type "
                                             r"NONE, which NCCL refuses \(\"User requested GIN resources but did not "
                                             r"request GIN to be enabled!\"\)\. Pass gin_connection_type="
                                             r"GinConnectionType\.FULL"):
        _requirements(gin_signal_count=4, gin_connection_type=GinConnectionType.NONE)


def test_a_world_gin_barrier_over_rail_connections_is_refused_as_nccl_refuses_it():
    with pytest.raises(sim.UsageError, match=r"world_gin_barrier_count=1\) needs GIN connections to every rank.*"
                                             r"\"Cannot create worldGinBarrier with NCCL_GIN_CONNECTION_RAIL\.\"\)"):
        _requirements(world_gin_barrier_count=1, gin_connection_type=GinConnectionType.RAIL)
    assert _requirements(world_gin_barrier_count=1, gin_connection_type=GinConnectionType.FULL)[
        "world_gin_barrier_count"] == 1


def test_connection_types_flowdsl_cannot_pass_are_refused_by_name():
    with pytest.raises(sim.UsageError, match="gin_connection_type CUSTOM_ARRAY: flowdsl does not pass NCCL a list of "
                                             "peers"):
        _requirements(gin_connection_type=GinConnectionType.CUSTOM_ARRAY)
    with pytest.raises(sim.UsageError, match="gin_connection_type 9 is not a flowdsl.GinConnectionType"):
        _requirements(gin_connection_type=9)
    assert isinstance(sim.UsageError("x"), flowdsl.UsageError)


@flowdsl.kernel
def _read_gin_context_count(comm, out):
    out[0] = comm.gin_context_count


@pytest.mark.parametrize("asked, count", [({"gin_signal_count": 1}, 4), ({"gin_signal_count": 1, "gin_context_count": 2}, 2),
                                          ({"gin_connection_type": GinConnectionType.RAIL}, 4), ({}, 0)])
def test_the_gin_context_count_is_read_on_host_and_in_kernels(asked, count):
    """What a kernel that spreads its blocks over contexts needs (NCCL's ginContextCount: the requirement is a
    hint, the device communicator's count is the one to use); none where GIN is not enabled."""
    def main(comm):
        out = comm.alloc(1, np.int32)
        with comm.device_communicator(**asked) as dc:
            _read_gin_context_count[1, 1](dc, out)
            comm.synchronize()
            return dc.gin_context_count, int(out.get()[0])
    assert sim.spawn(main, nranks=2, nodes=2) == [(count, count)] * 2
