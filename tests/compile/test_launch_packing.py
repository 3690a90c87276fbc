"""A direct launch packs its parameters into one buffer: the same bytes as the per-parameter
ctypes values that a prepared launch hands the driver (no GPU needed)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from numba.core import types

from flowdsl import _launch_params as _launch
from flowdsl._argtypes import argument_type, scalar_types
from flowdsl.errors import UsageError

pytestmark = pytest.mark.compile


class DeviceArray:
    """An array in the CUDA array interface only (as frameworks other than CuPy export them)."""

    def __init__(self, ptr, shape, typestr, strides=None):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": typestr,
                                         "strides": strides, "version": 3}


def _slots(argtypes, args):
    """Each flattened parameter as the prepared path makes it, in its own 8-byte slot."""
    flat: list = []
    for ty, arg in zip(argtypes, args):
        _launch._packer(ty)(arg, flat)
    out = b""
    for v in flat:
        raw = bytes(v) if isinstance(v, ctypes._SimpleCData) else bytes(ctypes.c_uint64(v & (2**64 - 1)))
        out += raw + b"\0" * (8 - len(raw))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_one_buffer_holds_what_the_per_parameter_packers_make(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) for d in rng.integers(1, 9, size=2))
    ptr = int(rng.integers(1 << 20, 1 << 47)) & ~0xFF
    contiguous = DeviceArray(ptr, shape, "<f4")
    strided = DeviceArray(ptr + 256, shape, "<f8", strides=(8, 8 * shape[0]))
    pointer = types.CPointer(types.float32)  # numba-cuda's C pointer argument: an int address, as a DevicePointer
    argtypes = (types.Array(types.float32, 2, "C"), types.Array(types.float64, 2, "A"), types.int32,
                types.uint64, types.float32, types.float64, types.int8, pointer)
    args = (contiguous, strided, int(rng.integers(-2**31, 2**31)), int(rng.integers(0, 2**63)) * 2 + 1,
            float(rng.standard_normal()), float(rng.standard_normal()), -3,
            scalar_types((pointer,))[0](ptr + 512))
    params = _launch._ParameterBuffer(argtypes)
    values: list = []
    for pack, arg in zip(params.packers, args):
        pack(arg, values)
    params.layout.pack_into(params.buffer, 0, *values)
    expected = _slots(argtypes, args)
    assert params.buffer.raw[:len(expected)] == expected
    assert len(params.pointers) * 8 == len(expected)
    assert expected[-8:] == (ptr + 512).to_bytes(8, "little") and argument_type("k", 7, args[-1]) == pointer


def test_a_value_out_of_its_parameters_range_is_refused_with_the_fix():
    params = _launch._ParameterBuffer((types.int32,))
    with pytest.raises(UsageError, match="does not fit its kernel parameter.*within the range"):
        params.launch(None, (2**40,), (1, 1, 1), (1, 1, 1), 0, 0)


def test_a_checked_launch_configuration_is_reused_but_never_for_a_wrong_one():
    import flowdsl

    @flowdsl.kernel
    def noop(x):
        pass

    assert noop[1, 32] is noop[1, 32]
    assert noop[(2, 2), 32, 0] is noop[(2, 2), 32, 0]
    for bad in ((2, 2), (0,)), (1, -32):
        with pytest.raises(UsageError, match="must be a positive int or a tuple"):
            noop[bad]
    for bad in ((1.0, 32), ((2.0, 2), 32)):  # not integers: a TypeError too, as numba-cuda raises it
        with pytest.raises(TypeError, match="must be a sequence of integers, got .*positive int or a tuple"):
            noop[bad]


def test_a_broadcast_numba_device_array_packs_its_zero_strides():
    """numba-cuda's ufuncs broadcast a scalar operand as a device array of strides 0, whose interface reports no
    strides (numba-cuda's is_contiguous skips broadcast axes): packed from the array's own strides, as numba-cuda's
    launcher packs it, never the C strides the interface implies (which read past its one element: a wrong
    result, numba-cuda's test_vectorize_scalar_arg on a GPU); typed with any layout."""
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    class Memory:  # stands in for the allocation (no GPU here)
        device_ctypes_pointer = ctypes.c_void_p(0x10000)

    broadcast = DeviceNDArray(shape=(10,), strides=(0,), dtype=np.float64, gpu_data=Memory())
    assert broadcast.__cuda_array_interface__["strides"] is None  # what the interface says
    ty = argument_type("k", 0, broadcast)
    assert ty.layout == "A"
    want = (0, 0, 10, 8, 0x10000, 10, 0)
    values: list = []
    _launch._ParameterBuffer((ty,)).packers[0](broadcast, values)
    assert tuple(values) == want
    flat: list = []
    _launch._packer(ty)(broadcast, flat)
    assert tuple(flat) == want
