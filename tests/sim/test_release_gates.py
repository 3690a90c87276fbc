"""The simulator of an NCCL release (``spawn(nccl=...)``) refuses what a GPU build for that release refuses,
in the same words: a primitive's release gate and a fence level when the call runs, a device-communicator
requirement the release has no field for when the communicator is made."""

from __future__ import annotations

import numpy as np
import pytest

import flowdsl
from flowdsl import cft, sim
from flowdsl._release import nccl_refusal
from flowdsl.host import checks
from tests.release_gates import REFUSED_ON_2_28, rail_barrier_no_fence


def _run(kernel, nccl, **requirements):
    def main(comm):
        buf, out = comm.alloc(64, np.uint64), comm.alloc(4, np.uint64)
        buf.set(np.arange(64, dtype=np.uint64) + 100 * comm.rank)
        with comm.register(buf) as win, comm.device_communicator(**requirements) as dc:
            kernel[1, 32](dc, win, out)
            comm.synchronize()
        return buf.get()
    return sim.spawn(main, nranks=2, nodes=2, nccl=nccl)


@pytest.mark.parametrize("kernel, feature, needs, requirements", REFUSED_ON_2_28,
                         ids=[k.__name__ for k, *_ in REFUSED_ON_2_28])
def test_what_2_28_lacks_is_refused_when_simulating_it_in_the_compile_paths_words(kernel, feature, needs,
                                                                                  requirements):
    with pytest.raises(flowdsl.FeatureUnavailableError) as caught:
        _run(kernel, "2.28.9", **requirements)
    assert str(caught.value).startswith(nccl_refusal(feature, needs, (2, 28, 9), simulated=True)), str(caught.value)
    assert isinstance(caught.value, flowdsl.KernelTypingError)  # what compiling for 2.28.9 raises


@pytest.mark.parametrize("kernel, feature, needs, requirements", REFUSED_ON_2_28,
                         ids=[k.__name__ for k, *_ in REFUSED_ON_2_28])
def test_a_release_that_has_it_runs_it(kernel, feature, needs, requirements):
    _run(kernel, "2.32.3", **requirements)
    _run(kernel, None, **requirements)  # the default: the newest release, which refuses nothing


def test_a_get_on_2_32_moves_the_peers_bytes():
    from tests.release_gates import get_from_peer
    got = _run(get_from_peer, "2.32.3", gin_signal_count=1)
    for rank in range(2):
        np.testing.assert_array_equal(got[rank][8:16], np.arange(8, dtype=np.uint64) + 100 * (1 - rank))


def test_the_fence_level_nccl_2_28_has_runs_there():
    _run(rail_barrier_no_fence, "2.28.9", rail_gin_barrier_count=1)


@pytest.mark.parametrize("nccl, requirement", [("2.28.9", "world_gin_barrier_count"), ("2.28.9", "gin_type"),
                                               ("2.28.9", "gin_strong_signals_required"),
                                               ("2.32.6", "cft_barrier_count")])
def test_a_requirement_the_release_has_no_field_for_is_refused_as_the_gpu_refuses_it(nccl, requirement):
    value = {"gin_type": flowdsl.GinBackend.PROXY, "gin_strong_signals_required": True}.get(requirement, 1)

    def main(comm):
        with comm.device_communicator(**{requirement: value}):
            pass

    with pytest.raises(flowdsl.UsageError) as caught:
        sim.spawn(main, nranks=2, nodes=2, nccl=nccl)
    assert str(caught.value).startswith(str(checks.requirement_unavailable(requirement, tuple(map(int, nccl.split("."))))))


def test_cft_is_refused_before_the_release_that_has_it():
    @flowdsl.kernel
    def cft_team(comm, out):
        out[0] = cft.team(comm).nranks

    def main(comm):
        out = comm.alloc(1, np.int64)
        with comm.device_communicator() as dc:
            cft_team[1, 1](dc, out)
            comm.synchronize()
        return int(out.get()[0])

    with pytest.raises(flowdsl.FeatureUnavailableError, match=r"flowdsl.cft.team requires NCCL >= 2.31.0, but this "
                                                              r"kernel is simulated for NCCL 2.28.9"):
        sim.spawn(main, nranks=2, nccl="2.28.9")
    assert sim.spawn(main, nranks=2, nccl="2.32.3") == [2, 2]


def test_a_release_flowdsl_does_not_build_for_is_refused_naming_those_it_does():
    with pytest.raises(flowdsl.UsageError, match=r"Cannot spawn a simulation of NCCL 2.30.0: flowdsl builds for "
                                                 r"NCCL 2.28.9, 2.32.3, 2.32.6. Pass one of them"):
        sim.spawn(lambda comm: None, nranks=1, nccl="2.30.0")


@flowdsl.kernel
def _cft_team_size(comm, out):
    out[0] = cft.team(comm).nranks


def _team_size(**spawn):
    def main(comm):
        out = comm.alloc(1, np.int64)
        with comm.device_communicator() as dc:
            _cft_team_size[1, 1](dc, out)
            comm.synchronize()
        return int(out.get()[0]), comm.cft_missing
    return sim.spawn(main, nranks=2, **spawn)


def test_cft_is_refused_on_an_arch_before_sm_100_in_the_compile_paths_words():
    from flowdsl._release import arch_refusal
    with pytest.raises(flowdsl.FeatureUnavailableError) as caught:
        _team_size(arch="sm_90")
    assert str(caught.value).startswith(arch_refusal("flowdsl.cft.team", (10, 0), "sm_90", simulated=True))
    assert _team_size(arch="sm_100") == [(2, None), (2, None)]


def test_the_communicator_says_what_cft_lacks_on_the_release_and_arch_simulated():
    def main(comm):
        return comm.cft_missing
    assert sim.spawn(main, nranks=1) == [None]
    missing = sim.spawn(main, nranks=1, nccl="2.28.9", arch="sm_90")[0]
    assert missing.startswith("needs NCCL >= 2.32") and "an sm_100 or newer GPU (this run simulates sm_90" in missing


def test_an_arch_named_as_nvcc_does_not_is_refused():
    with pytest.raises(flowdsl.UsageError, match=r"Cannot spawn a simulation for arch 'sm90': name the GPU "
                                                 r"architecture as sm_"):
        sim.spawn(lambda comm: None, nranks=1, arch="sm90")
