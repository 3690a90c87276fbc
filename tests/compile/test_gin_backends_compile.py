"""GIN kernels link the GIN build of one backend when the target names it (as a launch does for its
device communicator's backend), still inline every support call, and are cached and reloaded per backend.

The specialisation is what makes a GIN kernel compile in seconds: the build of one backend is a
fraction of the one with every backend, and NCCL's dispatch over the others is not compiled.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import flowdsl
from flowdsl import GinBackend, coop, gin, team
from flowdsl.examples import moe_gin
from flowdsl.lowering import externs
from flowdsl.lowering.gin import GIN_FEATURE, STRONG_SIGNAL_FEATURE, backend_feature, linked_backend
from flowdsl.lowering.target import Target
from flowdsl.runtime import support

pytestmark = pytest.mark.compile

F, I32, I64 = ("window", np.float32), ("window", np.int32), ("window", np.int64)
MOE_ARGS = ("devcomm", F, I32, F, I32, I64, F, F, np.zeros(2, np.int64), np.zeros(2, np.int32),
            np.zeros(2, np.float32), 12, 32, 0)


@flowdsl.kernel
def one_put(comm, win, out):
    ctx = gin.context(comm, 0)
    gin.put(ctx, team.world(comm), 0, win, 0, win, 64, 64, remote=gin.signal_inc(0), coop=coop.warp())


@flowdsl.kernel
def no_gin(comm, win, out):
    out[0] = comm.rank


ARGS = ("devcomm", ("window", np.float32), np.zeros(4, np.int64))


def _not_inlined(compiled):
    return [s for s in compiled.function_symbols() if s.startswith("flowdsl_")]


def _out_of_line(compiled):
    """The bodies GIN calls share (``out_of_line__<support function>__<constants>``), once each."""
    names = [s.rsplit("$", 1)[-1] for s in compiled.function_symbols()]
    return sorted(n for n in names if n.startswith("out_of_line__"))


#: The MoE example's 5 puts, 3 put_values and 2 hybrid barrier syncs, by support function and coop kind
#: (issued by one thread): one body for each kind called from several places, with the number of places.
#: Its one put_value with a strong signal is inlined where it is called.
MOE_BODIES = {"out_of_line__flowdsl_gin_put__none__thread": 2, "out_of_line__flowdsl_gin_put__weak_signal_inc__thread": 3,
              "out_of_line__flowdsl_gin_put_value__weak_signal_inc__u64__thread": 2,
              "out_of_line__flowdsl_hybrid_barrier_sync__cta": 2}


@pytest.mark.parametrize("backend", [None, *GinBackend])
def test_moe_example_compiles_for_each_backend_of_nccl_2_32(backend):
    """The MoE example for NCCL 2.32.3: every backend's build, and the one with every backend."""
    compiled = moe_gin.moe_gin.compile(flowdsl.FlowKernel.argtypes_for(*MOE_ARGS, nccl="2.32.3"), arch="sm_90",
                                       nccl="2.32.3", gin_backend=backend)
    assert _not_inlined(compiled) == []
    assert _out_of_line(compiled) == sorted(MOE_BODIES)
    assert {GIN_FEATURE, STRONG_SIGNAL_FEATURE} <= compiled.features
    assert linked_backend(compiled.features) == backend


@pytest.mark.parametrize("backend", [None, GinBackend.PROXY, GinBackend.GDAKI])
def test_the_ring_program_across_nodes_compiles_for_each_backend_of_nccl_2_28(backend):
    """NCCL 2.28.9 has the proxy and GDAKI backends. (The GIN examples use weak signals: NCCL >= 2.32.)"""
    from flowdsl import RedOp
    from flowdsl.collectives import _library

    kernel = _library.kernel_for("ring", "all_reduce", RedOp.SUM, True)
    compiled = kernel.compile(_library._argtypes("float32", "2.28.9"), arch="sm_90", nccl="2.28.9",
                              gin_backend=backend)
    assert _not_inlined(compiled) == []
    assert _out_of_line(compiled) == []  # Flow's transport calls each GIN kind from one place: inlined there
    assert GIN_FEATURE in compiled.features and linked_backend(compiled.features) == backend


@flowdsl.kernel
def puts_of_three_types(comm, fwin, iwin, lwin):
    ctx = gin.context(comm, 0)
    world = team.world(comm)
    gin.put(ctx, world, 1, fwin, 0, fwin, 64, 64, remote=gin.signal_inc(0))
    gin.put(ctx, world, 1, iwin, 0, iwin, 64, 64, remote=gin.signal_inc(0))
    gin.put(ctx, world, 1, lwin, 0, lwin, 64, 64, remote=gin.signal_inc(0))
    gin.put(ctx, world, 1, lwin, 0, lwin, 64, 64, remote=gin.signal_inc(0), coop=coop.warp())


def test_puts_of_one_kind_share_one_body_whatever_their_windows_types():
    """Three windows of three element types make three numba instantiations of ``gin.put``: the thread's
    three puts call one body, with NCCL's put inlined into it; the warp's one put is inlined where it is."""
    argtypes = flowdsl.FlowKernel.argtypes_for("devcomm", F, I32, I64, nccl="2.28.9")
    compiled = puts_of_three_types.compile(argtypes, arch="sm_90", nccl="2.28.9", gin_backend="gdaki")
    assert _not_inlined(compiled) == []
    assert _out_of_line(compiled) == ["out_of_line__flowdsl_gin_put__signal_inc__thread"]
    assert len(compiled.function_symbols()) == 2, compiled.function_symbols()  # and the kernel itself


def test_a_backend_the_release_lacks_or_a_wrong_name_is_refused():
    argtypes = flowdsl.FlowKernel.argtypes_for(*ARGS, nccl="2.28.9")
    assert support.gin_backends((2, 28, 9)) == (GinBackend.PROXY, GinBackend.GDAKI)
    with pytest.raises(flowdsl.UsageError, match=r"Cannot compile for GIN backend efa_gda: NCCL 2\.28\.9 has "
                                                 r"device code for proxy, gdaki only"):
        one_put.compile(argtypes, arch="sm_90", nccl="2.28.9", gin_backend="efa_gda")
    with pytest.raises(flowdsl.UsageError, match=r"Cannot compile one_put for gin_backend='ib': it is not a "
                                                 r"GIN backend\. Use one of proxy, gdaki, gpi, efa_gda"):
        one_put.compile(argtypes, arch="sm_90", nccl="2.28.9", gin_backend="ib")


@pytest.mark.parametrize("version", ["2.28.9", "2.32.3"])
def test_one_backend_links_a_fraction_of_the_gin_code(version):
    """What the link reads: the support build (no GIN), and one backend's GIN build, not every backend's."""
    nccl = tuple(map(int, version.split(".")))
    every = len(support.gin_build_for(nccl, "sm_90").ltoir)
    core = len(support.support_build_for(nccl, "sm_90").ltoir)
    assert core < every / 3
    for backend in support.gin_backends(nccl):
        assert len(support.gin_build_for(nccl, "sm_90", backend).ltoir) < 0.9 * every, backend
    proxy = len(support.gin_build_for(nccl, "sm_90", GinBackend.PROXY).ltoir)
    assert proxy < 0.65 * every


def test_put_is_one_function_per_remote_action_not_per_coop():
    """put, put_value and signal take the coop as an argument: 22 put functions on NCCL 2.32, not 110."""
    gin_symbols = externs.symbols((2, 32, 3), library="gin")
    puts = [s for s in gin_symbols if s.startswith("flowdsl_gin_put__")]
    assert len(puts) == 2 * len(externs.REMOTE_VARIANTS) == 22
    assert len(gin_symbols) <= 125  # the barrier syncs are one per coop (rail, world, hybrid and its two parts: 25)
    assert not [s for s in externs.symbols((2, 32, 3)) if s.startswith(("flowdsl_gin_", "flowdsl_hybrid_"))]


def test_a_kernel_without_gin_links_no_gin_build_and_ignores_the_backend():
    compiled = no_gin.compile(flowdsl.FlowKernel.argtypes_for(*ARGS, nccl="2.32.3"), arch="sm_90", nccl="2.32.3",
                              gin_backend="gdaki")
    assert GIN_FEATURE not in compiled.features and linked_backend(compiled.features) is None


def test_the_disk_cache_keeps_one_entry_per_backend_for_gin_kernels_only(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWDSL_CACHE_DIR", str(tmp_path))
    argtypes = flowdsl.FlowKernel.argtypes_for(*ARGS, nccl="2.28.9")
    generic, proxy, gdaki = (Target((2, 28, 9), "sm_90", gin_backend=b) for b in
                             (None, GinBackend.PROXY, GinBackend.GDAKI))
    assert [one_put.build(argtypes, t) for t in (proxy, proxy, generic, generic)] == \
        ["compiled", "cached", "compiled", "cached"]
    assert len(list(tmp_path.glob("kernels/*.json"))) == 2
    # A backend without an entry of its own uses the kernel linked with every backend (it runs with any).
    assert one_put.build(argtypes, gdaki) == "cached"
    # Without GIN, the backend does not matter: one entry.
    assert [no_gin.build(argtypes, t) for t in (proxy, gdaki, generic)] == ["compiled", "cached", "cached"]
    assert len(list(tmp_path.glob("kernels/*.json"))) == 3


def test_a_launch_on_another_backend_loads_the_kernel_linked_for_it(monkeypatch):
    """The launch check: a kernel loaded for one backend is never launched with another's communicator."""
    from flowdsl import _launch, _targets

    loads = []

    def load_or_compile(argtypes, target):
        loads.append(target.gin_backend)
        marks = {backend_feature(target.gin_backend)} if target.gin_backend is not None else set()
        return SimpleNamespace(flowdsl_features=frozenset({GIN_FEATURE, *marks}))

    kernel = flowdsl.kernel(one_put.py_func)
    monkeypatch.setattr(kernel, "_load_or_compile", load_or_compile)
    monkeypatch.setattr(_targets, "device_target", lambda: Target((2, 32, 3), "sm_90"))
    monkeypatch.setattr(_launch, "_packer", lambda t: None)  # no launch here: the slow path's loaded object
    loaded = SimpleNamespace(argtypes=("a",), features=frozenset({GIN_FEATURE, backend_feature(GinBackend.PROXY)}))
    proxy, gdaki = SimpleNamespace(gin_backend=GinBackend.PROXY), SimpleNamespace(gin_backend=GinBackend.GDAKI)
    assert kernel._for_gin_backend(loaded, (proxy, 1), None) is loaded
    other = kernel._for_gin_backend(loaded, (gdaki, 1), None)
    assert loads == [GinBackend.GDAKI] and linked_backend(other.features) == GinBackend.GDAKI
    assert kernel._for_gin_backend(loaded, (gdaki, 1), None) is other and loads == [GinBackend.GDAKI]
    unknown = kernel._for_gin_backend(loaded, (SimpleNamespace(gin_backend=None),), None)
    assert loads == [GinBackend.GDAKI, None] and unknown is not loaded
    generic = SimpleNamespace(argtypes=("a",), features=frozenset({GIN_FEATURE}))
    assert kernel._for_gin_backend(generic, (gdaki,), None) is generic


@pytest.mark.parametrize("backend", [GinBackend.PROXY, GinBackend.GDAKI])
def test_the_shared_bodies_are_called_without_local_memory(linked_ptx, backend):
    """The bodies take the device communicator's words as parameters: no copy of it is stored to local
    memory at a call or loaded in a body (the code before held none either), and each body is called from
    each of the MoE example's sites of its kind."""
    import re

    ptx = linked_ptx(moe_gin.moe_gin, flowdsl.FlowKernel.argtypes_for(*MOE_ARGS, nccl="2.32.3"), nccl="2.32.3",
                     gin_backend=backend)
    assert not re.search(r"\b(ld|st)\.local\b", ptx)
    calls = re.findall(r"call\.uni\s+(?:\([^)]*\),\s*)?(out_of_line__\w+)", ptx)
    assert {body: calls.count(body) for body in set(calls)} == MOE_BODIES
