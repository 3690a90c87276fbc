"""Compiling for an NCCL release refuses what it lacks in the words the simulator of that release uses
(``tests/sim/test_release_gates.py``), and the simulator's table of the requirement fields each release
lacks is what the releases' probed layouts say."""

from __future__ import annotations

import numpy as np
import pytest

import flowdsl
from flowdsl._release import SUPPORTED_RELEASES, nccl_refusal, parse_version
from flowdsl.host import checks
from tests.release_gates import REFUSED_ON_2_28

ARGS = ("devcomm", ("window", np.uint64), np.zeros(4, np.uint64))


@pytest.mark.parametrize("kernel, feature, needs, requirements", REFUSED_ON_2_28,
                         ids=[k.__name__ for k, *_ in REFUSED_ON_2_28])
def test_compiling_for_2_28_refuses_it_in_the_simulators_words(kernel, feature, needs, requirements):
    with pytest.raises(flowdsl.FeatureUnavailableError) as caught:
        kernel.compile(flowdsl.FlowKernel.argtypes_for(*ARGS, nccl="2.28.9"), arch="sm_90", nccl="2.28.9")
    assert str(caught.value).startswith(nccl_refusal(feature, needs, (2, 28, 9))), str(caught.value)
    kernel.compile(flowdsl.FlowKernel.argtypes_for(*ARGS, nccl="2.32.3"), arch="sm_90", nccl="2.32.3")


@pytest.mark.parametrize("release", SUPPORTED_RELEASES)
def test_the_requirements_a_release_lacks_are_those_its_layout_lacks(release):
    from flowdsl.runtime.support import abi_layout
    present = abi_layout(parse_version(release))["requirements_fields"]
    assert checks.REQUIREMENTS_LACKING[release] == {k for k, field in checks.REQUIREMENT_FIELDS.items()
                                                    if field not in present}


def test_compiling_cft_for_sm_90_refuses_it_in_the_simulators_words():
    from flowdsl import cft
    from flowdsl._release import arch_refusal

    @flowdsl.kernel
    def cft_team_size(comm, win, out):
        out[0] = cft.team(comm).nranks

    with pytest.raises(flowdsl.FeatureUnavailableError) as caught:
        cft_team_size.compile(flowdsl.FlowKernel.argtypes_for(*ARGS, nccl="2.32.3"), arch="sm_90", nccl="2.32.3")
    assert str(caught.value).startswith(arch_refusal("flowdsl.cft.team", (10, 0), "sm_90")), str(caught.value)
