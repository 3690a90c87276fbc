"""``stream=``: every accepted form resolves to its driver handle, bad ones are refused (CPU, no GPU).

Small fake classes stand for each framework's stream; fake ``torch`` / ``cupy`` modules stand
for the frameworks whose current stream ``stream=None`` reads.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest

import flowdsl
from flowdsl.host import streams
from flowdsl.host.streams import stream_handle

pytestmark = pytest.mark.compile


class ProtocolStream:  # cuda.core's convention
    def __cuda_stream__(self):
        return (0, 0x1000)


class CupyLikeStream:
    ptr = 0x2000


class TorchLikeStream:
    cuda_stream = 0x3000


class NumbaLikeStream:  # without __cuda_stream__: read through .handle
    handle = 0x4000


class CoreLikeStream:  # .handle is a cuda.bindings CUstream, as cuda.core's is
    def __init__(self):
        from cuda.bindings import driver

        self.handle = driver.CUstream(0x5000)


class ProtocolAndPtr:  # the protocol comes first
    ptr = 0x2000

    def __cuda_stream__(self):
        return (0, 0x6000)


def _numba_stream():
    from cuda.bindings import driver
    from numba.cuda.cudadrv.driver import Stream

    return Stream(driver.CUstream(0x7000))  # numba's own class: it has __cuda_stream__


@pytest.mark.parametrize(("make", "handle"), [
    (ProtocolStream, 0x1000), (CupyLikeStream, 0x2000), (TorchLikeStream, 0x3000), (NumbaLikeStream, 0x4000),
    (CoreLikeStream, 0x5000), (ProtocolAndPtr, 0x6000), (_numba_stream, 0x7000), (lambda: 0x8000, 0x8000),
    (lambda: 0, 0), (lambda: np.uint64(0x9000), 0x9000),
], ids=["__cuda_stream__", "ptr", "cuda_stream", "handle", "CUstream-handle", "protocol-first", "numba", "int",
        "legacy-default", "numpy-int"])
def test_each_stream_form_resolves_to_its_handle(make, handle):
    stream = make()
    assert stream_handle(stream, (), "all_reduce") == handle
    assert stream_handle(stream, (), "all_reduce") == handle  # again, through the remembered form


class NoneHandle:
    ptr = None


class BadProtocol:
    def __cuda_stream__(self):
        return 0x1000  # not (version, handle)


@pytest.mark.parametrize(("bad", "shown"), [
    (object(), "a value of type object"), ("stream", "'stream'"), (1.5, "1.5"), (True, "True"), (-1, "-1"),
    (1 << 64, str(1 << 64)), (NoneHandle(), "a value of type tests.compile.test_streams.NoneHandle"),
    (BadProtocol(), "a value of type tests.compile.test_streams.BadProtocol"),
], ids=["object", "str", "float", "bool", "negative", "too-large", "ptr-None", "bad-protocol"])
def test_a_bad_stream_is_refused_with_the_fix(bad, shown):
    with pytest.raises(flowdsl.UsageError) as info:
        stream_handle(bad, (), "all_reduce")
    assert str(info.value).startswith(f"Cannot all_reduce: stream= got {shown}; pass a CUDA stream (an object "
                                      "with __cuda_stream__; a CuPy, PyTorch, numba or cuda.core stream; or a "
                                      "handle as an int), or None for the current stream of the arrays' framework")


def test_none_without_framework_arrays_is_the_legacy_default_stream():
    assert stream_handle(None) == streams.LEGACY_DEFAULT_STREAM == 0
    assert stream_handle(None, (np.zeros(4, np.float32), 3, "x")) == 0


def _fake_torch(raw: bool):
    """A stand-in ``torch`` module: its current stream on device i is 0xA000 + i."""
    cuda = SimpleNamespace(current_stream=lambda i: SimpleNamespace(cuda_stream=0xA000 + i))
    c = SimpleNamespace(_cuda_getCurrentRawStream=lambda i: 0xA000 + i) if raw else SimpleNamespace()
    return SimpleNamespace(_C=c, cuda=cuda)


def _tensor_type():
    def get_device(self):
        return self.index

    # A new class per test: the resolver remembers its reader per type.
    return type("Tensor", (), {"__module__": "torch", "get_device": get_device,
                               "__init__": lambda self, index: setattr(self, "index", index)})


@pytest.mark.parametrize("raw", [True, False], ids=["raw-current-stream", "current_stream-fallback"])
def test_none_with_torch_tensors_is_torchs_current_stream_on_their_device(monkeypatch, raw):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(raw))
    tensor = _tensor_type()
    assert stream_handle(None, (tensor(3),), "all_reduce") == 0xA003
    assert stream_handle(None, (np.zeros(1), tensor(1)), "all_reduce") == 0xA001  # the first framework array
    assert stream_handle(None, (tensor(-1),), "all_reduce") == 0  # a CPU tensor: the argument checks refuse it
    assert stream_handle(TorchLikeStream(), (tensor(3),), "all_reduce") == 0x3000  # an explicit stream wins


def test_none_with_cupy_arrays_is_cupys_current_stream(monkeypatch):
    current = SimpleNamespace(ptr=0xB000)
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=SimpleNamespace(
        get_current_stream=lambda: current)))
    array = type("ndarray", (), {"__module__": "cupy", "data": None})
    assert stream_handle(None, (array(),), "all_reduce") == 0xB000
    current.ptr = 0xB001  # `with stream:` switched it: read at every call
    assert stream_handle(None, (array(),), "all_reduce") == 0xB001


def test_resolving_imports_no_framework():
    """Without a GPU, neither torch nor cupy is imported unless an object comes from them."""
    code = textwrap.dedent("""
        import sys
        import numpy as np
        from flowdsl.host.streams import stream_handle
        class S:
            cuda_stream = 5
        assert stream_handle(None, (np.zeros(2),)) == 0
        assert stream_handle(S()) == 5
        assert stream_handle(7) == 7
        print(sorted(m for m in ("torch", "cupy") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_capture_checks_without_a_driver_see_no_capture():
    # No GPU here: nothing can be capturing, and the check must not raise for it.
    from tests.conftest import gpu_count

    if gpu_count():
        pytest.skip("this machine has a GPU: the driver answers for real (tests/gpu/test_graphs_gpu.py)")
    assert streams.is_capturing(0) is False
    streams.refuse_during_capture(0, "all_reduce", "nothing")


def test_kernel_launch_configuration_takes_an_optional_stream():
    @flowdsl.kernel
    def k(out):
        out[0] = 1

    assert k[1, 32].stream is None  # the arrays' framework's current stream
    assert k[1, 32, 0].stream == 0  # explicitly the legacy default stream
    launch = k[(2, 1), 64, TorchLikeStream(), 128]
    assert isinstance(launch.stream, TorchLikeStream) and launch.shared == 128
    assert k[1, 32, None, 256].stream is None and k[1, 32, None, 256].shared == 256


def test_a_launch_refused_by_capture_says_why():
    from flowdsl._launch_params import _capture_hint

    assert "pass the capturing stream as stream=" in _capture_hint("CUDA_ERROR_STREAM_CAPTURE_IMPLICIT")
    assert "warm up outside capture" in _capture_hint("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED")
    assert _capture_hint("CUDA_ERROR_INVALID_VALUE") == ""


class _ForeignArray:
    """An array of another library that names the stream its data is made on (CUDA Array Interface v3)."""

    def __init__(self, stream):
        self.__cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0x10000, False), "version": 3,
                                         "strides": None, "stream": stream}


def test_a_launch_waits_for_the_stream_an_array_names(monkeypatch):
    """numba-cuda's rule (its test_cuda_array_interface's test_launch_sync): the stream an array's interface
    names is synchronised once before a kernel on another stream reads it; not when the launch is on that
    stream (1 names the legacy default stream, 0), nor for no stream, nor under NUMBA_CUDA_ARRAY_INTERFACE_SYNC=0;
    PyTorch's and CuPy's arrays name no producer."""
    from numba import cuda
    from numba.cuda.core import config

    synced = []
    monkeypatch.setattr(cuda, "external_stream", lambda ptr: SimpleNamespace(synchronize=lambda: synced.append(ptr)))
    streams.wait_for_producers((_ForeignArray(0x5000), 3, np.zeros(2)), 0)
    assert synced == [0x5000]
    streams.wait_for_producers((_ForeignArray(0x5000), _ForeignArray(None), _ForeignArray(1)), 0x5000)
    assert synced == [0x5000, 1]  # only the legacy default stream's array: another stream than the launch's
    streams.wait_for_producers((_ForeignArray(1),), 0)
    monkeypatch.setattr(config, "CUDA_ARRAY_INTERFACE_SYNC", False)
    streams.wait_for_producers((_ForeignArray(0x6000),), 0)
    assert synced == [0x5000, 1]
    foreign_in_numba = type("ForeignArray", (), {"__module__": "numba.cuda.tests.cudapy.test_cuda_array_interface"})
    monkeypatch.setattr(config, "CUDA_ARRAY_INTERFACE_SYNC", True)
    made_in_a_numba_module = foreign_in_numba()  # not numba-cuda's device array: its interface is read
    made_in_a_numba_module.__cuda_array_interface__ = {"stream": 0x8000}
    streams.wait_for_producers((made_in_a_numba_module,), 0)
    assert synced == [0x5000, 1, 0x8000]
    synced.pop()
    torch_like = type("Tensor", (), {"__module__": "torch", "__cuda_array_interface__": {"stream": 0x7000}})
    monkeypatch.setattr(config, "CUDA_ARRAY_INTERFACE_SYNC", True)
    streams.wait_for_producers((torch_like(),), 0)
    assert synced == [0x5000, 1]
