"""The GENK collectives on the simulator: every collective, dtype, op and placement against NumPy.

One spawn per topology runs the whole matrix (so the simulator starts once);
outputs are poisoned by ``comm.alloc`` (NaN / 0xA5 bytes), so an element a
program forgets to write fails the comparison. Protocols rotate over the calls
and the staging is tiny (two 128-byte slots), so every call crosses many slots.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import flowdsl
from flowdsl import Protocol
from flowdsl import collectives as coll
from flowdsl.collectives import check
from flowdsl.sim import spawn

pytestmark = pytest.mark.sim

OPS = ("sum", "prod", "min", "max", "avg")
CASES = [(alg, c) for (alg, c) in coll.programs.PROGRAMS]
PROTOCOLS = (Protocol.SIMPLE, Protocol.LL, Protocol.LL128)


def _config(i):
    return coll.FlowConfig(channels=2, nslots=2, slot_bytes=128, threads=32, protocol=PROTOCOLS[i % 3])


def _run_matrix(comm, seed, dtypes, counts, cases=CASES, ops=OPS):
    """Run every case on this rank; return a list of (label, result, expected) to compare."""
    n, r = comm.nranks, comm.rank
    out = []
    calls = itertools.count(seed)
    for (alg, collective), dtype, inplace in itertools.product(cases, dtypes, (False, True)):
        for op in (ops if collective in ("all_reduce", "reduce_scatter", "reduce") else (None,)):
            i = next(calls)
            count = counts[i % len(counts)]
            root = i % n
            rng = np.random.default_rng(1000 * i)  # the same on every rank
            size_in = count * (n if collective == "reduce_scatter" else 1)
            ins = check.inputs(rng, dtype, op or "sum", n, size_in)
            expected = check.reference(collective, ins, dtype, op, root)[r]
            store = check.storage_dtype(dtype)
            size_out = count * (n if collective == "all_gather" else 1)
            if collective == "reduce_scatter" and inplace:
                buf = comm.alloc(size_in, store)
                buf[:] = ins[r]
                src, dst, view = buf, buf[r * count:(r + 1) * count], lambda b=buf: b[r * count:(r + 1) * count]
            elif collective == "all_gather" and inplace:
                buf = comm.alloc(size_out, store)
                buf[r * count:(r + 1) * count] = ins[r]
                src, dst, view = buf[r * count:(r + 1) * count], buf, lambda b=buf: b
            elif inplace:
                buf = comm.alloc(size_in, store)
                buf[:] = ins[r]
                src, dst, view = buf, None, lambda b=buf: b
            else:
                src = comm.alloc(size_in, store)
                src[:] = ins[r]
                dst = comm.alloc(size_out, store)
                dst[:] = check.poison(dtype)  # fp8 codes need NaN: 0xA5 is a number there
                view = lambda b=dst: b  # noqa: E731
            kwargs = {"algorithm": alg, "config": _config(i)}
            if dtype.startswith("float8"):  # uint8 arrays: the call says they hold fp8
                kwargs["dtype"] = dtype
            if op is not None:
                kwargs["op"] = op
            if collective in ("broadcast", "reduce"):
                kwargs["root"] = root
            getattr(coll, collective)(comm, src, dst, **kwargs)
            comm.synchronize()
            label = f"{alg} {collective} {dtype} op={op} inplace={inplace} count={count} root={root} rank={r}"
            result = np.array(view())
            if expected is None:  # a non-root rank of reduce: dst untouched
                expected = check._values(ins[r] if inplace else check.storage_dtype(dtype).type(0), dtype)
                if not inplace:
                    out.append((label + " (untouched)", result, check.poison(dtype)))
                    continue
            out.append((label, result, expected))
    return out


def _check_all(results, dtypes_n):
    failures = []
    for rank_results in results:
        for label, result, expected in rank_results:
            dtype = label.split()[2]
            try:
                if label.endswith("(untouched)"):
                    poison = np.full(result.shape, expected, result.dtype)
                    assert np.array_equal(result.view(np.uint8), poison.view(np.uint8)), "dst of a non-root written"
                else:
                    check.compare(result, expected, dtype, dtypes_n, label)
            except AssertionError as exc:
                failures.append(str(exc) if label in str(exc) else f"{label}: {exc}")
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:20])


TOPOLOGIES = [(1, 1), (2, 1), (3, 1), (4, 1), (8, 1), (8, 2)]


@pytest.mark.parametrize("nranks,nodes", TOPOLOGIES, ids=[f"{n}ranks-{k}nodes" for n, k in TOPOLOGIES])
def test_every_collective_dtype_op_placement(nranks, nodes):
    dtypes = coll.DTYPES
    counts = (0, 1, 37, 131, 8) if nranks < 8 else (0, 1, 29, 8)  # 8 ranks: fewer slots, same cases
    results = spawn(lambda comm: _run_matrix(comm, nranks, dtypes, counts), nranks=nranks,
                    nodes=nodes, seed=nranks, gin_delivery="reordered" if nodes > 1 else "ordered")
    _check_all(results, nranks)


@pytest.mark.parametrize("seed", [1, 2])
def test_two_nodes_reordered_seeds(seed):
    """2 nodes x 4 ranks, GIN across, reordered delivery, more scheduler seeds (float32, all ops)."""
    results = spawn(lambda comm: _run_matrix(comm, seed, ("float32",), (53,)), nranks=8, nodes=2,
                    seed=seed, gin_delivery="reordered")
    _check_all(results, 8)


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
        errors = []
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
        for case in cases:
            try:
                case()
            except flowdsl.UsageError as exc:
                errors.append(str(exc))
            else:
                errors.append("no error")
        return errors
    errors = spawn(main, nranks=2)[0]
    expected = [
        "src is float32 but dst is float16",
        "dst has 11 elements but 10 are needed",
        "src has 9 elements, not a multiple of nranks=2",
        "dst has 10 elements but 20 are needed (nranks * count",
        "root 7 is not a rank of this communicator (0..1)",
        "unknown op 'median'. Use one of sum, prod, min, max, avg",
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
