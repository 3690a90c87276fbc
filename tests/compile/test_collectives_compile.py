"""The collectives and Flow compile and link without a GPU, for one LSA team and across nodes (GIN).

Kernels for one LSA team carry no GIN code; kernels for several nodes use strong
signals (legacy signals on NCCL 2.28, which its backends apply in order), and are
refused at launch on a backend with weak signals only. The cost model is pure
arithmetic and is checked here too.
"""

from __future__ import annotations

import numpy as np
import pytest

import flowdsl
from flowdsl import Protocol, RedOp
from flowdsl.collectives import _library, cost
from flowdsl.collectives._config import FlowConfig
from flowdsl.lowering.gin import STRONG_SIGNAL_FEATURE
from flowdsl.lowering.target import linker_cuda_version

pytestmark = pytest.mark.compile


def test_precompile_builds_every_program_then_finds_them_cached(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLOWDSL_CACHE_DIR", str(tmp_path))
    first = _library.precompile(arch="sm_90", nccl="2.28.9", dtypes=["float32"], ops=[RedOp.SUM], jobs=2)
    # within one node: every program but the 3 hierarchical ones and the CFT all_gather (across nodes only)
    # and multimem's (a switch)
    programs = len(_library.PROGRAMS) - 5
    assert first["kernels"] == programs and first["compiled"] == programs, first
    bar = capsys.readouterr().err.split("\r")  # two worker processes, each kernel reported as it is done
    assert [line.split()[2] for line in bar[1:]] == [f"{i}/{programs}" for i in range(1, programs + 1)], bar
    again = _library.precompile(arch="sm_90", nccl="2.28.9", dtypes=["float32"], ops=[RedOp.SUM], jobs=2,
                                progress=False)
    assert again["cached"] == programs and again["compiled"] == 0, again
    assert len(list((tmp_path / "kernels").glob("*.cubin"))) == programs


def test_precompile_builds_what_the_communicator_kind_can_call():
    entries = _library.library()
    algorithms = {flags: {e[0] for e in _library.precompiled(entries, *flags)}
                  for flags in ((False, False), (True, False), (False, True), (True, True))}
    assert algorithms[(False, False)] == {"ring", "tree", "one_shot", "pairwise"}
    assert algorithms[(True, False)] == {"ring", "tree", "one_shot", "pairwise", "hierarchical"}
    assert algorithms[(False, True)] == {"ring", "tree", "one_shot", "pairwise", "multimem"}
    assert _library.precompiled(entries, True, True, True) == entries
    # The far phase over CFT: for communicators across nodes (gin_peers) with CFT (sm_100, NCCL >= 2.32) only.
    assert {e[0] for e in _library.precompiled(entries, True, False, True)} == algorithms[(True, False)] | {
        "hierarchical_cft"}
    assert "hierarchical_cft" not in {e[0] for e in _library.precompiled(entries, False, True, True)}
    assert len(_library.precompiled(entries, False, False)) == 390  # of 520


def test_precompile_gives_each_worker_a_run_of_kernels_that_share_compiled_steps():
    """numba compiles Flow's steps once per process and element type: a worker gets a contiguous run of
    the library in element-type order (not every 16th kernel), and the runs are of equal length."""
    entries = _library.library()
    runs = _library._runs(entries, 16)
    assert sorted(e for run in runs for e in run) == sorted(entries)
    assert max(map(len, runs)) - min(map(len, runs)) <= 1
    for run in runs:
        assert len({_library.storage(dtype) for _, _, _, dtype in run}) <= 2, run
        assert [_library._affinity(e) for e in run] == sorted(_library._affinity(e) for e in run)
    assert _library._runs(entries[:3], 16) == [[e] for e in sorted(entries[:3], key=_library._affinity)]


def test_library_lists_every_collective_dtype_and_op():
    entries = _library.library()
    # all_gather, broadcast and all_to_all have no operator, and copy fp8 as uint8 and bfloat16 as uint16
    # 6 copying programs (the CFT all_gather among them) x 10 storage types, 6 reducing programs x NCCL's 12
    # dtypes x 6 ops (premulsum too), and the multimem all-reduce for the forms PTX has: sum and avg of 8 types,
    # min and max of 6
    assert len(entries) == 6 * 10 + 6 * 12 * 6 + 2 * 8 + 2 * 6
    assert ("hierarchical_cft", "all_gather", RedOp.SUM, "uint16") in entries
    assert ("hierarchical", "reduce_scatter", RedOp.PREMULSUM, "float8_e4m3fn") in entries
    assert ("hierarchical", "all_to_all", RedOp.SUM, "uint16") in entries
    assert ("multimem", "all_reduce", RedOp.AVG, "bfloat16") in entries
    assert ("multimem", "all_reduce", RedOp.MAX, "uint64") in entries
    assert not any(e[0] == "multimem" and (e[2] in (RedOp.PROD, RedOp.PREMULSUM) or e[3] in ("int8", "uint8"))
                   for e in entries)
    assert ("multimem", "all_reduce", RedOp.MAX, "float32") not in entries
    assert ("pairwise", "all_to_all", RedOp.SUM, "uint8") in entries
    assert ("one_shot", "all_reduce", RedOp.PREMULSUM, "float8_e5m2") in entries
    assert ("tree", "all_reduce", RedOp.AVG, "bfloat16") in entries
    assert ("ring", "reduce", RedOp.MAX, "float8_e5m2") in entries
    assert ("ring", "all_gather", RedOp.SUM, "uint16") in entries


def test_premulsum_multiplies_with_rounding_and_other_operators_carry_no_multiply(linked_ptx):
    """PREMULSUM's product is ``mul.rn`` (rounded before the sum: NVVM would fuse a plain multiply and the
    add after it into one fma, rounding once, unlike the simulator); every other operator's kernel holds
    no multiply of elements at all (its loops are the same as before PREMULSUM existed)."""
    argtypes = _library._argtypes("float32", "2.28.9")
    premul = linked_ptx(_library.kernel_for("ring", "all_reduce", RedOp.PREMULSUM), argtypes)
    assert "mul.rn.f32" in premul and "fma.rn.f32" not in premul
    plain = linked_ptx(_library.kernel_for("ring", "all_reduce", RedOp.SUM), argtypes)
    assert "mul.rn.f32" not in plain and "mul.f32" not in plain and "fma.rn.f32" not in plain


@pytest.mark.parametrize("algorithm,collective,dtype", [
    ("tree", "all_reduce", "bfloat16"), ("one_shot", "all_reduce", "float8_e4m3fn"),
    ("ring", "reduce_scatter", "int8"), ("ring", "reduce", "uint64"), ("ring", "all_reduce", "float16")])
def test_premulsum_compiles_for_every_reducing_program(algorithm, collective, dtype):
    kernel = _library.kernel_for(algorithm, collective, RedOp.PREMULSUM, False, _library.storage(dtype)[1])
    kernel.compile(_library._argtypes(dtype, "2.28.9", algorithm), arch="sm_90", nccl="2.28.9")


def test_ll128_is_compiled_only_into_kernels_for_calls_that_ask_for_it():
    """The library's kernels carry SIMPLE and LL (what the cost model picks); a call whose FlowConfig
    names LL128 gets a kernel with LL128's code too. The constant ``ll128=0`` reaches the steps
    through the link, which drops LL128's code from them."""
    argtypes = _library._argtypes("float32", "2.28.9")
    without = _library.kernel_for("ring", "reduce_scatter", RedOp.SUM).compile(argtypes, arch="sm_90",
                                                                               nccl="2.28.9")
    with_ll128 = _library.kernel_for("ring", "reduce_scatter", RedOp.SUM, ll128=True).compile(
        argtypes, arch="sm_90", nccl="2.28.9")
    assert len(without.cubin) < 0.85 * len(with_ll128.cubin), (len(without.cubin), len(with_ll128.cubin))
    assert _library.kernel_for("one_shot", "all_reduce", RedOp.SUM, ll128=True) is \
        _library.kernel_for("one_shot", "all_reduce", RedOp.SUM), "one-shot has no Flow protocol"


@pytest.mark.parametrize("nccl,arch", [("2.28.9", "sm_90"), ("2.32.3", "sm_100"), ("2.32.6", "sm_90")])
@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_all_reduce_across_nodes_uses_strong_signals(nccl, arch, algorithm):
    kernel = _library.kernel_for(algorithm, "all_reduce", RedOp.AVG, gin_peers=True)
    compiled = kernel.compile(_library._argtypes("bfloat16", nccl), arch=arch, nccl=nccl)
    assert STRONG_SIGNAL_FEATURE in compiled.features
    lsa_only = _library.kernel_for(algorithm, "all_reduce", RedOp.AVG, gin_peers=False)
    assert STRONG_SIGNAL_FEATURE not in lsa_only.compile(_library._argtypes("bfloat16", nccl), arch=arch,
                                                         nccl=nccl).features


@pytest.mark.parametrize("gin_peers", [False, True])
def test_direct_steps_compile(gin_peers):
    from flowdsl._kernel import FlowKernel
    from flowdsl.examples.allgather_direct import allgather_direct

    argtypes = FlowKernel.argtypes_for("devcomm", ("staging", np.uint64), np.zeros(1, np.float32),
                                       ("window", np.float32), *([0] * 5), nccl="2.28.9")
    compiled = allgather_direct(gin_peers).compile(argtypes, arch="sm_90", nccl="2.28.9")
    assert (STRONG_SIGNAL_FEATURE in compiled.features) == gin_peers


def test_flow_loopback_compiles_for_every_narrow_type():
    from flowdsl._kernel import FlowKernel
    from flowdsl.examples.flow_loopback import loopback

    for dtype in (np.uint8, np.float16, np.uint16):
        argtypes = FlowKernel.argtypes_for("devcomm", ("staging", np.uint64), np.zeros(1, dtype), np.zeros(1, dtype),
                                           *([0] * 6), nccl="2.28.9")
        loopback.compile(argtypes, arch="sm_90", nccl="2.28.9")


def test_cost_model_choices():
    # One rank: flowdsl's launch beats NCCL's 22 us floor; NCCL's copy engine wins past ~800 MB.
    assert cost.choose("all_reduce", 1, 1, 8, nccl_available=True) == "ring"
    assert cost.choose("all_reduce", 1, 1, 1 << 30, nccl_available=True) == "nccl"
    assert cost.choose("all_reduce", 1, 1, 1 << 30, nccl_available=False) == "ring"
    # Latency-bound across nodes: the tree's log steps beat the ring's 2(n-1).
    assert cost.choose("all_reduce", 64, 8, 4096, nccl_available=False) == "tree"
    # Bandwidth-bound on one node: the ring.
    assert cost.choose("all_reduce", 8, 8, 1 << 30, nccl_available=False) == "ring"
    # One LSA team, small messages (2 H200s): the one-shot all-reduce where it fits, else the ring.
    assert cost.choose("all_reduce", 2, 2, 64 << 10, one_shot_available=True) == "one_shot"
    assert cost.choose("all_reduce", 2, 2, 64 << 10, one_shot_available=False) == "ring"
    assert cost.choose("all_gather", 2, 2, 8, nccl_available=True) == "ring"
    # LL for small messages, SIMPLE above; LL128 was never the fastest on NVLink, so never chosen.
    assert cost.protocol_for(8, 8) == Protocol.LL
    assert cost.protocol_for(256 * 1024, 8) == Protocol.SIMPLE
    assert cost.protocol_for(64 << 20, 8) == Protocol.SIMPLE
    cfg = FlowConfig()
    assert cost.channels_for(8, 8, cfg) == 1
    assert cost.channels_for(64 << 10, 8, cfg) == 4  # one channel per 16 KiB of SIMPLE
    assert cost.channels_for(1 << 30, 8, cfg) == cfg.channels
    assert cost.one_shot_blocks(1, 2) == 1 and cost.one_shot_blocks(1 << 30, 2) == 128
    big = [cost.estimate("all_reduce", "ring", 8, 8, 1 << k) for k in range(10, 31, 4)]
    assert big == sorted(big)


def test_config_is_checked():
    from flowdsl import UsageError

    with pytest.raises(UsageError, match="give a multiple of 128 bytes"):
        FlowConfig(slot_bytes=100)
    with pytest.raises(UsageError, match="threads a multiple of 32"):
        FlowConfig(threads=100)


class _DeviceArray:
    """A stand-in for a CuPy array on another GPU (only what the checks read)."""

    def __init__(self, device):
        self.device = type("Device", (), {"id": device})()
        self.__cuda_array_interface__ = {"shape": (16,), "typestr": "<f4", "data": (0x7F0000000000, False),
                                         "strides": None, "version": 3}


def test_arrays_on_another_gpu_are_refused_before_launch():
    from flowdsl import UsageError
    from flowdsl import collectives as coll

    comm, _ = _fake_comm()  # on GPU 0
    with pytest.raises(UsageError, match="src is on device 1 but the communicator uses device 0. Move it there"):
        coll.all_reduce(comm, _DeviceArray(1))
    with pytest.raises(UsageError, match="dst is on device 2 but the communicator uses device 0"):
        coll.broadcast(comm, _DeviceArray(0), _DeviceArray(2))


class _FakeArray:
    """A stand-in for a CuPy array on GPU 0 (only what the checks and NCCL's path read)."""

    def __init__(self, n, typestr, address):
        self.device = type("Device", (), {"id": 0})()
        self.dtype = np.dtype(typestr)
        self.shape = (n,)
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr, "data": (address, False),
                                         "strides": None, "version": 3}


class _FakeNccl:
    """Records what the collectives ask of nccl4py's Communicator."""

    def __init__(self):
        self.created, self.calls = [], []

    def create_pre_mul_sum(self, scalar, datatype):
        self.created.append((scalar, datatype))
        return f"premulsum-op-{len(self.created)}"

    def allreduce(self, src, dst, op, stream=None):
        self.calls.append(("allreduce", op))

    def allgather(self, src, dst, stream=None):
        self.calls.append(("allgather", None))

    def reduce_scatter(self, src, dst, op, stream=None):
        self.calls.append(("reduce_scatter", op))

    def broadcast(self, src, dst, root, stream=None):
        self.calls.append(("broadcast", root))

    def reduce(self, src, dst, op, root, stream=None):
        self.calls.append(("reduce", op))


def _fake_comm(**attributes):
    """A GPU communicator on GPU 0 with what the host contract gives the collectives' checks and NCCL's path."""
    nccl = _FakeNccl()
    comm = type("Comm", (), {"nranks": 1, "device": 0, "alloc": None, "closed": False, "nccl": nccl,
                             "memory_device": "cuda", "check_collectives": False, "cuda_graphs": True,
                             "device_error": lambda self: None})()
    comm.__dict__.update(attributes)
    return comm, nccl


def test_premulsum_through_nccl_makes_one_pre_mul_sum_operator_per_scalar():
    """``algorithm="nccl"``: nccl4py's create_pre_mul_sum (ncclRedOpCreatePreMulSum) with the host value in
    the data's type, or with the device array itself (NCCL reads it when the collective runs), made once per
    scalar and reused."""
    from nccl.core import NcclDataType

    from flowdsl import collectives as coll

    comm, nccl = _fake_comm()
    x = _FakeArray(16, "<f4", 0x7F0000000000)
    for _ in range(2):
        coll.all_reduce(comm, x, op=coll.premul_sum(0.25), algorithm="nccl")
    coll.all_reduce(comm, x, op=coll.premul_sum(0.5), algorithm="nccl")
    (value, datatype), (other, _) = nccl.created
    assert datatype == NcclDataType.FLOAT32 and value.dtype == np.float32 and value.tolist() == [0.25]
    assert other.tolist() == [0.5]
    assert nccl.calls == [("allreduce", "premulsum-op-1")] * 2 + [("allreduce", "premulsum-op-2")]
    scalar = _FakeArray(1, "<f4", 0x7F0000100000)
    coll.all_reduce(comm, x, op=coll.premul_sum(scalar), algorithm="nccl")
    assert nccl.created[-1] == (scalar, NcclDataType.FLOAT32) and nccl.calls[-1] == ("allreduce", "premulsum-op-3")


@pytest.mark.parametrize("collective,op", [(c, None) for c in ("all_gather", "broadcast")] +
                         [(c, op) for c in ("all_reduce", "reduce_scatter", "reduce") for op in ("sum", "premulsum")])
def test_a_cached_nccl_plan_keeps_no_array_alive(collective, op):
    """A plan of ``algorithm="nccl"`` holds the call's arrays weakly, as the kernels' plans do: a training
    loop over fresh arrays frees them (a closure over the checked source kept 60 arrays of 64 KiB alive
    on an H100: 3.9 MB more after 100 calls)."""
    import gc
    import weakref

    from flowdsl import collectives as coll

    comm, nccl = _fake_comm()
    kwargs = {} if op is None else {"op": coll.premul_sum(0.5) if op == "premulsum" else op}
    refs = []
    for i in range(3):  # the first call plans, the others take the plan
        x = _FakeArray(16, "<f4", 0x7F0000000000 + (i << 20))
        y = _FakeArray(16, "<f4", 0x7F0000080000 + (i << 20))
        getattr(coll, collective)(comm, x, y, algorithm="nccl", **kwargs)
        refs += [weakref.ref(x), weakref.ref(y)]
        del x, y
        gc.collect()
    assert [r() for r in refs] == [None] * 6
    assert len(nccl.calls) == 3 and comm._flowdsl_plans  # planned, and the plans still cached


class _TorchFloat8:
    """What a PyTorch float8 CUDA tensor shows the host code: ``__cuda_array_interface__`` raises
    ``KeyError`` (the interface has no typestr for fp8, bfloat16, uint16-64), not AttributeError."""

    __module__ = "torch"
    dtype = "torch.float8_e4m3fn"
    is_cuda = True

    def data_ptr(self):
        return 0x7F0000200000

    def numel(self):
        return 1

    @property
    def __cuda_array_interface__(self):
        raise KeyError(self.dtype)


def test_a_torch_tensor_without_an_array_interface_is_a_device_scalar():
    """premul_sum of a one-element torch float8 tensor (the GPU test's case raised KeyError there):
    flowdsl reads tensors through data_ptr, and asks the interface only through one helper."""
    from flowdsl import collectives as coll
    from flowdsl.host.arrays import cuda_array_interface

    scalar = _TorchFloat8()
    assert cuda_array_interface(scalar) is None
    op = coll.premul_sum(scalar)
    assert op.residence == "device" and op.key[2] == 0x7F0000200000


def test_premulsum_through_nccl_refuses_what_nccl_would_misread():
    from flowdsl import UsageError
    from flowdsl import collectives as coll

    comm, nccl = _fake_comm()
    bits = _FakeArray(16, "<u2", 0x7F0000000000)  # bfloat16 bits in a uint16 array
    with pytest.raises(UsageError, match="bfloat16 held in uint16 arrays with algorithm='nccl': NCCL would take "
                                         "them for integers"):
        coll.all_reduce(comm, bits, op=coll.premul_sum(0.5), algorithm="nccl")
    x = _FakeArray(16, "<f4", 0x7F0000000000)
    with pytest.raises(UsageError, match=r"premul_sum\(<one-element float64 device array>\): its scalar is "
                                         "float64, and NCCL takes the scalar in the data's type"):
        coll.all_reduce(comm, x, op=coll.premul_sum(_FakeArray(1, "<f8", 0x7F0000100000)), algorithm="nccl")
    assert nccl.created == [] and nccl.calls == []


@pytest.mark.parametrize("collective", ["all_reduce", "reduce", "reduce_scatter"])
def test_fp8_reductions_are_refused_below_sm90_as_nccl_refuses_them(collective):
    """NCCL: "FP8 reduction support begins with sm90 capable devices" (reductions only, not copies, and
    not empty calls). The GPU's arch is cached on the communicator; here it is set to an sm_80's."""
    from flowdsl import UsageError
    from flowdsl import collectives as coll
    from flowdsl.collectives import _host

    comm, nccl = _fake_comm(_flowdsl_arch="sm_80")
    codes = _FakeArray(16, "|u1", 0x7F0000000000)
    out = _FakeArray(16, "|u1", 0x7F0000100000)
    with pytest.raises(UsageError, match=f"Cannot {collective} float8_e4m3fn on this sm_80 GPU: NCCL reduces fp8 "
                                         "only on sm_90 and newer"):
        getattr(coll, collective)(comm, codes, out, op="sum", dtype="float8_e4m3fn", algorithm="nccl")
    assert nccl.calls == []
    # a copy, and an empty reduction, are NCCL's to take on any GPU
    _host._check("all_gather", comm, codes, _FakeArray(16, "|u1", 0x7F0000200000), dtype="float8_e4m3fn")
    _host._check("all_reduce", comm, _FakeArray(0, "|u1", 0x7F0000300000), None, op="sum", dtype="float8_e4m3fn")
    comm.__dict__["_flowdsl_arch"] = "sm_90"
    _host._check("all_reduce", comm, codes, None, op="sum", dtype="float8_e4m3fn")


def _host_version(fn):
    """A device helper runnable on the host: ``mem.to_bits`` on float32 via NumPy."""
    import types

    import flowdsl.lowering.flow as fs

    class Mem:
        @staticmethod
        def to_bits(x):
            return int(np.array(np.float32(x)).view(np.uint32)[()])

    g = dict(fs.__dict__, mem=Mem, uint64=int, uint8=int, int32=int, float32=lambda x: float(np.float32(x)))
    return types.FunctionType(fn.__code__, g, fn.__name__)


@pytest.mark.parametrize("fmt", [1, 2], ids=["e4m3fn", "e5m2"])
def test_fp8_bit_conversions_match_the_table(fmt):
    """The GPU's fp8 conversions (bit arithmetic) against flowdsl/_fp8.py's table, every code
    and every tie, run on the host with the same code."""
    from flowdsl import _fp8
    from flowdsl.lowering import flow as flow_surface

    decode, encode = _host_version(flow_surface._fp8_to_float), _host_version(flow_surface._float_to_fp8)
    table = _fp8.values(fmt)
    for code in range(256):
        got = decode(code, fmt)
        assert (np.isnan(got) and np.isnan(table[code])) or got == table[code], (code, got, table[code])
    finite = np.sort(table[np.isfinite(table)])
    mids = (finite[1:] + finite[:-1]) / 2  # exact ties: rounding goes to the even code
    probes = np.concatenate([finite, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf),
                             np.random.default_rng(0).standard_normal(2000) * finite.max() / 8,
                             [finite.max() * 1.01, 1e30, -1e30, 0.0, -0.0, 1e-30]]).astype(np.float32)
    expected = _fp8.to_fp8(probes.astype(np.float64), fmt)
    got = np.array([encode(float(x), fmt) for x in probes], np.uint8)
    bad = np.flatnonzero(got != expected)
    assert bad.size == 0, [(float(probes[i]), int(got[i]), int(expected[i])) for i in bad[:5]]


@pytest.mark.parametrize("nccl,arch", [("2.28.9", "sm_90"), ("2.32.3", "sm_100"), ("2.32.6", "sm_90")])
def test_all_to_all_compiles_inside_a_node_and_across_nodes(nccl, arch):
    """The pairwise all-to-all links for every Flow target, its GIN variant with strong signals (peers on other
    nodes), the LSA one without GIN code."""
    argtypes = _library._argtypes("bfloat16", nccl, "pairwise")
    across = _library.kernel_for("pairwise", "all_to_all", RedOp.SUM, gin_peers=True).compile(
        argtypes, arch=arch, nccl=nccl)
    assert STRONG_SIGNAL_FEATURE in across.features
    inside = _library.kernel_for("pairwise", "all_to_all", RedOp.SUM).compile(argtypes, arch=arch, nccl=nccl)
    assert STRONG_SIGNAL_FEATURE not in inside.features and not [
        s for s in inside.function_symbols() if s.startswith("flowdsl_gin")]


@pytest.mark.parametrize("nccl,arch", [("2.28.9", "sm_90"), ("2.32.3", "sm_100")])
@pytest.mark.parametrize("collective,dtype,op", [("all_gather", "uint16", RedOp.SUM),
                                                 ("reduce_scatter", "bfloat16", RedOp.PREMULSUM),
                                                 ("all_to_all", "uint8", RedOp.SUM)])
def test_hierarchical_programs_link_with_gin_across_nodes(nccl, arch, collective, dtype, op):
    """The hierarchical programs are only ever the GIN build (the host refuses them within one node): linked
    for sm_90 on NCCL 2.28.9 (legacy signals) and sm_100 on 2.32.3 (strong signals)."""
    kernel = _library.kernel_for("hierarchical", collective, op, gin_peers=False)
    assert kernel is _library.kernel_for("hierarchical", collective, op, gin_peers=True)
    compiled = kernel.compile(_library._argtypes(dtype, nccl, "hierarchical"), arch=arch, nccl=nccl)
    assert STRONG_SIGNAL_FEATURE in compiled.features  # its connections to other nodes are GIN's


needs_cuda_13_3 = pytest.mark.skipif(
    linker_cuda_version() < (13, 3),
    reason=f"linking CFT needs nvJitLink >= 13.3 (CUDA 13.3 LTO-IR); this one is "
           f"{'.'.join(map(str, linker_cuda_version()))}")


@needs_cuda_13_3
@pytest.mark.parametrize("dtype", ["float32", "int8", "float64"])
def test_hierarchical_cft_all_gather_compiles_and_links_for_sm_100_on_nccl_2_32_3(dtype):
    """The far phase over CFT: the CFT build (CUDA 13.3 LTO-IR) linked in, and the CFT primitives (the HIER_LSA
    team, counted puts and waits, the CFT barrier) inlined (no flowdsl_ call left)."""
    from flowdsl.collectives.programs import hierarchical_cft_all_gather

    argtypes = _library._argtypes(dtype, "2.32.3", "hierarchical_cft")  # the window the host makes: u64 words
    compiled = _library.kernel_for("hierarchical_cft", "all_gather", RedOp.SUM, dtype=dtype).compile(
        argtypes, arch="sm_100", nccl="2.32.3")
    assert _library.kernel_for("hierarchical_cft", "all_gather", RedOp.SUM, dtype=dtype) is \
        hierarchical_cft_all_gather(np.dtype(dtype))
    assert "cft" in compiled.features
    assert not [s for s in compiled.function_symbols() if s.startswith("flowdsl_")]


def test_hierarchical_cft_all_gather_is_refused_below_sm_100():
    from numba.core.errors import TypingError

    from flowdsl.collectives.programs import hierarchical_cft_all_gather

    argtypes = _library._argtypes("float32", "2.32.3", "hierarchical_cft")
    with pytest.raises(TypingError, match=r"flowdsl.cft.\w+ requires sm_100 or newer, but this kernel is compiled "
                                          r"for sm_90"):
        hierarchical_cft_all_gather(np.dtype("float32")).compile(argtypes, arch="sm_90", nccl="2.32.3", cuda="13.3")
