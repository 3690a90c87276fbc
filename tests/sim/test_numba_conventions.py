"""numba-cuda's calling conventions on ``@flowdsl.kernel``: a signature types the scalars of a launch (as
``cuda.jit("void(int32[:], int32)")`` does: a Python int passed for an int32 wraps to 32 bits), ``specialize``
and ``forall``, and the streams of numba-cuda's own simulator; checked on the simulator against NumPy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numba import cuda, types

import flowdsl
import flowdsl.sim
from flowdsl.collectives import FlowConfig
from flowdsl.host import streams
from flowdsl.testing import run_ranks

pytestmark = pytest.mark.sim


def bits_and_sum(out, x, y):
    out[0] = cuda.clz(x)  # clz counts at the width of x's type
    out[1] = x + y


def _launch(kernel, *args):
    def main(comm):
        out = np.zeros(2, np.int64)
        kernel[1, 1](out, *args)
        comm.synchronize()
        return out
    return run_ranks(main, nranks=1)[0]


def test_a_signature_types_the_scalars_of_a_launch():
    typed = flowdsl.kernel("void(int64[:], int32, int32)")(bits_and_sum)
    untyped = flowdsl.kernel(bits_and_sum)
    assert list(_launch(typed, 1, 2)) == [31, 3] and list(_launch(untyped, 1, 2)) == [63, 3]
    # 0xFFFFFFFF is -1 as an int32, as numba converts it (NumPy alone would refuse it): -1 + 2 in 32 bits
    assert list(_launch(typed, 0xFFFFFFFF, 2)) == [0, 1]
    assert list(_launch(flowdsl.kernel(signature="void(int64[:], int16, int16)")(bits_and_sum), 0xFFFF, 1)) == [0, 0]


def test_specialize_takes_the_arguments_types():
    kernel = flowdsl.kernel(bits_and_sum).specialize(np.zeros(2, np.int64), np.int32(1), np.int32(0))
    assert list(_launch(kernel, 1, 2)) == [31, 3]


def test_specialize_keeps_its_kernels_and_refuses_a_specialized_one():
    """numba-cuda's rules: the same argument types give the same kernel (``specializations``); a kernel with its
    one signature, or made by ``specialize``, cannot be specialized again (a RuntimeError there)."""
    kernel = flowdsl.kernel(bits_and_sum)
    args = (np.zeros(2, np.int64), np.int32(1), np.int32(0))
    assert not kernel.specialized and kernel.specializations == {}
    first = kernel.specialize(*args)
    assert kernel.specialize(*args) is first and len(kernel.specializations) == 1 and first.specialized
    assert kernel.specialize(np.zeros(2, np.int64), np.int64(1), np.int64(0)) is not first
    for specialized in (first, flowdsl.kernel("void(int64[:], int32, int32)")(bits_and_sum)):
        with pytest.raises(flowdsl.errors.AlreadySpecializedError, match="Dispatcher already specialized") as err:
            specialized.specialize(*args)
        assert isinstance(err.value, RuntimeError) and isinstance(err.value, flowdsl.FlowDSLError)
    assert not flowdsl.kernel(["void(int64[:], int32, int32)"])(bits_and_sum).specialized  # a list: numba's rule


def add_into(r, x, y):
    r[0] = x + y


def test_a_list_of_signatures_takes_the_one_the_arguments_match():
    """numba-cuda's dispatch among declared signatures: an exact match, else numba's best conversion; no match
    or a tie is a TypeError in numba's words (a LaunchTypeError here), on both paths alike."""
    both = flowdsl.kernel(["void(int64[::1], int64, int64)", "void(float64[::1], float64, float64)"])(add_into)
    assert both.signatures[:2] == [(types.int64[::1], types.int64, types.int64),
                                   (types.float64[::1], types.float64, types.float64)]
    assert not both.specialized

    def main(comm):
        ints, floats = np.zeros(1, np.int64), np.zeros(1, np.float64)
        both[1, 1](ints, 1, 2)
        both[1, 1](floats, 1.5, 2.5)
        with pytest.raises(flowdsl.errors.LaunchTypeError, match="No matching definition") as none:
            both[1, 1](np.zeros(1, np.complex128), 1j, 1j)
        tie = flowdsl.kernel(["(float64[::1], float32, float64)", "(float64[::1], float64, float32)",
                              "(float64[::1], int64, int64)"])(add_into)
        with pytest.raises(TypeError, match="Ambiguous overloading") as ambiguous:
            tie[1, 1](floats, 1.0, 2.0)
        return ints[0], floats[0], str(none.value), str(ambiguous.value)

    ints, floats, none, ambiguous = run_ranks(main, nranks=1)[0]
    assert ints == 3 and floats == 4.0
    assert "complex128" in none and "int64" not in ambiguous.split("\n")[1:3]


def test_a_signature_numba_cannot_read_is_refused_naming_it():
    with pytest.raises(flowdsl.UsageError) as err:
        flowdsl.kernel("void(int33[:])")(bits_and_sum)
    assert "Cannot make kernel bits_and_sum with signature 'void(int33[:])'" in str(err.value)


@flowdsl.kernel
def count_tasks(out, n):
    i = cuda.grid(1)
    if i < n:
        cuda.atomic.add(out, 0, 1)


def test_forall_runs_every_task_and_refuses_a_negative_count():
    def main(comm):
        out = np.zeros(1, np.int64)
        count_tasks.forall(300)(out, 300)
        count_tasks.forall(0)(out, 0)  # nothing to run: nothing launched
        count_tasks.forall(5, tpb=2)(out, 5)
        comm.synchronize()
        return int(out[0])
    assert run_ranks(main, nranks=1) == [305]
    with pytest.raises(flowdsl.UsageError) as err:
        count_tasks.forall(-1)
    assert "Can't create ForAll with negative task count: -1 for count_tasks" in str(err.value)


def test_a_stream_of_numba_cudas_own_simulator_is_the_ranks_one_stream():
    stream = type("stream", (), {"__module__": "numba.cuda.simulator.api"})()  # what cuda.stream() gives there
    assert streams.stream_handle(stream) == streams.LEGACY_DEFAULT_STREAM
    with pytest.raises(flowdsl.UsageError):  # any other object without a handle is still refused
        streams.stream_handle(type("stream", (), {})())


@flowdsl.kernel
def record_fields(rec, out):
    i = cuda.grid(1)
    if i < rec.size:
        r = rec[i]
        r.y = r.x * 2.0  # a record's field by name, written through to the array
        out[i] = rec.x[i] + rec[i].y  # the array of a field, and a field of an element


def test_record_fields_by_name_as_numba_cuda_reads_them():
    dtype = np.dtype([("x", np.float64), ("y", np.float64)])
    rec = np.zeros(8, dtype)
    rec["x"] = np.arange(8)

    def main(comm):
        out = np.zeros(8)
        record_fields[1, 8](rec, out)
        comm.synchronize()
        return out
    out = run_ranks(main, nranks=1)[0]
    np.testing.assert_array_equal(out, 3 * np.arange(8.0))
    np.testing.assert_array_equal(rec["y"], 2 * np.arange(8.0))


def _make_fib():
    @flowdsl.device
    def fib(n):
        if n < 2:
            return n
        return fib(n - 1) + fib(n - 2)  # itself, through the factory's closure
    return fib


_fib = _make_fib()


@flowdsl.kernel
def fibs(out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = _fib(i)


def test_a_device_function_that_calls_itself_through_a_closure():
    def main(comm):
        out = np.zeros(12, np.int64)
        fibs[1, 12](out)
        comm.synchronize()
        return out
    assert list(run_ranks(main, nranks=1)[0]) == [0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89]


@flowdsl.kernel
def ldexp_and_aligned_local(x, e, out):
    i = cuda.grid(1)
    if i < x.size:
        scratch = cuda.local.array(4, np.float32, alignment=16)
        scratch[0] = math.ldexp(x[i], e[i])  # e[i] is an int32: numba takes it, Python's math wants an int
        out[i] = scratch[0]


def test_math_takes_numpy_scalars_and_local_arrays_take_an_alignment():
    x = np.random.default_rng(3).standard_normal(16).astype(np.float32)
    e = np.arange(-8, 8, dtype=np.int32)

    def main(comm):
        out = np.zeros(16, np.float32)
        ldexp_and_aligned_local[1, 16](x, e, out)
        comm.synchronize()
        return out
    np.testing.assert_array_equal(run_ranks(main, nranks=1)[0], np.ldexp(x, e))


@flowdsl.device
def _down_forever(n):
    return _down_forever(n + 1)  # no base case: on a GPU, a stack overflow


@flowdsl.kernel
def runaway(out):
    out[0] = _down_forever(0)


def test_a_recursion_without_end_is_a_clear_error_naming_the_line():
    def main(comm):
        runaway[1, 1](np.zeros(1, np.int64))
        comm.synchronize()
    with pytest.raises(flowdsl.sim.UnsupportedFeatureError) as err:
        run_ranks(main, nranks=1)
    msg = str(err.value)
    line = _down_forever.py_func.__code__.co_firstlineno + 2  # the call that recurses (after the decorator, def)
    assert f"Cannot go on in rank 0 block 0 thread 0 of kernel 'runaway' at test_numba_conventions.py:{line}" in msg
    assert "recursion went deeper than the simulator follows" in msg and "cudaLimitStackSize" in msg, msg


@flowdsl.kernel
def _cubed(x):  # a kernel's function, called from another kernel below: a device function there
    return x * x * x


def _kernel_calling_kernels():
    offset = 7.0

    @flowdsl.kernel
    def shifted(x):  # a kernel in a closure, its own closure value included
        return x + offset

    @flowdsl.kernel
    def outer(out, x):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = shifted(_cubed(x[i]))
    return outer


def kernel_calling_kernels_main(comm):
    """numba-cuda compiles a ``@cuda.jit`` kernel that another kernel calls as a device function: so do both
    of flowdsl's paths (tests/gpu/test_numba_features_gpu.py runs this on a GPU)."""
    x = np.random.default_rng(5).standard_normal(300).astype(np.float32)
    out = comm.alloc(300, np.float32)
    out.set(np.full(300, np.nan, np.float32))
    _kernel_calling_kernels()[3, 128](out, _device_copy(comm, x))
    comm.synchronize()
    return out.get(), x


def _device_copy(comm, x):
    buf = comm.alloc(x.size, x.dtype)
    buf.set(x)
    return buf


def test_a_kernel_called_from_another_kernel_runs_as_a_device_function():
    got, x = run_ranks(kernel_calling_kernels_main, nranks=1)[0]
    np.testing.assert_allclose(got, x * x * x + np.float32(7), rtol=1e-6)


def launch_bounds_main(comm):
    """A launch within a kernel's ``launch_bounds`` runs; one of more threads a block is refused before it runs
    (a GPU refuses it with CUDA_ERROR_INVALID_VALUE). tests/gpu/test_numba_features_gpu.py runs it on a GPU."""
    @flowdsl.kernel(launch_bounds=128)
    def ones(out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = 1

    out = comm.alloc(256, np.int32)
    out.set(np.zeros(256, np.int32))
    ones[2, 128](out)
    comm.synchronize()
    with pytest.raises(flowdsl.UsageError, match="launch_bounds allow at most 128") as err:
        ones[1, 256](out)
    return out.get(), str(err.value)


def test_a_launch_beyond_its_launch_bounds_is_refused():
    got, message = run_ranks(launch_bounds_main, nranks=1)[0]
    assert (got == 1).all() and "256 threads a block" in message


def test_a_shared_memory_carveout_is_checked_at_decoration():
    """numba-cuda's ``shared_memory_carveout``: -1 to 100 or a name, refused otherwise in numba-cuda's words
    before anything compiles (on a GPU it is set when the kernel is loaded: tests/gpu)."""
    for value, kept in (("MaxL1", 0), ("MaxShared", 100), ("default", -1), (50, 50), (-1, -1)):
        assert flowdsl.kernel(shared_memory_carveout=value)(add_into).shared_memory_carveout == kept
    for value, words in ((150, "must be between -1 and 100"), (-2, "must be between -1 and 100"),
                         ("InvalidOption", "Invalid carveout value")):
        with pytest.raises(flowdsl.UsageError, match=words):
            flowdsl.kernel("void(int64[::1], int64, int64)", shared_memory_carveout=value)(add_into)
    with pytest.raises(TypeError, match="must be str or int"):
        flowdsl.kernel(shared_memory_carveout=1.5)(add_into)


def test_a_complex_value_for_a_real_signature_type_is_refused():
    """numba-cuda's dispatcher does not drop an imaginary part: a complex scalar where the signature says int32
    is a TypeError (a LaunchTypeError here) before the launch, on both paths."""
    typed = flowdsl.kernel("(int32[::1], int32, int32)")(add_into)

    def main(comm):
        with pytest.raises(flowdsl.errors.LaunchTypeError, match="argument 2 is the complex") as err:
            typed[1, 1](np.zeros(1, np.int32), 12.3, 45.6j)
        return str(err.value)

    assert "its signature takes int32 there" in run_ranks(main, nranks=1)[0]


@flowdsl.kernel
def _scaled_into(dcomm, win, out, scale):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = scale * (i + dcomm.rank)


def test_specialize_takes_the_simulators_own_objects():
    """A device communicator and a window of the simulator have no numba type (the simulator types nothing):
    specialize takes them as they are, and types the scalars (it refused them, naming numba's internals)."""
    def main(comm):
        out = comm.alloc(4, np.float32)
        with comm.register(comm.alloc(4, np.float32)) as win, comm.device_communicator() as dcomm:
            typed = _scaled_into.specialize(dcomm, win, out, np.float32(2))
            typed[1, 4](dcomm, win, out, 2)  # the Python int takes the specialization's float32
            comm.synchronize()
        return out.get()

    assert [list(r) for r in run_ranks(main, nranks=2)] == [[0, 2, 4, 6], [2, 4, 6, 8]]


_LAYOUT = FlowConfig(channels=1, nslots=2, slot_bytes=128, threads=32)


@flowdsl.kernel
def _reads_a_config(out):
    out[0] = _LAYOUT.channels  # a dataclass instance: numba cannot freeze it into the code


def test_a_global_numba_cannot_type_is_refused_before_the_launch_in_numbas_words():
    """The GPU's typing refuses a global or closure value it has no numba type for (tests/compile checks the
    same kernel there); the simulator ran it. Now both refuse it, the simulator before any thread runs."""
    def main(comm):
        with pytest.raises(flowdsl.errors.KernelTypingError, match=r"Untyped global name '_LAYOUT': Cannot determine "
                                                                r"Numba type of <class 'flowdsl.collectives._config"):
            _reads_a_config[1, 1](comm.alloc(1, np.int64))

    run_ranks(main, nranks=1)


class _KernelError(Exception):
    pass


@flowdsl.kernel
def _raises(x, out):
    if x == 1:
        raise _KernelError
    if x == 2:
        raise _KernelError("foo")
    out[cuda.threadIdx.x] = x


def test_an_exception_raised_in_a_kernel_reaches_the_synchronize_as_numba_cuda_delivers_it():
    """numba-cuda gives a kernel's exception to the host that waits for it (its simulator always, a GPU in
    debug mode): the same class, led by the thread's and block's indices; the rank goes on."""
    def main(comm):
        out = comm.alloc(4, np.int32)
        got = []
        for x in (1, 2):
            _raises[1, 1](x, out)
            with pytest.raises(_KernelError) as err:
                comm.synchronize()
            got.append(str(err.value))
            assert any("_raises" in note and "seed=" in note for note in err.value.__notes__)
        _raises[1, 4](3, out)
        comm.synchronize()
        return got, out.get().tolist()

    assert run_ranks(main, nranks=1)[0] == (["tid=[0, 0, 0] ctaid=[0, 0, 0]",
                                             "tid=[0, 0, 0] ctaid=[0, 0, 0]: foo"], [3, 3, 3, 3])


def test_a_kernel_exception_left_unsynchronized_ends_the_rank_and_one_that_stops_a_barrier_is_the_cause():
    @flowdsl.kernel
    def stops_a_barrier(out):
        if cuda.threadIdx.x == 3:
            raise _KernelError("thread 3")
        cuda.syncthreads()  # the other threads wait here for thread 3, which has left
        out[cuda.threadIdx.x] = 1

    def unsynchronized(comm):
        _raises[1, 1](2, comm.alloc(1, np.int32))  # main returns without waiting

    with pytest.raises(_KernelError, match=r"tid=\[0, 0, 0\] ctaid=\[0, 0, 0\]: foo"):
        run_ranks(unsynchronized, nranks=2)

    def stuck(comm):
        stops_a_barrier[1, 8](comm.alloc(8, np.int32))
        comm.synchronize()

    with pytest.raises(_KernelError, match=r"tid=\[3, 0, 0\] ctaid=\[0, 0, 0\]: thread 3") as err:
        run_ranks(stuck, nranks=1)
    assert any("could not go on" in note for note in err.value.__notes__), err.value.__notes__


class PastTheEnd(Exception):
    pass


@flowdsl.kernel(debug=True, opt=False)
def raises_past_the_end(a, n):
    """numba-cuda's debug=True kernel: thread ``n`` raises, every other thread writes its index."""
    i = cuda.grid(1)
    if i == n:
        raise PastTheEnd("a thread past the end")
    a[i] = i


def check_debug_exception(launch, synchronize, out_of):
    """A ``debug=True`` kernel's launch waits for it and raises what its thread 35 (block 1, thread 3 of 32)
    raised, led by the thread's and block's indices, x first; the other threads ran; a launch after it that
    raises nothing returns (the record was cleared). ``launch(n)`` runs it on 64 threads."""
    with pytest.raises(PastTheEnd, match=r"^tid=\[3, 0, 0\] ctaid=\[1, 0, 0\]: a thread past the end"):
        launch(35)
    synchronize()
    got = out_of()
    assert np.array_equal(np.delete(got, 35), np.delete(np.arange(64, dtype=np.float32), 35))
    launch(64)  # no thread raises
    synchronize()
    assert np.array_equal(out_of(), np.arange(64, dtype=np.float32))


def test_a_debug_kernels_exception_is_raised_at_its_launch():
    def main(comm):
        a = comm.alloc(64, np.float32)
        a.set(np.full(64, -1, np.float32))
        check_debug_exception(lambda n: raises_past_the_end[2, 32](a, n), comm.synchronize, a.get)
        return True

    assert flowdsl.sim.spawn(main, nranks=1) == [True]


@flowdsl.device
def _tail_of(a):
    return a[1:]  # a new array: numba-cuda's typing refuses returning it (no NRT)


@flowdsl.device
def _itself(a):
    return a  # an argument: numba-cuda takes it


@flowdsl.kernel
def _first_two(a, out):
    out[0] = _itself(a)[0]
    out[1] = _tail_of(a)[0]


def test_a_device_function_returning_a_new_array_is_refused_as_numba_cuda_refuses_it():
    """numba-cuda accepts returning an array argument and refuses any other array (a slice, a view): the
    simulator the same, at the call (the GPU path's refusal: tests/compile/test_numba_linking_compile.py)."""
    def main(comm):
        a = comm.alloc(4, np.float64)
        out = comm.alloc(2, np.float64)
        _first_two[1, 1](a, out)
        comm.synchronize()

    with pytest.raises(flowdsl.errors.KernelTypingError,
                       match=r"Cannot return an array from device function _tail_of: .*passed into the function as "
                             r"argument.*Pass the array and an offset instead"):
        flowdsl.sim.spawn(main, nranks=1)


def _rgba(r, g, b, a):
    return ((r & 0xFF) << 16) | ((g & 0xFF) << 8) | (b & 0xFF) | ((a & 0xFF) << 24)


_rgba_int32 = flowdsl.device(_rgba, signature="int32(int32, int32, int32, int32)")


@flowdsl.kernel
def _packs(out, channels):
    out[0] = _rgba_int32(channels[0], channels[1], channels[2], channels[3])


def test_a_device_functions_declared_signature_converts_its_arguments():
    """As the GPU (tests/compile/test_dispatcher_api_compile.py, numba-cuda's test_device_casting): float32
    channels passed to an int32 device function are converted to int32 (truncated), where Python would refuse
    ``&`` on a float; a call no declared signature takes is numba's typing error."""
    assert _launch(_packs, np.asarray([1.9, 2.0, 3.5, 4.0], np.float32))[0] == 0x04010203
    with pytest.raises(flowdsl.errors.KernelTypingError, match="declared for"):
        _launch(_packs, np.asarray([1j, 2j, 3j, 4j], np.complex64))


def test_a_c_pointer_argument_is_refused_on_the_simulator_naming_it():
    """numba-cuda's ``CPointer`` parameter takes an int address on the GPU (tests/compile/test_launch_packing.py);
    the simulator has no GPU memory: refused before the launch, naming the fix."""
    pointer_kernel = flowdsl.kernel(types.void(types.CPointer(types.float32)))(lambda p: None)

    def main(comm):
        pointer_kernel[1, 1](0x1000)
    with pytest.raises(flowdsl.UsageError, match="C pointer argument.*Pass the array itself"):
        run_ranks(main, nranks=1)
