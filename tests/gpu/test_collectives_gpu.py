"""The GENK collectives and Flow's protocols on a real GPU through real NCCL (one rank).

With one rank each collective reduces to a local copy inside its program, so the
multi-rank protocol paths are also run here by a rank sending to itself through a
real connection (examples/flow_loopback.py): two blocks, hundreds of slots,
credits and flags through GPU memory. Outputs are poisoned before every call.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "uint8", "float8_e4m3fn", "float8_e5m2")
OPS = ("sum", "prod", "min", "max", "avg")


@pytest.fixture(scope="module")
def comm():
    import flowdsl

    with flowdsl.init() as c:
        yield c


def _poison(buf, dtype=None):
    import cupy

    from flowdsl.collectives import check

    if dtype is not None:
        buf.fill(check.poison(dtype))
    elif buf.dtype.kind == "f":
        buf.fill(np.nan)
    else:
        buf.view(cupy.uint8).fill(0xA5)


def _cases():
    from flowdsl.collectives.programs import PROGRAMS

    for (alg, collective), dtype in itertools.product(PROGRAMS, DTYPES):
        ops = OPS if collective in ("all_reduce", "reduce_scatter", "reduce") else (None,)
        for op in ops:
            yield alg, collective, dtype, op


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
def test_every_collective_dtype_op_matches_numpy(comm, inplace):
    """Every (algorithm, collective, dtype, op) at one rank, at counts 0, 1, 4099 and 2**20 + 3."""
    import cupy

    from flowdsl import collectives as coll
    from flowdsl.collectives import check

    failures = []
    counts = (0, 1, 4099, (1 << 20) + 3)
    for i, (alg, collective, dtype, op) in enumerate(_cases()):
        count = counts[i % len(counts)]
        rng = np.random.default_rng(i)
        ins = check.inputs(rng, dtype, op or "sum", 1, count)
        store = check.storage_dtype(dtype)
        src = comm.alloc(count, store)
        src.set(ins[0])
        if inplace:
            dst = None
        else:
            dst = comm.alloc(count, store)
            _poison(dst, dtype)
        kwargs = {"algorithm": alg}
        if dtype.startswith("float8"):  # CuPy has no fp8: uint8 arrays, and the call says what they hold
            kwargs["dtype"] = dtype
        if op:
            kwargs["op"] = op
        getattr(coll, collective)(comm, src, dst, **kwargs)
        comm.synchronize()
        result = (src if dst is None else dst).get()
        expected = check.reference(collective, ins, dtype, op, 0)[0]
        try:
            check.compare(result, expected, dtype, 1, f"{alg} {collective} {dtype} {op} count={count}")
        except AssertionError as exc:
            failures.append(str(exc))
        for buf in (src, dst):
            if buf is not None and buf.size:
                comm.free(buf)
        cupy.get_default_memory_pool().free_all_blocks()
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("protocol", ["SIMPLE", "LL", "LL128"])
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("bfloat16", "max"), ("float16", "avg"),
                                      ("int64", "prod"), ("uint8", "min")])
def test_flow_protocols_through_a_real_connection(comm, protocol, dtype, op):
    from flowdsl import Protocol
    from flowdsl.collectives import check
    from flowdsl.examples import flow_loopback

    result, expected = flow_loopback.run(comm, Protocol[protocol], dtype, op, n=100_003, seed=7)
    check.compare(result, expected, dtype, 2, f"loopback {protocol} {dtype} {op}")


def test_torch_tensors_bfloat16_and_fp8(comm):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    from flowdsl import collectives as coll

    x = comm.alloc(1000, np.float32, like="torch")
    x.copy_(torch.linspace(-1, 1, 1000, device=x.device))
    b = torch.empty(1000, dtype=torch.bfloat16, device=x.device)
    b.copy_(x)
    y = torch.full_like(b, float("nan"))
    coll.all_reduce(comm, b, y, op="max", algorithm="ring")
    torch.cuda.synchronize()
    assert torch.equal(y, b)
    out = torch.full((1000,), float("nan"), device=x.device)
    coll.broadcast(comm, x, out, algorithm="ring")
    torch.cuda.synchronize()
    assert torch.equal(out, x)
    f8 = x.to(torch.float8_e4m3fn)
    f8_out = torch.full((1000,), float("nan"), device=x.device).to(torch.float8_e4m3fn)
    coll.all_reduce(comm, f8, f8_out, op="avg", algorithm="tree")
    torch.cuda.synchronize()
    assert torch.equal(f8_out.view(torch.uint8), f8.view(torch.uint8))


def test_nccl_algorithm_and_repeated_calls_agree(comm):
    """``algorithm="nccl"`` is NCCL's host collective; flowdsl's repeated (planned) calls match it."""
    import cupy

    from flowdsl import collectives as coll

    x = comm.alloc(1 << 16, np.float32)
    x.set(np.random.default_rng(3).standard_normal(1 << 16).astype(np.float32))
    a = comm.alloc(1 << 16, np.float32)
    b = comm.alloc(1 << 16, np.float32)
    for _ in range(3):  # the second and third calls take the planned fast path
        _poison(a)
        coll.all_reduce(comm, x, a, op="sum", algorithm="ring")
    coll.all_reduce(comm, x, b, op="sum", algorithm="nccl")
    comm.synchronize()
    cupy.testing.assert_array_equal(a, b)


def test_bad_input_on_the_gpu(comm):
    import cupy

    import flowdsl
    from flowdsl import collectives as coll

    x = comm.alloc(64, np.float32)
    with pytest.raises(flowdsl.UsageError, match="is not contiguous"):
        coll.all_reduce(comm, x[::2])
    with pytest.raises(flowdsl.UsageError, match="is a NumPy array in host memory"):
        coll.all_reduce(comm, x, np.zeros(64, np.float32))
    with pytest.raises(flowdsl.UsageError, match="src is float32 but dst is int32"):
        coll.all_reduce(comm, x, cupy.zeros(64, cupy.int32))
    with pytest.raises(flowdsl.UsageError, match="unknown algorithm"):
        coll.reduce(comm, x, algorithm="butterfly")


def test_all_reduce_fused_with_bias_gelu(comm):
    from flowdsl.examples import allreduce_bias_gelu

    result, reference = allreduce_bias_gelu.run(comm, count=(1 << 20) + 7, channels=32, threads=256,
                                                nslots=4, slot_bytes=64 * 1024)
    np.testing.assert_allclose(result, reference, rtol=1e-5, atol=1e-5)
