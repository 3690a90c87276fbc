"""The support library: header generated from the table, builds matching their sources, every symbol present."""

from __future__ import annotations

import hashlib
import json

import pytest

from flowdsl.lowering import externs
from flowdsl.runtime import support_build
from flowdsl.runtime.support import manifest

pytestmark = pytest.mark.compile

PREBUILT = support_build.PREBUILT_DIR


def test_header_is_generated_from_the_extern_table():
    assert (PREBUILT / "include" / "flowdsl_support.h").read_text() == externs.render_header(), \
        "prebuilt/include/flowdsl_support.h is stale: run prebuilt/build.sh"


def test_manifest_matches_sources_and_builds():
    m = manifest()
    assert m["sources"] == support_build.source_digest(), \
        "support library sources changed since the checked-in builds: run prebuilt/build.sh"
    assert set(m["abis"]) == set(support_build.SUPPORTED_VERSIONS)
    for version, entry in m["abis"].items():
        assert set(entry["builds"]) == set(support_build.ARCHS), version
        for arch, build in entry["builds"].items():
            data = (PREBUILT / build["file"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == build["sha256"], (version, arch)


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
    """The build records what its source defines (a relocatable cubin of the same source)."""
    nccl = tuple(map(int, version.split(".")))
    wanted = externs.symbols(nccl, arch)
    built = set(manifest()["abis"][version]["builds"][arch]["symbols"])
    assert [s for s in wanted if s not in built] == []
    # and nothing is built that the table does not declare (a stale or misspelled wrapper)
    assert sorted(built - set(wanted)) == []


@pytest.mark.parametrize("version", support_build.SUPPORTED_VERSIONS)
def test_the_ltoir_files_resolve_the_table(version):
    """Link against the LTO-IR itself: one symbol of every table row (all coops of the LSA barrier)."""
    from numba.core import types

    from flowdsl.lowering.compiler import compile_kernel
    from flowdsl.lowering.target import Target
    from flowdsl.runtime.support import support_build_for

    nccl = tuple(map(int, version.split(".")))
    available = set(externs.symbols(nccl, "sm_90"))
    sample = [s for ext in externs.EXTERNS for s in ext.symbols(nccl)[:1] if s in available]
    sample += [s for s in externs.by_name("flowdsl_lsa_barrier_sync").symbols()]
    compile_kernel(_call_externs_kernel(sorted(set(sample))), (types.int32,), Target(nccl, "sm_90"),
                   support_build_for(nccl, "sm_90").ltoir)


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
