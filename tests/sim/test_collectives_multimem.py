"""The multimem all-reduce (NVLink SHARP) on the simulator: every type and operator it has against NumPy, on
1 to 8 ranks, across chunks of its window; what it cannot run refused by message; the cost model picks it
only where the communicator has multimem.

The matrix is :mod:`flowdsl.collectives.check`'s (outputs poisoned, random inputs, NumPy references), with
``multimem=True``: the simulated system has a switch (``spawn(multimem=True)``). The tiny shape's window is
512 bytes, so counts from 131 elements on cross several chunks, and odd counts end in a padded vector.
"""

from __future__ import annotations

import numpy as np
import pytest

import flowdsl
from flowdsl import RedOp
from flowdsl import collectives as coll
from flowdsl.collectives import check, cost
from flowdsl.collectives._host import launch_shape, multimem_window_bytes
from flowdsl.collectives.programs import multimem_form
from flowdsl.sim import spawn

pytestmark = pytest.mark.sim

TINY = coll.FlowConfig(channels=2, nslots=2, slot_bytes=128, threads=64)
#: The types and operators the multimem all-reduce takes (avg: its sum, divided).
TAKES = {("int32", "sum"), ("int32", "min"), ("int32", "max"), ("int32", "avg"),
         ("uint32", "sum"), ("uint32", "min"), ("uint32", "max"), ("uint32", "avg"),
         ("int64", "sum"), ("int64", "min"), ("int64", "max"), ("int64", "avg"),
         ("uint64", "sum"), ("uint64", "min"), ("uint64", "max"), ("uint64", "avg"),
         ("float32", "sum"), ("float32", "avg"), ("float64", "sum"), ("float64", "avg"),
         ("float16", "sum"), ("float16", "min"), ("float16", "max"), ("float16", "avg"),
         ("bfloat16", "sum"), ("bfloat16", "min"), ("bfloat16", "max"), ("bfloat16", "avg")}


def _matrix(nranks, counts, seed):
    def main(comm):
        cases = check.cases(comm.nranks, counts=counts, algorithms=("multimem",), protocols=(None,), config=TINY,
                            start=seed, lsa_size=comm.lsa_size, multimem=comm.supports_multimem)
        return [(c.dtype, c.op) for c in cases], check.run_matrix(comm, cases)

    results = spawn(main, nranks=nranks, seed=seed, multimem=True)
    failures = [f for _, rank in results for f in rank]
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:20])
    return set(results[0][0])


def test_the_window_is_tiny_so_the_matrix_crosses_chunks():
    assert multimem_window_bytes(TINY, 8) == 512  # 128 float32, 64 float64: counts 131 and 300 take chunks


@pytest.mark.parametrize("nranks", [1, 2, 4, 8])
def test_every_type_and_operator_it_takes_against_numpy(nranks):
    counts = (0, 1, 37, 131, 300) if nranks < 8 else (1, 37, 300)
    listed = _matrix(nranks, counts, nranks)
    assert listed == TAKES  # every form the table has, and nothing else


def test_a_message_of_many_chunks_and_grids_in_one_communicator():
    """Calls of several sizes (1 and 2 blocks, 1 to 40 chunks) one after another on the same window and barriers."""
    counts = [5000, 3, 640, 129, 2048]

    def main(comm):
        rng = np.random.default_rng(7)
        out = []
        for count in counts:
            ins = [rng.integers(-1000, 1000, count).astype(np.int64) for _ in range(comm.nranks)]
            src = comm.alloc(count, np.int64)
            src[:] = ins[comm.rank]
            coll.all_reduce(comm, src, op="max", algorithm="multimem", config=TINY)
            comm.synchronize()
            out.append(np.array_equal(np.array(src), np.max(ins, axis=0)))
        return out

    assert spawn(main, nranks=4, multimem=True, seed=3) == [[True] * len(counts)] * 4


def _refusal(call, nranks=2, **spawn_options):
    def main(comm):
        try:
            call(comm)
        except flowdsl.UsageError as exc:
            return str(exc)
        return "no error"

    messages = spawn(main, nranks=nranks, **spawn_options)
    assert len(set(messages)) == 1, messages
    return messages[0]


def _all_reduce(dtype, op="sum"):
    def call(comm):
        src = comm.alloc(64, check.storage_dtype(dtype))
        src[:] = 1
        coll.all_reduce(comm, src, op=op, algorithm="multimem", config=TINY,
                        dtype=dtype if dtype.startswith("float8") else None)
    return call


def test_no_switch_is_refused():
    message = _refusal(_all_reduce("float32"))
    assert message.startswith("Cannot all_reduce with algorithm='multimem': this communicator has no NVLink SHARP "
                              "(comm.supports_multimem is False"), message
    assert message.endswith("Use 'ring', 'tree', 'one_shot' or 'auto'")


def test_several_nodes_are_refused():
    message = _refusal(_all_reduce("float32"), nranks=4, nodes=2, multimem=True)
    assert message == ("Cannot all_reduce with algorithm='multimem': the NVLink switch reaches one LSA team, and this "
                       "communicator spans several (4 ranks, 2 per team). Use 'ring', 'tree' or 'auto'")


@pytest.mark.parametrize("dtype, op", [("float32", "max"), ("int32", "prod"), ("float64", "min"), ("int8", "sum"),
                                       ("uint8", "sum")])
def test_what_ptx_lacks_is_refused_naming_another_algorithm(dtype, op):
    message = _refusal(_all_reduce(dtype, op), multimem=True)
    assert message.startswith(f"Cannot all_reduce {dtype} with op={op} and algorithm='multimem': PTX's "
                              "multimem.ld_reduce has no such form (it reduces "), message
    assert "float32 sum;" in message and "bfloat16 sum/max/min" in message  # the table's, not restated
    assert message.endswith("Use 'ring', 'tree', 'one_shot' or 'auto'")


def test_premulsum_and_fp8_are_refused():
    def premul(comm):
        src = comm.alloc(64, np.float32)
        src[:] = 1
        coll.all_reduce(comm, src, op=coll.premul_sum(2.0), algorithm="multimem", config=TINY)

    assert "with op=premulsum and algorithm='multimem': PTX's multimem.ld_reduce has no such form" in \
        _refusal(premul, multimem=True)
    assert "Cannot all_reduce float8_e4m3fn with op=sum and algorithm='multimem'" in \
        _refusal(_all_reduce("float8_e4m3fn"), multimem=True)


def test_other_collectives_have_no_multimem_program():
    def call(comm):
        src, dst = comm.alloc(4, np.float32), comm.alloc(8, np.float32)
        coll.all_gather(comm, src, dst, algorithm="multimem", config=TINY)

    assert _refusal(call, multimem=True).startswith("Cannot all_gather with algorithm='multimem': only all_reduce "
                                                    "has a multimem program")


def test_supports_multimem_says_what_spawn_modelled():
    assert spawn(lambda comm: comm.supports_multimem, nranks=2, multimem=True) == [True, True]
    assert spawn(lambda comm: comm.supports_multimem, nranks=2) == [False, False]


# ---- the cost model ------------------------------------------------------------------------------------

SIZES = [1 << k for k in range(0, 27, 2)]  # elements per rank


def _choices(nranks, dtype="float32", op=None, **spawn_options):
    def main(comm):
        return [launch_shape("all_reduce", comm, n, dtype, op=op).algorithm for n in SIZES]

    return spawn(main, nranks=nranks, **spawn_options)[0]


@pytest.mark.parametrize("nranks", [2, 4, 8])
def test_auto_picks_multimem_for_large_messages_only_where_the_world_has_a_switch(nranks):
    with_switch = _choices(nranks, multimem=True)
    assert "multimem" in with_switch and with_switch[0] != "multimem", with_switch  # not for one element
    assert "multimem" not in _choices(nranks), "never without spawn(multimem=True)"
    assert "multimem" not in _choices(nranks, nodes=2, multimem=True), "never across LSA teams"
    assert "multimem" not in _choices(nranks, op=RedOp.PROD, multimem=True), "never for an operator it lacks"
    assert "multimem" not in _choices(nranks, dtype="int8", multimem=True), "never for a type it lacks"
    assert "multimem" not in _choices(nranks, dtype="float32", op=RedOp.MAX, multimem=True)


def test_auto_runs_multimem_end_to_end():
    """A call with algorithm="auto" that the cost model gives multimem: planned as multimem, and right."""
    count = next(n for n in SIZES if cost.choose("all_reduce", 4, 4, 4 * n, nccl_available=False,
                                                 one_shot_available=n <= 256 * 1024, multimem_available=True)
                 == "multimem")

    def main(comm):
        src = comm.alloc(count, np.float32)
        src[:] = np.arange(count, dtype=np.float32) * (comm.rank + 1)
        coll.all_reduce(comm, src, config=TINY)
        comm.synchronize()
        plans = [p.algorithm for p in comm._flowdsl_plans.values()]
        return plans, np.array_equal(np.array(src), np.arange(count, dtype=np.float32) * 10)

    assert spawn(main, nranks=4, multimem=True) == [(["multimem"], True)] * 4


def test_cost_model_offers_multimem_only_when_available():
    big = 1 << 28
    assert cost.choose("all_reduce", 8, 8, big, nccl_available=False, multimem_available=True) == "multimem"
    assert cost.choose("all_reduce", 8, 8, big, nccl_available=False, multimem_available=False) != "multimem"
    assert cost.choose("all_reduce", 8, 4, big, nccl_available=False, multimem_available=True) != "multimem"
    assert cost.choose("all_gather", 8, 8, big, nccl_available=False, multimem_available=True) != "multimem"
    # Small messages: the one-shot all-reduce's single step beats two barriers.
    assert cost.choose("all_reduce", 8, 8, 64, one_shot_available=True, multimem_available=True) == "one_shot"


def test_forms_come_from_the_ptx_table():
    from flowdsl import mem

    for dtype in ("int32", "uint32", "int64", "uint64", "float32", "float64", "float16", "uint16", "int8", "uint8"):
        for op in (RedOp.SUM, RedOp.PROD, RedOp.MIN, RedOp.MAX, RedOp.AVG, RedOp.PREMULSUM):
            form = multimem_form(dtype, op)
            base = RedOp.SUM if op == RedOp.AVG else op
            vector = mem.multimem_refusal("multimem_ld_reduce_vec", dtype, base, True) is None
            scalar = mem.multimem_refusal("multimem_ld_reduce", dtype, base, False) is None
            assert form == (True if vector else False if scalar else None), (dtype, op, form)
