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


# ---- the communicator's GIN support: NCCL's rules against a transcription of them ----------------------

_NONE, _FULL, _RAIL, _STRIDE = (GinConnectionType.NONE, GinConnectionType.FULL, GinConnectionType.RAIL,
                                GinConnectionType.CUSTOM_STRIDE)
_RESOURCES = ("gin_signal_count", "gin_counter_count", "barrier_count", "rail_gin_barrier_count",
              "world_gin_barrier_count")


def _nccl_refusal(reqs: dict, support) -> str | None:
    """What NCCL's ncclDevCommCreate (src/dev_runtime.cc, NVIDIA/nccl master) WARNs for these requirements
    on a communicator whose widest GIN connection type is ``support``, None where it creates the device
    communicator: written from NCCL's source, not from flowdsl's check."""
    requested = reqs.get("gin_connection_type", _NONE)  # NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER: NONE
    if reqs.get("gin_force_enable"):
        requested = _FULL
    if any(reqs.get(key, 0) > 0 for key in _RESOURCES) and requested == _NONE:
        return "User requested GIN resources but did not request GIN to be enabled!"
    if requested != _NONE:
        if support == _NONE:
            return "User requested GIN but not all ranks in the communicator support GIN"
        if requested == _FULL and support == _RAIL:
            return ("User requested GIN connection type NCCL_GIN_CONNECTION_FULL but the communicator supports "
                    "only NCCL_GIN_CONNECTION_RAIL")
    if reqs.get("world_gin_barrier_count", 0) > 0 and requested == _RAIL:
        return "Cannot create worldGinBarrier with NCCL_GIN_CONNECTION_RAIL."
    return None


def _cases():
    for mask in range(1 << len(_RESOURCES)):
        resources = {key: 1 for i, key in enumerate(_RESOURCES) if mask >> i & 1}
        for kind in (None, _NONE, _FULL, _RAIL, _STRIDE):
            for force in (False, True):
                reqs = dict(resources)
                if kind is not None:
                    reqs["gin_connection_type"] = kind
                if force:
                    reqs["gin_force_enable"] = 1
                yield reqs


@pytest.mark.parametrize("support", [_FULL, _RAIL, _NONE], ids=["full", "rail", "none"])
def test_flowdsl_refuses_exactly_what_nccl_refuses_quoting_it(support):
    """Every combination of GIN resources, connection type and gin_force_enable (320), on a communicator with
    FULL, RAIL or no GIN: what flowdsl passes NCCL, NCCL creates; what flowdsl refuses, NCCL refuses given
    flowdsl's default (FULL where GIN resources name no type), and flowdsl's message quotes NCCL's."""
    from flowdsl.host import checks

    refused = expected = 0
    for reqs in _cases():
        defaulted = dict(reqs)
        if any(reqs.get(key, 0) > 0 for key in _RESOURCES) and "gin_connection_type" not in reqs \
                and not reqs.get("gin_force_enable"):
            defaulted["gin_connection_type"] = _FULL
        nccl = _nccl_refusal(defaulted, support)
        expected += nccl is not None
        try:
            out = checks.device_requirements(dict(reqs), gin_support=support)
        except flowdsl.UsageError as exc:
            assert nccl is not None, f"{reqs} on {support.name}: flowdsl refuses ({exc}), NCCL creates it"
            assert f'"{nccl}"' in str(exc), (reqs, support.name, str(exc))
            refused += 1
        else:
            assert _nccl_refusal(out, support) is None, f"{reqs} on {support.name}: NCCL refuses what flowdsl passes"
    assert refused == expected > 0


def test_the_defaults_are_what_nccl_creates_on_a_machine_with_a_nic():
    """With a GIN-capable NIC reaching every rank (FULL), whatever GIN resources a device communicator asks for
    and names no type for, NCCL creates it with flowdsl's defaults."""
    from flowdsl.host import checks

    for reqs in _cases():
        if "gin_connection_type" in reqs or reqs.get("gin_force_enable"):
            continue
        out = checks.device_requirements(dict(reqs), gin_support=_FULL)
        assert _nccl_refusal(out, _FULL) is None, reqs


def _on(gin_connections, **requirements):
    def main(comm):
        with comm.device_communicator(**requirements) as dc:
            return dict(dc.group.reqs)
    return sim.spawn(main, nranks=2, nodes=2, gin_connections=gin_connections)[0]


def test_the_simulator_refuses_gin_where_its_network_has_none():
    with pytest.raises(sim.UsageError, match=r"asks for GIN \(gin_connection_type FULL\), and not every rank of this "
                                             r"communicator has GIN .*\(\"User requested GIN but not all ranks in "
                                             r"the communicator support GIN\"\)\. Ask for no GIN resources"):
        _on("none", gin_signal_count=1)
    assert "gin_connection_type" not in _on("none", lsa_barrier_count=1)  # LSA only: NCCL creates it


def test_the_simulator_refuses_full_where_its_network_connects_the_rail_team_only():
    with pytest.raises(sim.UsageError, match=r"\(\"User requested GIN connection type NCCL_GIN_CONNECTION_FULL but "
                                             r"the communicator supports only NCCL_GIN_CONNECTION_RAIL\"\)\. Pass "
                                             r"gin_connection_type=GinConnectionType\.RAIL"):
        _on("rail", rail_gin_barrier_count=1)
    assert _on("rail", rail_gin_barrier_count=1, gin_connection_type=_RAIL)["gin_connection_type"] is _RAIL


def test_a_kernel_that_uses_gin_is_refused_where_there_is_none():
    @flowdsl.kernel
    def put_one(comm, win):
        ctx = flowdsl.gin.context(comm)
        flowdsl.gin.put(ctx, flowdsl.team.world(comm), 0, win, 0, win, 0, 4)

    def main(comm):
        buf = comm.alloc(4, np.float32)
        with comm.register(buf), comm.device_communicator(for_kernel=put_one, grid=1):
            pass

    with pytest.raises(sim.UsageError, match=r"not all ranks in the communicator support GIN"):
        sim.spawn(main, nranks=2, nodes=2, gin_connections="none")


def test_an_unknown_gin_connections_option_is_refused():
    with pytest.raises(flowdsl.UsageError, match=r"gin_connections='wide': pass \"full\""):
        sim.spawn(lambda comm: None, nranks=1, gin_connections="wide")


# ---- which GIN backend takes the device communicator (NCCL 2.32's ncclGinDevCommSetup) -----------------------
_PROXY, _EFA = flowdsl.GinBackend.PROXY, flowdsl.GinBackend.EFA_GDA


def test_nccl_takes_the_first_backend_that_is_the_one_named_and_offers_the_signals_required():
    """NCCL tries the communicator's backends in turn, passing over one that is not ``gin_type`` (where named)
    and one without strong signals where they are required (the default): flowdsl refuses, before NCCL, what
    leaves none, in NCCL's words, on both paths (one check)."""
    from flowdsl.host import checks

    both = frozenset({_PROXY, _EFA})
    assert checks.device_requirements({"gin_signal_count": 1}, gin_backends=both)  # the proxy takes it
    assert checks.device_requirements({"gin_signal_count": 1, "gin_type": _EFA, "gin_strong_signals_required": False},
                                      gin_backends=both)["gin_type"] is _EFA
    with pytest.raises(flowdsl.UsageError, match=r"it requires strong GIN signals .* the GIN backend efa_gda offers "
                                                 r"weak signals only"):
        checks.device_requirements({"gin_signal_count": 1, "gin_type": _EFA}, gin_backends=both)
    with pytest.raises(flowdsl.UsageError, match=r"gin_type=GDAKI: this communicator's GIN backends are efa_gda, proxy, "
                                                 r"which NCCL refuses \(\"GIN: DevComm setup failed on all available "
                                                 r"backends\"\)\. Leave gin_type out"):
        checks.device_requirements({"gin_signal_count": 1, "gin_type": flowdsl.GinBackend.GDAKI}, gin_backends=both)
    with pytest.raises(flowdsl.UsageError, match=r"gin_type 'proxy' is not a flowdsl.GinBackend"):
        checks.device_requirements({"gin_signal_count": 1, "gin_type": "proxy"}, gin_backends=both)
    # no GIN asked: no backend needed; the backends unknown (NCCL 2.28 cannot say): NCCL decides
    assert checks.device_requirements({"lsa_barrier_count": 1}, gin_backends=frozenset({_EFA}))
    assert checks.device_requirements({"gin_signal_count": 1, "gin_type": _EFA}, gin_backends=None)


def test_the_simulator_takes_gin_type_as_nccl_does():
    def backend_of(gin_backend, **requirements):
        def main(comm):
            with comm.device_communicator(gin_signal_count=1, **requirements) as dc:
                return dc.gin_backend
        return sim.spawn(main, nranks=2, nodes=2, gin_backend=gin_backend)[0]

    assert backend_of("gdaki", gin_type=flowdsl.GinBackend.GDAKI) is flowdsl.GinBackend.GDAKI
    assert backend_of("efa_gda", gin_type=_EFA, gin_strong_signals_required=False) is _EFA
    with pytest.raises(sim.UsageError, match=r"gin_type=PROXY: this communicator's GIN backends are gdaki"):
        backend_of("gdaki", gin_type=_PROXY)
