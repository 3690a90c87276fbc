"""Warm disk-cache cost without a GPU: cache keys and disk hits in a fresh process.

A warm load is: the cache key of the kernel, reading (and checking) its cubin and
metadata, and loading the module on the GPU. This measures the first two, the part
the cache owns, in fresh processes:

* ``one``: ``build()`` of one library kernel already in the cache (key + disk read);
* ``library``: the cache key of every kernel of the collectives library;
* ``hits``: key and disk read of every library kernel found in ``$FLOWDSL_CACHE_DIR``.

``--gpu`` (on a GPU, the library precompiled into ``$FLOWDSL_CACHE_DIR``) times the whole
warm load instead, ``flowdsl.collectives.load()`` in fresh processes (keys, checked reads,
module loads; the goal is 0.2 s), and ``--profile`` prints the top of one run's cProfile.

``--fill`` stores the one compiled cubin under every library kernel's key: the disk
reads then have the size of real entries without compiling the whole library (the
entries are for reading only; a GPU would run the wrong kernel).

Usage::

    export FLOWDSL_CACHE_DIR=/tmp/c
    python benchmarks/cache_load.py --prepare --fill   # compile one kernel (slow), fill the rest
    python benchmarks/cache_load.py --runs 7           # fresh processes, timings
    python -m flowdsl precompile && python benchmarks/cache_load.py --gpu --runs 5 --profile
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time

ARCH, NCCL = "sm_90", "2.28.9"
ONE = ("ring", "all_reduce", "SUM", "float32")


def _entry(algorithm, collective, op, dtype):
    from flowdsl import RedOp
    from flowdsl.collectives import _library

    return _library.kernel_for(algorithm, collective, RedOp[op] if isinstance(op, str) else op, False,
                               _library.storage(dtype)[1]), _library._argtypes(dtype, NCCL)


def _child(what: str) -> dict:
    from flowdsl.collectives import _library
    from flowdsl.lowering.target import Target, parse_version
    from flowdsl.runtime.support import support_build_for

    target = Target(parse_version(NCCL), ARCH)
    support_build_for(target.nccl, target.arch)  # reading the support build is not the cache's cost
    _targets_module().cuda_version(None)  # nvJitLink's version: a GPU load asks it for the target anyway
    start = time.perf_counter()
    if what == "one":
        kernel, argtypes = _entry(*ONE)
        source = kernel.build(argtypes, target)
        return {"seconds": time.perf_counter() - start, "source": source}
    entries = _library.library()
    kernels = [_entry(*e) for e in entries]
    start = time.perf_counter()
    support = support_build_for(target.nccl, target.arch)
    if what == "library":
        for kernel, argtypes in kernels:
            _key(kernel, argtypes, target, support)
        return {"seconds": time.perf_counter() - start, "kernels": len(kernels)}
    hits = 0
    for kernel, argtypes in kernels:
        found = _disk_hit(kernel, argtypes, target)
        hits += found
    return {"seconds": time.perf_counter() - start, "kernels": len(kernels), "hits": hits}


def _gpu_child(profile: bool) -> dict:
    """``collectives.load()`` of the whole library in this fresh process (CUDA context made first)."""
    import cProfile
    import io
    import pstats

    from numba import cuda

    from flowdsl import collectives

    cuda.current_context()
    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    counts = collectives.load()
    seconds = time.perf_counter() - start
    out = {**counts, "seconds": seconds}
    if profiler:
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(35)
        out["profile"] = text.getvalue()
    return out


def _targets_module():
    from flowdsl import _targets

    return _targets


def _kernel_module():
    from flowdsl import _kernel

    return _kernel


def _key(kernel, argtypes, target, support) -> str:
    """The kernel's cache key (computed by flowdsl._cache since it holds the key; by the kernel before)."""
    cache = _cache_module()
    if cache is not None and hasattr(cache, "kernel_key"):
        return cache.kernel_key(kernel, argtypes, target, support)
    return _key(kernel, argtypes, target, support)


def _root():
    cache = _cache_module()
    if cache is not None and hasattr(cache, "kernel_root"):
        return cache.kernel_root()
    return _kernel_module()._cache_root()


@functools.cache
def _cache_module():
    """flowdsl._cache, or None before it existed (looked up once: a failed import searches the path)."""
    try:
        from flowdsl import _cache
    except ImportError:
        return None
    return _cache


def _disk_hit(kernel, argtypes, target) -> bool:
    """Key and disk read (checked, where the cache checks) of one kernel; never compiles."""
    from flowdsl.runtime.support import support_build_for

    key = _key(kernel, argtypes, target, support_build_for(target.nccl, target.arch))
    root = _root()
    _cache = _cache_module()
    if _cache is None:  # before the cache checked its entries
        cubin, meta = root / f"{key}.cubin", root / f"{key}.json"
        if cubin.exists() and meta.exists():
            cubin.read_bytes()
            json.loads(meta.read_text())
            return True
        return False
    return _cache.read_entry(root, key) is not None


def _fill() -> dict:
    """The one entry's cubin under the key of every library kernel (entries to read, never to run)."""
    from flowdsl.collectives import _library
    from flowdsl.lowering.target import Target, parse_version
    from flowdsl.runtime.support import support_build_for

    target = Target(parse_version(NCCL), ARCH)
    support = support_build_for(target.nccl, target.arch)
    kernel, argtypes = _entry(*ONE)
    root = _root()
    key = _key(kernel, argtypes, target, support)
    meta = json.loads((root / f"{key}.json").read_text())
    cubin = (root / meta.get("cubin", f"{key}.cubin")).read_bytes()  # named in the record since it is checked
    for entry in _library.library():
        kernel, argtypes = _entry(*entry)
        other = _key(kernel, argtypes, target, support)
        if _cache_module() is None:  # before the cache checked its entries
            (root / f"{other}.cubin").write_bytes(cubin)
            (root / f"{other}.json").write_text(json.dumps(meta))
        else:
            _cache_module().write_entry(root, other, cubin, meta["entry_name"], meta["features"])
    return {"filled": len(_library.library()), "cubin_bytes": len(cubin)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prepare", action="store_true", help="compile the one kernel into the cache")
    parser.add_argument("--fill", action="store_true", help="store that cubin under every library key")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", choices=["one", "library", "hits", "gpu"])
    parser.add_argument("--gpu", action="store_true", help="time collectives.load() on this GPU")
    parser.add_argument("--profile", action="store_true", help="with --gpu: one run's cProfile")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_gpu_child(args.profile) if args.child == "gpu" else _child(args.child)))
        return 0
    if args.gpu:
        runs = [json.loads(subprocess.run([sys.executable, __file__, "--child", "gpu"]
                                          + (["--profile"] if args.profile and i == 0 else []),
                                          check=True, capture_output=True, text=True).stdout.splitlines()[-1])
                for i in range(args.runs)]
        if args.profile:
            print(runs[0].pop("profile"))
        seconds = [r["seconds"] for r in runs[1:] if args.profile] or [r["seconds"] for r in runs]
        print(f"warm load of the library: median {statistics.median(seconds):.3f} s (min {min(seconds):.3f}, "
              f"max {max(seconds):.3f}, {len(seconds)} fresh processes, unprofiled; goal 0.2 s) "
              f"{ {k: v for k, v in runs[-1].items() if k != 'seconds'} }")
        return 0
    if args.prepare or args.fill:
        print(json.dumps(_child("one")))
        if args.fill:
            print(json.dumps(_fill()))
        return 0
    for what in ("one", "library", "hits"):
        results = [json.loads(subprocess.run([sys.executable, __file__, "--child", what], check=True,
                                             capture_output=True, text=True).stdout.splitlines()[-1])
                   for _ in range(args.runs)]
        seconds = [r["seconds"] for r in results]
        extra = {k: v for k, v in results[0].items() if k != "seconds"}
        print(f"{what:8s} median {1e3 * statistics.median(seconds):7.1f} ms  "
              f"(min {1e3 * min(seconds):.1f}, max {1e3 * max(seconds):.1f}, {args.runs} fresh processes) {extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
