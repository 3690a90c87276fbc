"""``python -m flowdsl`` (also the ``flowdsl`` command).

Verbs:
    demo    the fused ReduceScatter + RMSNorm + AllGather kernel, checked against NumPy:
            on the GPU(s) when there are any (one rank per process; under torchrun,
            one per GPU), otherwise on 4 simulated ranks on the CPU (``--sim`` forces it).
    info    versions, the loaded NCCL, and the support-library builds.
    precompile
            compile the collectives library (flowdsl.collectives) into the disk cache,
            with a progress bar; ``--arch sm_90`` builds without a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def _gpu_available() -> bool:
    try:
        from cuda.bindings import driver

        if int(driver.cuInit(0)[0]) != 0:
            return False
        err, count = driver.cuDeviceGetCount()
        return int(err) == 0 and count > 0
    except Exception:  # noqa: BLE001 - no driver at all
        return False


def _report(where: str, results, seconds: float) -> int:
    worst = max(float(np.max(np.abs(r - ref))) for r, ref in results)
    ok = all(np.allclose(r, ref, rtol=2e-5, atol=2e-5) for r, ref in results)
    tokens, hidden = results[0][0].shape
    print(f"flowdsl demo: fused ReduceScatter + RMSNorm + AllGather, {len(results)} rank(s) {where}, "
          f"{tokens} tokens x {hidden} hidden (float32)")
    print(f"  max |result - NumPy reference| over all ranks: {worst:.2e}  ->  {'OK' if ok else 'MISMATCH'}"
          f"  ({seconds:.2f} s)")
    return 0 if ok else 1


def demo(args) -> int:
    from flowdsl.examples import rmsnorm_lsa

    if args.sim or not _gpu_available():
        import flowdsl.sim

        why = "(--sim)" if args.sim else "(no GPU found)"
        start = time.perf_counter()
        results = flowdsl.sim.spawn(lambda comm: rmsnorm_lsa.run(comm, tokens_per_rank=args.tokens,
                                                                 hidden=args.hidden, seed=args.seed),
                                    nranks=args.ranks, seed=args.seed)
        return _report(f"on the CPU simulator {why}", results, time.perf_counter() - start)

    import flowdsl

    start = time.perf_counter()
    with flowdsl.init() as comm:
        result = rmsnorm_lsa.run(comm, tokens_per_rank=args.tokens, hidden=args.hidden, seed=args.seed)
    if comm.rank != 0:
        return 0 if np.allclose(*result, rtol=2e-5, atol=2e-5) else 1
    return _report(f"on GPU (NCCL {'.'.join(map(str, comm.nccl_version))}, rank 0 shown)", [result],
                   time.perf_counter() - start)


def info(args) -> int:
    import flowdsl
    from flowdsl.runtime.support import manifest

    print(f"flowdsl {flowdsl.__version__}")
    try:
        from flowdsl.runtime.nccl import loaded_version

        print(f"loaded NCCL: {'.'.join(map(str, loaded_version()))}")
    except Exception as exc:  # noqa: BLE001
        print(f"loaded NCCL: unavailable ({exc})")
    print(f"GPU: {'yes' if _gpu_available() else 'no (kernels compile; programs run on flowdsl.sim)'}")
    for version, entry in manifest()["abis"].items():
        print(f"support build NCCL {version}: {', '.join(sorted(entry['builds']))}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flowdsl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb")
    p = sub.add_parser("demo", help="run the fused RMSNorm demo (GPU, or the simulator without one)")
    p.add_argument("--sim", action="store_true", help="run on the CPU simulator even if a GPU is present")
    p.add_argument("--ranks", type=int, default=4, help="simulated ranks (default 4)")
    p.add_argument("--tokens", type=int, default=8, help="tokens per rank (default 8)")
    p.add_argument("--hidden", type=int, default=512, help="hidden size (default 512)")
    p.add_argument("--seed", type=int, default=0)
    sub.add_parser("info", help="versions and support builds")
    p = sub.add_parser("precompile", help="compile the collectives library into the disk cache")
    p.add_argument("--arch", help="target such as sm_90 (default: this GPU; needed without one)")
    p.add_argument("--nccl", help="NCCL release of the device ABI (default: the loaded libnccl)")
    p.add_argument("--dtypes", nargs="*", help="subset of element types (default: all)")
    p.add_argument("--ops", nargs="*", help="subset of operators: sum prod min max avg (default: all)")
    p.add_argument("--gin", action="store_true", help="the kernels for communicators spanning several nodes")
    p.add_argument("--jobs", type=int, help="worker processes (default: one per CPU)")
    args = parser.parse_args(argv)
    if args.verb in (None, "demo"):
        if args.verb is None:
            args = parser.parse_args(["demo"])
        return demo(args)
    if args.verb == "precompile":
        return precompile(args)
    return info(args)


def precompile(args) -> int:
    """``python -m flowdsl precompile``: build the collectives library ahead of time."""
    from .collectives import OPS  # noqa: PLC0415
    from .collectives import precompile as build  # noqa: PLC0415

    ops = [OPS[name] for name in args.ops] if args.ops else None
    counts = build(arch=args.arch, nccl=args.nccl, dtypes=args.dtypes, ops=ops, gin_peers=args.gin,
                   jobs=args.jobs)
    print(f"{counts['kernels']} kernels: {counts['compiled']} compiled, {counts['cached']} already cached, "
          f"{counts['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
