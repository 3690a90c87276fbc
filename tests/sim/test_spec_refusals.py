"""The simulator refuses each bad argument of ``tests/spec_refusals.py`` with the GPU's typing
words (``tests/compile/test_spec_refusals.py``), then the fix, as a :class:`flowdsl.sim.UsageError`."""

from __future__ import annotations

import numpy as np
import pytest

import flowdsl
import flowdsl.sim as sim
from flowdsl._spec import spec_of
from tests.launching import launching
from tests.spec_refusals import ARITY_CASES, ARRAY, CASES, KIND_CASES

pytestmark = pytest.mark.sim


def _run_case(body):
    """Run a case's kernel body at one simulated rank, given its ``(comm, win, arr, n)``."""
    kernel = flowdsl.kernel(body)

    def main(comm):
        buf = comm.alloc(ARRAY.size, ARRAY.dtype)
        with comm.register(buf) as win, comm.device_communicator(lsa_barrier_count=1, gin_counter_count=1) as dc:
            kernel[1, 1](dc, win, np.zeros_like(ARRAY), 1)
            comm.synchronize()

    sim.spawn(main, nranks=1)


@pytest.mark.parametrize("body, pattern", CASES, ids=[body.__name__ for body, _ in CASES])
def test_simulator_refuses(body, pattern):
    with pytest.raises(sim.UsageError, match=pattern) as caught:
        _run_case(body)
    assert isinstance(caught.value, TypeError)
    assert isinstance(caught.value, flowdsl.KernelTypingError)  # what compiling for a GPU raises


def test_refusals_end_with_the_fix():
    @flowdsl.kernel
    def kernel(comm):
        flowdsl.gin.flush(comm, flowdsl.coop.cta())

    with pytest.raises(sim.UsageError) as caught:
        sim.spawn(launching(kernel, 1, 1), nranks=1)
    fix = spec_of(flowdsl.gin.flush).args["ctx"].fix
    assert f"got DevComm. {fix} (the call is flowdsl.gin.flush(ctx, coop, order=MemoryOrder.ACQUIRE)) [" in str(caught.value)


@pytest.mark.parametrize("body, pattern", ARITY_CASES, ids=[body.__name__ for body, _ in ARITY_CASES])
def test_simulator_refuses_arguments_the_stub_does_not_take(body, pattern):
    kernel = flowdsl.kernel(body)

    def main(comm):
        buf = comm.alloc(ARRAY.size, ARRAY.dtype)
        with comm.register(buf) as win, comm.device_communicator() as dc:
            kernel[1, 1](dc, win, np.zeros_like(ARRAY), 1)
            comm.synchronize()

    with pytest.raises(flowdsl.KernelTypingError, match=pattern):
        sim.spawn(main, nranks=1)


@pytest.mark.parametrize("body, pattern", KIND_CASES, ids=[body.__name__ for body, _ in KIND_CASES])
def test_simulator_refuses_an_argument_of_the_wrong_kind(body, pattern):
    with pytest.raises(flowdsl.KernelTypingError, match=pattern):
        _run_case(body)
