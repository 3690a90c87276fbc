"""The ``flowdsl`` command (also ``python -m flowdsl``): the demo, what this machine has, precompiling.

Verbs:
    demo    the fused ReduceScatter + RMSNorm + AllGather kernel, checked against NumPy:
            on the GPU(s) when there are any (one rank per process; under torchrun,
            one per GPU), otherwise on 4 simulated ranks on the CPU (``--sim`` forces it).
    info    flowdsl, NCCL, CUDA driver / runtime / nvJitLink / nvcc, the GPU, the
            support builds, CFT availability, the GIN backend, the kernel cache.
    precompile
            compile the collectives library (flowdsl.collectives) into the disk cache,
            with a progress bar; ``--arch sm_90`` builds without a GPU.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
import time

import numpy as np

from ._release import arch_cc
from .errors import FlowDSLError, UsageError

_DESCRIPTION = "flowdsl: NCCL Device API kernels in Python, on GPUs or on a CPU simulator."
_EPILOG = """verbs:
  demo        fused ReduceScatter + RMSNorm + AllGather, checked against NumPy: on the
              GPU(s) if there are any (under torchrun one rank per GPU), otherwise on
              simulated ranks on the CPU (the default verb)
  info        versions (NCCL, CUDA driver and runtime, nvJitLink, nvcc), the GPU, the
              support builds, CFT and GIN availability, the kernel cache
  precompile  build the collectives library into the kernel cache
              (without a GPU: --arch sm_90, and --nccl for another NCCL release)

'flowdsl VERB --help' describes a verb's options."""


def _gpu_available() -> bool:
    try:
        from cuda.bindings import driver

        if int(driver.cuInit(0)[0]) != 0:
            return False
        err, count = driver.cuDeviceGetCount()
        return int(err) == 0 and count > 0
    except Exception:  # noqa: BLE001 - no driver at all
        return False


def _report(where: str, results, nranks: int, tokens_per_rank: int, seconds: float, dtype: str) -> int:
    from flowdsl.examples.rmsnorm_lsa import TOLERANCE

    tol = TOLERANCE[dtype]
    worst = max(float(np.max(np.abs(r - ref))) for r, ref in results)
    ok = all(np.allclose(r, ref, rtol=tol, atol=tol) for r, ref in results)
    hidden = results[0][0].shape[1]
    print(f"flowdsl demo: fused ReduceScatter + RMSNorm + AllGather, {nranks} rank(s) {where}, "
          f"{tokens_per_rank} tokens per rank ({tokens_per_rank * nranks} in all) x {hidden} hidden ({dtype})")
    print(f"  max |result - NumPy reference| over {'all ranks' if len(results) == nranks else 'rank 0'}: "
          f"{worst:.2e}  ->  {'OK' if ok else 'MISMATCH'}  ({seconds:.2f} s)")
    return 0 if ok else 1


def demo(args) -> int:
    """``flowdsl demo``: the fused RMSNorm example on GPUs, or on the simulator without one."""
    from flowdsl.examples import rmsnorm_lsa

    if args.sim or not _gpu_available():
        import flowdsl.sim

        why = "(--sim)" if args.sim else "(no GPU found)"
        start = time.perf_counter()
        results = flowdsl.sim.spawn(lambda comm: rmsnorm_lsa.run(comm, tokens_per_rank=args.tokens,
                                                                 hidden=args.hidden, seed=args.seed,
                                                                 dtype=args.dtype),
                                    nranks=args.ranks, seed=args.seed)
        return _report(f"on the CPU simulator {why}", results, args.ranks, args.tokens,
                       time.perf_counter() - start, args.dtype)

    import flowdsl

    start = time.perf_counter()
    with flowdsl.init() as comm:
        result = rmsnorm_lsa.run(comm, tokens_per_rank=args.tokens, hidden=args.hidden, seed=args.seed,
                                 dtype=args.dtype)
        nranks, rank = comm.nranks, comm.rank
    if rank != 0:
        tol = rmsnorm_lsa.TOLERANCE[args.dtype]
        return 0 if np.allclose(*result, rtol=tol, atol=tol) else 1
    version = ".".join(map(str, comm.nccl_version))
    return _report(f"on GPU (NCCL {version}, one rank per process)", [result], nranks, args.tokens,
                   time.perf_counter() - start, args.dtype)


# ---- info -------------------------------------------------------------------------------------

def _version_text(code: int) -> str:
    """A CUDA version code (13050) as ``13.5``."""
    return f"{code // 1000}.{code % 1000 // 10}"


def _cuda_versions() -> dict[str, str]:
    """CUDA driver, runtime and nvJitLink versions, or why each was not found."""
    found = {}
    try:
        from cuda.bindings import driver

        err, code = driver.cuDriverGetVersion()
        found["CUDA driver"] = _version_text(code) if int(err) == 0 else f"not usable ({err})"
    except Exception:  # noqa: BLE001 - no libcuda on this machine
        found["CUDA driver"] = "not found (no NVIDIA driver)"
    try:
        from cuda.bindings import runtime

        err, code = runtime.cudaRuntimeGetVersion()
        found["CUDA runtime"] = _version_text(code) if int(err) == 0 else f"not usable ({err})"
    except Exception as exc:  # noqa: BLE001
        found["CUDA runtime"] = f"not found ({exc})"
    try:
        from flowdsl.lowering.target import linker_cuda_version

        found["nvJitLink"] = ".".join(map(str, linker_cuda_version()))
    except Exception as exc:  # noqa: BLE001
        found["nvJitLink"] = f"not found ({exc}): kernels cannot be linked; pip install nvidia-nvjitlink"
    return found


def _nvcc_text() -> str:
    from flowdsl.runtime.support_build import nvcc_path

    nvcc = nvcc_path()
    if nvcc is None:
        return "not found (needed only to build support for an NCCL release without a prebuilt build)"
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
        release = next((line.split("release", 1)[1].split(",")[0].strip()
                        for line in out.splitlines() if "release" in line), "unknown version")
    except (OSError, subprocess.SubprocessError) as exc:
        release = f"does not run ({exc})"
    return f"{release} ({nvcc})"


def _gpus() -> list[tuple[str, str]]:
    """``(name, sm_XX)`` of each visible GPU; empty without a driver or GPU."""
    if not _gpu_available():
        return []
    from cuda.bindings import driver

    from flowdsl.runtime.memory import device_arch

    found = []
    for ordinal in range(driver.cuDeviceGetCount()[1]):
        dev = driver.cuDeviceGet(ordinal)[1]
        name = driver.cuDeviceGetName(128, dev)[1].split(b"\0", 1)[0].decode()
        found.append((name, device_arch(ordinal)))
    return found


def _support_lines(nccl) -> list[str]:
    """The checked-in support builds (and the CFT build), and builds made at first use."""
    from flowdsl.runtime import support_build
    from flowdsl.runtime.support import cache_dir, manifest

    info = manifest()
    lines = [f"support builds: {support_build.PREBUILT_DIR}"]
    if not info["abis"]:
        lines.append("  none found: reinstall flowdsl (the wheel carries them in flowdsl/_prebuilt)")
    cft = info.get("cft", {}).get("abis", {})
    for version, entry in info["abis"].items():
        text = f"  NCCL {version}: {', '.join(sorted(entry['builds'], key=arch_cc))}"
        if version in cft:
            text += f"; CFT: {', '.join(sorted(cft[version]['builds'], key=arch_cc))}"
        lines.append(text + ("  <- the loaded NCCL" if nccl and version == ".".join(map(str, nccl)) else ""))
    first_use = sorted((cache_dir() / "support").glob("nccl-*/*.ltoir"))
    for path in first_use:
        version = path.parent.name.removeprefix("nccl-")
        if version in info["abis"]:  # left by an earlier flowdsl without a prebuilt build of that release
            lines.append(f"  also in the cache, not used (the prebuilt {version} builds above are): {path}")
        else:
            lines.append(f"  NCCL {version}: {path.stem}, built at first use: {path}")
    loaded = ".".join(map(str, nccl)) if nccl else None
    if loaded and loaded not in info["abis"]:
        built = [p.stem for p in first_use if p.parent.name == f"nccl-{loaded}"]
        lines.append(f"  the loaded NCCL {loaded} has no prebuilt build: "
                     + (f"built here at first use for {', '.join(built)} (another arch is built at its first kernel, "
                        "with nvcc and its nvidia-nccl-cu13 headers)" if built else
                        "one is built at its first kernel (needs nvcc and its nvidia-nccl-cu13 headers), or install "
                        f"nvidia-nccl-cu13=={' or =='.join(info['abis'])}"))
    return lines


def _cft_text(nccl, gpus, nvjitlink: str) -> str:
    """Whether kernels using flowdsl.cft can run here, and what is missing (what the communicators'
    ``cft_missing`` says too: ``flowdsl.runtime.support.cft_missing``)."""
    from flowdsl.runtime.support import cft_missing

    try:
        linker = tuple(int(x) for x in nvjitlink.split(".")[:2])
    except ValueError:
        linker = None
    archs = [arch for _, arch in gpus]
    best = max(archs, key=arch_cc) if archs else None
    missing = cft_missing(nccl, best, linker)
    if not missing:
        return "available"
    return ("not runnable here: needs " + "; ".join(missing) +
            ". Kernels using flowdsl.cft compile without one (k.compile(..., arch='sm_100', nccl='2.32.3')) "
            "and run on flowdsl.sim")


def _gin_text(gpus) -> str:
    env = ", ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("NCCL_GIN")) or "none set"
    where = ("not knowable without a GPU" if not gpus else "not known before a communicator exists")
    return (f"{where}: NCCL picks it per communicator spanning nodes (proxy, GDAKI, GPI, EFA GDA); a "
            f"device communicator's .gin_backend names it, and GIN kernels are linked for it. NCCL_GIN_* "
            f"variables: {env}. flowdsl.sim models every backend (gin_backend=)")


def _cache_text() -> str:
    from flowdsl.runtime.support import cache_dir

    root = cache_dir()
    if not root.exists():
        return f"{root} (empty: not created yet; $FLOWDSL_CACHE_DIR moves it)"
    files = [p for p in root.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    return (f"{root} ({size / 2**20:.1f} MiB in {len(files)} file{'' if len(files) == 1 else 's'}; "
            "$FLOWDSL_CACHE_DIR moves it)")


def info(args) -> int:
    """``flowdsl info``: what flowdsl finds on this machine."""
    import flowdsl

    rows = [("flowdsl", f"{flowdsl.__version__} ({os.path.dirname(flowdsl.__file__)})")]
    nccl = None
    try:
        from flowdsl.runtime.nccl import loaded_version

        nccl = loaded_version()
        rows.append(("NCCL", ".".join(map(str, nccl)) + " (loaded by nccl4py)"))
    except Exception as exc:  # noqa: BLE001
        rows.append(("NCCL", f"not found ({exc})"))
    cuda = _cuda_versions()
    rows += list(cuda.items())
    rows.append(("nvcc", _nvcc_text()))
    gpus = _gpus()
    rows.append(("GPU", ", ".join(f"{i}: {name} ({arch})" for i, (name, arch) in enumerate(gpus))
                 or "none (kernels compile with k.compile(..., arch=...); programs run on flowdsl.sim)"))
    rows.append(("CFT", _cft_text(nccl, gpus, cuda["nvJitLink"])))
    rows.append(("GIN backend", _gin_text(gpus)))
    rows.append(("kernel cache", _cache_text()))
    for name, text in rows:
        print(textwrap.fill(text, width=100, initial_indent=f"{name + ':':<14}", subsequent_indent=" " * 14,
                            break_on_hyphens=False, break_long_words=False))
    for line in _support_lines(nccl):
        print(line)
    return 0


# ---- precompile -------------------------------------------------------------------------------

def precompile(args) -> int:
    """``flowdsl precompile``: build the collectives library ahead of time."""
    from .collectives import DTYPES, OPS  # noqa: PLC0415
    from .collectives import precompile as build  # noqa: PLC0415

    # The arguments first: a wrong one is reported before anything about this machine.
    for option, given, known in (("--dtypes", args.dtypes, DTYPES), ("--ops", args.ops, tuple(OPS))):
        unknown = [name for name in given or () if name not in known]
        if unknown:
            raise UsageError(f"unknown {option[2:-1]}(s) {', '.join(unknown)} for {option}: choose from "
                             f"{', '.join(known)}")
    if args.arch is None and not _gpu_available():
        from flowdsl.runtime.nccl import loaded_version

        loaded = ".".join(map(str, loaded_version()))
        given = "".join(f" {option} {' '.join(values)}" for option, values in
                        (("--dtypes", args.dtypes), ("--ops", args.ops)) if values)
        print("flowdsl precompile: no CUDA GPU was found here, so there is no arch to compile for. Name the "
              f"target instead:\n    flowdsl precompile --arch sm_90 --nccl {args.nccl or loaded}{given}\n"
              "--arch: the GPUs' compute capability (sm_80, sm_90, sm_100, ...); --nccl: the NCCL release "
              f"the kernels will run with (default: the loaded one, {loaded}).", file=sys.stderr)
        return 2
    ops = [OPS[name] for name in args.ops] if args.ops else None
    try:
        counts = build(arch=args.arch, nccl=args.nccl, dtypes=args.dtypes, ops=ops, gin_peers=args.gin,
                       multimem=args.multimem, cft=args.cft, jobs=args.jobs)
    except KeyboardInterrupt:
        print("\nflowdsl precompile: interrupted; the kernels compiled so far stay in the cache", file=sys.stderr)
        return 130
    print(f"{counts['kernels']} kernels: {counts['compiled']} compiled, {counts['cached']} already cached, "
          f"{counts['seconds']:.1f} s")
    return 0


def _parser() -> argparse.ArgumentParser:
    from . import __version__  # noqa: PLC0415
    from .examples._cli import at_least_one  # noqa: PLC0415 - the rule the examples' counts follow too

    parser = argparse.ArgumentParser(prog="flowdsl", description=_DESCRIPTION, epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"flowdsl {__version__}")
    # The verbs are listed once, in the epilog (argparse's own list would repeat them with shorter text).
    sub = parser.add_subparsers(dest="verb", metavar="VERB", help="one of the verbs below (demo when none is named)")
    p = sub.add_parser("demo",
                       description="Fused ReduceScatter + RMSNorm + AllGather over LSA, checked against NumPy. "
                                   "On GPUs: one rank per process (torchrun --nproc_per_node=N for N GPUs). "
                                   "Without a GPU (or with --sim): --ranks simulated ranks on the CPU.")
    p.add_argument("--sim", action="store_true", help="run on the CPU simulator even if a GPU is present")
    p.add_argument("--ranks", type=at_least_one, default=4,
                   help="simulated ranks (default 4; on GPUs: one per process)")
    p.add_argument("--tokens", type=at_least_one, default=8,
                   help="tokens per rank (default 8): each rank holds ranks x tokens rows and normalizes its "
                        "tokens of them")
    p.add_argument("--hidden", type=at_least_one, default=512, help="hidden size (default 512)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random inputs and of the simulator's interleaving (default 0)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                   help="element type of the tensor (default float32; the arithmetic is float32 for all)")
    sub.add_parser("info", description="What flowdsl finds on this machine: versions (NCCL, CUDA driver and runtime, "
                               "nvJitLink, nvcc), the GPUs, the support builds, whether CFT can run, the GIN "
                               "backend, and the kernel cache's location and size.")
    p = sub.add_parser("precompile", description="Compile every collective program (flowdsl.collectives) into the kernel "
                                   "cache: those a communicator within one node calls (--gin: across nodes; --multimem: with an NVLink "
                                   "switch); a kernel left out compiles at its first call. Without a GPU, name the "
                                   "target with --arch (and --nccl).")
    p.add_argument("--arch", help="target such as sm_90 (default: this GPU; needed without one)")
    p.add_argument("--nccl", help="NCCL release of the device ABI, e.g. 2.28.9 (default: the loaded libnccl)")
    p.add_argument("--dtypes", nargs="*", help="subset of element types (default: all)")
    p.add_argument("--ops", nargs="*", help="subset of operators: sum prod min max avg premulsum (default: all)")
    p.add_argument("--gin", action="store_true",
                   help="the kernels for communicators spanning several nodes (the hierarchical programs too)")
    p.add_argument("--multimem", action="store_true",
                   help="the multimem all-reduce too (GPUs behind an NVLink switch, NCCL's NVLS allowed)")
    p.add_argument("--cft", action="store_true",
                   help="with --gin, the all_gather whose far phase goes over CFT too (sm_100, NCCL >= 2.32)")
    p.add_argument("--jobs", type=at_least_one, help="worker processes (default: one per CPU)")
    return parser


def _verb_parser(parser: argparse.ArgumentParser, verb: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[verb]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    implicit = not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"))
    if implicit:
        argv.insert(0, "demo")  # the default verb, with its options (flowdsl --ranks 2)
    args, unknown = parser.parse_known_args(argv)
    if unknown and implicit:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (without a verb, flowdsl runs demo, whose options "
                     "'flowdsl demo --help' lists)")
    if unknown:  # said by the verb's own parser, with its usage line, not the top level's
        _verb_parser(parser, args.verb).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return {"demo": demo, "info": info, "precompile": precompile}[args.verb](args)
    except FlowDSLError as exc:  # what flowdsl refuses, said in one line (with its fix), not a traceback
        print(f"flowdsl {args.verb}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
