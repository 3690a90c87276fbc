"""All-gather over LSA: every rank writes its block into every LSA rank's window.

Each rank contributes ``count`` elements from ``src`` (any device array). The
output is a symmetric window of ``nranks * count`` elements: the kernel writes
this rank's block at ``rank * count`` of every LSA rank's window (its own
included), then a release barrier publishes the writes. Afterwards every rank
holds all blocks, in rank order.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

import flowdsl
from flowdsl import MemoryOrder, coop, lsa


@flowdsl.kernel
def allgather_lsa(comm, src, win, count):
    cta = coop.cta()
    bar = lsa.barrier(comm, cta, cuda.blockIdx.x)
    bar.sync(MemoryOrder.ACQUIRE)  # no peer is still reading an earlier result
    nthreads = cuda.gridDim.x * cuda.blockDim.x
    first = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    for peer in range(comm.lsa_size):
        dst = lsa.lsa_view(win, peer, comm.rank * count, count)
        for i in range(first, count, nthreads):
            dst[i] = src[i]
    bar.sync(MemoryOrder.RELEASE)


def poison_value(dtype):
    """NaN for floats, the dtype's max for integers: a value the inputs never hold."""
    dtype = np.dtype(dtype)
    return np.nan if dtype.kind == "f" else np.iinfo(dtype).max


def run(comm, count: int = 4096, dtype=np.float32, blocks: int = 4, seed: int = 0):
    """Run the all-gather on ``comm``; return ``(result, reference)`` for this rank."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        blocks_in = [rng.standard_normal(count).astype(dtype) for _ in range(comm.nranks)]
    else:  # below the dtype's max, which is the poison value
        blocks_in = [rng.integers(0, np.iinfo(dtype).max, count, dtype=dtype) for _ in range(comm.nranks)]
    src = comm.alloc(count, dtype)
    src.set(blocks_in[comm.rank])
    out = comm.alloc(comm.nranks * count, dtype)
    out.set(np.full(comm.nranks * count, poison_value(dtype), dtype))
    with comm.register(out) as win, comm.device_communicator(lsa_barrier_count=blocks) as dcomm:
        allgather_lsa[blocks, 256](dcomm, src, win, count)
        comm.synchronize()
        result = out.get()
    return result, np.concatenate(blocks_in)


def main(argv: list[str] | None = None) -> int:
    """``python -m flowdsl.examples.allgather_lsa``: run the all-gather and say what it did.

    On GPUs one rank per process (``torchrun --nproc_per_node=N``); without a GPU, or
    with ``--sim``, on ``--ranks`` simulated ranks on the CPU.
    """
    from flowdsl.examples import _cli  # noqa: PLC0415

    p = _cli.parser("allgather_lsa", "all-gather over LSA", ranks=4)
    p.add_argument("--count", type=_cli.at_least_one, default=4096, help="elements each rank contributes (default 4096)")
    args = p.parse_args(argv)

    def body():
        results, nranks, where = _cli.run_somewhere(lambda comm: run(comm, count=args.count), args.sim, args.ranks,
                                                    args.nodes)
        ok = all(np.array_equal(result, ref) for result, ref in results)
        checked = "every rank's window holds" if len(results) == nranks else "this rank's window holds"
        print(f"allgather_lsa: {nranks} rank(s) {where}: each rank wrote its {args.count} float32 values into every "
              f"LSA rank's window; {checked} all {nranks * args.count} in rank order, equal to NumPy's "
              f"concatenation: {'OK' if ok else 'MISMATCH'}")
        return 0 if ok else 1
    return _cli.checked("allgather_lsa", body)

if __name__ == "__main__":
    import sys

    sys.exit(main())
