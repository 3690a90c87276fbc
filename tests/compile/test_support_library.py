"""The support library and its GIN builds: headers generated from the table, builds matching their sources,
every symbol present in every build (the GIN library's in the build of every backend)."""

from __future__ import annotations

import hashlib
import json

import pytest

from flowdsl.lowering import externs
from flowdsl.runtime import support_build
from flowdsl.runtime.support import manifest

pytestmark = pytest.mark.compile

PREBUILT = support_build.PREBUILT_DIR


@pytest.mark.parametrize("library", ["support", "gin"])
def test_header_is_generated_from_the_extern_table(library):
    assert (PREBUILT / "include" / f"flowdsl_{library}.h").read_text() == externs.render_header(library), \
        f"prebuilt/include/flowdsl_{library}.h is stale: run prebuilt/build.sh"


def test_manifest_matches_sources_and_builds():
    m = manifest()
    assert m["sources"] == support_build.source_digest(), \
        "support library sources changed since the checked-in builds: run prebuilt/build.sh"
    assert set(m["abis"]) == set(support_build.SUPPORTED_VERSIONS)
    for version, entry in m["abis"].items():
        assert set(entry["builds"]) == set(support_build.ARCHS), version
        assert set(entry["gin"]["builds"]) == {"all", *entry["gin"]["backends"]}, version
        builds = [*entry["builds"].values(), *(b for arches in entry["gin"]["builds"].values() for b in arches.values())]
        for arches in entry["gin"]["builds"].values():
            assert set(arches) == set(support_build.ARCHS), version
        for build in builds:
            data = (PREBUILT / build["file"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == build["sha256"], (version, build["file"])
    assert m["abis"]["2.28.9"]["gin"]["backends"] == ["proxy", "gdaki"]
    assert m["abis"]["2.32.3"]["gin"]["backends"] == ["proxy", "gdaki", "gpi", "efa_gda"]


def _call_externs_kernel(symbols):
    """A kernel calling ``symbols`` behind a branch never taken (the link resolves each of them)."""
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic

    from flowdsl.lowering.declarations import call_extern, signature_of

    rows = {sym: ext for ext in externs.EXTERNS for sym in ext.symbols()}

    @intrinsic
    def call_all(typingctx, flag):
        def codegen(context, builder, sig, args):
            with builder.if_then(builder.icmp_signed("==", args[0], ir.Constant(args[0].type, 12345))):
                for sym in symbols:
                    zeros = [ir.Constant(context.get_value_type(t), None) for t in signature_of(rows[sym]).args]
                    call_extern(context, builder, sym, zeros)
            return context.get_dummy_value()
        return types.void(flag), codegen

    def kernel(flag):
        call_all(flag)

    return kernel


@pytest.mark.parametrize("version", support_build.SUPPORTED_VERSIONS)
@pytest.mark.parametrize("arch", support_build.ARCHS)
def test_every_table_symbol_is_in_every_build(version, arch):
    """Each build records what its source defines (read from the preprocessed source)."""
    nccl = tuple(map(int, version.split(".")))
    entry = manifest()["abis"][version]
    builds = [("support", entry["builds"][arch])] + [("gin", arches[arch]) for arches in entry["gin"]["builds"].values()]
    for library, build in builds:
        wanted = externs.symbols(nccl, arch, library=library)
        built = set(build["symbols"])
        assert [s for s in wanted if s not in built] == [], build["file"]
        # and nothing is built that the table does not declare (a stale or misspelled wrapper)
        assert sorted(built - set(wanted)) == [], build["file"]


@pytest.mark.parametrize("version", support_build.SUPPORTED_VERSIONS)
def test_the_ltoir_files_resolve_the_table(version):
    """Link against the LTO-IR itself: one symbol of every table row (all coops of the LSA barrier)."""
    from numba.core import types

    from flowdsl.lowering.compiler import compile_kernel
    from flowdsl.lowering.target import Target
    from flowdsl.runtime.support import feature_libraries, gin_backends, support_build_for

    nccl = tuple(map(int, version.split(".")))
    available = set(externs.symbols(nccl, "sm_90")) | set(externs.symbols(nccl, "sm_90", library="gin"))
    sample = [s for ext in externs.EXTERNS for s in ext.symbols(nccl)[:1] if s in available]
    sample += [s for s in externs.by_name("flowdsl_lsa_barrier_sync").symbols()]
    for backend in (None, gin_backends(nccl)[-1]):
        target = Target(nccl, "sm_90", gin_backend=backend)
        compile_kernel(_call_externs_kernel(sorted(set(sample))), (types.int32,), target,
                       support_build_for(nccl, "sm_90").ltoir, link_for_features=feature_libraries(target))


def test_a_missing_symbol_fails_the_link():
    from cuda.bindings.nvjitlink import nvJitLinkError
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic

    from flowdsl.lowering.compiler import compile_kernel
    from flowdsl.lowering.target import Target
    from flowdsl.runtime.support import support_build_for

    @intrinsic
    def call_missing(typingctx, flag):
        def codegen(context, builder, sig, args):
            fn = ir.Function(builder.module, ir.FunctionType(ir.VoidType(), []), "flowdsl_not_in_any_build")
            with builder.if_then(builder.icmp_signed("==", args[0], ir.Constant(args[0].type, 12345))):
                builder.call(fn, [])
            return context.get_dummy_value()
        return types.void(flag), codegen

    def kernel(flag):
        call_missing(flag)

    with pytest.raises(nvJitLinkError, match="flowdsl_not_in_any_build"):
        compile_kernel(kernel, (types.int32,), Target((2, 28, 9), "sm_90"), support_build_for((2, 28, 9), "sm_90").ltoir)


def test_layouts_are_those_of_the_abis():
    layouts = {v: e["layout"] for v, e in manifest()["abis"].items()}
    assert layouts["2.28.9"]["dev_comm_size"] == 200 and layouts["2.28.9"]["requirements_size"] == 56
    assert layouts["2.32.3"]["dev_comm_size"] == 248 and layouts["2.32.3"]["requirements_size"] == 120
    # 2.32's requirements start with size, magic 0xcafebeef and the version code.
    init = bytes.fromhex(layouts["2.32.3"]["requirements_initializer"])
    assert int.from_bytes(init[0:8], "little") == 120
    assert int.from_bytes(init[8:12], "little") == 0xCAFEBEEF
    assert int.from_bytes(init[12:16], "little") == 23203
    # Where ncclDevComm records its GIN connections (count, then one ncclNetDeviceType byte each).
    for layout in layouts.values():
        count_at, types_at = layout["gin_types"]
        assert 0 < count_at < types_at <= layout["dev_comm_size"] - 4


def test_a_device_communicator_names_the_backend_its_struct_records():
    from flowdsl.enums import GinBackend
    from flowdsl.runtime.memory import gin_backends_in

    layout = manifest()["abis"]["2.32.3"]["layout"]
    count_at, types_at = layout["gin_types"]
    raw = bytearray(layout["dev_comm_size"])
    assert gin_backends_in(bytes(raw), layout) == frozenset()
    raw[count_at], raw[types_at:types_at + 2] = 2, bytes([3, 3])
    assert gin_backends_in(bytes(raw), layout) == {GinBackend.GDAKI}
    raw[types_at + 1] = 5
    assert gin_backends_in(bytes(raw), layout) == {GinBackend.GDAKI, GinBackend.EFA_GDA}
    assert gin_backends_in(bytes(raw), {"dev_comm_size": 248}) is None  # a layout read by an older flowdsl


def test_a_release_without_a_build_and_without_matching_headers_says_what_to_install(tmp_path):
    with pytest.raises(RuntimeError, match=r"Install nvidia-nccl-cu13==2\.30\.1 .*2\.28\.9, 2\.32\.3"):
        support_build.build_for_installed("2.30.1", "sm_90", tmp_path)


@pytest.mark.skipif(support_build.nvcc_path() is None, reason="needs nvcc to build the support library")
def test_first_use_build_from_installed_headers_links(tmp_path):
    import numpy as np

    import flowdsl
    from flowdsl.examples.allgather_lsa import allgather_lsa
    from flowdsl.lowering.compiler import compile_kernel
    from flowdsl.lowering.target import Target

    include = support_build.installed_include_dir()
    code = support_build.header_version_code(include)
    version = f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    path, layout = support_build.build_for_installed(version, "sm_90", tmp_path)
    assert json.loads((tmp_path / f"nccl-{version}" / "layout.json").read_text()) == layout
    nccl = tuple(map(int, version.split(".")))
    argtypes = flowdsl.FlowKernel.argtypes_for("devcomm", np.zeros(4, np.float32), ("window", np.float32), 4,
                                               nccl=version)
    compiled = compile_kernel(allgather_lsa.py_func, argtypes, Target(nccl, "sm_90"), path.read_bytes())
    assert not [s for s in compiled.function_symbols() if s.startswith("flowdsl_")]
    # The GIN library of one backend, built from the same headers.
    gin_path, _ = support_build.build_for_installed(version, "sm_90", tmp_path, gin="proxy")
    assert gin_path.name == "sm_90-gin-proxy.ltoir" and gin_path.stat().st_size > 0
    with pytest.raises(RuntimeError, match=r"Cannot build the flowdsl GIN library for backend ib"):
        support_build.build_for_installed(version, "sm_90", tmp_path, gin="ib")
