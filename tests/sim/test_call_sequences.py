"""Long seeded sequences of collective calls on one communicator, bit for bit (flowdsl.collectives.sequences).

Each topology test drives one communicator through 200 random calls (program or ``"auto"``,
protocol, small ``FlowConfig``, count, dtype, op, root, placement, views with guard bytes inside
larger allocations) and compares every allocation bit for bit with the reference that combines
in each program's order (:mod:`flowdsl.collectives.exact`). The seed is fixed
(``sequences.CI_SEED``); ``pytest --seq-seed S`` or ``FLOWDSL_SEQ_SEED=S`` runs another. A
failure prints the seed, the failing call, the minimal failing sequence and the command that
reruns it (``python -m flowdsl.collectives.sequences ...``).

The other tests check the parts: the generator's coverage, the reference's arithmetic against
the simulator's, that the reference tells orders apart, and that planted faults (a stale
element, a write past the output, a written input) are found and shrunk to their minimal
sequence.
"""

from __future__ import annotations

import collections
import dataclasses
import os

import numpy as np
import pytest

from flowdsl import Protocol, _flow_elements
from flowdsl import collectives as coll
from flowdsl.collectives import exact, sequences
from flowdsl.collectives.programs import PROGRAMS
from flowdsl.errors import UsageError

pytestmark = pytest.mark.sim

TOPOLOGIES = [(2, 1), (3, 1), (4, 1), (4, 2)]


@pytest.fixture
def seq_seed(request) -> int:
    seed = request.config.getoption("--seq-seed")
    if seed is None:
        seed = int(os.environ.get("FLOWDSL_SEQ_SEED", sequences.CI_SEED))
    return seed


@pytest.mark.parametrize("nranks,nodes", TOPOLOGIES, ids=[f"{n}ranks-{k}nodes" for n, k in TOPOLOGIES])
def test_call_sequence(seq_seed, nranks, nodes):
    """200 calls on one communicator, every allocation bit for bit after every call."""
    text, run = sequences.check_seed(seq_seed, nranks, nodes, sequences.DEFAULT_CALLS, shrink_seconds=60)
    assert text is None, "\n" + text


# ---- the generator ------------------------------------------------------------------------------

def test_generator_is_seeded_and_covers_every_program_dtype_op_and_placement():
    calls = sequences.generate(5, 200, 3)
    assert calls == sequences.generate(5, 200, 3)
    assert calls != sequences.generate(6, 200, 3)
    seen = collections.Counter
    programs = seen((c.algorithm, c.collective) for c in calls)
    # Every program but multimem (these worlds have no NVLink SHARP: tests/sim/test_collectives_multimem.py) and
    # the hierarchical ones, which need several nodes of several ranks (below).
    assert {k for k in PROGRAMS if k[0] not in ("multimem", "hierarchical", "hierarchical_cft")} <= set(programs), \
        set(PROGRAMS) - set(programs)
    assert not any(c.algorithm.startswith("hierarchical") for c in calls)
    across = {(c.algorithm, c.collective) for c in sequences.generate(5, 200, 4, 2)}
    # Across nodes the hierarchical programs, the far phase over CFT too (the simulator's communicators have CFT;
    # a GPU communicator without passes cft=False)
    assert {k for k in PROGRAMS if k[0].startswith("hierarchical")} <= across, set(PROGRAMS) - across
    assert not any(c.algorithm == "hierarchical_cft" for c in sequences.generate(5, 200, 4, 2, cft=False))
    assert not any(c.algorithm == "multimem" for c in calls)
    assert {("auto", c) for (_, c) in PROGRAMS} <= set(programs)
    assert set(coll.DTYPES) <= {c.dtype for c in calls}
    assert set(coll.OPS) <= {c.op for c in calls if c.op}
    assert {c.config.protocol for c in calls} == set(sequences.PROTOCOLS)
    assert {c.placement for c in calls} == {"out-of-place", "in-place", "mixed"}
    counts = {c.count for c in calls}
    assert {0, 1} <= counts and any(n % 3 and n % 16 and n > 100 for n in counts)
    assert any(c.repeat for c in calls)
    assert {c.root for c in calls if c.collective in ("broadcast", "reduce")} == {0, 1, 2}
    # One LSA team per node: no one-shot across nodes (it stores into every peer's memory).
    assert not any(c.algorithm == "one_shot" for c in sequences.generate(5, 200, 4, lsa_size=2))


def test_new_dtypes_and_ops_are_drawn_and_unknown_ones_refused():
    """The generator draws what DTYPES/OPS list when it is called; integer types are modelled
    whatever their width; a float type or operator the reference has no model of is refused."""
    calls = sequences.generate(3, 60, 2, dtypes=("int8", "uint32", "uint64"))
    assert {c.dtype for c in calls} == {"int8", "uint32", "uint64"}
    for call in calls[:10]:
        ins = sequences.call_inputs(call, 2)
        assert ins[0].dtype == np.dtype(call.dtype)
    avg = exact.elements("int8").finish("avg", np.array([-128, -3, 3, 127], np.int8), 2)
    assert avg.tolist() == [-64, -1, 1, 63]  # truncated toward zero
    with pytest.raises(UsageError, match="Cannot compute the exact reference of dtype 'float8_e8m0fnu'"):
        sequences.generate(3, 5, 2, dtypes=("float8_e8m0fnu",))
    with pytest.raises(UsageError, match="op='bitand'.*Fix: add its combine and finish"):
        exact.reference("all_reduce", "ring", [np.ones(4, np.float32)] * 2, "float32", "bitand", grid=1,
                        protocol=Protocol.LL, config=coll.FlowConfig())
    with pytest.raises(UsageError, match="premulsum without every rank's scalar"):
        exact.reference("all_reduce", "one_shot", [np.ones(4, np.float32)] * 2, "float32", "premulsum")


def test_premulsum_reference_multiplies_each_rank_then_sums_in_order():
    """Each rank's input times its own scalar, rounded once to the type, then the program's sum order."""
    rng = np.random.default_rng(4)
    ins = [rng.standard_normal(33).astype(np.float16) for _ in range(3)]
    scalars = [np.float16(0.75), np.float16(-0.5), np.float16(0.625)]
    got = exact.reference("all_reduce", "one_shot", ins, "float16", "premulsum", scalars=scalars)[0]
    p = [(x.astype(np.float32) * np.float32(s)).astype(np.float16) for x, s in zip(ins, scalars)]
    want = ((p[0].astype(np.float32) + p[1].astype(np.float32)).astype(np.float16).astype(np.float32)
            + p[2].astype(np.float32)).astype(np.float16)  # rank 0 first, rounded after each combine
    assert got.view(np.uint16).tolist() == want.view(np.uint16).tolist()


# ---- the reference ------------------------------------------------------------------------------

_FP8_FORMAT = {"float8_e4m3fn": _flow_elements.E4M3, "float8_e5m2": _flow_elements.E5M2}


@pytest.mark.parametrize("dtype", coll.DTYPES)
def test_reference_arithmetic_matches_the_simulators_element_by_element(dtype):
    """The vectorised combine and finish give the simulator's scalar flow.combine/flow.finish bits
    (which the GPU tests hold against the GPU's), on values with zeros, subnormals and infinities."""
    rng = np.random.default_rng(11)
    arith = exact.elements(dtype)
    a = sequences._random_elements(rng, dtype, "sum", 400)
    b = sequences._random_elements(rng, dtype, "sum", 400)
    fp8 = _FP8_FORMAT.get(dtype, 0)
    for name, op in coll.OPS.items():
        got = arith.combine(name, a, b)
        want = np.array([_flow_elements.combine(op, x, y, fp8) for x, y in zip(a, b)], arith.storage)
        assert exact.mismatches(got, want, dtype, nan_ok=True).size == 0, (dtype, name)
        for nranks in (1, 3):
            got = arith.finish(name, a, nranks)
            want = np.array([_flow_elements.finish(op, x, nranks, fp8) for x in a], arith.storage)
            assert exact.mismatches(got, want, dtype, nan_ok=True).size == 0, (dtype, name, nranks)


def test_reference_tells_orders_apart():
    """Bit for bit has teeth: float32 sums over 4 ranks in the ring's, the tree's and the one-shot's
    orders differ, and so do the ring all-reduce's rounds of two chunk sizes."""
    rng = np.random.default_rng(2)
    ins = [sequences._random_elements(rng, "float32", "sum", 4096) for _ in range(4)]
    cfg = coll.FlowConfig(channels=2, nslots=2, slot_bytes=256, threads=32)

    def ref(algorithm, grid=2, protocol=Protocol.SIMPLE, config=cfg):
        return exact.reference("all_reduce", algorithm, ins, "float32", "sum", protocol=protocol, grid=grid,
                               config=config)[0]

    ring, tree, one_shot = ref("ring"), ref("tree"), ref("one_shot")
    for x, y in ((ring, tree), (ring, one_shot), (tree, one_shot), (ring, ref("ring", protocol=Protocol.LL)),
                 (tree, ref("tree", grid=1))):
        assert exact.mismatches(x, y, "float32", nan_ok=True).size > 100
    # The chains' starts: piece j of a ring round begins at rank j + 1.
    first = exact.ring_all_reduce_first_ranks(count=200, nranks=4, grid=1, chunk=16)
    assert first[:16].tolist() == [1] * 16 and first[16:32].tolist() == [2] * 16 and first[48:64].tolist() == [0] * 16


def test_the_orders_docs_collectives_md_writes_down():
    """The formulas of "Reduction order: what the bits are", written out for 4 ranks."""
    rng = np.random.default_rng(1)
    x = [sequences._random_elements(rng, "float32", "sum", 64) for _ in range(4)]
    cfg = coll.FlowConfig(channels=2, nslots=2, slot_bytes=128, threads=32)

    def ref(algorithm, collective="all_reduce", root=0):
        return exact.reference(collective, algorithm, x, "float32", "sum", root, protocol=Protocol.SIMPLE, grid=2,
                               config=cfg)

    def same(got, want):
        return exact.mismatches(got, np.asarray(want, np.float32), "float32", nan_ok=True).size == 0

    with np.errstate(all="ignore"):
        tree0 = x[2] + ((x[3] + x[1]) + x[0])  # channel 0: [0, 32)
        tree1 = x[1] + ((x[0] + x[2]) + x[3])  # channel 1: [32, 64)
        one_shot = ((x[0] + x[1]) + x[2]) + x[3]
        reduce_root2 = ((x[3] + x[0]) + x[1]) + x[2]  # from root + 1 round to the root
    assert same(ref("tree")[0][:32], tree0[:32]) and same(ref("tree")[0][32:], tree1[32:])
    assert same(ref("one_shot")[0], one_shot)
    assert same(ref("ring", "reduce", root=2)[2], reduce_root2)
    # Ring all-reduce, SIMPLE 128-byte slots (32 float32), nslots 2: chunks of 32, rounds of 128; a
    # channel's 32 elements are one round of 4 pieces of 16 (8 rounded up): pieces 0 and 1.
    piece0 = ((x[1] + x[2]) + x[3]) + x[0]
    piece1 = ((x[2] + x[3]) + x[0]) + x[1]
    ring = ref("ring")[0]
    assert same(ring[:16], piece0[:16]) and same(ring[16:32], piece1[16:32]) and same(ring[32:48], piece0[32:48])


# ---- planted faults: found, described and shrunk --------------------------------------------------

def _planted(monkeypatch, fault):
    """Make ``coll.all_gather`` (as the runner calls it) do ``fault(src, dst, last)`` after the real call,
    ``last`` being this rank's previous output of all_gather (None at first)."""
    real = coll.all_gather
    last = {}  # by communicator: each simulated run starts afresh

    def all_gather(comm, src, dst, **kwargs):
        out = real(comm, src, dst, **kwargs)
        comm.synchronize()
        fault(src, dst, last.get(comm))
        last[comm] = np.array(dst)
        return out

    monkeypatch.setattr(coll, "all_gather", all_gather)


def _calls(n):
    """A short mixed list with two all_gathers (#2 and #5) among other calls."""
    cfg = coll.FlowConfig(channels=2, nslots=2, slot_bytes=256, threads=32, protocol=Protocol.LL)

    def call(index, algorithm, collective, dtype, op, count, placement):
        return sequences.Call(index, algorithm, collective, dtype, op, count, 0, placement, cfg, seed=index + 1,
                              layout_seed=9)

    return [call(0, "ring", "all_reduce", "float32", "sum", 37, "in-place"),
            call(1, "ring", "broadcast", "int32", None, 20, "out-of-place"),
            call(2, "ring", "all_gather", "float16", None, 33, "out-of-place"),
            call(3, "tree", "all_reduce", "bfloat16", "max", 19, "out-of-place"),
            call(4, "ring", "reduce", "uint8", "sum", 5, "in-place"),
            call(5, "ring", "all_gather", "float16", None, 17, "in-place")][:n]


def test_a_stale_element_is_found_and_shrunk_to_its_two_calls(monkeypatch):
    def stale(src, dst, last):  # element 3 keeps what the previous all_gather left there
        if last is not None:
            dst[3] = last[3]

    _planted(monkeypatch, stale)
    calls = _calls(6)
    run = sequences.simulate(calls, 2)
    assert run.failed and run.first_call.index == 5
    assert "1 output elements differ; first at element 3" in run.failures[0].message
    minimal, shrunk = sequences.shrink(calls, 2, run=run, seconds=60)
    assert [c.index for c in minimal] == [2, 5]
    text = sequences.report(99, 6, 2, 1, run, minimal, shrunk, 1.0)
    assert "Call sequence seed 99 on 2 ranks (1 node)" in text and "#5 ring all_gather float16" in text
    assert text.splitlines()[-1] == ("Rerun: python -m flowdsl.collectives.sequences --seed 99 --ranks 2 --nodes 1 "
                                     "--calls 6 --only 2,5")


def test_writes_past_the_output_and_into_the_input_are_found(monkeypatch):
    def stray(src, dst, last):
        past = np.lib.stride_tricks.as_strided(dst, shape=(dst.size + 1,))
        past[dst.size] = -past[dst.size] if past[dst.size] else 1  # the first guard element after dst
        if not np.shares_memory(src, dst):
            src[0] = src[0] + 1  # an out-of-place input must stay as it was

    _planted(monkeypatch, stray)
    run = sequences.simulate(_calls(3), 2)
    message = run.failures[0].message
    assert run.first_call.index == 2
    assert "guard elements after the arrays written" in message
    assert "1 input (it must stay as it was) elements differ; first at element 0" in message


def test_an_unwritten_output_is_not_taken_for_a_nan_result():
    """Where a reduction's result is NaN any payload matches, but never the poison's bits."""
    poison = np.float32(np.nan)
    want = np.array([np.nan, 1.0], np.float32)
    other_nan = np.array([0xFFC00000], np.uint32).view(np.float32)[0]
    assert exact.mismatches(np.array([other_nan, 1.0], np.float32), want, "float32", nan_ok=True,
                            poison=poison).size == 0
    assert exact.mismatches(np.array([poison, 1.0], np.float32), want, "float32", nan_ok=True,
                            poison=poison).tolist() == [0]
    assert exact.mismatches(np.array([0.0], np.float32), np.array([-0.0], np.float32), "float32",
                            nan_ok=True).tolist() == [0]  # signed zeros are bits too


def test_nccls_own_order_is_checked_within_a_tolerance():
    """Where ``"auto"`` picks NCCL's host collective (GPUs), a float reduction in another order passes
    and a wrong element does not."""
    call = sequences.Call(0, "auto", "all_reduce", "float32", "sum", 1000, 0, "out-of-place", coll.FlowConfig(),
                          seed=1, layout_seed=2)
    ins = sequences.call_inputs(call, 3)
    ring = exact.reference("all_reduce", "ring", ins, "float32", "sum", protocol=Protocol.SIMPLE, grid=1,
                           config=call.config)[0]
    other_order = exact.reference("all_reduce", "one_shot", ins, "float32", "sum")[0]
    assert exact.mismatches(other_order, ring, "float32", nan_ok=True).size > 0
    assert sequences._close(call, other_order, ring, ins, 0) is None
    other_order[5] += 1
    assert "1 output elements beyond NCCL's tolerance; first at element 5" in sequences._close(call, other_order, ring,
                                                                                             ins, 0)


def test_the_reference_models_every_operator_listed():
    """A new operator in OPS fails here, by name, until exact.py models it (the sequences draw it)."""
    assert set(coll.OPS) <= set(exact.MODELLED_OPS), f"not modelled: {set(coll.OPS) - set(exact.MODELLED_OPS)}"


def test_config_pool_is_small():
    """Calls share a few FlowConfigs, so they share staging and one-shot windows (state across calls)."""
    calls = sequences.generate(8, 200, 2)
    shapes = {dataclasses.replace(c.config, protocol=None) for c in calls}
    assert len(shapes) <= sequences._SHAPES


def test_a_sequence_call_and_a_check_case_pass_the_same_keywords():
    """Both build their keywords with check.call_kwargs: fp8 in uint8 arrays names its dtype (a torch tensor
    says it itself), op only where given, root only for the rooted collectives."""
    from flowdsl.collectives import check

    config = coll.FlowConfig()
    call = sequences.Call(0, "ring", "reduce", "float8_e4m3fn", "sum", 8, 1, "in-place", config, 0, 0)
    case = check.Case("ring", "reduce", "float8_e4m3fn", "sum", False, 8, root=1, config=config)
    want = {"algorithm": "ring", "config": config, "dtype": "float8_e4m3fn", "op": "sum", "root": 1}
    assert call.kwargs() == case.call_kwargs() == want
    assert "dtype" not in dataclasses.replace(case, like="torch").call_kwargs()
    gather = sequences.Call(0, "ring", "all_gather", "float32", None, 8, 0, "in-place", config, 0, 0)
    assert gather.kwargs() == {"algorithm": "ring", "config": config}
