"""numba-cuda features the simulator models, run on the GPU with the simulator tests' kernels and checks: the
intrinsics probe (tests/sim/test_intrinsics.py; fma and the atomics' NaN rules bit for bit) and dynamic shared
memory (tests/sim/test_dynamic_shared.py)."""

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


def test_dynamic_shared_memory_on_the_gpu_as_on_the_simulator(comm):
    import cupy

    from tests.sim.test_dynamic_shared import through_dynamic_shared

    src = np.random.default_rng(64).standard_normal(64).astype(np.float32)
    out = cupy.zeros(64, np.int32)
    through_dynamic_shared[1, 64, None, 64 * 4](cupy.asarray(src), out, 64)
    comm.synchronize()
    np.testing.assert_array_equal(out.get(), np.roll(src, -1).view(np.int32))
