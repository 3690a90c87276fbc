"""The unchanged examples on 1, 2, 3, 4 and 8 simulated ranks match NumPy."""

import numpy as np
import pytest

import flowdsl

from flowdsl.testing import assert_ranks_close, for_seeds, run_ranks

from flowdsl.examples import (allgather_lsa, allreduce_lsa, allreduce_multimem, alltoall_lsa, rmsnorm_lsa,
                              rmsnorm_multimem)

pytestmark = pytest.mark.sim


@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 8])
def test_rmsnorm_matches_numpy(nranks):
    results = run_ranks(rmsnorm_lsa.run, nranks=nranks, seed=nranks)
    assert len(results) == nranks
    assert_ranks_close(results, rtol=1e-5, atol=1e-5)
    assert all(not np.isnan(r).any() for r, _ in results)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("nranks", [1, 3, 4])
def test_rmsnorm_in_half_precision_matches_numpy_within_the_types_rounding(nranks, dtype):
    tol = rmsnorm_lsa.TOLERANCE[dtype]
    results = run_ranks(lambda c: rmsnorm_lsa.run(c, tokens_per_rank=2, hidden=256, seed=nranks, dtype=dtype),
                        nranks=nranks)
    assert_ranks_close(results, rtol=tol, atol=tol)
    # Not the float32 result by accident: the element type's rounding shows.
    result, reference = results[0]
    assert 0 < np.abs(result - reference).max()


def test_rmsnorm_refuses_an_element_type_it_has_no_arithmetic_for():
    with pytest.raises(ValueError, match=r"choose one of \('float32', 'float16', 'bfloat16'\)"):
        run_ranks(lambda c: rmsnorm_lsa.run(c, dtype="int32"), nranks=1)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("nranks", [1, 2, 4])
def test_rmsnorm_multimem_matches_numpy(nranks, dtype):
    """The reduce-scatter by multimem.ld_reduce, the all-gather by multimem.st, on a simulated NVLink SHARP switch."""
    tol = 1e-5 if dtype == "float32" else rmsnorm_multimem.TOLERANCE[dtype]
    results = run_ranks(lambda c: rmsnorm_multimem.run(c, tokens_per_rank=2, hidden=256, seed=nranks, dtype=dtype),
                        nranks=nranks, multimem=True)
    assert len(results) == nranks
    assert_ranks_close(results, rtol=tol, atol=tol)
    assert all(not np.isnan(r).any() for r, _ in results)


def test_rmsnorm_multimem_equals_the_lsa_example_in_bfloat16():
    """Both sum in float32 and round once per phase: the same bits, whichever path the sum took."""
    def both(comm):
        return [rmsnorm_multimem.run(comm, tokens_per_rank=2, hidden=64, seed=5, dtype="bfloat16")[0],
                rmsnorm_lsa.run(comm, tokens_per_rank=2, hidden=64, seed=5, dtype="bfloat16")[0]]
    for multimem, lsa in run_ranks(both, nranks=2, multimem=True):
        np.testing.assert_array_equal(multimem, lsa)


def test_rmsnorm_multimem_is_refused_without_a_switch():
    with pytest.raises(flowdsl.UsageError, match=r"Cannot create a device communicator with lsa_multimem=True: this "
                                                 r"simulated system has no NVLink SHARP"):
        run_ranks(lambda c: rmsnorm_multimem.run(c, tokens_per_rank=1, hidden=64), nranks=2)


def test_rmsnorm_multimem_refuses_a_token_of_partial_16_byte_accesses():
    with pytest.raises(flowdsl.UsageError, match=r"hidden=60 float16 elements: each token moves in 16-byte multimem "
                                                 r"accesses\. Use a multiple of 8"):
        run_ranks(lambda c: rmsnorm_multimem.run(c, hidden=60, dtype="float16"), nranks=1, multimem=True)


@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 8])
def test_allgather_matches_numpy(nranks):
    results = run_ranks(allgather_lsa.run, nranks=nranks, seed=nranks)
    assert_ranks_close(results, rtol=1e-5)


@for_seeds(4)
def test_allgather_under_seeds(seed):
    assert_ranks_close(run_ranks(lambda c: allgather_lsa.run(c, count=300, blocks=2), nranks=3, seed=seed))


def test_rmsnorm_two_nodes_is_per_node():
    """With 2 nodes the LSA team is a node: the kernel reduces over the node only."""
    def main(comm):
        result, _ = rmsnorm_lsa.run(comm, tokens_per_rank=2, hidden=64)
        return comm.lsa_size, comm.lsa_rank, result
    out = run_ranks(main, nranks=4, nodes=2)
    assert [o[:2] for o in out] == [(2, 0), (2, 1), (2, 0), (2, 1)]


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_allreduce_lsa_matches_numpy_bit_for_bit(nranks):
    """NCCL's 01_allreduce_lsa: the same float32 sums, in the same order, as NumPy's."""
    for result, reference in run_ranks(lambda c: allreduce_lsa.run(c, count=1000, seed=nranks), nranks=nranks,
                                       seed=nranks):
        np.testing.assert_array_equal(result, reference)


@for_seeds(3)
def test_allreduce_lsa_under_seeds(seed):
    for result, reference in run_ranks(lambda c: allreduce_lsa.run(c, count=300, blocks=2, threads=32), nranks=4,
                                       seed=seed):
        np.testing.assert_array_equal(result, reference)


def test_allreduce_lsa_refuses_two_nodes_naming_why():
    with pytest.raises(flowdsl.UsageError, match="on 4 ranks in LSA teams of 2: it reads every rank's memory"):
        run_ranks(allreduce_lsa.run, nranks=4, nodes=2)


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
@pytest.mark.parametrize("variant", ["run", "run_poison"], ids=["barrier", "poison"])
def test_alltoall_lsa_matches_numpy_in_every_call(variant, nranks):
    """NCCL's two LSA all-to-alls (contrib/custom_algos), several calls on one window set, race-checked: the
    poison variant's calls past the second meet at no barrier, and its windows rotate."""
    run = getattr(alltoall_lsa, variant)
    for calls in flowdsl.sim.spawn(lambda c: run(c, count=40, blocks=2, threads=64, calls=5), nranks=nranks,
                                   seed=nranks, races=True):
        assert len(calls) == 5
        for result, reference in calls:
            np.testing.assert_array_equal(result, reference)


def test_alltoall_lsa_poison_with_a_plain_store_is_a_data_race(monkeypatch):
    """The receiver polls each element's last word while the sender writes it: the element must be one 16-byte
    relaxed store (atomic, whole); a plain store there is a data race, and the simulator names both accesses."""
    from flowdsl.sim import DataRaceError

    push = alltoall_lsa.push.py_func

    @flowdsl.device
    def plain_push(comm, send, win, count, relaxed):
        push(comm, send, win, count, False)

    monkeypatch.setattr(alltoall_lsa, "push", plain_push)
    with pytest.raises(DataRaceError, match=r"(?s)atomic read .*alltoall_lsa_poison.*write .*\(push\)"):
        flowdsl.sim.spawn(lambda c: alltoall_lsa.run_poison(c, count=40, blocks=2, threads=64), nranks=2,
                          seed=1, races=True)


_EXAMPLES = sorted(p.stem for p in __import__("pathlib").Path(flowdsl.__file__).parent.joinpath("examples").glob("*.py")
                   if not p.stem.startswith("_"))


def test_every_example_runs_from_the_command_line():
    """``python -m flowdsl.examples.<name>`` runs each one (a newcomer found ten that printed nothing)."""
    import pathlib

    root = pathlib.Path(flowdsl.__file__).parent / "examples"
    silent = [name for name in _EXAMPLES if 'if __name__ == "__main__":' not in (root / f"{name}.py").read_text()]
    assert silent == []


@pytest.mark.filterwarnings("ignore:'flowdsl.examples.* found in sys.modules:RuntimeWarning")  # run again as __main__
@pytest.mark.parametrize("name", [n for n in _EXAMPLES if n not in ("allgather_lsa", "tp_mlp")])
def test_an_examples_command_line_says_it_matched_numpy(name, capsys, monkeypatch):
    import runpy

    monkeypatch.setattr("sys.argv", [name, "--sim"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module(f"flowdsl.examples.{name}", run_name="__main__")
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{name}: ") and "on the CPU simulator" in out and out.rstrip().endswith(
        "every result equal to NumPy's: OK"), out


# ---- NCCL's contrib/custom_algos/allreduce: the three multimem all-reduces -------------------------------------
MULTIMEM_ALLREDUCES = ["run_oneshot", "run_twoshot", "run_poison"]


@pytest.mark.parametrize("nranks", [1, 2, 4])
@pytest.mark.parametrize("variant", MULTIMEM_ALLREDUCES)
def test_allreduce_multimem_matches_numpy_in_every_call(variant, nranks):
    """Several calls on one device communicator, new random inputs each, outputs poisoned (NaN, or the poison's
    .w) first, the race detector on, on a simulated NVLink SHARP switch: every call's sums bit-equal to NumPy's
    float32 sums in LSA rank order (the order the simulated switch adds in)."""
    run = getattr(allreduce_multimem, variant)
    for calls in flowdsl.sim.spawn(lambda c: run(c, lines=12 * nranks, blocks=3, threads=32, seed=nranks),
                                   nranks=nranks, seed=nranks, races=True, multimem=True):
        assert len(calls) == (5 if variant == "run_poison" else 3)
        for result, reference in calls:
            np.testing.assert_array_equal(result, reference)


@for_seeds(3)
def test_allreduce_multimem_poison_under_seeds(seed):
    """Five calls with no host barrier between them, three receive windows rotating, a block with no part of the
    chunk (12 lines over 4 ranks, 3 per rank, 4 blocks), under several interleavings."""
    for calls in flowdsl.sim.spawn(lambda c: allreduce_multimem.run_poison(c, lines=12, blocks=4, threads=32,
                                                                           calls=7, seed=seed),
                                   nranks=4, seed=seed, races=True, multimem=True):
        for result, reference in calls:
            np.testing.assert_array_equal(result, reference)


def test_allreduce_multimem_poison_with_nccls_clear_takes_a_stale_line(monkeypatch):
    """NCCL's kernel re-poisons only its own chunk of its local copy: another rank's chunk there keeps the sums of
    three calls before, and three calls later the poll passes over it before that rank wrote it again. The
    simulator says so where the line is taken (wait.accepted)."""
    from flowdsl.sim import StaleDataError

    repoison = allreduce_multimem.repoison.py_func
    block_part = allreduce_multimem._block_part.py_func

    @flowdsl.device
    def own_chunk_only(comm, clear_win, lines, first, last):
        mine, start, end, _ = block_part(comm, lines)
        repoison(comm, clear_win, lines, mine + start, mine + end)

    monkeypatch.setattr(allreduce_multimem, "repoison", own_chunk_only)
    with pytest.raises(StaleDataError, match=r"(?s)as fresh data from rank \d: .*launch #0 of rank .*launch #3 of "
                                             r"rank \d\)"):
        flowdsl.sim.spawn(lambda c: allreduce_multimem.run_poison(c, lines=16, blocks=2, threads=32, calls=6),
                          nranks=2, seed=0, races=True, multimem=True)


def test_allreduce_multimem_poison_with_a_weak_multimem_store_is_a_data_race(monkeypatch):
    """NCCL stores the line with the weak multimem.st, which the peers' relaxed polls of .w race with under PTX's
    memory model; the simulator names both accesses."""
    from flowdsl.sim import DataRaceError, semantics

    weak = semantics.SEMANTICS["flowdsl.mem.multimem_store_vec"]
    monkeypatch.setitem(semantics.SEMANTICS, "flowdsl.mem.multimem_store_vec_relaxed",
                        lambda view, index, values, scope: weak(view, index, values))
    with pytest.raises(DataRaceError, match=r"(?s)write by rank .*atomic read by rank .*twoshot_mc_poison_allreduce"):
        flowdsl.sim.spawn(lambda c: allreduce_multimem.run_poison(c, lines=16, blocks=2, threads=32),
                          nranks=2, seed=1, races=True, multimem=True)


@pytest.mark.parametrize("variant", MULTIMEM_ALLREDUCES)
def test_allreduce_multimem_is_refused_without_a_switch(variant):
    run = getattr(allreduce_multimem, variant)
    with pytest.raises(flowdsl.UsageError, match=r"Cannot create a device communicator with lsa_multimem=True: this "
                                                 r"simulated system has no NVLink SHARP"):
        run_ranks(lambda c: run(c, lines=8), nranks=2)


def test_allreduce_multimem_command_runs_on_a_switch_and_refuses_in_one_line_without(capsys):
    """``python -m flowdsl.examples.allreduce_multimem``: OK on the simulator's switch; where the system has no
    NVLink SHARP (here a simulated one without a switch, as a GPU without NVLS refuses in the same words) one line
    on stderr and status 2, no traceback."""
    from flowdsl.examples import _cli

    assert allreduce_multimem.main(["--sim", "--ranks", "2"]) == 0
    assert "allreduce_multimem: 2 rank(s) on the CPU simulator" in capsys.readouterr().out
    assert _cli.main("allreduce_multimem", allreduce_multimem.run, allreduce_multimem.WHAT,
                     argv=["--sim", "--ranks", "2"], multimem=False) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m flowdsl.examples.allreduce_multimem: error: Cannot create a device communicator "
                          "with lsa_multimem=True: this simulated system has no NVLink SHARP") and \
        "Traceback" not in err and err.count("\n") == 1, err


def test_allreduce_multimem_refuses_lines_it_cannot_split_and_two_nodes():
    with pytest.raises(flowdsl.UsageError, match=r"twoshot_mc_allreduce with lines=10: each rank owns an equal "
                                                 r"chunk of the 16-byte lines. Use a positive multiple of 4"):
        run_ranks(lambda c: allreduce_multimem.run_twoshot(c, lines=10), nranks=4, multimem=True)
    with pytest.raises(flowdsl.UsageError, match=r"oneshot_mc_allreduce on 4 ranks in LSA teams of 2: its multicast "
                                                 r"address reaches one LSA team"):
        run_ranks(lambda c: allreduce_multimem.run_oneshot(c, lines=8), nranks=4, nodes=2, multimem=True)
