"""Host NumPy arrays passed to a launch, as numba-cuda takes them (flowdsl.host.transfers): copied in and back
with numba's performance warning, ``cuda.In`` in only, ``cuda.Out`` back only, ``cuda.InOut`` both, and
numba-cuda's ``extensions`` hooks; a launch that copies back returns with the results there. The host program is shared with the GPU test
(tests/gpu/test_numba_features_gpu.py), so both paths are held to the same results."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from numba import cuda

import flowdsl
from flowdsl.testing import run_ranks

pytestmark = pytest.mark.sim


@flowdsl.kernel
def scale_and_mark(src, dst, factor):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i] * factor
        src[i] = -1.0  # a write to the input: seen on the host only where it is copied back


def host_arrays_main(comm):
    """Every way numba-cuda passes a host array; returns what it checked (the caller asserts it is all True)."""
    from numba.cuda.core.errors import NumbaPerformanceWarning  # numba-cuda's own class, as its launch warns

    rng = np.random.default_rng(7)
    n = 300
    seen = {}
    src = rng.standard_normal(n).astype(np.float32)
    expect = src * np.float32(3)
    host_src, dst = src.copy(), np.full(n, np.nan, np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scale_and_mark[(n + 127) // 128, 128](host_src, dst, np.float32(3))
    # No synchronize: a launch that copies back returns with the results on the host.
    seen["plain: both copied back"] = np.array_equal(dst, expect) and (host_src == -1).all()
    seen["plain: numba's warning, at the launch"] = any(
        issubclass(w.category, NumbaPerformanceWarning) and "copy overhead" in str(w.message)
        and w.filename == __file__ for w in caught)

    host_src, dst = src.copy(), np.full(n, np.nan, np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scale_and_mark[(n + 127) // 128, 128](cuda.In(host_src), cuda.Out(dst), np.float32(3))
    seen["Out: copied back"] = np.array_equal(dst, expect)
    seen["In: not copied back"] = np.array_equal(host_src, src)
    seen["hints: no warning"] = not any(  # of copies (a grid this small has numba-cuda's low-occupancy one)
        issubclass(w.category, NumbaPerformanceWarning) and "copy overhead" in str(w.message) for w in caught)

    host_src = src.copy()
    device_dst = comm.alloc(n, np.float32)
    device_dst.set(np.full(n, np.nan, np.float32))
    scale_and_mark[(n + 127) // 128, 128](cuda.InOut(host_src), cuda.InOut(device_dst), np.float32(3))
    comm.synchronize()
    seen["InOut: copied back; device memory in a hint passed as it is"] = (
        (host_src == -1).all() and np.array_equal(device_dst.get(), expect))

    strided = np.zeros(2 * n, np.float32)
    scale_and_mark[(n + 127) // 128, 128](src.copy(), strided[::2], np.float32(3))
    seen["a strided view: copied back into its elements only"] = (
        np.array_equal(strided[::2], expect) and (strided[1::2] == 0).all())

    ran = []

    class InByDefault:  # numba-cuda's extension hook, as its tests write one
        def prepare_args(self, ty, val, stream=None, retr=None):
            retr.append(lambda: ran.append("writeback"))
            return ty, (cuda.In(val) if isinstance(val, np.ndarray) else val)

    nocopy = flowdsl.kernel(scale_and_mark.py_func)
    nocopy.extensions.append(InByDefault())
    dst = np.full(n, np.nan, np.float32)
    nocopy[(n + 127) // 128, 128](src.copy(), dst, np.float32(3))
    comm.synchronize()
    seen["extensions: their hints hold, their retr callables run after the launch"] = (
        np.isnan(dst).all() and ran == ["writeback"] * 3)

    try:
        scale_and_mark[1, 128].prepare(src.copy(), device_dst, np.float32(3))
        seen["prepare refuses a host array"] = False
    except flowdsl.UsageError as e:
        seen["prepare refuses a host array"] = "Cannot prepare a launch of scale_and_mark with a host NumPy " \
                                               "array (argument 0)" in str(e) and "launch it directly" in str(e)
    comm.free(device_dst)
    return seen


def test_host_arrays_are_copied_in_and_back_as_numba_cuda_does():
    seen = run_ranks(host_arrays_main, nranks=1)[0]
    assert all(seen.values()), {k: v for k, v in seen.items() if not v}


def test_an_out_array_starts_undefined_on_the_simulator_as_on_a_gpu():
    @flowdsl.kernel
    def read_first(dst, out):
        out[0] = dst[0]

    def main(comm):
        dst, out = np.zeros(4, np.float32), np.zeros(1, np.float32)
        read_first[1, 1](cuda.Out(dst), out)
        return out
    assert np.isnan(run_ranks(main, nranks=1)[0][0])  # poisoned: not the host's zeros


def test_a_python_list_is_refused_at_the_launch_naming_the_fix():
    def main(comm):
        with pytest.raises(flowdsl.UsageError, match=r"Cannot launch scale_and_mark: argument 1 is a Python list, "
                                                      r"which a kernel cannot take. Pass a NumPy array"):
            scale_and_mark[1, 32](np.zeros(4, np.float32), [0.0] * 4, np.float32(2))
        return True
    assert run_ranks(main, nranks=1) == [True]


def test_a_host_array_without_a_gpu_or_a_simulation_says_so():
    from tests.conftest import gpu_count

    if gpu_count():
        pytest.skip("this machine has a GPU")
    with pytest.raises(flowdsl.NoDeviceError, match=r"Cannot launch scale_and_mark with a host NumPy array: no CUDA "
                                                     r"GPU is available.*flowdsl.sim.spawn"):
        scale_and_mark[1, 32](np.zeros(4, np.float32), np.zeros(4, np.float32), np.float32(2))
