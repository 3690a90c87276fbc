"""The compiled library: which kernel a call uses, and building all of them ahead of time.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
import time

import numpy as np

from ..enums import RedOp
from ..errors import UsageError
from .programs import PROGRAMS

__all__ = ["kernel_for", "library", "precompile", "load", "storage"]

# Collectives whose result does not depend on the operator get one kernel.
_NO_OP = ("all_gather", "broadcast", "all_to_all")
# Programs that store into every peer's memory: one LSA team only.
_LSA_ONLY = ("one_shot", "multimem")
# Programs that run across several LSA teams only (the host refuses one node): always the GIN build.
_ACROSS_ONLY = ("hierarchical",)
# Programs with the far phase over CFT (sm_100, NCCL >= 2.32): a kernel per element type (its shared-memory
# stage is typed) taking (comm, win, src, dst, count, channels), built only for communicators with CFT.
_CFT = ("hierarchical_cft",)
# Programs whose kernel depends on the element type's multimem form (programs.multimem_form): PTX has one
# form per type, and numba types every call in a kernel, so the other form's kernel is another kernel.
_BY_FORM = ("multimem",)


#: Element types stored as another NumPy type in kernels, and the fp8 format code.
_STORAGE = {"bfloat16": ("uint16", 0), "float8_e4m3fn": ("uint8", 1), "float8_e5m2": ("uint8", 2)}


def storage(dtype: str) -> tuple[str, int]:
    """(NumPy dtype the kernel sees, fp8 format code) for a collectives dtype name."""
    return _STORAGE.get(dtype, (dtype, 0))


def kernel_for(algorithm: str, collective: str, op: RedOp, gin_peers: bool = False, fp8: int = 0,
               ll128: bool = False, dtype: str | None = None):
    """The ``@flowdsl.kernel`` of a program for ``op`` (``gin_peers``: peers beyond the LSA team;
    ``fp8``: the format of uint8 elements, for the collectives that combine them; ``ll128``: with
    LL128's code, for calls whose ``FlowConfig`` asks for it: the library holds the kernels without;
    ``dtype``: the kernel's element type, needed by the multimem program, whose form depends on it)."""
    if algorithm in _LSA_ONLY:  # no GIN variant (the host refuses these across nodes), no Flow protocols
        gin_peers, ll128 = False, False
    if algorithm in _ACROSS_ONLY:  # no LSA-only variant: the host refuses these within one node
        gin_peers = True
    if algorithm in _CFT:  # a copy, one kernel per storage type; no GIN, no Flow protocols
        if dtype is None:
            raise UsageError(f"Cannot make the {algorithm} {collective} kernel without its element type: its "
                             "shared-memory stage is typed. Pass dtype=")
        return PROGRAMS[(algorithm, collective)](np.dtype(storage(dtype)[0]))
    if algorithm in _BY_FORM:
        from .programs import multimem_form  # noqa: PLC0415

        form = multimem_form(storage(dtype)[0], op) if dtype is not None else None
        if form is None:
            raise UsageError(f"Cannot make the {algorithm} {collective} kernel for {dtype} and {RedOp(op).name}: "
                             "PTX's multimem has no form for them (flowdsl.mem.multimem_refusal says why). Use "
                             "another algorithm")
        return PROGRAMS[(algorithm, collective)](RedOp(op), False, 0, False, form)
    if collective in _NO_OP:  # a copy: neither the operator nor the fp8 format matters
        return PROGRAMS[(algorithm, collective)](RedOp.SUM, bool(gin_peers), 0, bool(ll128))
    return PROGRAMS[(algorithm, collective)](RedOp(op), bool(gin_peers), int(fp8), bool(ll128))


def library(dtypes=None, ops=None) -> list[tuple[str, str, RedOp, str]]:
    """Every (algorithm, collective, op, dtype) the library holds."""
    from ._config import DTYPES  # noqa: PLC0415

    from .programs import multimem_form  # noqa: PLC0415

    dtypes = tuple(dtypes or DTYPES)
    ops = tuple(ops or tuple(RedOp))
    out = []
    for (algorithm, collective) in PROGRAMS:
        for op in ((RedOp.SUM,) if collective in _NO_OP else ops):
            seen = set()
            for dt in dtypes:
                if algorithm in _BY_FORM and multimem_form(storage(dt)[0], op) is None:
                    continue  # what PTX's multimem lacks: the host refuses the call
                kernel_type = storage(dt)[0] if collective in _NO_OP else dt  # fp8 copies are uint8 copies
                if kernel_type not in seen:
                    seen.add(kernel_type)
                    out.append((algorithm, collective, op, kernel_type if collective in _NO_OP else dt))
    return out


@functools.lru_cache(maxsize=None)
def _argtypes(dtype: str, nccl, algorithm: str = "ring"):
    """The library kernels' argument types (numba types are immutable: one tuple serves every kernel)."""
    from .._kernel import FlowKernel  # noqa: PLC0415

    sample = np.zeros(1, storage(dtype)[0])
    if algorithm in _CFT:  # (comm, win, src, dst, count, channels): a counted window of u64 words
        return FlowKernel.argtypes_for("devcomm", ("window", np.uint64), sample, sample, 0, 0, nccl=nccl)
    # Flow programs take a staging window (flow.staging); one-shot its own zeroed window. The last two:
    # PREMULSUM's scalar (its bits, an int; a device array of the element type, empty for a host immediate).
    stage = ("window" if algorithm in _LSA_ONLY else "staging", np.uint64)
    return FlowKernel.argtypes_for("devcomm", stage, sample, sample, *([0] * 9), sample, nccl=nccl)


def _kernel_of(entry, gin_peers):
    algorithm, collective, op, dtype = entry
    return kernel_for(algorithm, collective, op, gin_peers, storage(dtype)[1], dtype=dtype)


def _build(entry, target, gin_peers) -> str:
    """Compile one library entry into the disk cache."""
    return _kernel_of(entry, gin_peers).build(_argtypes(entry[3], target.nccl, entry[0]), target)


def _affinity(entry) -> tuple:
    """Sort key that puts kernels sharing compiled device code next to each other.

    numba compiles Flow's steps once per process and element type (about 3 s of CPU the
    first time), again for each operator (about 1.5 s), and reuses them for every other
    program of that type and operator (0.3 s each): the kernel's element type (the
    storage type, then the fp8 format), then the operator, then the program.
    """
    algorithm, collective, op, dtype = entry
    kernel_type, fp8 = storage(dtype)
    return kernel_type, fp8, int(op), algorithm, collective


#: Runs per worker process: a free worker takes the next run.
RUNS_PER_WORKER = 4


def _runs(entries: list, runs: int) -> list[list]:
    """``entries`` in :func:`_affinity` order, cut into ``runs`` contiguous runs of equal length.

    A worker meets an element type and operator once per run (not once per kernel, as
    when kernels go to whichever worker is free). Runs are not equal work: an fp8 or
    bfloat16 kernel compiles several times longer than a float32 one, so with one run per
    worker the fp8 workers finished last, long after the others (226 s for the library on 16
    CPUs); with several runs per worker, the free workers take the remaining runs.
    """
    ordered = sorted(entries, key=_affinity)
    cuts = [round(i * len(ordered) / runs) for i in range(runs + 1)]
    return [ordered[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]


_progress_queue = None


def _start_worker(queue) -> None:
    import signal  # noqa: PLC0415

    global _progress_queue
    _progress_queue = queue
    # Ctrl-C reaches the whole process group: the parent alone handles it and ends the workers, instead
    # of each worker abandoning its current kernel and going on with the queue.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _build_run(run, target, gin_peers) -> None:
    """Compile a run of entries in a worker process, reporting each kernel as it is done."""
    for entry in run:
        _progress_queue.put((entry, _build(entry, target, gin_peers)))


def precompiled(entries, gin_peers: bool, multimem: bool, cft: bool = False) -> list:
    """The library entries a communicator of this kind can call: the hierarchical programs only with
    ``gin_peers`` (the host refuses them within one node), the multimem one only with ``multimem`` (an NVLink
    switch that NCCL is let use), the CFT one only with ``gin_peers`` and ``cft`` (sm_100, NCCL >= 2.32, the
    CFT build; several nodes)."""
    return [e for e in entries if (gin_peers or e[0] not in _ACROSS_ONLY) and (multimem or e[0] not in _BY_FORM)
            and ((gin_peers and cft) or e[0] not in _CFT)]


def precompile(*, arch: str | None = None, nccl=None, dtypes=None, ops=None, gin_peers: bool = False,
               multimem: bool = False, cft: bool = False, jobs: int | None = None, progress: bool = True) -> dict:
    """Compile the library's kernels for one kind of communicator into the disk cache (no GPU needed when
    ``arch`` is given); a kernel left out is compiled at its first call.

    Args:
        arch: Target such as ``"sm_90"`` (default: this machine's GPU).
        nccl: NCCL release of the device ABI (default: the loaded libnccl).
        dtypes: Subset of the element types to build (default: all).
        ops: Subset of the reduction operators (:class:`flowdsl.RedOp`) to build (default: all).
        gin_peers: Build the kernels for communicators spanning several nodes (GIN), the hierarchical
            programs among them.
        multimem: Build the multimem all-reduce too (GPUs behind an NVLink switch, NVLS allowed).
        cft: With ``gin_peers``, build the all_gather with its far phase over CFT too (``arch`` sm_100 or
            newer, NCCL >= 2.32, a CUDA 13.3 linker).
        jobs: Worker processes (default: the CPUs this process may use; each kernel
            compiles on one core).
        progress: Print a progress bar on stderr.

    Returns:
        ``{"kernels": n, "compiled": n, "cached": n, "seconds": s}``.
    """
    from .._targets import device_target  # noqa: PLC0415
    from ..lowering.target import Target, parse_version  # noqa: PLC0415
    from ..runtime import nccl as nccl_runtime  # noqa: PLC0415

    if arch is None:
        target = device_target()
    else:
        from .._targets import checked_arch  # noqa: PLC0415

        target = Target(parse_version(nccl) if nccl is not None else nccl_runtime.loaded_version(),
                        checked_arch(arch, "precompile the collectives"))
    entries = precompiled(library(dtypes, ops), gin_peers, multimem, cft)
    start = time.perf_counter()
    counts = {"kernels": len(entries), "compiled": 0, "cached": 0}
    jobs = max(1, min(jobs or len(os.sched_getaffinity(0)), len(entries)))

    def report(i, entry, source):
        counts[source] += 1
        if progress:
            done = int(30 * i / len(entries))
            algorithm, collective, op, dtype = entry
            sys.stderr.write(f"\rprecompile [{'#' * done}{'.' * (30 - done)}] {i}/{len(entries)} "
                             f"{algorithm} {collective}{'' if collective in _NO_OP else ' ' + op.name.lower()} "
                             f"{dtype}        ")
            sys.stderr.flush()

    # Found here, the cached kernels start no worker (a worker's start-up is seconds).
    missing = []
    for entry in entries:
        if _kernel_of(entry, gin_peers).cached(_argtypes(entry[3], target.nccl, entry[0]), target):
            report(counts["cached"] + 1, entry, "cached")
        else:
            missing.append(entry)
    found = counts["cached"]
    if min(jobs, len(missing)) == 1:
        for i, entry in enumerate(sorted(missing, key=_affinity), found + 1):
            report(i, entry, _build(entry, target, gin_peers))
    elif missing:
        workers = min(jobs, len(missing))
        _build_in_workers(_runs(missing, min(workers * RUNS_PER_WORKER, len(missing))), workers, target,
                          gin_peers, lambda i, entry, source: report(found + i, entry, source))
    if progress:
        sys.stderr.write("\n")
    counts["seconds"] = time.perf_counter() - start
    return counts


def _build_in_workers(runs, workers: int, target, gin_peers, report) -> None:
    """``workers`` processes (numba compiles one kernel at a time per process) take the runs
    in order as they become free; each kernel is reported as it is done."""
    import multiprocessing  # noqa: PLC0415
    import queue as queues  # noqa: PLC0415
    from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415

    context = multiprocessing.get_context("spawn")
    done_queue = context.Queue()
    total = sum(map(len, runs))
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker, initargs=(done_queue,))
    try:
        futures = [pool.submit(_build_run, run, target, gin_peers) for run in runs]
        done = 0
        while done < total:
            try:
                entry, source = done_queue.get(timeout=0.5)
            except queues.Empty:
                for future in futures:  # a worker that failed (or died) ends the build with its error
                    if future.done() and future.exception() is not None:
                        raise future.exception()
                continue
            done += 1
            report(done, entry, source)
    except BaseException:  # Ctrl-C or a failed kernel: end the workers now, not after the queue
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def load(*, dtypes=None, ops=None, gin_peers: bool = False) -> dict:
    """Load the library's kernels onto this GPU now (from the disk cache; compiling what is missing).

    Returns ``{"kernels": n, "disk": n, "compiled": n, "seconds": s}``.
    """
    from .._targets import device_target  # noqa: PLC0415

    start = time.perf_counter()
    target = device_target()
    counts = {"kernels": 0, "disk": 0, "compiled": 0, "loaded": 0}
    with _collection_paused():
        for algorithm, collective, op, dtype in library(dtypes, ops):
            if algorithm in _CFT:  # sm_100 and NCCL >= 2.32 only: compiled at its first call
                continue
            kernel = kernel_for(algorithm, collective, op, gin_peers, storage(dtype)[1], dtype=dtype)
            source = kernel._load_for(_argtypes(dtype, target.nccl, algorithm), target)
            counts["kernels"] += 1
            counts[source] += 1
    counts["seconds"] = time.perf_counter() - start
    return counts


@contextlib.contextmanager
def _collection_paused():
    """No cyclic garbage collection while the library loads: each kernel makes thousands of small objects
    (its key's walk, its launch packers), and the collections they set off, each over every object numba's
    import made, were a fifth of the load; what is garbage is collected after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
