"""The unchanged examples on 1, 2, 3, 4 and 8 simulated ranks match NumPy."""

import numpy as np
import pytest

from flowdsl.testing import assert_ranks_close, for_seeds, run_ranks

from flowdsl.examples import allgather_lsa, rmsnorm_lsa

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
