"""The intrinsics probe on the GPU: what the simulator's tests assert of it (tests/sim/test_intrinsics.py)
holds on the device, and the simulator's fma and atomics give the device's bits."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_the_intrinsics_probe_on_the_gpu_agrees_with_the_simulator(comm):
    import cupy

    from flowdsl.sim import intrinsics
    from tests.sim.test_intrinsics import check_probe, intrinsic_probe, probe_inputs, probe_outputs

    ints, floats = probe_inputs()
    outputs = [cupy.asarray(o) for o in probe_outputs()]
    intrinsic_probe[1, 32](cupy.asarray(ints), cupy.asarray(floats), *outputs)
    comm.synchronize()
    got = [o.get() for o in outputs]
    check_probe(ints, floats, *got)
    np.testing.assert_array_equal(got[2][:, 0], [intrinsics.fma(f, f, -1.0) for f in floats])
