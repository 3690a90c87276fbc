"""Every CFT primitive compiles and links for sm_100 against the NCCL 2.32.3 CFT build; the CFT gates.

Linking CFT needs an nvJitLink of CUDA >= 13.3 (the CFT build is CUDA 13.3 LTO-IR):
those tests skip, saying so, where the installed one is older. The gate tests fail
at typing, before any link, and run everywhere.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from numba import cuda, float32, uint64
from numba.core.errors import TypingError

import flowdsl
from flowdsl import MemoryOrder, cft, coop, team
from flowdsl.lowering import externs
from flowdsl.lowering.target import linker_cuda_version
from flowdsl.runtime import support_build
from flowdsl.runtime.support import cft_build_for, manifest, support_build_for

pytestmark = pytest.mark.compile

NCCL = "2.32.3"
needs_cuda_13_3 = pytest.mark.skipif(
    linker_cuda_version() < (13, 3),
    reason=f"linking CFT needs nvJitLink >= 13.3 (CUDA 13.3 LTO-IR); this one is "
           f"{'.'.join(map(str, linker_cuda_version()))}")


@flowdsl.kernel
def cft_everything(comm, win, counted, out):
    """Every primitive of flowdsl.cft, with the defaults and with explicit arguments."""
    state = cuda.shared.array(4, uint64, alignment=16)
    warp_state = cuda.shared.array((4, 4), uint64, alignment=16)
    buf = cuda.shared.array(64, float32, alignment=16)
    t = cft.team(comm)
    peer = (t.rank + 1) % t.nranks
    le, off = cft.le_info(comm, counted, 256, t, peer)
    nodes = cft.team(comm, cft.CftTeamMode.HIER_LSA)
    le_n, off_n = cft.le_info(comm, counted, 256, nodes, (nodes.rank + 1) % nodes.nranks)
    out[2] = le_n + off_n + cft.team(comm, mode=cft.CftTeamMode.HIER_MULTIMEM).stride
    le_w, off_w = cft.peer_le_info(comm, win, 0, comm.rank)
    s = cft.session(comm, coop.cta(), state)
    cft.put(s, le_w, off_w, buf, 256)
    cft.put_counted(s, le, off, off - 256, buf, 128)
    cft.get(s, le_w, off_w, buf, 64)
    cft.submit(s)
    cft.flush_smem(s)
    out[0] = cft.flush(s)
    cft.wait_counted(s, counted, 0, 128)
    cft.wait_counted(s, counted, 0, 256, MemoryOrder.RELAXED, cft.MemProxyType.FABRIC)
    out[1] = cft.read_counter(counted, 0) + cft.read_counter(counted, 8, MemoryOrder.ACQUIRE)
    cft.fence(coop.cta())
    cft.fence(coop.warp(), MemoryOrder.RELEASE, cft.MemProxyType.GENERIC, cft.MemProxyType.FABRIC,
              cft.MemFenceScope.CTA)
    cft.close(s)
    w = cft.session(comm, coop.warp(), warp_state[cuda.threadIdx.x // 32])
    cft.put(w, le_w, off_w, buf, 16)
    cft.submit(w)
    cft.flush(w)
    cft.close(w)
    bar = cft.barrier(comm, coop.cta(), cuda.blockIdx.x)
    bar.arrive(MemoryOrder.RELEASE)
    bar.wait(MemoryOrder.ACQUIRE, cft.MemProxyType.FABRIC, cft.MemProxyType.GENERIC)
    bar.sync(MemoryOrder.ACQ_REL)


@flowdsl.device
def _session_of(comm, c, state, buf, le, off, counted, out):
    s = cft.session(comm, c, state)
    cft.put_counted(s, le, off, off - 64, buf, 64)
    cft.submit(s)
    out[0] += cft.flush(s)
    cft.wait_counted(s, counted, 0, 64)
    cft.close(s)
    cft.barrier(comm, c, 0).sync(MemoryOrder.ACQ_REL)


@flowdsl.kernel
def cft_other_coops(comm, win, counted, out):
    """Sessions of the thread, lanes and warp-span coops (one C function per coop kind)."""
    state = cuda.shared.array(4, uint64, alignment=16)
    buf = cuda.shared.array(16, float32, alignment=16)
    le, off = cft.le_info(comm, counted, 64, team.world(comm), 0)
    _session_of(comm, coop.thread(), state, buf, le, off, counted, out)
    _session_of(comm, coop.lanes(0xFF), state, buf, le, off, counted, out)
    _session_of(comm, coop.warp_span(0, 2, 1), state, buf, le, off, counted, out)


def _argtypes(nccl=NCCL):
    return flowdsl.FlowKernel.argtypes_for("devcomm", ("window", np.float32), ("window", np.uint64),
                                           np.zeros(4, np.uint64), nccl=nccl)


@needs_cuda_13_3
@pytest.mark.parametrize("kernel", [cft_everything, cft_other_coops], ids=["cta-warp", "thread-lanes-span"])
def test_every_cft_primitive_compiles_links_and_inlines_for_sm_100(kernel):
    compiled = kernel.compile(_argtypes(), arch="sm_100", nccl=NCCL)
    assert "cft" in compiled.features
    assert not [s for s in compiled.function_symbols() if s.startswith("flowdsl_")]


def test_kernels_without_cft_do_not_record_it():
    from flowdsl.examples.allgather_lsa import allgather_lsa

    argtypes = flowdsl.FlowKernel.argtypes_for("devcomm", np.zeros(4, np.float32), ("window", np.float32), 4,
                                               nccl=NCCL)
    assert "cft" not in allgather_lsa.compile(argtypes, arch="sm_100", nccl=NCCL).features


# ---------------------------------------------------------------- gates
def test_cft_below_sm_100_is_refused_naming_arch_needed_and_found():
    with pytest.raises(TypingError, match=r"flowdsl.cft.team requires sm_100 or newer, but this kernel is "
                                          r"compiled for sm_90"):
        cft_everything.compile(_argtypes(), arch="sm_90", nccl=NCCL, cuda="13.3")


def test_cft_on_nccl_2_28_is_refused_naming_release_needed_and_found():
    with pytest.raises(TypingError, match=r"flowdsl.cft.team requires NCCL >= 2.31.0, but this kernel is "
                                          r"compiled for NCCL 2.28.9. Install nvidia-nccl-cu13>=2.31.0"):
        cft_everything.compile(_argtypes("2.28.9"), arch="sm_100", nccl="2.28.9", cuda="13.3")


@pytest.mark.parametrize("stub", [cft.put_counted, cft.read_counter, cft.wait_counted])
def test_counted_writes_on_nccl_2_31_are_refused_naming_2_32(stub):
    """NCCL 2.31 has CFT but no counted writes (its headers lack putCounted, waitCounted and counters): the
    gate typing checks (no 2.31 headers here to build its support library, so the gate is asked directly)."""
    from flowdsl._spec import spec_of
    from flowdsl.lowering.checks import require_gate
    from flowdsl.lowering.target import Target, compiling_for

    name = f"flowdsl.cft.{stub.__name__}"
    with compiling_for(Target((2, 31, 2), "sm_100", (13, 3))):
        with pytest.raises(flowdsl.FeatureUnavailableError,
                           match=rf"{name} requires NCCL >= 2.32.0, but this kernel is compiled for NCCL "
                                 r"2.31.2. Install nvidia-nccl-cu13>=2.32.0"):
            require_gate(name, spec_of(stub).gate)
        require_gate("flowdsl.cft.put", spec_of(cft.put).gate)  # the rest of CFT is 2.31's


def test_cft_linked_by_cuda_below_13_3_is_refused_naming_cuda_needed_and_found():
    with pytest.raises(TypingError, match=r"flowdsl.cft.\w+ requires CUDA >= 13.3 \(nvJitLink\), but this "
                                          r"kernel is linked by nvJitLink 13.0 \(CUDA 13.0\)"):
        cft_everything.compile(_argtypes(), arch="sm_100", nccl=NCCL, cuda="13.0")


@flowdsl.kernel
def _team_mode_five(comm, win, counted, out):
    out[0] = cft.team(comm, 5).nranks


@flowdsl.kernel
def _team_mode_at_run_time(comm, win, counted, out):
    out[0] = cft.team(comm, out[1]).nranks


@pytest.mark.parametrize("kernel, words", [
    (_team_mode_five, r"flowdsl.cft.team requires mode FLAT, HIER_MULTIMEM, HIER_LSA, got 5. Pass one of "
                      r"flowdsl.cft.CftTeamMode.FLAT, HIER_MULTIMEM, HIER_LSA"),
    (_team_mode_at_run_time, r"flowdsl.cft.team requires mode to be a compile-time constant such as "
                             r"flowdsl.cft.CftTeamMode.FLAT, got uint64"),
], ids=["five", "at_run_time"])
def test_cft_team_mode_must_be_a_CftTeamMode_known_when_the_kernel_compiles(kernel, words):
    with pytest.raises(TypingError, match=words):
        kernel.compile(_argtypes(), arch="sm_100", nccl=NCCL, cuda="13.3")


def test_cft_typing_errors_name_the_argument():
    @flowdsl.kernel
    def wrong_storage(comm, win, counted, out):
        cft.session(comm, coop.cta(), cuda.shared.array(4, float32))

    with pytest.raises(TypingError, match=r"flowdsl.cft.session requires storage to be a shared u64 array"):
        wrong_storage.compile(_argtypes(), arch="sm_100", nccl=NCCL, cuda="13.3")

    @flowdsl.kernel
    def no_session(comm, win, counted, out):
        cft.submit(comm)

    with pytest.raises(TypingError, match=r"flowdsl.cft.submit requires a CFT session .*, got DevComm"):
        no_session.compile(_argtypes(), arch="sm_100", nccl=NCCL, cuda="13.3")


def test_a_release_without_a_cft_build_says_which_exist():
    with pytest.raises(RuntimeError, match=r"Cannot link flowdsl.cft for NCCL 2.31.0: flowdsl has CFT builds for "
                                           r"NCCL 2.32.3 only"):
        cft_build_for((2, 31, 0), "sm_100")


# ---------------------------------------------------------------- the CFT build
def test_cft_header_is_generated_from_the_extern_table():
    assert (support_build.PREBUILT_DIR / "include" / "flowdsl_cft.h").read_text() == externs.render_header("cft"), \
        "prebuilt/include/flowdsl_cft.h is stale: run prebuilt/build.sh"


def test_cft_build_matches_its_sources_toolkit_and_table():
    entry = manifest()["cft"]
    assert entry["sources"] == support_build.source_digest(sources=support_build.CFT_SOURCES), \
        "CFT sources changed since the checked-in build: run prebuilt/build.sh"
    assert "cuda_13.3" in entry["nvcc"] and entry["toolkit"] == support_build.CFT_TOOLKIT
    assert set(entry["abis"]) == set(support_build.CFT_VERSIONS)
    for version, abi in entry["abis"].items():
        assert set(abi["requirements_fields"]) == {"cftCaps", "cftBarrierCount"}
        assert set(abi["builds"]) == set(support_build.CFT_ARCHS)
        for arch, build in abi["builds"].items():
            data = (support_build.PREBUILT_DIR / build["file"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == build["sha256"]
            wanted = externs.symbols(tuple(map(int, version.split("."))), arch, library="cft")
            assert sorted(build["symbols"]) == sorted(wanted)
    # The CUDA 13.0 builds carry no CFT function, and the CFT rows are only in the CFT library.
    assert not [s for s in externs.symbols(library="support") if s.startswith("flowdsl_cft")]
    for abi in manifest()["abis"].values():
        assert not [s for b in abi["builds"].values() for s in b["symbols"] if s.startswith("flowdsl_cft")]


@needs_cuda_13_3
def test_the_cft_ltoir_resolves_every_cft_symbol():
    """Link every CFT C function (every coop kind) against the sm_100 CFT LTO-IR."""
    from numba.core import types

    from flowdsl.lowering.compiler import compile_kernel
    from flowdsl.lowering.target import Target

    from tests.compile.test_support_library import _call_externs_kernel

    nccl = (2, 32, 3)
    symbols = externs.symbols(nccl, "sm_100", library="cft")
    assert len(symbols) == 69
    compile_kernel(_call_externs_kernel(symbols), (types.int32,), Target(nccl, "sm_100", (13, 3)),
                   support_build_for(nccl, "sm_100").ltoir,
                   link_for_features=lambda features: [("flowdsl_cft", cft_build_for(nccl, "sm_100").ltoir)])


def test_kernel_requirements_ask_for_a_cft_barrier_per_block():
    from flowdsl.examples.alltoall_cft import alltoall_cft

    assert alltoall_cft.requirements((3,)) == {"cft_barrier_count": 3}
