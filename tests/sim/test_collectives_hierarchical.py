"""The hierarchical all_gather, reduce_scatter and all_to_all on the simulator, across several nodes.

The matrix is :mod:`flowdsl.collectives.check`'s (random inputs, outputs poisoned, a NumPy reference), run on
2 nodes x 2 ranks (every dtype and op), 2 x 3 and 3 x 2 (a type of each family), with GIN between nodes under
reordered delivery and tiny staging so that every call crosses many slots and chunks. The reduce_scatter's
bits are held to :mod:`flowdsl.collectives.exact`'s model of its order; the refusals name their fix.
"""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

import flowdsl
from flowdsl import Protocol
from flowdsl import collectives as coll
from flowdsl.collectives import check, exact
from flowdsl.collectives._host import hierarchical_refusal, launch_shape
from flowdsl.sim import spawn

pytestmark = pytest.mark.sim

PROTOCOLS = (Protocol.SIMPLE, Protocol.LL, Protocol.LL128)
TINY = coll.FlowConfig(channels=2, nslots=2, slot_bytes=128, threads=64)
#: One element type of each family: signed and unsigned integers of 1, 4 and 8 bytes, the floats, bfloat16, fp8.
FAMILIES = ("int8", "uint32", "int64", "float16", "float32", "float64", "bfloat16", "float8_e5m2")


def _run(nranks, nodes, seed, algorithm="hierarchical", protocols=PROTOCOLS, **matrix):
    """The check matrix of ``algorithm`` on ``nodes`` simulated nodes, reordered GIN delivery: no mismatch."""
    def main(comm):
        cft = comm.cft_missing is None  # the simulator models CFT (its CFT domain is the world)
        cases = check.cases(comm.nranks, protocols=protocols, config=TINY, start=seed, lsa_size=comm.lsa_size,
                            algorithms=(algorithm,), cft=cft, **matrix)
        assert cases and {c.algorithm for c in cases} == {algorithm}, f"no {algorithm} case listed"
        assert {c.inplace for c in cases} == {False, True}
        return check.run_matrix(comm, cases)

    failures = [f for rank in spawn(main, nranks=nranks, nodes=nodes, seed=seed, gin_delivery="reordered")
                for f in rank]
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:20])


def test_two_nodes_of_two_every_dtype_op_placement():
    _run(4, 2, 1, counts=(0, 1, 37, 131))


@pytest.mark.parametrize("nranks,nodes", [(6, 2), (6, 3)], ids=["2x3", "3x2"])
def test_other_node_shapes_every_family(nranks, nodes):
    _run(nranks, nodes, nranks + nodes, counts=(1, 37, 131), dtypes=FAMILIES, ops=("sum", "min", "avg", "premulsum"))


def test_reduce_scatter_bits_follow_the_modelled_order():
    """float32 and bfloat16 sums and averages (which round differently in another order) equal, bit for bit,
    exact's chain inside each node then along the rail (3 nodes x 2 ranks)."""
    nranks, nodes, count = 6, 3, 67
    rng = np.random.default_rng(3)
    data = {"float32": [(rng.standard_normal(nranks * count) * 10.0 ** rng.integers(-3, 4)).astype(np.float32)
                        for _ in range(nranks)],
            "bfloat16": [check.bf16_bits(rng.standard_normal(nranks * count) * 100) for _ in range(nranks)]}
    calls = [(dtype, op) for dtype in data for op in ("sum", "avg")]

    def main(comm):
        out = []
        for i, (dtype, op) in enumerate(calls):
            ins = data[dtype]
            src = comm.alloc(nranks * count, ins[0].dtype)
            src[:] = ins[comm.rank]
            dst = comm.alloc(count, ins[0].dtype)
            dst[:] = check.poison(dtype)
            coll.reduce_scatter(comm, src, dst, op=op, algorithm="hierarchical",
                                config=dataclasses.replace(TINY, protocol=PROTOCOLS[i % 3]))
            comm.synchronize()
            out.append(np.array(dst))
        return out

    results = spawn(main, nranks=nranks, nodes=nodes, seed=2, gin_delivery="reordered")
    for i, (dtype, op) in enumerate(calls):
        want = exact.reference("reduce_scatter", "hierarchical", data[dtype], dtype, op, lsa_size=nranks // nodes)
        for rank in range(nranks):
            got = results[rank][i]
            bad = exact.mismatches(got, want[rank], dtype)
            assert bad.size == 0, f"{dtype} {op} rank {rank}: {bad.size} elements differ, first at {bad[0]}"


def test_refused_where_it_cannot_apply():
    def main(comm):
        n = comm.nranks
        x, y = comm.alloc(8, np.float32), comm.alloc(n * 8, np.float32)
        z = comm.alloc(n * 8, np.float32)
        out = []
        for call in (lambda: coll.all_gather(comm, x, y, algorithm="hierarchical"),
                     lambda: coll.reduce_scatter(comm, y, x, algorithm="hierarchical"),
                     lambda: coll.all_to_all(comm, y, z, algorithm="hierarchical"),
                     lambda: coll.all_reduce(comm, x, algorithm="hierarchical"),
                     lambda: coll.all_to_all(comm, y, z, algorithm="hierarchical",
                                             config=coll.FlowConfig(channels=2, nslots=2, slot_bytes=128,
                                                                    threads=32))):
            try:
                call()
                out.append("no error")
            except flowdsl.UsageError as exc:
                out.append(str(exc))
        return out

    one_node = spawn(main, nranks=4)[0]
    assert one_node[0] == ("Cannot all_gather with algorithm='hierarchical': this communicator is one LSA team "
                           "(4 ranks on one node), so nothing crosses the network and there is no rail to gather "
                           "along. Use 'ring' or 'auto'")
    assert one_node[1].startswith("Cannot reduce_scatter with algorithm='hierarchical': this communicator is one")
    assert one_node[2].endswith("Use 'ring' or 'auto' ('pairwise' for all_to_all)")
    assert one_node[3].startswith("Cannot all_reduce with algorithm='hierarchical': only all_gather, "
                                  "reduce_scatter, all_to_all have a hierarchical program")
    one_per_node = spawn(main, nranks=2, nodes=2)[0]
    assert one_per_node[0] == ("Cannot all_gather with algorithm='hierarchical': every node holds one rank (2 "
                               "nodes), so the rail is the whole ring and there is nothing to do inside a node. Use "
                               "'ring' or 'auto'")
    six = spawn(main, nranks=6, nodes=2)[0]
    assert six[:2] == ["no error"] * 2
    assert six[2] == six[4]  # the simulator's default shape has 2 channels, as the last call's
    assert six[4] == ("Cannot all_to_all over 6 ranks with FlowConfig(channels=2): its 5 hierarchical rounds take 2 "
                      "connections each, so 2 rounds a channel, so at least 3 channels. Pass FlowConfig(channels=3) "
                      "or more")


def test_refuses_ranks_not_laid_out_node_by_node():
    """GPU communicators may number ranks otherwise (the simulator lays them out node by node): the check reads
    the team size and this rank's LSA rank."""
    uneven = types.SimpleNamespace(nranks=6, rank=1, lsa_size=4, lsa_rank=1)
    assert hierarchical_refusal("all_gather", uneven) == (
        "Cannot all_gather with algorithm='hierarchical': the ranks are not laid out node by node with as many on "
        "every node (6 ranks do not split into LSA teams of 4; the rails need rank r to be LSA rank r % 4). "
        "Launch the same number of ranks on every node, numbered node by node (torchrun does), or use 'ring' or "
        "'auto'")
    interleaved = types.SimpleNamespace(nranks=4, rank=1, lsa_size=2, lsa_rank=0)
    assert "(rank 1 is LSA rank 0; the rails need rank r to be LSA rank r % 2)" in \
        hierarchical_refusal("all_to_all", interleaved)
    assert hierarchical_refusal("all_to_all", types.SimpleNamespace(nranks=4, rank=3, lsa_size=2, lsa_rank=1)) \
        is None


def test_launch_shape_names_the_program():
    def main(comm):
        return [launch_shape(c, comm, 1000, "float32", "hierarchical", TINY).algorithm
                for c in ("all_gather", "reduce_scatter")]

    assert spawn(main, nranks=4, nodes=2)[0] == ["hierarchical", "hierarchical"]


def test_cost_model_picks_it_across_nodes_only_where_modelled():
    """(Without NCCL's host collective, as on the simulator.) Across nodes the rail carries each block once per
    node and the node ring the rest over LSA, where the
    flat ring carries every block over GIN: auto picks the hierarchical all_gather and reduce_scatter there
    (when the communicator is laid out for it), never within a node, and never for all_to_all (as many
    network bytes as pairwise)."""
    cfg = coll.FlowConfig()

    def pick(collective, nranks, lsa_size, nbytes, **kw):
        return coll.cost.choose(collective, nranks, lsa_size, nbytes, nccl_available=False, config=cfg, **kw)

    for nbytes in (8, 64 * 1024, 64 << 20):
        for collective in ("all_gather", "reduce_scatter"):
            assert pick(collective, 8, 4, nbytes, hierarchical_available=True) == "hierarchical"
            assert pick(collective, 8, 4, nbytes) != "hierarchical"
            assert pick(collective, 8, 8, nbytes, hierarchical_available=True) != "hierarchical"
        assert pick("all_to_all", 8, 4, nbytes, hierarchical_available=True) != "hierarchical"
    assert coll.cost.estimate("all_gather", "hierarchical", 8, 4, 1 << 20, cfg) < \
        coll.cost.estimate("all_gather", "ring", 8, 4, 1 << 20, cfg)


def test_auto_runs_it_across_nodes():
    def main(comm):
        shape = launch_shape("all_gather", comm, 300, "float32", "auto", TINY)
        x = comm.alloc(300, np.float32)
        x[:] = np.arange(300, dtype=np.float32) + 1000 * comm.rank
        y = comm.alloc(300 * comm.nranks, np.float32)
        coll.all_gather(comm, x, y, config=TINY)
        comm.synchronize()
        return shape.algorithm, np.array(y)

    want = np.concatenate([np.arange(300, dtype=np.float32) + 1000 * r for r in range(4)])
    for algorithm, got in spawn(main, nranks=4, nodes=2, seed=1, gin_delivery="reordered"):
        assert algorithm == "hierarchical"
        np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- the far phase over CFT
def _cft_all_gather(comm, dtype, count, channels, launches, seed):
    """``launches`` calls of hierarchical_cft_all_gather on one counted window (its counters and slots carry
    over from call to call); each call's output poisoned first, its inputs random; every output and the
    NumPy reference of each."""
    from flowdsl.collectives.programs import cft_all_gather_layout, hierarchical_cft_all_gather

    kernel = hierarchical_cft_all_gather(np.dtype(dtype))
    nbytes, _ = cft_all_gather_layout(channels, comm.nranks // comm.lsa_size)
    itemsize = np.dtype(dtype).itemsize
    buf = comm.alloc(nbytes // itemsize, dtype)
    buf.set(np.zeros(nbytes // itemsize, dtype))  # the counters start at 0
    src, dst = comm.alloc(count, dtype), comm.alloc(comm.nranks * count, dtype)
    got, want = [], []
    with comm.register(buf, cft_counted=True) as win, \
            comm.device_communicator(cft_barrier_count=channels, lsa_barrier_count=channels) as dc:
        for k in range(launches):
            rng = np.random.default_rng([seed, k])
            every = (rng.standard_normal((comm.nranks, count)) * 100).astype(dtype)
            src.set(every[comm.rank])
            dst.set(np.full(comm.nranks * count, 77, dtype))  # poisoned
            kernel[channels, 64](dc, win, src, dst, count, channels)
            comm.synchronize()
            got.append(dst.get())
            want.append(every.reshape(-1))
    return got, want


@pytest.mark.parametrize("nranks,nodes", [(4, 2), (6, 2), (6, 3)], ids=["2x2", "2x3", "3x2"])
@pytest.mark.parametrize("dtype,count,channels", [("float32", 1100, 2), ("int8", 4133, 1), ("float64", 300, 3)])
def test_hierarchical_cft_all_gather_matches_numpy_with_a_cft_team_wider_than_the_lsa_team(nranks, nodes, dtype,
                                                                                           count, channels):
    # The CFT team is the world, the LSA teams the nodes: the far phase goes over cft.team(HIER_LSA). Counts
    # cross several 2048-byte chunks and end off a 16-byte unit; two launches reuse the window's counters.
    for rank in spawn(lambda c: _cft_all_gather(c, dtype, count, channels, 2, nranks), nranks=nranks, nodes=nodes,
                      seed=nranks + nodes, gin_delivery="reordered"):
        for got, want in zip(*rank):
            np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- through the public call: algorithm="hierarchical_cft"
def test_cft_all_gather_through_all_gather_every_dtype_on_two_nodes_of_two():
    # Counts cross the 2048-byte CFT chunk (1100 float32 is 4400 bytes a rank) and end off its 16-byte unit.
    _run(4, 2, 11, "hierarchical_cft", (None,), counts=(0, 1, 37, 1100))


@pytest.mark.parametrize("nranks,nodes", [(6, 2), (6, 3)], ids=["2x3", "3x2"])
def test_cft_all_gather_through_all_gather_other_node_shapes(nranks, nodes):
    _run(nranks, nodes, 20 + nranks + nodes, "hierarchical_cft", (None,), counts=(1, 131, 1100), dtypes=FAMILIES)


def test_cft_all_gather_is_listed_only_where_the_communicator_has_cft_and_several_nodes():
    one = check.cases(4, counts=(8,), algorithms=("hierarchical_cft",), lsa_size=2)
    assert one == []  # cft=False: the communicator cannot run CFT kernels
    assert check.cases(4, counts=(8,), algorithms=("hierarchical_cft",), lsa_size=4, cft=True) == []  # one node
    assert {c.collective for c in check.cases(4, counts=(8,), algorithms=("hierarchical_cft",), lsa_size=2,
                                              cft=True)} == {"all_gather"}


def test_cft_all_gather_repeated_calls_return_each_calls_data():
    """One communicator, one counted window: calls on the same arrays (the planned fast path) and on new ones,
    other dtypes and counts, and GIN hierarchical and ring all_gathers in between, each with new random inputs
    and its output poisoned; every call must return its own inputs (never the last call's data left in the
    window's slots), and the window and device communicator are made once for the config."""
    count_a, count_b = 4500, 1100  # 18000 bytes a rank: two channels of TINY; 1100 bytes: one

    def main(comm):
        n, r = comm.nranks, comm.rank
        out = []
        x32, y32 = comm.alloc(count_a, np.float32), comm.alloc(n * count_a, np.float32)
        x8, y8 = comm.alloc(count_b, np.int8), comm.alloc(n * count_b, np.int8)
        plan = [("f", "hierarchical_cft"), ("f", "hierarchical_cft"), ("i", "hierarchical_cft"),
                ("f", "hierarchical"), ("f", "hierarchical_cft"), ("i", "ring"), ("i", "hierarchical_cft"),
                ("f", "hierarchical_cft")]
        states = []
        for k, (kind, algorithm) in enumerate(plan):
            rng = np.random.default_rng([5, k])
            if kind == "f":
                every = (rng.standard_normal((n, count_a)) * 1000).astype(np.float32)
                x, y = x32, y32
            else:
                every = rng.integers(-128, 128, (n, count_b), dtype=np.int8)
                x, y = x8, y8
            x[:] = every[r]
            y[:] = check.poison("float32" if kind == "f" else "int8")
            coll.all_gather(comm, x, y, algorithm=algorithm, config=TINY)
            comm.synchronize()
            out.append((np.array(y), every.reshape(-1)))
            states.append(len(comm.__dict__["_flowdsl_collectives"]))
        st = comm.__dict__["_flowdsl_collectives"][(TINY, "hierarchical_cft")]
        grids = [launch_shape("all_gather", comm, c, t, "hierarchical_cft", TINY).grid
                 for c, t in ((count_a, "float32"), (count_b, "int8"))]
        return out, states, st.window.group.cft_counted, grids  # the simulator's window group records it

    for out, states, counted, grids in spawn(main, nranks=4, nodes=2, seed=4, gin_delivery="reordered"):
        assert grids == [2, 1]
        for k, (got, want) in enumerate(out):
            np.testing.assert_array_equal(got, want, err_msg=f"call #{k}")
        assert states == [1, 1, 1, 2, 2, 3, 3, 3]  # the CFT state once, the GIN hierarchical's and the ring's
        assert counted


def test_cft_all_gather_resources_are_released_with_the_communicator():
    """The counted window, its buffer and the device communicator are tracked and closed with the communicator
    (nothing left registered); another config gets its own."""
    other = dataclasses.replace(TINY, channels=1)

    def main(comm):
        x, y = comm.alloc(40, np.float32), comm.alloc(comm.nranks * 40, np.float32)
        x[:] = comm.rank
        coll.all_gather(comm, x, y, algorithm="hierarchical_cft", config=TINY)
        coll.all_gather(comm, x, y, algorithm="hierarchical_cft", config=other)
        comm.synchronize()
        states = [comm.__dict__["_flowdsl_collectives"][(c, "hierarchical_cft")] for c in (TINY, other)]
        before = [(st.window.closed, st.devcomm.closed, st in comm.open_resources,
                   any(b is st.buffer for b in comm.open_resources)) for st in states]
        sizes = [st.buffer.nbytes for st in states]
        comm.close()
        after = [(st.closed, st.window.closed, st.devcomm.closed) for st in states]
        return before, after, sizes, np.array(y)

    from flowdsl.collectives.programs import cft_all_gather_layout

    for before, after, sizes, y in spawn(main, nranks=4, nodes=2):
        assert before == [(False, False, True, True)] * 2
        assert after == [(True, True, True)] * 2
        assert sizes == [cft_all_gather_layout(2, 2)[0], cft_all_gather_layout(1, 2)[0]]
        np.testing.assert_array_equal(y, np.repeat(np.arange(4, dtype=np.float32), 40))


def test_cft_all_gather_refusals_name_the_fix():
    def main(comm):
        n = comm.nranks
        x, y = comm.alloc(8, np.float32), comm.alloc(n * 8, np.float32)
        out = []
        for call in (lambda: coll.all_gather(comm, x, y, algorithm="hierarchical_cft"),
                     lambda: coll.reduce_scatter(comm, y, x, algorithm="hierarchical_cft")):
            try:
                call()
                out.append("no error")
            except flowdsl.UsageError as exc:
                out.append(str(exc))
        return out, comm.open_resources

    old, left = spawn(main, nranks=4, nodes=2, nccl="2.28.9")[0]
    assert old[0] == ("Cannot all_gather with algorithm='hierarchical_cft': its far phase goes over CFT, and this "
                      "communicator cannot run CFT kernels (needs NCCL >= 2.32 (counted writes; this run simulates "
                      "NCCL 2.28.9: flowdsl.sim.spawn(nccl='2.28.9'))). Use 'hierarchical' (the far phase over GIN) "
                      "or 'auto'")
    assert not [r for r in left if not isinstance(r, np.ndarray)]  # refused before anything was made
    assert old[1] == ("Cannot reduce_scatter with algorithm='hierarchical_cft': only all_gather has a "
                      "hierarchical_cft program. Use 'ring' or 'auto'")
    one_node = spawn(main, nranks=4)[0][0]
    assert one_node[0] == ("Cannot all_gather with algorithm='hierarchical_cft': this communicator is one LSA team "
                           "(4 ranks on one node), so nothing crosses the network and there is no rail to gather "
                           "along. Use 'ring' or 'auto'")


def test_cft_refusal_is_one_function_for_the_gpu_and_the_simulator():
    """The GPU communicator's cft_missing (from flowdsl.runtime.support.cft_missing, read here without a GPU)
    goes into the same refusal the simulator's does."""
    from flowdsl.collectives._host import cft_refusal
    from flowdsl.runtime.support import cft_missing

    lacking = cft_missing((2, 28, 9), "sm_90", (13, 0))
    assert lacking[0] == "NCCL >= 2.32 (counted writes, loaded 2.28.9: install nvidia-nccl-cu13>=2.32.3)"
    assert lacking[1:] == ["nvJitLink >= 13.3 (CUDA 13.3 LTO-IR, have 13.0: install nvidia-nvjitlink-cu13>=13.3)",
                           "an sm_100 or newer GPU (this one is sm_90)"]
    assert cft_missing((2, 32, 3), "sm_100", (13, 3)) == []
    assert cft_missing((2, 32, 3), "sm_103a", (13, 5)) == []
    assert cft_missing((2, 33, 0), "sm_100", (13, 3))[0].startswith("the CFT library for the loaded NCCL 2.33.0 (")
    gpu = types.SimpleNamespace(nranks=4, rank=1, lsa_size=2, lsa_rank=1,
                                cft_missing="needs " + "; ".join(lacking[2:]))
    assert cft_refusal("all_gather", gpu) == (
        "Cannot all_gather with algorithm='hierarchical_cft': its far phase goes over CFT, and this communicator "
        "cannot run CFT kernels (needs an sm_100 or newer GPU (this one is sm_90)). Use 'hierarchical' (the far "
        "phase over GIN) or 'auto'")
    assert cft_refusal("all_gather", types.SimpleNamespace(nranks=4, rank=1, lsa_size=2, lsa_rank=1,
                                                           cft_missing=None)) is None


def test_auto_never_picks_the_cft_far_phase():
    """The cost model has no CFT constants: auto keeps the GIN far phase where CFT is there too, and estimating
    the CFT program is refused, naming why."""
    def main(comm):
        return comm.cft_missing, launch_shape("all_gather", comm, 1 << 16, "float32", "auto", TINY).algorithm, \
            launch_shape("all_gather", comm, 1000, "float32", "hierarchical_cft", TINY)

    missing, auto, cft_shape = spawn(main, nranks=4, nodes=2)[0]
    assert (missing, auto) == (None, "hierarchical")
    assert cft_shape == ("hierarchical_cft", None, 1)
    with pytest.raises(flowdsl.UsageError, match=r"^Cannot estimate all_gather with algorithm='hierarchical_cft': "
                                                 r"the cost model has no constants for CFT"):
        coll.cost.estimate("all_gather", "hierarchical_cft", 8, 4, 1 << 20, coll.FlowConfig())
