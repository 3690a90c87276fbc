"""``cache=True``, numba-cuda's on-disk cache: what is refused at decoration and before a load, without a GPU
(the files, hits and numba-cuda's reading of flowdsl's entries: tests/gpu/test_numba_features_gpu.py)."""

from __future__ import annotations

import pickle
import textwrap

import pytest
from numba import cuda

import flowdsl
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
