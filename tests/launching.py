"""A rank's host program that launches one kernel, for tests that run it on the simulator."""

from __future__ import annotations


def launching(kernel, grid, block, /, **devcomm):
    """``main(comm)``: launch ``kernel[grid, block](dc)`` once on a device communicator made with
    ``devcomm``, and wait for it."""
    def main(comm):
        with comm.device_communicator(**devcomm) as dc:
            kernel[grid, block](dc)
            comm.synchronize()
    return main
