"""A direct launch repeated with the same arguments becomes a replay of a prepared launch, and
only then: what decides it, without a GPU (the driver calls are recorded, not made)."""

from __future__ import annotations

import ctypes
import gc
import types as pytypes
import weakref

import numpy as np
import pytest
from numba.core import types

import flowdsl
from flowdsl import _argtypes, _launch, _launch_params, _launch_replay
from flowdsl.errors import ResourceClosedError
from flowdsl.lowering.types import DevCommType, WindowType
from flowdsl.runtime import memory

pytestmark = pytest.mark.compile


class Pointer:
    def __init__(self, ptr):
        self.ptr = ptr


class Flags:
    c_contiguous = True


class CupyLike:
    """What the launch reads of a CuPy array (typed and packed by attributes)."""

    flags = Flags()
    data = Pointer(0)

    def __init__(self, ptr, n, dtype=np.float32):
        self.dtype = np.dtype(dtype)
        self.ndim, self.size, self.data = 1, n, Pointer(ptr)
        self.shape, self.strides = (n,), (self.dtype.itemsize,)

    @property
    def __cuda_array_interface__(self):
        return {"data": (self.data.ptr, False), "shape": self.shape, "typestr": self.dtype.str,
                "strides": None, "version": 3}


CupyLike.__module__ = "cupy._core.core"


class Comm:
    def track(self, resource):
        pass

    def _untrack(self, resource):
        pass


def _window(comm):
    window = object.__new__(memory.Window)
    window._comm, window._closed, window.handle, window.nbytes = comm, False, 0x1000, 4096
    window._type = WindowType(types.float32)
    window._nccl_window = pytypes.SimpleNamespace(close=lambda: None)
    return window


def _devcomm(comm):
    devcomm = object.__new__(memory.DevComm)
    devcomm._comm, devcomm._closed, devcomm.gin_backend = comm, False, None
    devcomm._word_values = tuple(range(1, 12))
    devcomm._words = tuple(ctypes.c_uint64(w) for w in devcomm._word_values)
    devcomm._type = DevCommType((2, 28, 9), 11)
    devcomm._release = lambda: None
    return devcomm


@flowdsl.kernel
def four_arguments(dcomm, window, x, n):
    if n < 0:
        x[0] = 0.0


@pytest.fixture()
def driver(monkeypatch):
    """The driver calls a launch makes, recorded: ``calls`` lists ("kernel" | "graph", stream)."""
    calls = []

    class DriverError(Exception):
        pass

    def launch_kernel(handle, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        calls.append(("kernel", stream))

    calls_of_cupy = (launch_kernel, lambda graph, stream: calls.append(("graph", stream)), lambda stream: False,
                     DriverError)
    monkeypatch.setattr(_launch_params, "_cuda_calls", lambda: calls_of_cupy)
    monkeypatch.setattr(_launch_replay._PreparedLaunch, "_instantiate", lambda self: 1)
    return calls


@pytest.fixture()
def kernel(monkeypatch):
    """``four_arguments`` as if loaded for (devcomm, float32 window, float32 array, int64)."""
    comm = Comm()
    args = (_devcomm(comm), _window(comm), CupyLike(0x7000, 1024), 1024)
    argtypes = tuple(_argtypes.argument_type("four_arguments", i, a) for i, a in enumerate(args))
    loaded = object.__new__(_launch._Loaded)
    loaded.numba_kernel, loaded.argtypes, loaded.features = None, argtypes, frozenset()
    loaded.packers, loaded.fast = [_launch_params._packer(t) for t in argtypes], True
    loaded.cu_kernel, loaded.handle, loaded.exceptions = pytypes.SimpleNamespace(handle=0), 0, None
    loaded.params = _launch_params._ParameterBuffer(argtypes)
    monkeypatch.setattr(four_arguments, "_loaded", {argtypes: loaded})
    monkeypatch.setattr(four_arguments, "_loaded_by_ids", {tuple(map(id, argtypes)): loaded})
    monkeypatch.setattr(four_arguments, "_launches", {})
    return args


def test_after_three_launches_with_the_same_arguments_the_next_ones_are_replays(driver, kernel):
    for _ in range(5):
        four_arguments[1, 32, 7](*kernel)
    assert driver == [("kernel", 7)] * 3 + [("graph", 7)] * 2


def test_each_stream_has_its_own_replay(driver, kernel):
    for stream in (7, 7, 7, 8, 8, 8, 7, 8):
        four_arguments[1, 32, stream](*kernel)
    # The graph launches of one executable graph are ordered: two streams must not share one.
    assert driver == [("kernel", 7)] * 3 + [("kernel", 8)] * 3 + [("graph", 7), ("graph", 8)]


def test_a_changed_scalar_or_array_is_launched_not_replayed(driver, kernel):
    dcomm, window, x, n = kernel
    for _ in range(4):
        four_arguments[1, 32, 0](dcomm, window, x, n)
    assert driver[-1] == ("graph", 0)
    del driver[:]
    four_arguments[1, 32, 0](dcomm, window, x, n + 1)
    four_arguments[1, 32, 0](dcomm, window, CupyLike(0x9000, 1024), n)
    x.shape, x.strides = (512,), (4,)  # set in place, as CuPy allows: it packs differently
    four_arguments[1, 32, 0](dcomm, window, x, n)
    assert driver == [("kernel", 0)] * 3


@pytest.mark.parametrize("first, second", [(0.0, -0.0), (1, True), (np.int32(5), np.int64(5)), (2, 2.0)])
def test_scalars_replay_only_with_the_same_type_and_bits(driver, kernel, first, second):
    """Equal in Python, different as parameters: -0.0 has another bit pattern, bool and int64
    or int32 and int64 another type (and kernel)."""
    assert _launch_replay._replay_key(0, (first,)) == _launch_replay._replay_key(0, (first,))
    assert _launch_replay._replay_key(0, (first,)) != _launch_replay._replay_key(0, (second,))


def test_a_closed_window_is_refused_not_replayed(driver, kernel):
    dcomm, window, x, n = kernel
    for _ in range(4):
        four_arguments[1, 32, 0](dcomm, window, x, n)
    window.close()
    with pytest.raises(ResourceClosedError, match="argument 1.*this window was closed"):
        four_arguments[1, 32, 0](dcomm, window, x, n)


def test_replays_do_not_keep_arrays_alive(driver, kernel):
    dcomm, window, _, n = kernel
    x = CupyLike(0x5000, 1024)
    for _ in range(4):
        four_arguments[1, 32, 0](dcomm, window, x, n)
    assert driver[-1] == ("graph", 0)
    alive = weakref.ref(x)
    del x
    gc.collect()
    assert alive() is None


def test_a_new_array_at_a_reused_id_is_launched_not_replayed(driver, kernel):
    """A loop over temporaries: each new array may take the freed one's address and id."""
    dcomm, window, _, n = kernel
    ids = []
    for i in range(12):
        x = CupyLike(0x5000 + 4096 * i, 1024)
        ids.append(id(x))
        four_arguments[1, 32, 0](dcomm, window, x, n)
        del x
    assert len(set(ids)) < len(ids)  # CPython gave a new array a freed one's id (what this is about)
    assert driver == [("kernel", 0)] * 12


def test_a_loop_over_changing_arguments_makes_no_graph(driver, kernel, monkeypatch):
    dcomm, window, _, n = kernel
    launch = four_arguments[1, 32, 0]
    arrays = [CupyLike(0x10000 + 4096 * i, 1024) for i in range(16)]  # all alive: no id is reused
    for i in range(200):
        launch(dcomm, window, arrays[i % 16], n)
    for i in range(200):  # two alternating: never three in a row
        launch(dcomm, window, arrays[i % 2], n)
    assert driver == [("kernel", 0)] * 400
    assert not launch.replays.prepared


def test_numba_cudas_launcher_takes_a_device_communicator_and_a_window():
    """A launch with an argument kind flowdsl does not pack itself (a bool) goes through numba-cuda's launcher,
    which flattens a device communicator and a window through flowdsl's extension: into the ctypes values
    the driver takes, the same words as the fast path's (a GPU run found ctypes words refused there)."""
    from numba.cuda.dispatcher import _Kernel

    from flowdsl.lowering.types import ArgumentMarshaller

    comm = Comm()
    launcher = object.__new__(_Kernel)
    launcher.extensions = [ArgumentMarshaller()]
    flat: list = []
    for arg in (_devcomm(comm), _window(comm)):
        ty = _argtypes.argument_type("k", 0, arg)
        launcher._prepare_args(ty, arg, 0, [], flat)
    assert [v.value for v in flat] == [*range(1, 12), 0x1000, 4096]
