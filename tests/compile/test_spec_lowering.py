"""Primitives lowered from their spec alone (``returns=``: flowdsl/lowering/generic.py): the team primitives
compile with positional and keyword arguments and refuse a wrong argument in the spec's words; a new one-call
primitive needs only its stub (here reusing an existing C function) to compile; a kind without a C mapping and
``returns`` without ``extern`` are refused naming the fix. Compile only."""

from __future__ import annotations

import numpy as np
import pytest

import flowdsl
from flowdsl import team
from flowdsl._spec import COMM, SPECS, TEAM, make_spec, spec_of
from flowdsl._stubs import PRIMITIVES, primitive
from flowdsl.errors import FlowDSLError

pytestmark = pytest.mark.compile


def _compile(fn, *args):
    return flowdsl.kernel(fn).compile(flowdsl.FlowKernel.argtypes_for(*args, nccl="2.28.9"), arch="sm_90",
                                      nccl="2.28.9")


def test_the_team_primitives_are_lowered_from_their_specs():
    assert {name: spec_of(stub).returns for name, stub in PRIMITIVES.items() if name.startswith("flowdsl.team.")} \
        == {"flowdsl.team.world": "team", "flowdsl.team.lsa": "team", "flowdsl.team.rail": "team",
            "flowdsl.team.rank_to_world": "value", "flowdsl.team.rank_to_lsa": "value",
            "flowdsl.team.rank_is_member": "bool", "flowdsl.team.rank_to_team": "value",
            "flowdsl.team.inner_factor": "team", "flowdsl.team.outer_factor": "team",
            "flowdsl.team.rank_in_difference": "value"}


def test_keywords_and_the_specs_refusal_hold_for_a_generated_lowering():
    def by_keyword(comm, out):
        out[0] = team.rank_to_world(comm, rank=1, team=team.lsa(comm))

    assert len(_compile(by_keyword, "devcomm", np.zeros(1, np.int32)).function_symbols()) == 1

    def wrong(comm, out):
        out[0] = team.rank_to_world(comm, 3, 1)

    with pytest.raises(flowdsl.KernelTypingError, match=r"flowdsl.team.rank_to_world requires a team, got int64"):
        _compile(wrong, "devcomm", np.zeros(1, np.int32))


def test_a_new_one_call_primitive_needs_only_its_stub():
    from flowdsl.lowering.generic import lower_from_spec

    @primitive(extern="flowdsl_team_rank_to_lsa", returns="value", comm=COMM, team=TEAM)
    def lsa_rank_of(comm, team, rank):
        """A second name for ``team.rank_to_lsa``: a primitive made by its stub alone."""

    try:
        lower_from_spec(lsa_rank_of)

        def k(comm, out):
            out[0] = lsa_rank_of(comm, team.world(comm), 0)

        assert len(_compile(k, "devcomm", np.zeros(1, np.int32)).function_symbols()) == 1
    finally:
        PRIMITIVES.pop(spec_of(lsa_rank_of).name)
        SPECS.pop(spec_of(lsa_rank_of).name)


def test_what_a_spec_cannot_lower_is_refused_naming_the_fix():
    from flowdsl._spec import WINDOW
    from flowdsl.lowering.generic import lower_from_spec

    def body(win):
        """A window has no C mapping of its own (its pointer depends on the call)."""

    stub = primitive(body, extern="flowdsl_get_local_pointer", returns="value", win=WINDOW)
    try:
        with pytest.raises(FlowDSLError, match=r"Cannot lower .*body from its spec: its argument win is of kind "
                                               r"'window', which has no C mapping .*C_ARGUMENTS\)\. Add one, or "
                                               r"write its lowering by hand"):
            lower_from_spec(stub)
    finally:
        PRIMITIVES.pop(spec_of(stub).name)
        SPECS.pop(spec_of(stub).name)
    with pytest.raises(FlowDSLError, match=r"returns='value': a primitive lowered from its spec calls extern="):
        make_spec(body, returns="value", win=WINDOW)
