"""The kernel disk cache is always right: a change the compiled code depends on is a new entry.

Kernels are built for an explicit target (no GPU): ``build`` compiles into the disk cache
or finds the entry there. Each case below compiled to a different cubin but hit the first
one's entry when the key covered only the kernel's module source and simple closure
values. Damaged entries are rebuilt with a warning; an unwritable cache falls back to
memory with one warning.
"""

from __future__ import annotations

import enum
import importlib
import json
import os
import subprocess
import sys
import textwrap
import warnings
import zlib

import numpy as np
import pytest

import flowdsl
from numba import cuda
from flowdsl import CacheWarning, RedOp
from flowdsl._kernel import FlowKernel
from flowdsl.lowering.target import Target

pytestmark = pytest.mark.compile

TARGET = Target((2, 28, 9), "sm_90")


def _argtypes():
    return FlowKernel.argtypes_for(np.zeros(1, np.float32), nccl="2.28.9")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("FLOWDSL_CACHE_DIR", str(root))
    return root / "kernels"


def _cubins(root) -> dict:
    return {p.name: p.read_bytes() for p in root.glob("*.cubin")}


def _assert_new_entry(first: FlowKernel, make_second, cache):
    """After ``first`` is cached, the kernel ``make_second()`` returns compiles into an entry of its
    own, whose cubin differs (a reload rebinds the first kernel's module globals too: build it first)."""
    assert first.build(_argtypes(), TARGET) == "compiled"
    second = make_second()
    assert second.build(_argtypes(), TARGET) == "compiled", "served the first kernel's cache entry"
    cubins = _cubins(cache)
    assert len(cubins) == 2 and len(set(cubins.values())) == 2
    assert second.build(_argtypes(), TARGET) == "cached"


@pytest.fixture
def source_dir(tmp_path, monkeypatch):
    """A directory on ``sys.path`` for modules written by a test (no bytecode files: edits are seen)."""
    path = tmp_path / "src"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    yield path
    for name in [n for n in sys.modules if n.startswith("cache_case_")]:
        del sys.modules[name]


def _write_module(directory, name: str, text: str):
    (directory / f"{name}.py").write_text(textwrap.dedent(text))
    importlib.invalidate_caches()
    if name in sys.modules:
        return importlib.reload(sys.modules[name])
    return importlib.import_module(name)


HELPER = """
import flowdsl

@flowdsl.device
def scale(x):
    return x * {factor}
"""

KERNEL_CALLING_HELPER = """
import flowdsl
from cache_case_helper import scale

@flowdsl.kernel
def k(out):
    out[0] = scale(out[0])
"""


def test_edited_device_helper_in_another_module_is_a_new_entry(cache, source_dir):
    _write_module(source_dir, "cache_case_helper", HELPER.format(factor=2.0))
    first = _write_module(source_dir, "cache_case_kernel", KERNEL_CALLING_HELPER).k

    def edit_helper():  # the kernel's file is unchanged
        _write_module(source_dir, "cache_case_helper", HELPER.format(factor=3.0))
        return _write_module(source_dir, "cache_case_kernel", KERNEL_CALLING_HELPER).k
    _assert_new_entry(first, edit_helper, cache)


def _closure_kernel(value):
    @flowdsl.kernel
    def k(out):
        out[0] = value[0] * value[1]
    return k


def _closure_scalar_kernel(value):
    @flowdsl.kernel
    def k(out):
        out[0] = value
    return k


class Mode(enum.IntEnum):
    ADD = 1
    MUL = 2


def _closure_enum_kernel(mode):
    @flowdsl.kernel
    def k(out):
        if mode == Mode.ADD:
            out[0] = out[0] + 3.0
        else:
            out[0] = out[0] * 3.0
    return k


@pytest.mark.parametrize("factory,first,second", [
    (_closure_kernel, (2.0, 3.0), (5.0, 7.0)),
    (_closure_kernel, np.array([2.0, 3.0]), np.array([5.0, 7.0])),
    (_closure_scalar_kernel, np.float32(1.5), np.float32(2.5)),
    (_closure_enum_kernel, Mode.ADD, Mode.MUL),
], ids=["tuple", "numpy-array", "numpy-scalar", "enum"])
def test_factory_closure_value_is_part_of_the_key(cache, factory, first, second):
    _assert_new_entry(factory(first), lambda: factory(second), cache)


KERNEL_WITH_ENV_GLOBAL = """
import os
import flowdsl

SCALE = float(os.environ.get("FLOWDSL_TEST_SCALE", "2"))

@flowdsl.kernel
def k(out):
    out[0] = out[0] * SCALE
"""


def test_module_global_computed_from_the_environment_is_part_of_the_key(cache, source_dir, monkeypatch):
    monkeypatch.setenv("FLOWDSL_TEST_SCALE", "2")
    first = _write_module(source_dir, "cache_case_env", KERNEL_WITH_ENV_GLOBAL).k

    def import_again():  # the same source, another environment
        monkeypatch.setenv("FLOWDSL_TEST_SCALE", "5")
        return _write_module(source_dir, "cache_case_env", KERNEL_WITH_ENV_GLOBAL).k
    _assert_new_entry(first, import_again, cache)


CELL = """
@flowdsl.kernel
def cell(out):
    out[0] = {constant}
"""


def _run_cell(text: str) -> FlowKernel:
    """A kernel defined as a notebook cell defines it: exec'd code without a source file, in ``__main__``."""
    namespace = {"flowdsl": flowdsl, "__name__": "__main__"}
    exec(compile(text, "<notebook-cell>", "exec"), namespace)  # noqa: S102 - what a notebook does
    return namespace["cell"]


def test_kernel_defined_by_exec_is_keyed_by_its_code(cache):
    _assert_new_entry(_run_cell(CELL.format(constant=2.0)), lambda: _run_cell(CELL.format(constant=7.0)), cache)
    # The same cell run again is the same kernel: found, not compiled.
    assert _run_cell(CELL.format(constant=7.0)).build(_argtypes(), TARGET) == "cached"


def test_values_numba_freezes_are_keyed_by_value():
    """No compile: keys of kernels that differ in one frozen value, and of equal ones."""
    from flowdsl import _cache

    def key(value):
        return _cache.dependency_digest(_closure_scalar_kernel(value).py_func)

    same = [(1, 1), (np.float32(1.5), np.float32(1.5)), (np.arange(3), np.arange(3)), (RedOp.MAX, RedOp.MAX),
            ((1, (2.0, "x")), (1, (2.0, "x"))), (frozenset({"a", "b"}), frozenset({"b", "a"}))]
    different = [(1, 2), (1, 1.0), (1, True), (np.float32(1.5), np.float64(1.5)), (np.arange(3), np.arange(4)),
                 (np.arange(3), np.arange(3).reshape(3, 1)), (RedOp.MAX, RedOp.MIN), (Mode.ADD, 1),
                 ((1, (2.0, "x")), (1, (2.0, "y"))), (np.dtype("f4"), np.dtype("f8"))]
    for a, b in same:
        assert key(a) == key(b), (a, b)
    for a, b in different:
        assert key(a) != key(b), (a, b)


KEY_IN_A_FRESH_PROCESS = """
import sys
from flowdsl import RedOp, _cache
from flowdsl.collectives import _library
import flowdsl

def make(values):
    @flowdsl.kernel
    def k(out):
        out[0] = len(values)
    return k

kernel = _library.kernel_for("ring", "all_reduce", RedOp.MAX, gin_peers=True, fp8=1)
print(_cache.dependency_digest(kernel.py_func), _cache.dependency_digest(make(frozenset({"a", "b", "c"})).py_func))
"""


def test_keys_are_the_same_in_every_process():
    """String hashing is randomised per process: a key must not depend on it, or the cache never hits."""
    def keys(seed):
        env = dict(os.environ, PYTHONHASHSEED=str(seed), PYTHONPATH=os.getcwd())
        return subprocess.run([sys.executable, "-c", KEY_IN_A_FRESH_PROCESS], env=env, check=True,
                              capture_output=True, text=True).stdout.split()
    assert keys(1) == keys(2)


class Opaque:
    """A value numba freezes (typed as None) but flowdsl cannot hash: its content is unknown."""
    from numba.core import types as _types
    _numba_type_ = _types.none


OPAQUE = Opaque()


@flowdsl.kernel
def reads_an_opaque_global(out):
    marker = OPAQUE  # noqa: F841 - the kernel depends on the value, which has no reliable hash
    out[0] = 2.0


def test_value_without_a_reliable_hash_compiles_in_memory_with_one_warning(cache):
    with pytest.warns(CacheWarning, match=r"Cannot cache kernel reads_an_opaque_global on disk: .*"
                                          r"reads OPAQUE, a .*Opaque, whose value flowdsl cannot hash"):
        assert reads_an_opaque_global.build(_argtypes(), TARGET) == "compiled"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reads_an_opaque_global.build(_argtypes(), TARGET) == "compiled"  # no second warning
    assert not cache.exists() or not _cubins(cache)


# -- damaged entries and unwritable directories ----------------------------------------------------------

@flowdsl.kernel
def small(out):
    out[0] = out[0] + 1.0


def _damage_metadata_truncated(cubin, meta):
    meta.write_text(meta.read_text()[:20])


def _damage_cubin_empty(cubin, meta):
    cubin.write_bytes(b"")


def _damage_metadata_empty_object(cubin, meta):
    meta.write_text("{}")


def _damage_cubin_flipped(cubin, meta):
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cubin.write_bytes(bytes(data))


def _damage_cubin_missing(cubin, meta):
    cubin.unlink()


@pytest.mark.parametrize("damage", [_damage_metadata_truncated, _damage_cubin_empty, _damage_metadata_empty_object,
                                    _damage_cubin_flipped, _damage_cubin_missing],
                         ids=["truncated-json", "empty-cubin", "empty-metadata", "flipped-byte", "missing-cubin"])
def test_damaged_entry_is_rebuilt_with_one_warning(cache, damage):
    assert small.build(_argtypes(), TARGET) == "compiled"
    (cubin,), (meta,) = cache.glob("*.cubin"), cache.glob("*.json")
    damage(cubin, meta)
    with pytest.warns(CacheWarning, match=rf"Damaged kernel cache entry {meta}: .*Rebuilding it") as caught:
        assert small.build(_argtypes(), TARGET) == "compiled"
    assert len(caught) == 1
    record = json.loads(meta.read_text())
    (cubin,) = cache.glob("*.cubin")  # the damaged one is gone
    rebuilt = cubin.read_bytes()
    assert cubin.name == record["cubin"]
    assert rebuilt.startswith(b"\x7fELF") and record["entry_name"] in rebuilt.decode("latin-1")
    assert record["cubin_bytes"] == len(rebuilt) and record["cubin_crc32"] == zlib.crc32(rebuilt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert small.build(_argtypes(), TARGET) == "cached"


def test_a_writer_that_stops_after_its_cubin_leaves_the_entry_whole(cache):
    """Ranks compile the same kernel at once: one's cubin never lands under another's record."""
    from flowdsl import _cache

    assert small.build(_argtypes(), TARGET) == "compiled"
    (record,) = cache.glob("*.json")
    key = record.stem
    cubin, meta = _cache.read_entry(cache, key)
    other = cubin[:-1] + bytes([cubin[-1] ^ 1])  # another process's build of the same kernel
    (cache / _cache._cubin_name(key, other)).write_bytes(other)  # ... which stopped before its record
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _cache.read_entry(cache, key) == (cubin, meta)
        assert _cache.write_entry(cache, key, other, meta["entry_name"], meta["features"])
        assert _cache.read_entry(cache, key)[0] == other


def _check_unwritable(monkeypatch, root, reason: str):
    from flowdsl import _cache

    monkeypatch.setattr(_cache, "_WARNED_DIRS", set())
    monkeypatch.setenv("FLOWDSL_CACHE_DIR", str(root))
    with pytest.warns(CacheWarning, match=rf"Cannot write the kernel cache {root / 'kernels'}: {reason}") as caught:
        assert small.build(_argtypes(), TARGET) == "compiled"
        assert _closure_scalar_kernel(4.0).build(_argtypes(), TARGET) == "compiled"
    assert len(caught) == 1  # one warning for the directory, not one per kernel


def test_cache_directory_that_cannot_be_created_falls_back_to_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    _check_unwritable(monkeypatch, blocker / "cache", "Not a directory")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes into read-only directories; the test above covers a failing write")
def test_read_only_cache_directory_falls_back_to_memory(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    (root / "kernels").mkdir(parents=True)
    (root / "kernels").chmod(0o500)
    try:
        _check_unwritable(monkeypatch, root, "Permission denied")
    finally:
        (root / "kernels").chmod(0o700)


def test_a_failed_write_leaves_no_entry_and_no_temporary_file(cache, monkeypatch):
    """A write that fails half way (disk full) leaves nothing a later process would read."""
    from flowdsl import _cache

    real_replace = os.replace

    def full_disk(src, dst):
        if str(dst).endswith(".json"):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(_cache, "_WARNED_DIRS", set())
    monkeypatch.setattr(_cache.os, "replace", full_disk)
    with pytest.warns(CacheWarning, match="No space left on device"):
        assert small.build(_argtypes(), TARGET) == "compiled"
    monkeypatch.setattr(_cache.os, "replace", real_replace)
    assert not list(cache.glob("*.json")) and not list(cache.glob("*.tmp"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a cubin without its record is no entry, and no damage
        assert small.build(_argtypes(), TARGET) == "compiled"
    assert small.build(_argtypes(), TARGET) == "cached"


def _reads_maybe_unset(result, n):
    if n:
        if n > 0:
            c = 0
        result[0] = c
    else:
        c += 1  # noqa: F821 - numba's SSA pass warns of it (test_ssa's check_undefined_var)
        result[0] = c


def test_what_a_compile_warned_is_said_again_at_each_load_from_disk(cache):
    """numba's compile-time diagnostics are kept with the entry: a kernel loaded from disk warns as its compile
    did, and the switch that makes numba warn is part of the key."""
    from numba.core.errors import NumbaWarning as CoreNumbaWarning
    from numba.cuda.core.errors import NumbaWarning
    from numba.cuda.tests.support import override_config

    argtypes = FlowKernel.argtypes_for(np.zeros(1, np.int64), 1, nccl="2.28.9")

    def built(warn: int):
        with override_config("ALWAYS_WARN_UNINIT_VAR", warn), warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            source = flowdsl.kernel(_reads_maybe_unset).build(argtypes, TARGET)
        said = [w for w in seen if issubclass(w.category, (NumbaWarning, CoreNumbaWarning))]
        return source, said

    source, said = built(1)
    assert source == "compiled" and said and "Detected uninitialized variable c" in str(said[0].message)
    again, said_again = built(1)  # a new kernel object: from disk, the same warnings at the same lines
    assert again == "cached"
    assert [(str(w.message), w.filename, w.lineno) for w in said_again] == [
        (str(w.message), w.filename, w.lineno) for w in said]
    assert built(0) == ("compiled", [])  # another key: numba does not warn of it then
    assert built(0) == ("cached", [])


def test_declared_signatures_of_what_a_kernel_calls_are_part_of_the_key(cache):
    """A numba dispatcher whose compilation is disabled (declared signatures: numba refuses a call it does not
    match) and a flowdsl device function's declared signatures (a call converts to them) type the caller: the same
    code without them is another entry (test_device_func's cpu dispatcher tests ran the valid one's cubin)."""
    from numba import jit

    from flowdsl.errors import KernelTypingError

    def add_kernel_of(add):
        def add_kernel(ary):
            i = cuda.grid(1)
            ary[i] = add(ary[i], 1)
        return flowdsl.kernel(add_kernel)

    argtypes = FlowKernel.argtypes_for(np.zeros(1, np.int64), nccl="2.28.9")

    def add(a, b):
        return a + b

    assert add_kernel_of(jit(add)).build(argtypes, TARGET) == "compiled"
    with pytest.raises(KernelTypingError, match="using cpu function on device but its compilation is disabled"):
        add_kernel_of(jit("(i4, i4)")(add)).build(argtypes, TARGET)
    assert add_kernel_of(flowdsl.device(add)).build(argtypes, TARGET) == "compiled"
    assert add_kernel_of(flowdsl.device(signature="int32(int32, int32)")(add)).build(argtypes, TARGET) == "compiled"


def test_an_overloaded_functions_implementation_is_part_of_the_key(cache):
    """A kernel calling a function numba-cuda's ``@overload`` implements compiles the overload, not the function's
    body: its implementation and options are in the key (test_extending's strictness test ran the lax one)."""
    from numba.cuda.extending import overload

    argtypes = FlowKernel.argtypes_for(np.zeros(1, np.int64), nccl="2.28.9")

    def kernel_calling(impl_of, strict=True):
        def myoverload(a, kw=None):
            pass

        overload(myoverload, strict=strict)(impl_of)

        def foo(out):
            out[0] = myoverload(out[0], kw=11)
        return flowdsl.kernel(foo)

    def plus_one(a, kw=None):
        def impl(a, kw=None):
            return a + 1
        return impl

    def plus_two(a, kw=None):
        def impl(a, kw=None):
            return a + 2
        return impl

    assert kernel_calling(plus_one).build(argtypes, TARGET) == "compiled"
    assert kernel_calling(plus_one).build(argtypes, TARGET) == "cached"
    assert kernel_calling(plus_two).build(argtypes, TARGET) == "compiled"
    assert kernel_calling(plus_two, strict=False).build(argtypes, TARGET) == "compiled"
