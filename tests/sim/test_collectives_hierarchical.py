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


def _run(nranks, nodes, seed, **matrix):
    def main(comm):
        cases = check.cases(comm.nranks, protocols=PROTOCOLS, config=TINY, start=seed, lsa_size=comm.lsa_size,
                            algorithms=("hierarchical",), **matrix)
        assert cases, "no hierarchical case listed"
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
