"""The collectives and Flow compile and link without a GPU, for one LSA team and across nodes (GIN).

Kernels for one LSA team carry no GIN code; kernels for several nodes use strong
signals (legacy signals on NCCL 2.28, which its backends apply in order), and are
refused at launch on a backend with weak signals only. The cost model is pure
arithmetic and is checked here too.
"""

from __future__ import annotations

import numpy as np
import pytest

from flowdsl import Protocol, RedOp
from flowdsl.collectives import _library, cost
from flowdsl.collectives._host import FlowConfig
from flowdsl.lowering.gin_surface import STRONG_SIGNAL_FEATURE

pytestmark = pytest.mark.compile


def test_precompile_builds_every_program_then_finds_them_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWDSL_CACHE_DIR", str(tmp_path))
    first = _library.precompile(arch="sm_90", nccl="2.28.9", dtypes=["float32"], ops=[RedOp.SUM], jobs=1,
                                progress=False)
    assert first["kernels"] == 6 and first["compiled"] == 6, first
    again = _library.precompile(arch="sm_90", nccl="2.28.9", dtypes=["float32"], ops=[RedOp.SUM], jobs=1,
                                progress=False)
    assert again["cached"] == 6 and again["compiled"] == 0, again
    assert len(list((tmp_path / "kernels").glob("*.cubin"))) == 6


def test_library_lists_every_collective_dtype_and_op():
    entries = _library.library()
    assert len(entries) == 2 * 7 + 4 * 7 * 5  # all_gather and broadcast have no operator
    assert ("tree", "all_reduce", RedOp.AVG, "bfloat16") in entries


@pytest.mark.parametrize("nccl,arch", [("2.28.9", "sm_90"), ("2.32.3", "sm_100")])
@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_all_reduce_across_nodes_uses_strong_signals(nccl, arch, algorithm):
    kernel = _library.kernel_for(algorithm, "all_reduce", RedOp.AVG, gin_peers=True)
    compiled = kernel.compile(_library._argtypes("bfloat16", nccl), arch=arch, nccl=nccl)
    assert STRONG_SIGNAL_FEATURE in compiled.features
    lsa_only = _library.kernel_for(algorithm, "all_reduce", RedOp.AVG, gin_peers=False)
    assert STRONG_SIGNAL_FEATURE not in lsa_only.compile(_library._argtypes("bfloat16", nccl), arch=arch,
                                                         nccl=nccl).features


@pytest.mark.parametrize("gin_peers", [False, True])
def test_direct_steps_compile(gin_peers):
    from flowdsl._kernel import FlowKernel
    from flowdsl.examples.allgather_direct import allgather_direct

    argtypes = FlowKernel.argtypes_for("devcomm", ("window", np.uint64), np.zeros(1, np.float32),
                                       ("window", np.float32), *([0] * 5), nccl="2.28.9")
    compiled = allgather_direct(gin_peers).compile(argtypes, arch="sm_90", nccl="2.28.9")
    assert (STRONG_SIGNAL_FEATURE in compiled.features) == gin_peers


def test_flow_loopback_compiles_for_every_narrow_type():
    from flowdsl._kernel import FlowKernel
    from flowdsl.examples.flow_loopback import loopback

    for dtype in (np.uint8, np.float16, np.uint16):
        argtypes = FlowKernel.argtypes_for("devcomm", ("window", np.uint64), np.zeros(1, dtype), np.zeros(1, dtype),
                                           *([0] * 6), nccl="2.28.9")
        loopback.compile(argtypes, arch="sm_90", nccl="2.28.9")


def test_cost_model_choices():
    # One rank: flowdsl's launch beats NCCL's 22 us floor; NCCL's copy engine wins past ~800 MB.
    assert cost.choose("all_reduce", 1, 1, 8, nccl_available=True) == "ring"
    assert cost.choose("all_reduce", 1, 1, 1 << 30, nccl_available=True) == "nccl"
    assert cost.choose("all_reduce", 1, 1, 1 << 30, nccl_available=False) == "ring"
    # Latency-bound across nodes: the tree's log steps beat the ring's 2(n-1).
    assert cost.choose("all_reduce", 64, 8, 4096, nccl_available=False) == "tree"
    # Bandwidth-bound on one node: the ring.
    assert cost.choose("all_reduce", 8, 8, 1 << 30, nccl_available=False) == "ring"
    assert cost.protocol_for(8, 8) == Protocol.LL
    assert cost.protocol_for(256 * 1024, 8) == Protocol.LL128
    assert cost.protocol_for(64 << 20, 8) == Protocol.SIMPLE
    cfg = FlowConfig()
    assert cost.channels_for(8, 8, cfg) == 1
    assert cost.channels_for(1 << 30, 8, cfg) == cfg.channels
    big = [cost.estimate("all_reduce", "ring", 8, 8, 1 << k) for k in range(10, 31, 4)]
    assert big == sorted(big)


def test_config_is_checked():
    from flowdsl import UsageError

    with pytest.raises(UsageError, match="give a multiple of 128 bytes"):
        FlowConfig(slot_bytes=100)
    with pytest.raises(UsageError, match="threads a multiple of 32"):
        FlowConfig(threads=100)


class _DeviceArray:
    """A stand-in for a CuPy array on another GPU (only what the checks read)."""

    def __init__(self, device):
        self.device = type("Device", (), {"id": device})()
        self.__cuda_array_interface__ = {"shape": (16,), "typestr": "<f4", "data": (0x7F0000000000, False),
                                         "strides": None, "version": 3}


def test_arrays_on_another_gpu_are_refused_before_launch():
    from flowdsl import UsageError
    from flowdsl import collectives as coll

    comm = type("Comm", (), {"nranks": 1, "device": 0, "alloc": None})()
    with pytest.raises(UsageError, match="src is on device 1 but the communicator uses device 0. Move it there"):
        coll.all_reduce(comm, _DeviceArray(1))
    with pytest.raises(UsageError, match="dst is on device 2 but the communicator uses device 0"):
        coll.broadcast(comm, _DeviceArray(0), _DeviceArray(2))
