"""``cache=True``, numba-cuda's on-disk cache: what is refused at decoration and before a load, without a GPU
(the files, hits and numba-cuda's reading of flowdsl's entries: tests/gpu/test_numba_features_gpu.py)."""

from __future__ import annotations

import pickle
import textwrap

import pytest
from numba import cuda

import flowdsl
from flowdsl import _numba_cache
from flowdsl.errors import CacheRefusedError
from flowdsl.errors import FlowDSLError


def test_linked_files_are_refused_at_decoration_as_numba_cuda_refuses_them(tmp_path):
    ptx = tmp_path / "extra.ptx"
    ptx.write_text("// nothing\n")

    def kernel(x):
        x[0] = 1

    with pytest.raises(RuntimeError, match="Cannot pickle CUDACodeLibrary with linking files") as err:
        flowdsl.kernel(cache=True, link=[str(ptx)])(kernel)
    assert isinstance(err.value, FlowDSLError) and "Drop cache=True" in str(err.value)
    flowdsl.kernel(link=[str(ptx)])(kernel)  # without cache=True: flowdsl's own cache keys the file's contents


class _GpuArray:
    """Stands in for a device array: an object with the CUDA array interface, which no cache can key."""

    __cuda_array_interface__ = {"shape": (3,), "typestr": "<f4", "data": (0x7F0000000000, False), "version": 3}


def test_a_kernel_reaching_a_device_array_is_refused_with_numbas_pickling_error():
    captured = _GpuArray()

    def reaches_device_array(out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = captured[i] * 2.0

    made = flowdsl.kernel(cache=True)(reaches_device_array)
    with pytest.raises(pickle.PicklingError, match="global device arrays") as err:
        made._numba_cache._refuse_device_arrays()  # what a load does first
    assert isinstance(err.value, FlowDSLError) and "Pass the array(s) as arguments" in str(err.value)


def test_a_function_without_a_source_file_is_refused_at_decoration():
    scope = {}
    exec(textwrap.dedent("""
        def no_source(x):
            x[0] = 1
    """), scope)
    with pytest.raises(CacheRefusedError, match="no locator available") as err:
        flowdsl.kernel(cache=True)(scope["no_source"])
    assert "drop cache=True" in str(err.value)


def test_stats_before_any_load():
    def counted(x):
        x[0] = 1

    plain, cached = flowdsl.kernel(counted), flowdsl.kernel(cache=True)(counted)
    assert plain.stats.cache_path is None and not plain.stats.cache_hits and not plain.stats.cache_misses
    assert cached.stats.cache_path.endswith("__pycache__")
    assert pickle.loads(pickle.dumps(cached))._numba_cache is not None  # numba-cuda's pickling keeps the option


class _LoadedStub:
    """Stands in for numba-cuda's loaded kernel (loading one needs a GPU): records what it was made with."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs, self.bound = args, kwargs, False

    def bind(self):
        self.bound = True


def test_the_load_path_with_and_without_numba_cudas_cache(monkeypatch, tmp_path):
    """What a first launch runs, up to the GPU's load: without ``cache=True`` flowdsl's disk cache alone (a miss in
    numba-cuda's counting); with it numba-cuda's entry first (its features from the marshaller), else a compile stored
    there with what it was linked for."""
    from numba import types

    from flowdsl import _launch
    from flowdsl.lowering.target import Target
    from flowdsl.lowering.types import ArgumentMarshaller

    monkeypatch.setenv("FLOWDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_launch, "numba_kernel", _LoadedStub)
    target, argtypes = Target((2, 28, 9), "sm_90"), (types.int64[::1],)

    def sets_one(x):
        x[0] = 1

    plain = flowdsl.kernel(sets_one)
    loaded = plain._load_or_compile(argtypes, target)
    assert loaded.bound and loaded.kwargs["linked_for"] is None and plain.last_build["source"] == "compiled"
    assert dict(plain.stats.cache_misses) == {argtypes: 1} and not plain.stats.cache_hits

    cached = flowdsl.kernel(cache=True)(sets_one)
    saved = []
    monkeypatch.setattr(cached._numba_cache, "load", lambda a, t: None)
    monkeypatch.setattr(cached._numba_cache, "save", lambda a, kernel: saved.append((a, kernel)))
    loaded = cached._load_or_compile(argtypes, target)
    assert saved == [(argtypes, loaded)] and loaded.kwargs["linked_for"] == _numba_cache.stamp(target)
    assert cached.last_build["source"] == "disk"  # flowdsl's own disk cache had it from the kernel above

    entry = _LoadedStub()
    entry.extensions = [ArgumentMarshaller({"cooperative"}, _numba_cache.stamp(target))]
    monkeypatch.setattr(cached._numba_cache, "load", lambda a, t: entry)
    assert cached._load_or_compile(argtypes, target) is entry and entry.bound
    assert entry.flowdsl_features == {"cooperative"} and dict(cached.stats.cache_hits) == {argtypes: 1}


def test_an_entry_linked_for_another_nccl_or_flowdsl_is_a_miss(monkeypatch):
    from flowdsl.lowering.target import Target
    from flowdsl.lowering.types import ArgumentMarshaller

    def sets_two(x):
        x[0] = 2

    cache = flowdsl.kernel(cache=True)(sets_two)._numba_cache
    target = Target((2, 28, 9), "sm_90")
    entry = _LoadedStub()
    monkeypatch.setattr(cache._cache, "load_overload", lambda sig, context: entry)
    another_nccl = _numba_cache.stamp(Target((2, 32, 3), "sm_90"))
    for linked_for, found in ((_numba_cache.stamp(target), True), (another_nccl, False),
                              (("another flowdsl", (2, 28, 9)), False)):
        entry.extensions = [ArgumentMarshaller(frozenset(), linked_for)]
        assert (cache.load(("argtypes",), target) is entry) is found, linked_for
    entry.extensions = []  # numba-cuda's own entry: taken as it is
    assert cache.load(("argtypes",), target) is entry
