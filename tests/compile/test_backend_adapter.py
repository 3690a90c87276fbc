"""What :mod:`flowdsl.lowering.backend` relies on in numba-cuda, one test per reliance.

The adapter is the only module that reaches numba-cuda's private or undocumented names. Each test
here states one of them; when a numba-cuda release changes it, the test fails with a message
naming what changed and where the adapter uses it. Compile-only: no GPU.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from numba import cuda
from numba.core import types

from flowdsl.lowering import backend

pytestmark = pytest.mark.compile


def _parameters(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


@cuda.jit(device=True)
def _helper(x):
    return x * 3 + 1


def _kernel(out):
    out[0] = _helper(out[1])


_ARGTYPES = (types.int64[::1],)


def test_compile_pyfunc_with_fixup_takes_what_lower_kernel_passes():
    from numba.cuda import compiler

    fn = getattr(compiler, "_compile_pyfunc_with_fixup", None)
    assert fn is not None, ("numba.cuda.compiler._compile_pyfunc_with_fixup is gone: backend.lower_kernel "
                            "compiles kernels through it (the code library, not LTO-IR bytes, is needed)")
    missing = {"pyfunc", "sig", "device", "cc", "lto", "abi", "fastmath", "lineinfo"} - set(_parameters(fn))
    assert not missing, f"_compile_pyfunc_with_fixup no longer takes {sorted(missing)} (backend.lower_kernel)"


def test_lowered_kernel_has_entry_name_ir_and_ltoir():
    lowered = backend.lower_kernel(_kernel, _ARGTYPES, (9, 0), fastmath=False, lineinfo=False)
    assert isinstance(lowered.entry_name, str) and lowered.entry_name, \
        "a kernel's code library no longer carries _entry_name (backend.Lowered.entry_name)"
    assert f'@"{lowered.entry_name}"' in lowered.ir_text or f"@{lowered.entry_name}(" in lowered.ir_text, \
        "get_llvm_str() no longer holds the kernel's entry symbol (backend.Lowered.ir_text)"
    ltoir = lowered.ltoir((9, 0))
    assert isinstance(ltoir, bytes) and len(ltoir) > 100, "get_ltoir(cc=) no longer returns LTO-IR bytes"


def test_library_llvm_strs_is_what_get_ltoir_and_get_llvm_str_read():
    """lower_kernel drops duplicate modules and adds ``noinline`` by replacing ``_llvm_strs``: numba-cuda's
    ``llvm_strs`` (read by ``get_llvm_str`` and ``get_ltoir``) must return it once set."""
    from numba.cuda.codegen import CUDACodeLibrary

    source = inspect.getsource(CUDACodeLibrary.llvm_strs.fget)
    assert "_llvm_strs" in source, "CUDACodeLibrary.llvm_strs no longer reads _llvm_strs (backend.lower_kernel)"
    assert "llvm_strs" in inspect.getsource(CUDACodeLibrary.get_ltoir), \
        "CUDACodeLibrary.get_ltoir no longer compiles llvm_strs (backend.lower_kernel)"
    assert isinstance(CUDACodeLibrary.__dict__.get("modules"), property), \
        "CUDACodeLibrary.modules is no longer a property (backend._unique_modules)"


def test_out_of_line_device_function_is_marked_noinline():
    """numba mangles ``module.qualname`` as ``_ZN<len><part>...`` followed by ``B`` or ``E``."""
    name = f"{_helper.py_func.__module__}.{_helper.py_func.__qualname__}"
    plain = backend.lower_kernel(_kernel, _ARGTYPES, (9, 0), fastmath=False, lineinfo=False)
    kept = backend.lower_kernel(_kernel, _ARGTYPES, (9, 0), fastmath=False, lineinfo=False, out_of_line={name})

    def helper_definition(ir_text):
        prefix = backend._mangled_prefix(name)
        lines = [line for line in ir_text.splitlines() if line.startswith("define") and prefix in line]
        assert lines, f"no definition of {name} mangled as {prefix}...: numba-cuda's mangling changed"
        return lines[0]

    assert "noinline" not in helper_definition(plain.ir_text)
    assert "noinline" in helper_definition(kept.ir_text)
    assert "noduplicate" in helper_definition(kept.ir_text)  # its calls are not copied either


def test_overloads_compile_for_the_current_device_of_the_dispatcher_module():
    """numba-cuda compiles device functions (overload implementations) for the compute capability of
    ``numba.cuda.dispatcher.get_current_device()``: backend.explicit_target replaces that name."""
    from numba.cuda import dispatcher

    assert "get_current_device" in dispatcher.CUDADispatcher.compile_device.__code__.co_names, \
        "CUDADispatcher.compile_device no longer asks get_current_device: revisit backend.explicit_target"
    assert callable(getattr(dispatcher, "get_current_device", None))


def test_explicit_target_answers_only_the_compiling_thread_and_is_undone(monkeypatch):
    from numba.cuda import dispatcher

    def driver_answer():
        return SimpleNamespace(compute_capability=(1, 2))

    monkeypatch.setattr(dispatcher, "get_current_device", driver_answer)
    seen = {}
    with backend.explicit_target((10, 0)):
        seen["here"] = dispatcher.get_current_device().compute_capability
        with backend.explicit_target((9, 0)):
            seen["nested"] = dispatcher.get_current_device().compute_capability
        seen["after nested"] = dispatcher.get_current_device().compute_capability
        other = threading.Thread(target=lambda: seen.update(other=dispatcher.get_current_device().compute_capability))
        other.start()
        other.join()
    assert seen == {"here": (10, 0), "nested": (9, 0), "after nested": (10, 0), "other": (1, 2)}
    assert dispatcher.get_current_device is driver_answer


def test_a_compile_leaves_numba_cudas_get_current_device_in_place():
    from numba.cuda import api, dispatcher

    backend.lower_kernel(_kernel, _ARGTYPES, (8, 0), fastmath=False, lineinfo=False)
    assert dispatcher.get_current_device is api.get_current_device


def test_code_library_and_kernel_rebuild_take_what_load_kernel_passes():
    """load_kernel wraps a linked cubin as numba-cuda kernel through the unpickling ``_rebuild``s."""
    from numba.cuda.codegen import CUDACodeLibrary
    from numba.cuda.dispatcher import _Kernel

    assert _parameters(CUDACodeLibrary._rebuild) == [
        "codegen", "name", "entry_name", "llvm_strs", "ptx_cache", "cubin_cache", "linkerinfo_cache",
        "max_registers", "nvvm_options", "needs_cudadevrt", "nrt", "use_cooperative", "lto"], \
        "CUDACodeLibrary._rebuild's parameters changed (backend.load_kernel passes them by position)"
    assert _parameters(_Kernel._rebuild)[:8] == [
        "cooperative", "name", "signature", "codelibrary", "debug", "lineinfo", "call_helper", "extensions"], \
        "_Kernel._rebuild's parameters changed (backend.load_kernel passes them by position)"
    assert "_cubin_cache" in inspect.getsource(CUDACodeLibrary.get_cubin), \
        "CUDACodeLibrary.get_cubin no longer reads _cubin_cache, where load_kernel puts the linked cubin"
    assert callable(getattr(CUDACodeLibrary, "_ensure_cc", None)), "CUDACodeLibrary._ensure_cc is gone"
    assert "_codelibrary" in inspect.getsource(_Kernel._rebuild), \
        "_Kernel no longer keeps its library as _codelibrary (backend.kernel_function)"
    assert callable(getattr(CUDACodeLibrary, "get_cufunc", None)), "CUDACodeLibrary.get_cufunc is gone"


def test_experimental_stream_wraps_a_handle():
    from numba.cuda.cudadrv import driver

    assert callable(getattr(getattr(driver, "ExperimentalStream", None), "from_handle", None)), \
        "numba.cuda.cudadrv.driver.ExperimentalStream.from_handle is gone (backend.stream_from_handle)"


def test_host_values_type_as_kernel_arguments():
    assert backend.argument_type(np.zeros(3, np.float32)) == types.Array(types.float32, 1, "C")
    assert backend.argument_type(np.zeros((2, 3), np.int16)[:, ::2]) == types.Array(types.int16, 2, "A")
    assert backend.argument_type(np.float32(1)) == types.float32
    with pytest.raises(ValueError, match="Cannot determine Numba type"):  # flowdsl words it for the launch
        backend.argument_type(object())


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.uint16, np.int32, np.uint64, np.bool_])
def test_dtypes_and_numba_types_convert_both_ways(dtype):
    ty = backend.numpy_to_type(np.dtype(dtype))
    assert isinstance(ty, types.Type)
    assert backend.type_to_numpy(ty) == np.dtype(dtype)


def test_cache_key_names_exist():
    versions = backend.versions()
    assert set(versions) == {"numba_cuda", "numba", "llvmlite"}
    assert versions["numba_cuda"] != "?", "numba_cuda.__version__ is gone (part of the kernel cache key)"
    settings = backend.codegen_settings()
    assert len(settings) == 5 and all(isinstance(flag, bool) for flag in settings[1:]), \
        "numba.cuda.core.config lost OPT / CUDA_DEBUGINFO_DEFAULT / CUDA_ENABLE_NRT / ALWAYS_WARN_UNINIT_VAR / " \
        "DISABLE_PERFORMANCE_WARNINGS (part of the kernel cache key)"


def test_device_only_functions_are_stubs():
    """The simulator finds numba.cuda's device-only functions as subclasses of ``Stub``."""
    for name in ("threadIdx", "blockIdx", "atomic", "shared", "local"):
        assert issubclass(getattr(cuda, name), backend.Stub), f"numba.cuda.{name} is no longer a Stub (sim/cudashim.py)"


def test_populate_array_takes_the_view_fields():
    missing = {"data", "shape", "strides", "itemsize", "meminfo"} - set(_parameters(backend.populate_array))
    assert not missing, f"numba.cuda.np.arrayobj.populate_array no longer takes {sorted(missing)} (lsa views)"


def test_overload_method_templates_keep_their_type_name_and_function():
    """``overloaded_methods`` reads numba-cuda's typing registry: each ``@overload_method`` template keeps
    ``key`` (the type class), ``_attr`` and ``_overload_func``; ``resolve_stub`` binds an overloaded stub."""
    importlib.import_module("flowdsl.lowering.bindings")  # binds every stub
    from flowdsl import lsa
    from flowdsl.lowering.types import CoopType

    found = {(typ, attr): fn.__name__ for typ, attr, fn in backend.overloaded_methods()}
    assert found.get((CoopType, "sync")) == "coop_sync", "numba-cuda's method templates changed (overloaded_methods)"
    assert backend.resolve_stub(lsa.sync) and not backend.resolve_stub(_kernel)


def test_unknown_names_are_refused():
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        backend.nothing  # noqa: B018
