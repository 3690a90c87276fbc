"""Cold compile of the GIN examples, split into numba lowering, nvJitLink link and module load.

Each measurement runs in a fresh process with an empty kernel cache (``$FLOWDSL_CACHE_DIR``
set to a new directory) and compiles one kernel for an explicit target (NCCL release,
arch, GIN backend) the way the compile tests do, without a GPU
(``FlowKernel.compile(argtypes, arch=..., nccl=..., gin_backend=...)``):

* **lower**: numba typing and lowering to LTO-IR (everything but the link);
* **link**: nvJitLink's LTO link with the support builds (one C call, timed around it);
* **load**: the module load on the GPU (``cuModuleLoadData`` through numba), only when a
  GPU is present; otherwise ``-``.

CPU time (the process's, all threads) is the steady figure on a shared machine; wall time
is printed beside it. Each line is the median of ``--runs`` fresh processes; the runs of
the configurations are interleaved round by round. ``--profile`` prints the cProfile of one
compile (nvJitLink is a single C call in it). ``--backends`` takes ``all`` (every backend the
NCCL headers have, the build used when the backend is not known) and backend names.

Usage::

    python benchmarks/gin_compile.py                      # moe_gin on 2.32.3, every backend
    python benchmarks/gin_compile.py --kernels moe_gin,ring_gin --nccl 2.32.3,2.28.9 --runs 5
    python benchmarks/gin_compile.py --profile --kernels moe_gin --backends all
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

ARCH = "sm_90"


def _cases(nccl: str):
    """kernel name -> (kernel, argtypes). The GIN examples use weak signals (NCCL >= 2.32); ``ring_gin`` (the
    library's ring all_reduce for peers beyond the LSA team, float32 sum) compiles for every release;
    ``allgather_lsa`` uses no GIN."""
    import numpy as np

    import flowdsl
    from flowdsl import RedOp
    from flowdsl.collectives import _library
    from flowdsl.examples import allgather_lsa, alltoall_gin, alltoall_hybrid, moe_gin

    f, i32, i64 = ("window", np.float32), ("window", np.int32), ("window", np.int64)
    cases = {
        "moe_gin": (moe_gin.moe_gin, ("devcomm", f, i32, f, i32, i64, f, f, np.zeros(2, np.int64),
                                      np.zeros(2, np.int32), np.zeros(2, np.float32), 12, 32, 0)),
        "alltoall_gin": (alltoall_gin.alltoall_gin, ("devcomm", f, f, 256, 4)),
        "alltoall_hybrid": (alltoall_hybrid.alltoall_hybrid, ("devcomm", f, f, 256, 4)),
        # no GIN: links the support build alone (the control)
        "allgather_lsa": (allgather_lsa.allgather_lsa, ("devcomm", np.zeros(4, np.float32), f, 4)),
    }
    out = {name: (k, flowdsl.FlowKernel.argtypes_for(*args, nccl=nccl)) for name, (k, args) in cases.items()}
    out["ring_gin"] = (_library.kernel_for("ring", "all_reduce", RedOp.SUM, True), _library._argtypes("float32", nccl))
    return out


def _child(kernel_name: str, nccl: str, backend: str, profile: bool) -> dict:
    """One cold compile in this (fresh) process."""
    t0, c0 = time.perf_counter(), time.process_time()
    from flowdsl.lowering import compiler

    imported = (time.perf_counter() - t0, time.process_time() - c0)
    kernel, argtypes = _cases(nccl)[kernel_name]
    linked = {"wall": 0.0, "cpu": 0.0, "bytes": 0}
    real_linker = compiler.Linker

    class TimedLinker(real_linker):  # nvJitLink: one C call, timed from outside
        def __init__(self, *objects, options=None):
            linked["bytes"] = sum(len(o.code) for o in objects[1:])  # the support builds linked in
            super().__init__(*objects, options=options)

        def link(self, kind):
            w, c = time.perf_counter(), time.process_time()
            try:
                return super().link(kind)
            finally:
                linked["wall"] += time.perf_counter() - w
                linked["cpu"] += time.process_time() - c

    compiler.Linker = TimedLinker
    options = {} if backend == "all" else {"gin_backend": backend}
    w, c = time.perf_counter(), time.process_time()
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        compiled = prof.runcall(kernel.compile, argtypes, arch=ARCH, nccl=nccl, **options)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(15)
    else:
        compiled = kernel.compile(argtypes, arch=ARCH, nccl=nccl, **options)
    total = (time.perf_counter() - w, time.process_time() - c)
    load = None
    if _has_gpu():
        from flowdsl._launch import numba_kernel

        w = time.perf_counter()
        numba_kernel(compiled.entry_name, compiled.cubin, compiled.argtypes).bind()
        load = time.perf_counter() - w
    leftover = [s for s in compiled.function_symbols() if s.startswith("flowdsl_")]
    return {"import_wall": imported[0], "import_cpu": imported[1],
            "lower_wall": total[0] - linked["wall"], "lower_cpu": total[1] - linked["cpu"],
            "link_wall": linked["wall"], "link_cpu": linked["cpu"], "total_wall": total[0], "total_cpu": total[1],
            "load_wall": load, "support_bytes": linked["bytes"], "cubin_bytes": len(compiled.cubin),
            "inlined": not leftover}


def _has_gpu() -> bool:
    try:
        from numba import cuda

        return cuda.is_available()
    except Exception:  # noqa: BLE001 - no driver
        return False


def _run_child(kernel_name, nccl, backend, profile=False) -> dict | str:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, FLOWDSL_CACHE_DIR=cache)
        cmd = [sys.executable, __file__, "--child", kernel_name, nccl, backend] + (["--profile"] if profile else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if profile:
        sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        text = re.sub(r"\x1b\[[0-9;]*m", "", proc.stderr)
        errors = [line.strip() for line in text.splitlines() if "Error" in line]
        return errors[-1] if errors else f"exit {proc.returncode}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median(runs, key):
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def _fmt(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default="moe_gin")
    parser.add_argument("--nccl", default="2.32.3")
    parser.add_argument("--backends", default="all,proxy,gdaki,gpi,efa_gda")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="cProfile one compile of each configuration")
    parser.add_argument("--json", help="write every run here")
    parser.add_argument("--child", nargs=3, metavar=("KERNEL", "NCCL", "BACKEND"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child, profile=args.profile)))
        return 0
    configs = [(k, n, b) for k in args.kernels.split(",") for n in args.nccl.split(",")
               for b in args.backends.split(",")]
    print(f"# {platform.node()} {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, arch {ARCH}, {args.runs} fresh processes each")
    if args.profile:
        for config in configs:
            print(f"## profile {config}", file=sys.stderr)
            _run_child(*config, profile=True)
    runs = {c: [] for c in configs}
    refused = {}
    for _ in range(args.runs):
        for config in configs:
            if config in refused:
                continue
            result = _run_child(*config)
            if isinstance(result, str):
                refused[config] = result
            else:
                runs[config].append(result)
    header = ("kernel", "nccl", "backend", "lower cpu", "link cpu", "total cpu", "total wall", "load",
              "support MB", "cubin KB", "inlined")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for config, rs in runs.items():
        if config in refused:
            print(f"| {' | '.join(config)} | refused: {refused[config][:100]} |")
            continue
        print("| " + " | ".join([*config, _fmt(_median(rs, "lower_cpu")), _fmt(_median(rs, "link_cpu")),
                                  _fmt(_median(rs, "total_cpu")), _fmt(_median(rs, "total_wall")),
                                  _fmt(_median(rs, "load_wall"), 3), _fmt(_median(rs, "support_bytes") / 1e6),
                                  _fmt(_median(rs, "cubin_bytes") / 1e3, 0), str(all(r["inlined"] for r in rs))])
              + " |")
    imports = [r["import_cpu"] for rs in runs.values() for r in rs]
    if imports:
        print(f"# import flowdsl: {statistics.median(imports):.2f} s CPU (median), not counted above")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": {" ".join(c): rs for c, rs in runs.items()}, "refused": {" ".join(c): r for c, r in
                                                                                         refused.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
