"""A rank's host program that launches one kernel, for tests that run it on the simulator."""

from __future__ import annotations

import pytest


def launching(kernel, grid, block, /, **devcomm):
    """``main(comm)``: launch ``kernel[grid, block](dc)`` once on a device communicator made with
    ``devcomm``, and wait for it."""
    def main(comm):
        with comm.device_communicator(**devcomm) as dc:
            kernel[grid, block](dc)
            comm.synchronize()
    return main


def launch_refused(kernel, grid, block, /, error, match, nranks=2, nodes=1, **devcomm):
    """Assert that :func:`launching` ``kernel`` on ``nranks`` simulated ranks (``nodes`` nodes) raises
    ``error`` with a message matching ``match``; the error."""
    from flowdsl import sim
    with pytest.raises(error, match=match) as caught:
        sim.spawn(launching(kernel, grid, block, **devcomm), nranks=nranks, nodes=nodes)
    return caught.value
