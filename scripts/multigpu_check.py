"""Several GPUs, one rank each (launch with torchrun): the LSA examples against NumPy, and the LSA
all-gather against NCCL's own all-gather on the same buffers.

    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=2 scripts/multigpu_check.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on shared machines

import cupy  # noqa: E402

import flowdsl  # noqa: E402
from flowdsl.examples import allgather_lsa, rmsnorm_lsa  # noqa: E402


def check(name, ok, comm, detail=""):
    if comm.rank == 0 or not ok:
        print(f"[rank {comm.rank}] {name}: {'OK' if ok else 'FAILED'} {detail}", flush=True)
    return ok


def main() -> int:
    import torch.distributed as dist

    # torchrun's environment; the NCCL unique id travels over this (gloo) process group.
    dist.init_process_group("gloo")
    ok = True
    with flowdsl.init(group=dist.group.WORLD) as comm:
        for tokens, hidden in ((64, 1024), (5, 777)):
            result, reference = rmsnorm_lsa.run(comm, tokens_per_rank=tokens, hidden=hidden, seed=hidden)
            err = float(np.max(np.abs(result - reference)))
            ok &= check(f"rmsnorm_lsa {comm.nranks} ranks, {tokens} tokens/rank x {hidden}", err < 2e-5, comm,
                        f"max err {err:.1e}")
        for count, dtype in ((1, np.float32), (4097, np.int32), (1 << 20, np.float32)):
            result, reference = allgather_lsa.run(comm, count=count, dtype=dtype, seed=count)
            ok &= check(f"allgather_lsa {comm.nranks} ranks, {count} x {np.dtype(dtype)}",
                        np.array_equal(result, reference), comm)

        # Bandwidth: flowdsl's LSA all-gather against NCCL's all-gather, same sizes, one run.
        count = 64 << 20  # float32 per rank: 256 MiB
        src = comm.alloc(count, np.float32)
        out = comm.alloc(comm.nranks * count, np.float32)
        nccl_out = cupy.empty(comm.nranks * count, np.float32)
        src.set(np.random.default_rng(comm.rank).standard_normal(count).astype(np.float32))
        blocks = 132 * 4
        with comm.register(out) as win, comm.device_communicator(lsa_barrier_count=blocks) as dcomm:
            def flowdsl_call():
                allgather_lsa.allgather_lsa[blocks, 512](dcomm, src, win, count)

            def nccl_call():
                comm.nccl.allgather(src, nccl_out)

            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            times = {}
            for name, fn in (("flowdsl", flowdsl_call), ("nccl", nccl_call)) * 2:
                fn()
                comm.synchronize()
                start.record()
                for _ in range(10):
                    fn()
                stop.record()
                stop.synchronize()
                times[name] = cupy.cuda.get_elapsed_time(start, stop) / 10
            comm.synchronize()
            ok &= check("allgather_lsa == NCCL allgather (256 MiB/rank)", bool(cupy.array_equal(out, nccl_out)), comm)
        nbytes = comm.nranks * count * 4
        busbw = {k: nbytes * (comm.nranks - 1) / comm.nranks / (v * 1e-3) / 1e9 for k, v in times.items()}
        if comm.rank == 0:
            print(f"allgather 256 MiB/rank x {comm.nranks}: flowdsl {times['flowdsl']:.3f} ms "
                  f"({busbw['flowdsl']:.0f} GB/s bus), NCCL {times['nccl']:.3f} ms ({busbw['nccl']:.0f} GB/s bus), "
                  f"flowdsl/NCCL bandwidth {busbw['flowdsl'] / busbw['nccl']:.3f}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
