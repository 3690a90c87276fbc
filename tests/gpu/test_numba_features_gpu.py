"""numba-cuda features the simulator models, run on the GPU with the simulator tests' kernels and checks: the
intrinsics probe (tests/sim/test_intrinsics.py; fma and the atomics' NaN rules bit for bit), dynamic shared
memory (tests/sim/test_dynamic_shared.py), and numba-cuda's signatures, ``specialize`` and ``forall``
(tests/sim/test_numba_conventions.py)."""

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


def test_numba_signatures_specialize_and_forall_on_the_gpu(comm):
    import cupy

    import flowdsl
    from tests.sim.test_numba_conventions import bits_and_sum, count_tasks

    typed = flowdsl.kernel("void(int64[:], int32, int32)")(bits_and_sum)
    out = cupy.zeros(2, np.int64)
    typed[1, 1](out, 0xFFFFFFFF, 2)
    comm.synchronize()
    assert list(out.get()) == [0, 1]  # as on the simulator: -1 as an int32, clz 0, -1 + 2
    special = flowdsl.kernel(bits_and_sum).specialize(out, np.int32(1), np.int32(0))
    special[1, 1](out, 1, 2)
    comm.synchronize()
    assert list(out.get()) == [31, 3]
    tasks = cupy.zeros(1, np.int64)
    count_tasks.forall(300)(tasks, 300)
    count_tasks.forall(0)(tasks, 0)
    comm.synchronize()
    assert int(tasks.get()[0]) == 300


def test_fp16_on_the_gpu_bit_for_bit_with_the_simulator(comm):
    import cupy

    from tests.sim.test_intrinsics import fp16_expected, fp16_inputs, fp16_probe

    a, b, c = fp16_inputs()
    out, flags = cupy.zeros((256, 10), np.float16), cupy.zeros((256, 4), np.uint8)
    fp16_probe[2, 128](cupy.asarray(a), cupy.asarray(b), cupy.asarray(c), out, flags)
    comm.synchronize()
    want, want_flags = fp16_expected(a, b, c)
    got = out.get()
    nan = np.isnan(want)  # NaN payloads may differ: a NaN must be a NaN
    assert (np.isnan(got) == nan).all()
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    np.testing.assert_array_equal(flags.get(), want_flags)
