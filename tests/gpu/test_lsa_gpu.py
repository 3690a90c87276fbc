"""On a real GPU through real NCCL (one rank per GPU): the LSA examples match NumPy."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("nothing_left_open")]


@pytest.mark.parametrize("tokens_per_rank,hidden", [(64, 1024), (7, 333)])
def test_rmsnorm_lsa_matches_numpy(comm, tokens_per_rank, hidden):
    from flowdsl.examples import rmsnorm_lsa

    result, reference = rmsnorm_lsa.run(comm, tokens_per_rank=tokens_per_rank, hidden=hidden, seed=hidden)
    np.testing.assert_allclose(result, reference, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint8])
@pytest.mark.parametrize("count", [1, 4097, 1 << 20])
def test_allgather_lsa_matches_numpy(comm, count, dtype):
    from flowdsl.examples import allgather_lsa

    result, reference = allgather_lsa.run(comm, count=count, dtype=dtype, seed=count)
    np.testing.assert_array_equal(result, reference)


@pytest.mark.parametrize("count", [1, 4097, 1 << 20])
def test_allreduce_lsa_matches_numpy_bit_for_bit(comm, count):
    """NCCL's 01_allreduce_lsa as a flowdsl program (its grid: 16 blocks of 512 threads)."""
    from flowdsl.examples import allreduce_lsa

    result, reference = allreduce_lsa.run(comm, count=count, blocks=16, threads=512, seed=count)
    np.testing.assert_array_equal(result, reference)


@pytest.mark.parametrize("variant", ["run", "run_poison"], ids=["barrier", "poison"])
def test_alltoall_lsa_matches_numpy_in_every_call(comm, variant):
    """NCCL's two LSA all-to-alls (contrib/custom_algos) as flowdsl programs, 5 calls (the poison one's windows
    rotate, and its calls past the second meet at no barrier)."""
    from flowdsl.examples import alltoall_lsa

    for result, reference in getattr(alltoall_lsa, variant)(comm, count=1 << 16, blocks=8, threads=256, calls=5):
        np.testing.assert_array_equal(result, reference)


def test_torch_buffers_share_the_symmetric_memory(comm):
    torch = pytest.importorskip("torch")
    import flowdsl
    from flowdsl.examples.allgather_lsa import allgather_lsa

    src = comm.alloc(1000, np.float32, like="torch")
    out = comm.alloc(1000, np.float32, like="torch")
    assert isinstance(src, torch.Tensor) and src.is_cuda
    src.copy_(torch.arange(1000, dtype=torch.float32, device=src.device) * 0.5 - 7)
    out.fill_(float("nan"))
    with comm.register(out) as win, comm.device_communicator(lsa_barrier_count=2) as dcomm:
        allgather_lsa[2, 128](dcomm, src, win, 1000)
        comm.synchronize()
    np.testing.assert_array_equal(out.cpu().numpy(), np.arange(1000, dtype=np.float32) * 0.5 - 7)
    assert isinstance(win, flowdsl.Window)
