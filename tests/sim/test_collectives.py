"""The GENK collectives on the simulator: every collective, dtype, op and placement against NumPy.

The matrix is :mod:`flowdsl.collectives.check`'s, the one the GPU tests run: the
same cases, made by the same code. One spawn per topology runs the whole matrix
(so the simulator starts once); outputs are poisoned, so an element a program
forgets to write fails the comparison. Protocols rotate over the calls and the
staging is tiny (two 128-byte slots), so every call crosses many slots.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import flowdsl
from flowdsl import Protocol
from flowdsl import collectives as coll
from flowdsl.collectives import check
from flowdsl.sim import spawn

pytestmark = pytest.mark.sim

PROTOCOLS = (Protocol.SIMPLE, Protocol.LL, Protocol.LL128)
# Tiny staging: two 128-byte slots per connection, so every call crosses many slots.
# Two warps: the second is the sync warp (posts and credits) while the first moves data, as on GPUs.
TINY = coll.FlowConfig(channels=2, nslots=2, slot_bytes=128, threads=64)



def _usage_errors(calls):
    """The message of the UsageError each call raises, or "no error"."""
    errors = []
    for call in calls:
        try:
            call()
        except flowdsl.UsageError as exc:
            errors.append(str(exc))
        else:
            errors.append("no error")
    return errors

def _run(nranks, nodes, seed, **matrix):
    """Run the matrix on ``nranks`` simulated ranks; fail with the first mismatches of every rank."""
    def main(comm):
        return check.run_matrix(comm, check.cases(comm.nranks, protocols=PROTOCOLS, config=TINY, start=seed,
                                                  lsa_size=comm.lsa_size, **matrix))
    failures = [f for rank in spawn(main, nranks=nranks, nodes=nodes, seed=seed,
                                    gin_delivery="reordered" if nodes > 1 else "ordered") for f in rank]
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:20])


TOPOLOGIES = [(1, 1), (2, 1), (3, 1), (4, 1), (8, 1), (8, 2)]


@pytest.mark.parametrize("nranks,nodes", TOPOLOGIES, ids=[f"{n}ranks-{k}nodes" for n, k in TOPOLOGIES])
def test_every_collective_dtype_op_placement(nranks, nodes):
    counts = (0, 1, 37, 131, 8) if nranks < 8 else (0, 1, 29, 8)  # 8 ranks: fewer slots, same cases
    _run(nranks, nodes, nranks, counts=counts)


@pytest.mark.parametrize("seed", [1, 2])
def test_two_nodes_reordered_seeds(seed):
    """2 nodes x 4 ranks, GIN across, reordered delivery, more scheduler seeds (float32, all ops)."""
    _run(8, 2, seed, counts=(53,), dtypes=("float32",))


INTEGERS = ("int8", "uint8", "int32", "uint32", "int64", "uint64")


@pytest.mark.parametrize("dtype", INTEGERS)
def test_integers_wrap_and_avg_divides_the_wrapped_sum(dtype):
    """Inputs over the whole range of the type: sum and prod wrap in the element type, min and max
    compare signed or unsigned as the type is, and avg is NCCL's SumPostDiv: the wrapping sum, then
    divided truncating toward zero. The expected values come from NumPy's own wrapping arithmetic."""
    nranks, count = 3, 37
    info = np.iinfo(dtype)
    rng = np.random.default_rng(11)
    ins = [rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True) for _ in range(nranks)]
    ins[0][:4] = (info.max, info.min, info.max, 0)  # sums that wrap for certain
    ins[1][:4] = (info.max, info.min, 1, info.min)
    stack = np.stack(ins)
    wrapped = np.add.reduce(stack, axis=0, dtype=dtype)
    expected = {
        "sum": wrapped,
        "prod": np.multiply.reduce(stack, axis=0, dtype=dtype),
        "min": stack.min(0), "max": stack.max(0),
        "avg": np.array([abs(int(x)) // nranks * (-1 if x < 0 else 1) for x in wrapped]).astype(dtype),
    }
    calls = [(algorithm, collective, op) for algorithm, collective in
             [("ring", "all_reduce"), ("tree", "all_reduce"), ("one_shot", "all_reduce"), ("ring", "reduce"),
              ("ring", "reduce_scatter")] for op in expected]

    def main(comm):
        out = []
        for i, (algorithm, collective, op) in enumerate(calls):
            config = dataclasses.replace(TINY, protocol=PROTOCOLS[i % 3])
            if collective == "reduce_scatter":  # rank r's piece of every rank's concatenated inputs
                src = comm.alloc(nranks * count, dtype)
                src[:] = np.concatenate([np.roll(ins[comm.rank], k) for k in range(nranks)])
                dst = comm.alloc(count, dtype)
            else:
                src, dst = comm.alloc(count, dtype), comm.alloc(count, dtype)
                src[:] = ins[comm.rank]
            dst[:] = check.poison(dtype)
            kwargs = {"root": 1} if collective == "reduce" else {}
            getattr(coll, collective)(comm, src, dst, op=op, algorithm=algorithm, config=config, **kwargs)
            comm.synchronize()
            out.append(np.array(dst))
        return out

    for rank, results in enumerate(spawn(main, nranks=nranks, seed=4)):
        for (algorithm, collective, op), got in zip(calls, results):
            if collective == "reduce" and rank != 1:
                continue
            # reduce_scatter: piece r of rank q is ins[q] rolled by r, so rank r's result is the rolled result
            want = np.roll(expected[op], rank) if collective == "reduce_scatter" else expected[op]
            np.testing.assert_array_equal(got, want, err_msg=f"{algorithm} {collective} {op} rank {rank}")


def test_premulsum_rounds_each_product_then_the_sum():
    """The exact definition, bit for bit, on 2 ranks (a sum of two is the same in either order): each
    rank's product in the element type (float16, bfloat16 and fp8 multiplied in float32 and rounded
    once; float32 and float64 in their own type), then the sum, rounded once more. The expected bits
    are NumPy's (fp8 by flowdsl/_fp8.py's table)."""
    from flowdsl import _fp8

    rng = np.random.default_rng(5)
    count = 61
    cases = {}
    for dtype in ("float16", "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e5m2"):
        x = rng.uniform(-2, 2, (2, count))
        s = rng.uniform(0.5, 1.0, 2) * np.array([1.0, -1.0])
        if dtype.startswith("float8"):
            fmt = _fp8.E4M3 if dtype == "float8_e4m3fn" else _fp8.E5M2
            x, s = _fp8.to_fp8(x, fmt), _fp8.to_fp8(s, fmt)
            xv, sv = _fp8.from_fp8(x, fmt), _fp8.from_fp8(s, fmt)
            products = [_fp8.from_fp8(_fp8.to_fp8(xv[r] * sv[r], fmt), fmt).astype(np.float32) for r in range(2)]
            want = _fp8.to_fp8(products[0] + products[1], fmt)
        elif dtype == "bfloat16":
            x, s = check.bf16_bits(x), check.bf16_bits(s)
            xv, sv = check.bf16_values(x), check.bf16_values(s)
            products = [check.bf16_values(check.bf16_bits(xv[r] * sv[r])) for r in range(2)]
            want = check.bf16_bits(products[0] + products[1])
        else:
            x, s = x.astype(dtype), s.astype(dtype)
            if dtype == "float16":
                products = [np.float16(x[r].astype(np.float32) * np.float32(s[r])) for r in range(2)]
                want = (products[0].astype(np.float32) + products[1].astype(np.float32)).astype(np.float16)
            else:
                products = [x[r] * s[r] for r in range(2)]
                want = products[0] + products[1]
        cases[dtype] = (x, s, np.asarray(want))

    def main(comm):
        out = {}
        for i, (dtype, (x, s, _)) in enumerate(cases.items()):
            src, dst = comm.alloc(count, x.dtype), comm.alloc(count, x.dtype)
            src[:] = x[comm.rank]
            kwargs = {"dtype": dtype} if dtype.startswith("float8") else {}
            config = dataclasses.replace(TINY, protocol=PROTOCOLS[i % 3])
            coll.all_reduce(comm, src, dst, op=coll.premul_sum(check._values(s[comm.rank:comm.rank + 1], dtype)[0]),
                            algorithm="ring", config=config, **kwargs)
            comm.synchronize()
            out[dtype] = np.array(dst)
        return out

    for got in spawn(main, nranks=2, seed=2):
        for dtype, (_, _, want) in cases.items():
            bits = f"u{want.dtype.itemsize}"
            np.testing.assert_array_equal(got[dtype].view(bits), want.view(bits), err_msg=dtype)


def test_premulsum_reads_a_device_scalar_when_the_kernel_runs():
    """A device scalar is read by each launch (a repeated, planned call sees the new value); a host
    immediate is the value it was made with; one rank multiplies too."""
    for nranks in (1, 3):
        def main(comm):
            x = comm.alloc(40, np.float32)
            x[:] = np.arange(40, dtype=np.float32)
            y = comm.alloc(40, np.float32)
            scalar = comm.alloc(1, np.float32)
            op = coll.premul_sum(scalar)
            seen = []
            for value in (2.0, -0.5):  # the same arrays and op: the second call runs the planned launch
                scalar[:] = value * (comm.rank + 1)
                coll.all_reduce(comm, x, y, op=op, algorithm="ring", config=TINY)
                comm.synchronize()
                seen.append(np.array(y))
            host = coll.premul_sum(np.float32(4.0))
            coll.all_reduce(comm, x, y, op=host, algorithm="ring", config=TINY)
            comm.synchronize()
            seen.append(np.array(y))
            return seen

        ranks = sum(range(1, nranks + 1))
        for seen in spawn(main, nranks=nranks):
            base = np.arange(40, dtype=np.float32)
            np.testing.assert_array_equal(seen[0], base * 2.0 * ranks)
            np.testing.assert_array_equal(seen[1], base * -0.5 * ranks)
            np.testing.assert_array_equal(seen[2], base * 4.0 * nranks)


def test_premulsum_bad_input_is_refused_before_launch():
    def main(comm):
        x = comm.alloc(8, np.float32)
        h = comm.alloc(8, np.float16)
        i8 = comm.alloc(8, np.int8)
        i32 = comm.alloc(8, np.int32)
        f32_scalar = comm.alloc(1, np.float32)
        calls = [
            lambda: coll.all_reduce(comm, x, op="premulsum"),
            lambda: coll.reduce(comm, x, op=flowdsl.RedOp.PREMULSUM),
            lambda: coll.all_reduce(comm, i32, op=coll.premul_sum(0.5)),
            lambda: coll.reduce_scatter(comm, comm.alloc(8, np.int8), comm.alloc(4, np.int8),
                                        op=coll.premul_sum(300)),
            lambda: coll.all_reduce(comm, h, op=coll.premul_sum(1e6)),
            lambda: coll.all_reduce(comm, h, op=coll.premul_sum(f32_scalar)),
            lambda: coll.all_reduce(comm, x, op=coll.premul_sum(comm.alloc(2, np.float32))),
            lambda: coll.all_reduce(comm, x, op=coll.premul_sum("2")),
            lambda: coll.all_reduce(comm, i8, op=coll.premul_sum(np.zeros(3))),
            lambda: coll.all_reduce(comm, comm.alloc(8, np.uint8), dtype="float8_e4m3fn",
                                    op=coll.premul_sum(1000.0)),
        ]
        return _usage_errors(calls)
    expected = [
        "Cannot all_reduce with op='premulsum': premulsum multiplies each rank's input by that rank's scalar, and "
        "none was given. Pass op=flowdsl.collectives.premul_sum(scalar)",
        "Cannot reduce with op=<RedOp.PREMULSUM: 5>: premulsum multiplies",
        "Cannot all_reduce int32 with premul_sum(0.5): 0.5 is not an integer, and NCCL takes the scalar in the "
        "data's type. Pass an integer scalar",
        "Cannot reduce_scatter int8 with premul_sum(300): 300 is outside int8's range (-128..127). Pass a scalar "
        "that int8 holds",
        "Cannot all_reduce float16 with premul_sum(1000000.0): 1000000.0 is outside float16's range (±65504)",
        "Cannot all_reduce float16 with premul_sum(<one-element float32 device array>): its scalar is float32, and "
        "NCCL takes the scalar in the data's type. Pass a one-element array of float16",
        "Cannot make premul_sum over a device array of 2 elements: the scalar is one element",
        "Cannot make premul_sum('2'): the scalar must be a real number (a host immediate) or a one-element device "
        "array, got str. Pass an int or a float",
        "Cannot make premul_sum over a NumPy array of 3 elements",
        "Cannot all_reduce float8_e4m3fn with premul_sum(1000.0): 1000.0 is outside float8_e4m3fn's range (±448)",
    ]
    for errors in spawn(main, nranks=2):
        assert len(errors) == len(expected)
        for got, want in zip(errors, expected):
            assert want in got, (want, got)


def test_larger_slots_and_channels():
    """Default-like shapes: 4 slots, 4 channels, a count that is prime and spans many chunks."""
    def main(comm):
        rng = np.random.default_rng(7)
        ins = [rng.standard_normal(4099).astype(np.float32) for _ in range(comm.nranks)]
        out = []
        for proto in PROTOCOLS:
            x = comm.alloc(4099, np.float32)
            x[:] = ins[comm.rank]
            y = comm.alloc(4099, np.float32)
            cfg = coll.FlowConfig(channels=4, nslots=4, slot_bytes=512, threads=64, protocol=proto)
            coll.all_reduce(comm, x, y, algorithm="ring", config=cfg)
            comm.synchronize()
            out.append(np.array(y))
        return out, sum(ins)
    for results, expected in spawn(main, nranks=4, nodes=2, seed=5, gin_delivery="reordered"):
        for proto, got in zip(PROTOCOLS, results):
            check.compare(got, expected, "float32", 4, f"ring all_reduce {proto.name}")


def test_bad_input_is_refused_before_launch():
    def main(comm):
        x = comm.alloc(10, np.float32)
        y16 = comm.alloc(10, np.float16)
        y = comm.alloc(11, np.float32)
        cases = [
            lambda: coll.all_reduce(comm, x, y16),
            lambda: coll.all_reduce(comm, x, y),
            lambda: coll.reduce_scatter(comm, comm.alloc(9, np.float32), comm.alloc(4, np.float32)),
            lambda: coll.all_gather(comm, x, comm.alloc(10, np.float32)),
            lambda: coll.broadcast(comm, x, root=7),
            lambda: coll.all_reduce(comm, x, op="median"),
            lambda: coll.all_reduce(comm, x, algorithm="fastest"),
            lambda: coll.all_gather(comm, x, comm.alloc(20, np.float32), algorithm="tree"),
            lambda: coll.all_reduce(comm, np.zeros(10, np.float32)),
            lambda: coll.all_reduce(comm, comm.alloc(10, np.int16)),
            lambda: coll.all_reduce(comm, x, algorithm="nccl"),
            lambda: coll.all_reduce(None, x),
            lambda: (coll.all_reduce(comm, x, algorithm="ring"), comm.close(),
                     coll.all_reduce(comm, x, algorithm="ring")),
        ]
        return _usage_errors(cases)
    errors = spawn(main, nranks=2)[0]
    expected = [
        "src is float32 but dst is float16",
        "dst has 11 elements but 10 are needed",
        "src has 9 elements, not a multiple of nranks=2",
        "dst has 10 elements but 20 are needed (src's 10 elements, times nranks=2). Pass a dst of 20 elements",
        "root 7 is not a rank of this communicator (0..1)",
        "unknown op 'median'. Use one of sum, prod, min, max, avg or flowdsl.collectives.premul_sum(scalar)",
        "unknown algorithm 'fastest'",
        "only all_reduce has a tree program",
        "is a NumPy array in host memory",
        "has dtype int16; the collectives take",
        "this communicator has no NCCL host communicator",
        "is not a flowdsl communicator",
        "the communicator is closed, and with it its device communicator",
    ]
    assert len(errors) == len(expected)
    for got, want in zip(errors, expected):
        assert want in got, (want, got)


@pytest.mark.parametrize("nranks,nodes", [(1, 1), (3, 1), (8, 2)])
def test_all_reduce_fused_with_bias_gelu(nranks, nodes):
    """The example that fuses an epilogue into the ring all-reduce, every protocol."""
    from flowdsl.examples import allreduce_bias_gelu

    for protocol in PROTOCOLS:
        for result, reference in spawn(lambda comm: allreduce_bias_gelu.run(comm, count=301, protocol=protocol),
                                       nranks=nranks, nodes=nodes, seed=nranks, gin_delivery="reordered"):
            np.testing.assert_allclose(result, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nranks,nodes", [(1, 1), (2, 1), (4, 1), (8, 2)])
def test_direct_steps_all_gather(nranks, nodes):
    from flowdsl.examples import allgather_direct

    for result, reference in spawn(lambda comm: allgather_direct.run(comm, count=301), nranks=nranks, nodes=nodes,
                                   seed=nranks, gin_delivery="reordered"):
        np.testing.assert_array_equal(result, reference)


def test_auto_picks_a_program_and_matches():
    """``algorithm="auto"`` on the simulator (no NCCL host collective there): ring or tree by the cost model."""
    def main(comm):
        x = comm.alloc(517, np.float32)
        x[:] = np.arange(517, dtype=np.float32) * (comm.rank + 1)
        y = comm.alloc(517, np.float32)
        coll.all_reduce(comm, x, y, op="max", config=coll.FlowConfig(channels=2, nslots=2, slot_bytes=256,
                                                                     threads=32))
        comm.synchronize()
        return np.array(y)
    for result in spawn(main, nranks=4, nodes=2, seed=3, gin_delivery="reordered"):
        np.testing.assert_array_equal(result, np.arange(517, dtype=np.float32) * 4)


def test_one_rank_fills_the_gpu_with_more_blocks_than_channels():
    """At one rank a collective is a local copy on a grid that fills the GPU (one block per 64 KiB), past the
    staging's channels: no program may make a Flow processor there (a GPU run found every program's kernel
    refusing channel 46 of 24)."""
    count = 3 * 64 * 1024 // 4  # three blocks of float32
    assert coll.cost.channels_for(count * 4, 1, TINY) > TINY.channels
    _run(1, 1, 0, counts=(count,), dtypes=("float32",), ops=("sum",))


def test_all_to_all_refuses_in_place_a_wrong_size_and_too_few_channels():
    def main(comm):
        n = comm.nranks
        src, dst = comm.alloc(n * 8, np.float32), comm.alloc(n * 8, np.float32)
        both = comm.alloc(n * 8 + 4, np.float32)
        return _usage_errors([
            lambda: coll.all_to_all(comm, src, src),
            lambda: coll.all_to_all(comm, src, None),
            lambda: coll.all_to_all(comm, src, comm.alloc(n * 8 - 1, np.float32)),
            lambda: coll.all_to_all(comm, comm.alloc(n * 8 + 1, np.float32), dst),
            lambda: coll.all_to_all(comm, src, dst, algorithm="ring"),
            lambda: coll.all_to_all(comm, src, dst, config=coll.FlowConfig(channels=2)),
            lambda: coll.all_to_all(comm, both[:n * 8], both[4:n * 8 + 4]),
        ])

    errors = spawn(main, nranks=10)[0]
    assert errors[0] == errors[1] == ("Cannot all_to_all in place: a rank's block for a peer would be overwritten "
                                      "by the peer's block before it is sent. Pass a dst of its own")
    assert errors[2] == ("Cannot all_to_all: dst has 79 elements but 80 are needed (src's 80 elements / "
                         "nranks=10, times nranks=10). Pass a dst of 80 elements")
    assert errors[3].startswith("Cannot all_to_all: src has 81 elements, not a multiple of nranks=10")
    assert errors[4].startswith("Cannot all_to_all with algorithm='ring': only ")
    assert errors[5] == ("Cannot all_to_all over 10 ranks with FlowConfig(channels=2): its 9 pairwise rounds take "
                         "4 connections a channel, so at least 3 channels. Pass FlowConfig(channels=3) or more")
    assert errors[6].startswith("Cannot all_to_all with dst overlapping src: a rank's block")


def test_empty_arrays_are_never_one_buffer():
    """CuPy gives every empty array the address 0: a GPU run took an out-of-place all_to_all of 0 elements for an
    in-place one and refused it. Two empty arrays share no memory, whatever their addresses."""
    from flowdsl.collectives._host import _Buffer

    class Empty:
        def __init__(self, n=0):
            self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (0, False), "version": 3}

    a, b = _Buffer(Empty(), "src", "all_to_all"), _Buffer(Empty(), "dst", "all_to_all")
    assert not a.same_memory(b) and not a.overlaps(b)
    c, d = _Buffer(Empty(4), "src", "all_to_all"), _Buffer(Empty(4), "dst", "all_to_all")
    assert c.same_memory(d) and c.overlaps(d)


def test_empty_buffers_share_one_address_as_cupys_do():
    """The simulator's empty buffers lie where CuPy's do, all at one address: the call sequences at count 0
    then meet what a GPU meets (an out-of-place call of two empty arrays looked in place there)."""
    def main(comm):
        a, b = comm.alloc(0, np.float32), comm.alloc((0, 3), np.int64)
        c = comm.alloc(0, np.float32)
        comm.free(c)
        coll.all_to_all(comm, a, comm.alloc(0, np.float32))
        comm.synchronize()
        return a.__array_interface__["data"][0] == b.__array_interface__["data"][0], b.shape

    assert spawn(main, nranks=2) == [(True, (0, 3))] * 2
