"""What the first collectives of a fresh process cost: cold compile, then warm load, each run in fresh processes.

The steps are a notebook's first calls, in order: ring all_reduce float32 (the first kernel:
numba's start-up and the first typing of Flow's steps), then reduce_scatter, all_gather and
tree all_reduce of the same type (further kernels: Flow's steps are typed already), then ring
all_reduce bfloat16 (a new element type: the steps are typed again).

* Without ``--gpu`` (no GPU needed): each step compiles for ``--arch`` / ``--nccl`` into a
  fresh disk cache (``FlowKernel.build``); then a fresh process finds each in the cache
  (key and checked read).
* With ``--gpu``: one rank on this machine's GPU (``flowdsl.init()``), each step a real
  collective call, timed to ``comm.synchronize()``: compile, load and launch with a cold
  cache; then a fresh process with the cache filled times the same calls (warm: key, read,
  module load, launch, and the first call's staging window).

Prints, per step, the median (min-max) of wall and process CPU seconds over ``--runs`` fresh
processes, and the compile's CPU seconds by step: numba (typing and lowering), nvvm (LLVM IR
to LTO-IR), link (nvJitLink: link-time optimisation with the support build, and ptxas).
``--profile`` adds, for the first and a further kernel, numba's own passes (CPU seconds,
nested compiles excluded) and the device functions it compiled, with each one's own CPU
seconds and how they spread: where numba is the floor; with
``--gpu``, the cProfile of the first call of a fresh process whose cache is filled.

``--precompile JOBS...`` times ``python -m flowdsl precompile`` of the whole library into a
fresh cache for each number of worker processes (wall, and the CPU of every process it ran).
``--tree PATH`` measures another checkout of flowdsl (before / after) with this script.

Usage::

    python benchmarks/cold_compile.py --runs 3                  # CPU only, sm_90 / NCCL 2.28.9
    python benchmarks/cold_compile.py --runs 3 --gpu            # on a GPU, one rank
    python benchmarks/cold_compile.py --runs 1 --profile
    python benchmarks/cold_compile.py --precompile 16 32        # the library, 16 and 32 workers
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (label, algorithm, collective, op, dtype), in the order a notebook might call them.
STEPS = [
    ("first: ring all_reduce float32", "ring", "all_reduce", "sum", "float32"),
    ("further: ring reduce_scatter float32", "ring", "reduce_scatter", "sum", "float32"),
    ("further: ring all_gather float32", "ring", "all_gather", "sum", "float32"),
    ("further: tree all_reduce float32", "tree", "all_reduce", "sum", "float32"),
    ("new type: ring all_reduce bfloat16", "ring", "all_reduce", "sum", "bfloat16"),
]


def _clocks():
    return time.perf_counter(), time.process_time()


def _since(start) -> dict:
    wall, cpu = _clocks()
    return {"wall": wall - start[0], "cpu": cpu - start[1]}


# ---- children (one fresh process each) -----------------------------------------------------------

def _child_cpu(arch: str, nccl: str) -> list[dict]:
    """Each step built for ``arch`` / ``nccl`` through the disk cache (compiled, or found there)."""
    start = _clocks()
    import flowdsl  # noqa: F401, PLC0415

    rows = [{"step": "import flowdsl", **_since(start)}]
    start = _clocks()
    from flowdsl import RedOp  # noqa: PLC0415
    from flowdsl.collectives import _library  # noqa: PLC0415
    from flowdsl.lowering.target import Target, parse_version  # noqa: PLC0415

    target = Target(parse_version(nccl), arch)
    rows.append({"step": "import flowdsl.collectives", **_since(start)})
    for label, algorithm, collective, op, dtype in STEPS:
        start = _clocks()
        kernel = _library.kernel_for(algorithm, collective, RedOp[op.upper()], False, _library.storage(dtype)[1])
        source = kernel.build(_library._argtypes(dtype, target.nccl, algorithm), target)
        rows.append({"step": label, "source": source, **_since(start), **kernel.last_build.get("phases", {})})
    return rows


def _child_gpu() -> list[dict]:
    """Each step a collective call on one rank of this GPU, to ``comm.synchronize()``."""
    start = _clocks()
    import flowdsl  # noqa: PLC0415

    rows = [{"step": "import flowdsl", **_since(start)}]
    start = _clocks()
    comm = flowdsl.init()
    rows.append({"step": "flowdsl.init() (one rank)", **_since(start)})
    from flowdsl import RedOp, collectives  # noqa: PLC0415
    from flowdsl.collectives import _library  # noqa: PLC0415

    n = 1 << 20  # bfloat16 travels in uint16 arrays (CuPy has no bfloat16)
    arrays = {dtype: (comm.alloc(n, _library.storage(dtype)[0]), comm.alloc(n, _library.storage(dtype)[0]))
              for dtype in ("float32", "bfloat16")}
    comm.synchronize()
    for label, algorithm, collective, op, dtype in STEPS:
        src, dst = arrays[dtype]
        start = _clocks()
        call = getattr(collectives, collective)
        extra = {} if collective == "all_gather" else {"op": op}
        call(comm, src, dst, algorithm=algorithm, **extra)
        comm.synchronize()
        kernel = _library.kernel_for(algorithm, collective, RedOp[op.upper()], False, _library.storage(dtype)[1])
        build = kernel.last_build
        rows.append({"step": label, "source": build.get("source"), "load": build.get("seconds"), **_since(start),
                     **build.get("phases", {})})
    comm.close()
    return rows


def _child_gpu_profile() -> dict:
    """Where the warm first call's time goes (cache filled): the top of its cProfile, by cumulative time."""
    import cProfile  # noqa: PLC0415
    import io  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    start = _clocks()
    import flowdsl  # noqa: PLC0415

    comm = flowdsl.init()
    from flowdsl import collectives  # noqa: PLC0415

    src, dst = comm.alloc(1 << 20, "float32"), comm.alloc(1 << 20, "float32")
    comm.synchronize()
    ready = _since(start)
    imported = _watch_imports(("torch", "cupyx", "scipy"))
    profiler = cProfile.Profile()
    first = _clocks()
    profiler.enable()
    collectives.all_reduce(comm, src, dst, algorithm="ring", op="sum")
    comm.synchronize()
    profiler.disable()
    spent = _since(first)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
    comm.close()
    return {"before": ready, "first": spent, "profile": text.getvalue(), "imported": imported}


def _watch_imports(names) -> dict:
    """Record the Python stack of the first import of each of ``names`` from now on."""
    import importlib.abc  # noqa: PLC0415
    import traceback  # noqa: PLC0415

    seen: dict = {}

    class Watch(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname in names and fullname not in seen:
                seen[fullname] = "".join(traceback.format_stack(limit=25)[:-1])
            return None

    sys.meta_path.insert(0, Watch())
    return seen


def _child_profile(arch: str, nccl: str) -> dict:
    """numba's passes and the device functions it compiled (CPU seconds each, nested compiles excluded) of
    the first and a further kernel."""
    import collections  # noqa: PLC0415

    from flowdsl import RedOp  # noqa: PLC0415
    from flowdsl.collectives import _library  # noqa: PLC0415
    from flowdsl.lowering.target import Target, parse_version  # noqa: PLC0415
    from numba.cuda import compiler as numba_compiler  # noqa: PLC0415
    from numba.cuda.core import compiler_machinery  # noqa: PLC0415

    passes: collections.Counter = collections.Counter()
    functions: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()  # per function, its callees' compiles excluded
    stack: list[float] = []
    compiling: list[float] = []
    run_pass = compiler_machinery.PassManager._runPass
    compile_extra = numba_compiler.compile_extra

    def timed_pass(self, index, pss, state):  # exclusive time: a pass that compiles a callee excludes it
        start = time.thread_time()
        stack.append(0.0)
        try:
            return run_pass(self, index, pss, state)
        finally:
            spent, nested = time.thread_time() - start, stack.pop()
            passes[pss.name()] += spent - nested
            if stack:
                stack[-1] += spent

    def counted_compile(typingctx, targetctx, func, *args, **kwargs):
        name = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', str(func))}"
        functions[name] += 1
        start = time.thread_time()
        compiling.append(0.0)
        try:
            return compile_extra(typingctx, targetctx, func, *args, **kwargs)
        finally:
            spent, nested = time.thread_time() - start, compiling.pop()
            own[name] += spent - nested
            if compiling:
                compiling[-1] += spent

    compiler_machinery.PassManager._runPass = timed_pass
    numba_compiler.compile_extra = counted_compile
    target = Target(parse_version(nccl), arch)
    out = {}
    for label, algorithm, collective, op, dtype in STEPS[:2]:
        passes.clear()
        functions.clear()
        own.clear()
        kernel = _library.kernel_for(algorithm, collective, RedOp[op.upper()], False, _library.storage(dtype)[1])
        compiled = kernel.compile(_library._argtypes(dtype, target.nccl, algorithm), arch=arch, nccl=nccl)
        seconds = sorted(own.values(), reverse=True)
        out[label] = {"phases": compiled.phases, "passes": dict(passes.most_common(12)),
                      "functions": sum(functions.values()), "slowest": dict(own.most_common(12)),
                      "spread": {"total": sum(seconds), "median": statistics.median(seconds) if seconds else 0,
                                 "largest 10": sum(seconds[:10]), "under 0.05 s": sum(1 for t in seconds if t < 0.05),
                                 "their total": sum(t for t in seconds if t < 0.05)}}
    return out


# ---- the parent: fresh processes, medians, tables --------------------------------------------------

def _env(tree: Path, cache: str) -> dict:
    return dict(os.environ, FLOWDSL_CACHE_DIR=cache, PYTHONPATH=os.pathsep.join(
        filter(None, [str(tree), os.environ.get("PYTHONPATH")])))


def _run_child(args: list[str], cache: str, tree: Path) -> object:
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], capture_output=True, text=True,
                          env=_env(tree, cache), cwd=tree)
    if proc.returncode:
        raise SystemExit(f"child {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _precompile(jobs_list: list[int], arch: str, nccl: str, tree: Path) -> None:
    """``python -m flowdsl precompile`` of the whole library into a fresh cache, per number of workers."""
    print(f"\nprecompile of the whole library, {arch}, NCCL {nccl}, fresh cache each time")
    print(f"{'workers':>8s} {'kernels':>8s} {'wall s':>8s} {'CPU s':>8s} {'CPU s / kernel':>15s}")
    for jobs in jobs_list:
        with tempfile.TemporaryDirectory(prefix="flowdsl-precompile-") as cache:
            before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "flowdsl", "precompile", "--arch", arch, "--nccl", nccl,
                                   "--jobs", str(jobs)], capture_output=True, text=True, env=_env(tree, cache),
                                  cwd=tree)
            wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode:
            raise SystemExit(f"precompile failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        kernels = int(proc.stdout.split()[0])  # "239 kernels: 239 compiled, ..."
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        print(f"{jobs:8d} {kernels:8d} {wall:8.1f} {cpu:8.1f} {cpu / kernels:15.2f}")


def _span(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} ({min(values):.2f}-{max(values):.2f})"


def _table(title: str, runs: list[list[dict]]) -> None:
    print(f"\n{title} ({len(runs)} fresh process{'es' if len(runs) > 1 else ''}; seconds, median (min-max))")
    print(f"{'step':40s} {'wall':>18s} {'process CPU':>18s} {'numba':>6s} {'nvvm':>5s} {'link':>5s}  source")
    for i, row in enumerate(runs[0]):
        rows = [run[i] for run in runs]
        phases = "".join(f" {statistics.median(r.get(p, 0.0) for r in rows):{w}.2f}" if p in row else " " * (w + 1)
                         for p, w in (("numba", 6), ("nvvm", 5), ("link", 5)))
        print(f"{row['step']:40s} {_span([r['wall'] for r in rows]):>18s} {_span([r['cpu'] for r in rows]):>18s}"
              f"{phases}  {row.get('source') or ''}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per measurement (default 3)")
    parser.add_argument("--gpu", action="store_true", help="real collective calls on this GPU (one rank)")
    parser.add_argument("--arch", default="sm_90", help="without --gpu: the target arch (default sm_90)")
    parser.add_argument("--nccl", default="2.28.9", help="without --gpu: the NCCL release (default 2.28.9)")
    parser.add_argument("--profile", action="store_true", help="numba's passes for the first and a further kernel")
    parser.add_argument("--precompile", type=int, nargs="+", metavar="JOBS",
                        help="instead: time the whole library's precompile with these numbers of workers")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the flowdsl checkout to measure (default: this one)")
    parser.add_argument("--child", choices=["cpu", "gpu", "gpu-profile", "profile"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = {"cpu": lambda: _child_cpu(args.arch, args.nccl), "gpu": _child_gpu, "gpu-profile": _child_gpu_profile,
                  "profile": lambda: _child_profile(args.arch, args.nccl)}[args.child]()
        print(json.dumps(result))
        return 0
    tree = args.tree.resolve()
    if args.precompile:
        print(f"cold_compile: {tree}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        _precompile(args.precompile, args.arch, args.nccl, tree)
        return 0
    kind = ["--child", "gpu"] if args.gpu else ["--child", "cpu", "--arch", args.arch, "--nccl", args.nccl]
    where = "this GPU, one rank" if args.gpu else f"{args.arch}, NCCL {args.nccl}, no GPU"
    cold, warm = [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="flowdsl-cold-") as cache:
            cold.append(_run_child(kind, cache, tree))
            warm.append(_run_child(kind, cache, tree))
    print(f"cold_compile: {tree}; {where}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    _table("cold cache: each step compiles", cold)
    _table("warm cache: a fresh process finds each step on disk", warm)
    if args.profile and args.gpu:
        with tempfile.TemporaryDirectory(prefix="flowdsl-cold-") as cache:
            _run_child(["--child", "gpu"], cache, tree)
            found = _run_child(["--child", "gpu-profile"], cache, tree)
        print(f"\nwarm first call, profiled: {found['first']['wall']:.3f} s wall "
              f"({found['before']['wall']:.2f} s before it: import, init, alloc)\n{found['profile']}")
        for name, stack in found["imported"].items():
            print(f"first import of {name} during the call, from:\n{stack}")
    elif args.profile:
        with tempfile.TemporaryDirectory(prefix="flowdsl-cold-") as cache:
            profile = _run_child(["--child", "profile", "--arch", args.arch, "--nccl", args.nccl], cache, tree)
        for label, found in profile.items():
            print(f"\nnumba's passes, {label}: {found['functions']} functions compiled; compile steps (CPU s): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in found["phases"].items()))
            for name, seconds in found["passes"].items():
                print(f"  {name:40s} {seconds:6.2f}")
            spread = found["spread"]
            print(f"  device functions, each through numba's whole pipeline (CPU s, callees excluded): total "
                  f"{spread['total']:.2f}, median {spread['median']:.3f}, the largest 10 {spread['largest 10']:.2f}, "
                  f"{spread['under 0.05 s']} under 0.05 s ({spread['their total']:.2f} together); the slowest:")
            for name, seconds in found["slowest"].items():
                print(f"    {seconds:6.3f}  {name[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
