"""The unchanged examples on 1, 2, 3, 4 and 8 simulated ranks match NumPy."""

import numpy as np
import pytest

import flowdsl

from flowdsl.testing import assert_ranks_close, for_seeds, run_ranks

from flowdsl.examples import allgather_lsa, allreduce_lsa, alltoall_lsa, rmsnorm_lsa, rmsnorm_multimem

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
