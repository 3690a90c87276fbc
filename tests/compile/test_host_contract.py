"""The GPU runtime's communicator, window and device communicator and the simulator's keep one
contract (:mod:`flowdsl.host.contract`): every member of it on both, methods with the same
parameters (names, kinds, defaults). The GPU classes are read without a GPU; the simulator's are
also checked as instances, inside a simulated rank."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

from flowdsl.host import contract

pytestmark = pytest.mark.compile


def _members(protocol) -> dict:
    """name -> "method", "property" or "attribute", of a Protocol class."""
    out = {}
    for name in protocol.__protocol_attrs__ if hasattr(protocol, "__protocol_attrs__") else dir(protocol):
        if name.startswith("_"):
            continue
        value = inspect.getattr_static(protocol, name, None)
        out[name] = ("property" if isinstance(value, property) else "method" if callable(value) else "attribute")
    for cls in protocol.__mro__:  # annotations of the Protocols it extends too
        for name in vars(cls).get("__annotations__", {}):
            out.setdefault(name, "attribute")
    return out


def _parameters(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def _declares(cls, name: str) -> bool:
    """A class attribute, property or method, or an attribute its ``__init__`` assigns."""
    missing = object()
    if inspect.getattr_static(cls, name, missing) is not missing:
        return True
    init = inspect.getsource(cls.__init__)
    return re.search(rf"self\.{name}\s*(:[^=]*)?=", init) is not None or f"self.{name}, " in init


def _pairs():
    from flowdsl.runtime.communicator import Communicator
    from flowdsl.runtime.memory import DevComm, Window
    from flowdsl.sim import host, memory

    return [(contract.Communicator, Communicator, host.SimComm), (contract.Window, Window, memory.Window),
            (contract.DevComm, DevComm, host.DevComm)]


@pytest.mark.parametrize("index", range(3), ids=["Communicator", "Window", "DevComm"])
def test_both_sides_keep_the_contract(index):
    protocol, gpu, sim = _pairs()[index]
    missing, differ = [], []
    for name, what in _members(protocol).items():
        for side in (gpu, sim):
            if not _declares(side, name):
                missing.append(f"{side.__module__}.{side.__qualname__}.{name}")
        if what == "method":
            want = _parameters(getattr(protocol, name))
            for side in (gpu, sim):
                got = getattr(side, name, None)
                if got is not None and _parameters(got) != want:
                    differ.append(f"{side.__module__}.{side.__qualname__}.{name}{inspect.signature(got)} against "
                                  f"the contract's {inspect.signature(getattr(protocol, name))}")
    assert missing == [] and differ == [], "\n".join(["missing:", *missing, "parameters differ:", *differ])


def test_the_contract_lists_what_both_offer():
    names = _members(contract.Communicator)
    assert {"alloc", "free", "register", "device_communicator", "open_resources", "synchronize", "barrier", "abort",
            "close", "closed", "check_collectives", "wait_timeout", "device_error", "rank", "nranks", "exchange",
            "track", "supports_multimem", "device", "memory_device"} <= set(names)
    assert names["device_communicator"] == "method" and names["closed"] == names["open_resources"] == "property"


def test_simulated_objects_are_instances_of_the_contract():
    import flowdsl.sim as sim

    def main(comm):
        buf = comm.alloc(64, np.float32)
        with comm.register(buf) as win, comm.device_communicator(lsa_barrier_count=1) as dc:
            kinds = (isinstance(comm, contract.Communicator), isinstance(win, contract.Window),
                     isinstance(dc, contract.DevComm), win.communicator is comm, dc.communicator is comm,
                     win.kind, dc.kind, len(comm.open_resources))
        comm.free(buf)
        return kinds, len(comm.open_resources)

    (kinds, left), = sim.spawn(main, nranks=1)
    assert kinds == (True, True, True, True, True, "window", "device communicator", 3) and left == 0


def test_the_simulator_frees_and_refuses_as_the_gpu_runtime():
    import flowdsl.sim as sim

    def main(comm):
        buf = comm.alloc(64, np.float32)
        win = comm.register(buf)
        with pytest.raises(sim.UsageError, match="Cannot free this buffer: a window is still registered over it. "
                                                 "Close it first"):
            comm.free(buf)
        win.close()
        comm.free(buf)
        with pytest.raises(sim.UsageError, match="Cannot free this buffer: it was not allocated by comm.alloc"):
            comm.free(buf)
        with pytest.raises(sim.UsageError, match="Cannot create a device communicator: lsa_barrier_count must be "
                                                 ">= 0, got -1"):
            comm.device_communicator(lsa_barrier_count=-1)
        with pytest.raises(sim.UsageError, match="unknown requirement.s. lsa_barriers. Use the known ones: "
                                                 "lsa_barrier_count"):
            comm.device_communicator(lsa_barriers=1)
        return True

    assert sim.spawn(main, nranks=2) == [True, True]


def test_the_gpu_runtime_maps_every_requirement_the_contract_takes():
    from flowdsl.host.checks import DEVICE_REQUIREMENTS
    from flowdsl.runtime.communicator import REQUIREMENT_FIELDS

    assert set(REQUIREMENT_FIELDS) == set(DEVICE_REQUIREMENTS)


def test_requirement_fields_follow_the_loaded_releases_layout():
    """What the GPU runtime writes into ncclDevCommRequirements: the connection type flowdsl fills in is left
    out where the release has no such field (NCCL 2.28 enables GIN itself), one the user names is refused."""
    import json
    from pathlib import Path

    import flowdsl
    from flowdsl.host.checks import device_requirements
    from flowdsl.runtime.communicator import requirement_fields

    manifest = json.loads((Path(flowdsl.__file__).parents[1] / "prebuilt/build/manifest.json").read_text())
    old, new = (manifest["abis"][v]["layout"] for v in ("2.28.9", "2.32.3"))
    asked = {"gin_signal_count": 2}
    checked = device_requirements(asked)
    assert requirement_fields(checked, set(asked), new, (2, 32, 3)) == {"ginSignalCount": 2, "ginConnectionType": 1}
    assert requirement_fields(checked, set(asked), old, (2, 28, 9)) == {"ginSignalCount": 2}
    named = {"gin_signal_count": 2, "gin_connection_type": flowdsl.GinConnectionType.RAIL}
    with pytest.raises(flowdsl.UsageError, match="NCCL 2.28.9 has no ginConnectionType"):
        requirement_fields(device_requirements(named), set(named), old, (2, 28, 9))
    world = {"world_gin_barrier_count": 1, "gin_queue_depth": 64, "gin_exclusive_contexts": True}
    assert requirement_fields(device_requirements(world), set(world), new, (2, 32, 3)) == {
        "worldGinBarrierCount": 1, "ginQueueDepth": 64, "ginExclusiveContexts": 1, "ginConnectionType": 1}


#: Public members one communicator has and the other lacks, each with why: a new one fails the test below, so
#: that host code written on one side cannot quietly depend on something the other does not offer.
_ONE_SIDED = {
    "sim": {
        "lsa_rank": "not yet on GPUs: NCCL keeps it in the device communicator (the GPU run of the LSA examples "
                    "found a host check that read it)",
        "lsa_size": "as lsa_rank",
        "node": "the simulated world's node of this rank (GPUs: not yet, as lsa_rank)",
        "nodes": "the simulated world's node count",
        "world": "the simulated world itself",
    },
    "gpu": {
        "nccl_version": "the loaded libnccl's release (the simulator models the device API of every release)",
    },
}


def test_what_only_one_communicator_offers_is_listed_with_its_reason():
    from flowdsl.runtime.communicator import Communicator
    from flowdsl.sim import host

    def public(cls):
        names = {n for n in dir(cls) if not n.startswith("_")}
        return names | set(re.findall(r"self\.([a-z]\w*)\s*(?::[^=]*)?=", inspect.getsource(cls.__init__)))

    gpu, sim = public(Communicator), public(host.SimComm)
    assert {"sim": sim - gpu, "gpu": gpu - sim} == {side: set(names) for side, names in _ONE_SIDED.items()}


def test_the_gin_support_of_a_gpu_communicator_is_read_from_nccls_properties():
    """The GPU runtime passes NCCL's ncclCommProperties (through nccl4py) to the one check of GIN requirements:
    ginConnectionType from NCCL 2.31, else ginType (every rank) / railedGinType (the rail team); None on 2.28."""
    from types import SimpleNamespace

    from flowdsl import GinConnectionType
    from flowdsl.runtime.memory import gin_support_of

    def comm(**props):
        return SimpleNamespace(_nccl=SimpleNamespace(properties=SimpleNamespace(**props)))

    assert gin_support_of(comm(gin_connection_type=2, gin_type=0, railed_gin_type=3)) is GinConnectionType.RAIL
    assert gin_support_of(comm(gin_connection_type=None, gin_type=3, railed_gin_type=3)) is GinConnectionType.FULL
    assert gin_support_of(comm(gin_type=0, railed_gin_type=5)) is GinConnectionType.RAIL
    assert gin_support_of(comm(gin_type=0, railed_gin_type=0)) is GinConnectionType.NONE
    assert gin_support_of(SimpleNamespace(_nccl=SimpleNamespace())) is None  # NCCL 2.28: no query


def test_the_gin_backends_of_a_gpu_communicator_are_read_from_nccls_properties():
    """NCCL's ncclCommProperties.ginSupport (nccl4py's ``available_gin_types``) gives the backends the one check of
    GIN requirements chooses among (``gin_type``, strong signals); None where NCCL cannot say (2.28)."""
    from types import SimpleNamespace

    from flowdsl import GinBackend
    from flowdsl.runtime.memory import gin_backends_of

    def comm(types):
        return SimpleNamespace(_nccl=SimpleNamespace(properties=SimpleNamespace(available_gin_types=types)))

    assert gin_backends_of(comm(frozenset({3, 5}))) == {GinBackend.GDAKI, GinBackend.EFA_GDA}
    assert gin_backends_of(comm(frozenset())) == frozenset()
    assert gin_backends_of(comm(None)) is None
    assert gin_backends_of(SimpleNamespace(_nccl=SimpleNamespace())) is None  # NCCL 2.28: no query
