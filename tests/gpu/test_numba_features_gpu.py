"""numba-cuda features the simulator models, run on the GPU with the simulator tests' kernels and checks: the
intrinsics probe (tests/sim/test_intrinsics.py; fma and the atomics' NaN rules bit for bit), dynamic shared
memory (tests/sim/test_dynamic_shared.py), numba-cuda's signatures, ``specialize`` and ``forall``
(tests/sim/test_numba_conventions.py), and host NumPy arrays (tests/sim/test_host_arrays.py)."""

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


def test_host_arrays_on_the_gpu_as_on_the_simulator(comm):
    from tests.sim.test_host_arrays import host_arrays_main

    seen = host_arrays_main(comm)
    assert all(seen.values()), {k: v for k, v in seen.items() if not v}


def test_half_precision_and_link_files_through_flowdsls_link_step(comm, tmp_path):
    """numba-cuda's shims (float16 arithmetic, bfloat16 intrinsics) and a link= file, against NumPy."""
    import cupy

    import flowdsl
    from tests.compile.test_numba_linking_compile import (TRIPLE_CU, bf16_arithmetic, half_arithmetic,
                                                          linked_triple)

    rng = np.random.default_rng(16)
    a, b = (rng.standard_normal(256).astype(np.float16) for _ in range(2))
    out = cupy.full(256, np.nan, np.float16)
    flowdsl.kernel(half_arithmetic)[2, 128](cupy.asarray(a), cupy.asarray(b), out)
    af, bf = a.astype(np.float64), b.astype(np.float64)
    fused = (af * bf + (a + b).astype(np.float64)).astype(np.float16)  # exact in float64, then one rounding
    want = np.where(a < b, fused, a * b)
    np.testing.assert_array_equal(out.get(), want)

    x, y = rng.standard_normal(256).astype(np.float32), rng.standard_normal(256).astype(np.float32)
    got = cupy.full(256, np.nan, np.float32)
    flowdsl.kernel(bf16_arithmetic)[2, 128](cupy.asarray(x), cupy.asarray(y), got)
    rx, ry = _to_bfloat16(x.astype(np.float64)), _to_bfloat16(y.astype(np.float64))
    fused = rx.astype(np.float64) * ry.astype(np.float64) + rx.astype(np.float64)  # exact in float64
    np.testing.assert_array_equal(got.get(), _to_bfloat16(fused))  # then one rounding

    source = tmp_path / "triple.cu"
    source.write_text(TRIPLE_CU)
    tripled = cupy.zeros(300, np.int32)
    flowdsl.kernel(linked_triple, link=[str(source)])[3, 128](tripled)
    comm.synchronize()
    np.testing.assert_array_equal(tripled.get(), 3 * np.arange(300) + 1)


def _to_bfloat16(v: np.ndarray) -> np.ndarray:
    """float64 ``v`` rounded to the nearest bfloat16 (ties to even; normal numbers), as float32."""
    bits = v.view(np.uint64)
    rounded = (bits + np.uint64((1 << 44) - 1) + ((bits >> np.uint64(45)) & np.uint64(1))) >> np.uint64(45) \
        << np.uint64(45)
    return rounded.view(np.float64).astype(np.float32)


def test_the_dispatcher_api_on_a_loaded_kernel(comm):
    """numba-cuda's resource getters and SASS on the kernel as the GPU loaded it."""
    from numba import void

    from tests.compile.test_dispatcher_api_compile import SIG, store_scaled

    regs = store_scaled.get_regs_per_thread()  # one signature: specialized, its value (numba-cuda's rule)
    assert isinstance(regs, int) and 0 < regs <= 255
    assert store_scaled.get_regs_per_thread(SIG) == store_scaled.get_regs_per_thread(void(*SIG)) == regs
    assert store_scaled.get_max_threads_per_block(SIG) >= 128 and store_scaled.get_local_mem_per_thread(SIG) == 0
    assert store_scaled.get_shared_mem_per_block(SIG) == 0
    sass = store_scaled.inspect_sass(SIG)
    assert "store_scaled" in sass and "EXIT" in sass
    # numba-cuda's tests read a kernel's typing there (test_sm_creation, test_localmem)
    typemap = store_scaled.overloads[SIG]._type_annotation.typemap
    assert str(typemap["x"]) == "array(float32, 1d, C)" and str(typemap["y"]) == "int32"
    # and its code there (test_array_alignment reads a local array's alignment in the loaded kernel's LLVM IR)
    loaded = store_scaled.overloads[SIG]
    assert loaded.inspect_llvm() == store_scaled.inspect_llvm(SIG) and "store_scaled" in loaded.inspect_llvm()
    assert ".entry" in loaded.inspect_asm(None)


def test_element_conversions_on_the_gpu_bit_for_bit(comm):
    import cupy

    from tests.sim.test_element_conversions import check, conversion_probe, expected, outputs, probe_inputs

    values, bf16, f16 = probe_inputs()
    outs = [cupy.asarray(o) for o in outputs(values.size)]
    conversion_probe[(values.size + 127) // 128, 128](cupy.asarray(values), cupy.asarray(bf16), cupy.asarray(f16),
                                                      *outs)
    comm.synchronize()
    check([o.get() for o in outs], expected(values, bf16, f16))


def test_float64_elements_are_computed_in_float64_on_the_gpu(comm):
    import cupy

    from tests.sim.test_element_conversions import float64_through

    x = np.random.default_rng(3).standard_normal(200)
    y = cupy.full(200, np.nan)
    float64_through[2, 128](cupy.asarray(x), y)
    comm.synchronize()
    # float64 throughout (ptxas may fuse the multiply-add: one rounding fewer than NumPy's)
    np.testing.assert_allclose(y.get(), x * 3.0 + 0.1, rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_rmsnorm_in_each_element_type_matches_numpy(comm, dtype):
    from flowdsl.examples import rmsnorm_lsa

    result, reference = rmsnorm_lsa.run(comm, tokens_per_rank=4, hidden=1024, seed=3, dtype=dtype)
    tol = rmsnorm_lsa.TOLERANCE[dtype]
    np.testing.assert_allclose(result, reference, rtol=tol, atol=tol)


def test_bf16_on_the_gpu_bit_for_bit_with_the_simulator(comm):
    import cupy

    from tests.sim.test_bf16 import N, bf16_probe, check, expected, outputs, probe_inputs

    a, b, c, floats = probe_inputs()
    outs = [cupy.asarray(o) for o in outputs()]
    bf16_probe[(N + 127) // 128, 128](cupy.asarray(a), cupy.asarray(b), cupy.asarray(c), cupy.asarray(floats), *outs)
    comm.synchronize()
    check([o.get() for o in outs], expected(a, b, c, floats), a, b)


def test_a_grid_sync_on_the_gpu_as_on_the_simulator(comm):
    """A cooperative launch (numba-cuda's launcher) of a kernel that syncs its grid."""
    import cupy

    from tests.sim.test_grid_sync import reference, sequential_rows

    m = cupy.zeros((64, 256), np.int32)
    sequential_rows[8, 32](m)
    comm.synchronize()
    np.testing.assert_array_equal(m.get(), reference((64, 256)))


def test_a_kernel_called_from_another_kernel_on_the_gpu(comm):
    from tests.sim.test_numba_conventions import kernel_calling_kernels_main

    got, x = kernel_calling_kernels_main(comm)
    np.testing.assert_allclose(got, x * x * x + np.float32(7), rtol=1e-6)


def test_a_declared_signature_compiles_at_decoration(comm):
    """numba-cuda compiles ``cuda.jit(signature)`` at once: a typing error is raised by the decoration (naming
    the line), and a good kernel is loaded before its first launch."""
    from numba import cuda, float32

    import flowdsl
    from flowdsl.errors import KernelTypingError

    def float_shape(x):
        s = cuda.shared.array(shape=1.5, dtype=float32)
        x[0] = s[0]

    with pytest.raises(KernelTypingError, match="shared.array") as raised:
        flowdsl.kernel("void(float32[:])")(float_shape)
    assert "float_shape" in str(raised.value)

    def copy_first(x):
        x[1] = x[0]

    ready = flowdsl.kernel("void(float32[:])")(copy_first)
    assert ready.last_build["source"] in ("compiled", "disk") and len(ready._loaded) == 1


def test_launch_bounds_on_the_gpu(comm):
    from tests.sim.test_numba_conventions import launch_bounds_main

    got, message = launch_bounds_main(comm)
    assert (got == 1).all() and "256 threads a block" in message


def test_a_shared_memory_carveout_on_the_gpu(comm):
    import cupy

    import flowdsl
    from tests.sim.test_numba_conventions import add_into

    for value in ("MaxL1", "MaxShared", "default", 0, 50, 100, -1):
        r = cupy.zeros(1, np.int64)
        flowdsl.kernel(shared_memory_carveout=value)(add_into)[1, 1](r, 2, 3)
        comm.synchronize()
        assert int(r.get()[0]) == 5, value


def test_a_debug_kernels_exception_is_raised_at_its_launch(comm):
    """numba-cuda's debug=True through flowdsl's link and launch: the same check as on the simulator."""
    import cupy

    from tests.sim.test_numba_conventions import check_debug_exception, raises_past_the_end

    a = cupy.full(64, -1, np.float32)
    check_debug_exception(lambda n: raises_past_the_end[2, 32](a, n), comm.synchronize, a.get)


def test_coop_utilities_on_the_gpu_as_on_the_simulator(comm):
    import cupy

    from tests.sim.test_semantics import check_coop_traits, coop_traits

    out = cupy.zeros((64, 7), np.int64)
    coop_traits[1, 64](out)
    comm.synchronize()
    check_coop_traits(out.get())


@pytest.mark.parametrize("dtype", [np.int32, np.uint64, np.float32, np.float64])
def test_coop_broadcast_on_the_gpu_as_on_the_simulator(comm, dtype):
    import cupy

    from tests.sim.test_semantics import broadcast_expected, coop_broadcasts

    a = (np.arange(96) * 3 + 1).astype(dtype)
    out = cupy.zeros((96, 6), dtype)
    coop_broadcasts[1, 96](out, cupy.asarray(a))
    comm.synchronize()
    np.testing.assert_array_equal(out.get(), broadcast_expected(a))


def test_coop_tiles_on_the_gpu_as_on_the_simulator(comm):
    import cupy

    from tests.sim.test_semantics import check_coop_tiles, coop_tiles

    out = cupy.zeros((64, 4), np.int64)
    coop_tiles[1, 64](out)
    comm.synchronize()
    check_coop_tiles(out.get())


_CACHED_MODULE = '''
import os

import numpy as np
from numba import cuda

import flowdsl

Z = 1
jit = cuda.jit if os.environ.get("PLAIN_NUMBA_CUDA") else flowdsl.kernel


@jit(cache=True)
def add(r, x, y):
    r[0] = x[0] + y[0] + Z


def run():
    r = np.zeros(1, np.float64)
    add[1, 1](r, np.array([2.0]), np.array([3.0]))
    return r[0]
'''


def test_cache_true_is_numba_cudas_disk_cache(comm, tmp_path, monkeypatch):
    """numba-cuda's files beside the source, its hits and misses, recompile(), and numba-cuda's own dispatcher
    loading flowdsl's entry in another process (test_caching's rules)."""
    import importlib
    import os
    import subprocess
    import sys
    import warnings

    (tmp_path / "flowdsl_cache_true_fodder.py").write_text(_CACHED_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PLAIN_NUMBA_CUDA", raising=False)
    pycache = tmp_path / "__pycache__"

    def entries():
        return sorted(p.name for p in pycache.glob("*") if p.suffix in (".nbi", ".nbc")) if pycache.exists() else []

    def fresh():
        sys.modules.pop("flowdsl_cache_true_fodder", None)
        return importlib.import_module("flowdsl_cache_true_fodder")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numba's performance warning for host arrays
        mod = fresh()
        assert entries() == [] and mod.run() == 6.0
        assert [n[-4:] for n in entries()] == [".nbc", ".nbi"], entries()
        assert sum(mod.add.stats.cache_misses.values()) == 1 and not sum(mod.add.stats.cache_hits.values())
        mtimes = {p: os.path.getmtime(pycache / p) for p in entries()}

        mod = fresh()  # a new kernel object: loaded from numba-cuda's entry
        assert mod.run() == 6.0 and sum(mod.add.stats.cache_hits.values()) == 1
        assert not sum(mod.add.stats.cache_misses.values())

        code = ("import sys; sys.path.insert(0, sys.argv[1]); import flowdsl_cache_true_fodder as m; "
                "print(m.run(), sum(m.add.stats.cache_hits.values()), type(m.add).__module__)")
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                              env={**os.environ, "PLAIN_NUMBA_CUDA": "1"}, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        value, hits, module = done.stdout.split()[-3:]
        assert (float(value), int(hits)) == (6.0, 1) and module.startswith("numba"), done.stdout
        assert {p: os.path.getmtime(pycache / p) for p in entries()} == mtimes  # read, not written again

        mod.Z = 10  # numba froze Z at the compile; recompile() takes its value now, on disk too
        assert mod.run() == 6.0
        mod.add.recompile()
        assert mod.run() == 15.0
        assert fresh().run() == 15.0


def test_reshape_closures_and_ml_dtypes_bfloat16_on_the_gpu(comm):
    """This session's compile fixes, run: an array's reshape (numba-cuda's reshape helpers linked), a closure made in
    a kernel passed to a kernel called as a device function, and CuPy arrays of ml_dtypes' bfloat16."""
    import cupy
    import pytest

    import flowdsl
    from tests.compile.test_numba_linking_compile import reshaped_copy

    src = np.random.default_rng(7).standard_normal((3, 2))
    out = cupy.full((3, 2), np.nan)
    flowdsl.kernel(reshaped_copy)[1, 1](out, cupy.asarray(src))
    comm.synchronize()
    np.testing.assert_array_equal(out.get(), src)

    from numba import cuda

    @flowdsl.kernel
    def consumer(func, x):
        return func(x)

    def applies_a_closure(x):
        def inner(v):
            return v * 3 + 1
        return consumer(inner, x)

    applied = flowdsl.kernel(applies_a_closure)

    @flowdsl.kernel
    def run(out, x):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = applied(x[i])

    x = cupy.arange(64, dtype=np.int64)
    got = cupy.zeros(64, np.int64)
    run[1, 64](got, x)
    comm.synchronize()
    np.testing.assert_array_equal(got.get(), np.arange(64) * 3 + 1)

    ml_dtypes = pytest.importorskip("ml_dtypes")
    if int(cupy.__version__.split(".")[0]) < 14:
        pytest.skip(f"CuPy {cupy.__version__} has no bfloat16 interop (CuPy >= 14 has)")
    values = np.asarray([1, 2, 3, 4, 5], dtype=ml_dtypes.bfloat16)
    arr, arr2, res = cupy.asarray(values), cupy.arange(5), cupy.empty(5, dtype=ml_dtypes.bfloat16)

    @flowdsl.kernel
    def bf16_sum(arr_in, arr_in2, arr_out):
        tid = cuda.grid(1)
        if tid < arr_in.size:
            arr_out[tid] = 2 * arr_in[tid] + 4 * arr_in2[tid] + ml_dtypes.bfloat16(3.0)

    bf16_sum[1, 32](arr, arr2, res)
    comm.synchronize()
    np.testing.assert_array_equal(res.get().astype(np.float32), (2 * values.astype(np.float32) + 4 * np.arange(5) + 3))
