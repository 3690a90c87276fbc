"""The GPU's typing refuses each bad argument of ``tests/spec_refusals.py`` in its spec's words
(the simulator's test runs the same cases: ``tests/sim/test_spec_refusals.py``)."""

from __future__ import annotations

import pytest
from numba.core.errors import TypingError

import flowdsl
from tests.spec_refusals import ARITY_CASES, ARRAY, CASES, KIND_CASES

pytestmark = pytest.mark.compile

NCCL = "2.32.3"


@pytest.mark.parametrize("body, pattern", CASES, ids=[body.__name__ for body, _ in CASES])
def test_typing_refuses(body, pattern):
    kernel = flowdsl.kernel(body)
    argtypes = flowdsl.FlowKernel.argtypes_for("devcomm", ("window", ARRAY.dtype), ARRAY, 1, nccl=NCCL)
    with pytest.raises(TypingError, match=pattern) as caught:
        kernel.compile(argtypes, arch="sm_100", nccl=NCCL, cuda="13.3")
    # A flowdsl error (the class the simulator raises for the same mistake), numba's own as its cause.
    assert type(caught.value) is flowdsl.KernelTypingError and isinstance(caught.value, flowdsl.UsageError)
    assert isinstance(caught.value.__cause__, TypingError)


def _compile_case(body):
    """Compile a case's kernel body ``(comm, win, arr, n)`` for the GPU (sm_100, NCCL 2.32.3)."""
    argtypes = flowdsl.FlowKernel.argtypes_for("devcomm", ("window", ARRAY.dtype), ARRAY, 1, nccl=NCCL)
    flowdsl.kernel(body).compile(argtypes, arch="sm_100", nccl=NCCL, cuda="13.3")


@pytest.mark.parametrize("body, pattern", ARITY_CASES, ids=[body.__name__ for body, _ in ARITY_CASES])
def test_typing_refuses_arguments_the_stub_does_not_take(body, pattern):
    with pytest.raises(flowdsl.KernelTypingError, match=pattern):
        _compile_case(body)


@pytest.mark.parametrize("body, pattern", KIND_CASES, ids=[body.__name__ for body, _ in KIND_CASES])
def test_typing_refuses_an_argument_of_the_wrong_kind(body, pattern):
    with pytest.raises(flowdsl.KernelTypingError, match=pattern):
        _compile_case(body)
