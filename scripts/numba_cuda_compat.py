"""numba-cuda's own test suite with its kernels compiled through ``@flowdsl.kernel``, beside plain numba-cuda.

The tests are numba-cuda's, imported from the installed wheel (``numba.cuda.tests.cudapy``), never copied.
Each module runs twice, in fresh processes: as numba-cuda runs it, and with ``numba.cuda.jit`` made
``@flowdsl.kernel`` (``device=True``: ``@flowdsl.device``) before the module is imported, so that the
tests' own kernels, inputs and checks go through flowdsl.

    python scripts/numba_cuda_compat.py --target sim [--modules test_atomics test_intrinsics ...] [--json out] [--jobs N]

``--target sim`` (a CPU machine): plain numba-cuda is its simulator (``NUMBA_ENABLE_CUDASIM=1``), flowdsl's
side is flowdsl's simulator; each test runs inside a one-rank simulated communicator (``flowdsl.sim.spawn``),
its host calls (``cuda.to_device``, ``copy_to_host``) are numba's simulator's, and a launch waits for its
kernel (numba's simulator runs kernels at the launch; flowdsl's queues them on the rank's stream).
``--target gpu``: both sides on the GPU, the host API numba-cuda's own.

Prints per module: tests run, passed, failed, refused (a ``flowdsl.FlowDSLError``: flowdsl says no, by name),
errors of other kinds, skipped (numba-cuda's own skips: host-only tests, features the target lacks), and the
totals with flowdsl's passes as a ratio of numba-cuda's. A module that runs past ``--timeout`` is reported as
timed out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Modules of numba.cuda.tests.cudapy run by default on the simulator: one or more per feature family
#: (atomics, intrinsics, warp functions, shared and local memory, math, control flow, device functions,
#: closures and globals, records, complex numbers). The whole cudapy package is ``--modules all``.
SIM_MODULES = (
    "test_atomics", "test_intrinsics", "test_warp_ops", "test_sync", "test_sm", "test_localmem",
    "test_math", "test_complex", "test_freevar", "test_globals", "test_const_string", "test_idiv", "test_inspect",
    "test_recursion", "test_record_dtype", "test_operator", "test_laplace", "test_montecarlo",
    "test_vectorize_device", "test_casting", "test_exception", "test_userexc", "test_alignment",
    "test_array", "test_blackscholes", "test_boolean", "test_constmem", "test_cuda_array_interface",
    "test_datetime", "test_debug", "test_device_func", "test_enums", "test_errors", "test_fastmath",
    "test_forall", "test_gufunc_scalar", "test_iterators", "test_lang", "test_matmul", "test_minmax",
    "test_nondet", "test_optimization", "test_print", "test_random", "test_slicing", "test_stream_api",
    "test_transpose", "test_vector_type", "test_warning", "test_sm_creation", "test_dispatcher",
)


# ---- the child: one module, one side ------------------------------------------------------------------------

def _flowdsl_jit(target):
    """``numba.cuda.jit`` as flowdsl: kernels through ``@flowdsl.kernel``, device functions ``@flowdsl.device``.
    numba-cuda's own calls of ``cuda.jit`` (its compiler's passes, which make a closure inside a kernel a device
    dispatcher) stay numba-cuda's, as they are in a program that uses flowdsl: only the tests' decorators change."""
    import flowdsl

    numba_jit = sys.modules["numba.cuda"].jit

    def jit(func_or_sig=None, device=False, **options):
        if sys._getframe(1).f_globals.get("__name__", "").startswith("numba.cuda.core."):
            return numba_jit(func_or_sig, device=device, **options)
        known = {k: options[k] for k in ("fastmath", "lineinfo", "max_registers", "link", "launch_bounds", "debug",
                                         "opt", "cache", "shared_memory_carveout", "inline", "forceinline")
                 if options.get(k) is not None}
        fn = func_or_sig if callable(func_or_sig) and not isinstance(func_or_sig, str) else None
        signature = None if fn is not None else func_or_sig
        # The decorator is made here, as cuda.jit makes its own: its warnings (debug with opt, ...) come now.
        if device:
            decorate = flowdsl.device(signature=signature, fastmath=bool(known.get("fastmath")),
                                      debug=known.get("debug"), opt=known.get("opt"), lineinfo=known.get("lineinfo"))
        else:
            make_kernel = flowdsl.kernel(signature=signature, **known)  # inline, forceinline: as a callee

            def decorate(f):
                k = make_kernel(f)
                return _SyncLaunches(k) if target == "sim" else k
        return decorate(fn) if fn is not None else decorate
    return jit


class _SyncLaunches:
    """A flowdsl kernel whose simulated launches wait for the kernel, as numba's simulator's do; its numba-only
    attributes are the kernel's (missing ones fail the test that asks for them, as they would for a user)."""

    comm = None  # the one-rank simulated communicator the running test is in

    def __init__(self, kernel):
        self._kernel = kernel
        self._made: dict = {}  # specialize's wrappers by the kernel it made
        self.__doc__ = kernel.__doc__  # the kernel's, as numba-cuda's dispatcher gives it

    def __getitem__(self, config):
        return self._synced(self._kernel[config])

    def forall(self, *args, **kwargs):
        return self._synced(self._kernel.forall(*args, **kwargs))

    def specialize(self, *args):
        made = self._kernel.specialize(*args)  # the kernel's own cache: the same types, the same wrapper
        if id(made) not in self._made:
            self._made[id(made)] = _SyncLaunches(made)
        return self._made[id(made)]

    def __call__(self, *args, **kwargs):  # a launch without [grid, block]: the kernel's own refusal
        return self._kernel(*args, **kwargs)

    @staticmethod
    def _synced(launch):
        def run(*args):
            launch(*(_host_view(a) for a in args))
            _SyncLaunches.comm.synchronize()
        return run

    def __getattr__(self, name):
        return getattr(self._kernel, name)


def _host_view(a):
    """numba's simulated device arrays are NumPy arrays underneath: the kernel gets the same memory."""
    return getattr(a, "_ary", a)


def _child(module: str, side: str, target: str) -> dict:
    import unittest

    if side == "flowdsl":
        import numba.cuda

        numba.cuda.jit = _flowdsl_jit(target)
    counts = {"run": 0, "passed": 0, "failed": 0, "refused": 0, "errors": 0, "skipped": 0}
    try:
        suite = unittest.defaultTestLoader.loadTestsFromName(f"numba.cuda.tests.cudapy.{module}")
    except unittest.SkipTest as e:  # the whole module does not apply on this target (numba-cuda says why)
        return {"module": module, "side": side, **counts, "not_applicable": str(e), "refusals": {}}
    refusals = {}
    problems = {}  # test name -> the last line of its error or failure (the JSON keeps them for diagnosis)

    def record(result):
        """Count one test once, whatever its subtests: an error (a refusal when every error is flowdsl's),
        else a failure, else skipped, else passed; each failing subtest's last line is kept."""
        counts["run"] += 1
        lasts = [text.strip().splitlines()[-1] for _, text in result.errors]
        for test, text in result.errors + result.failures:
            last = text.strip().splitlines()[-1]
            if not _is_refusal(last):
                failed = "failed: " if any(text is t for _, t in result.failures) else ""
                problems[test.id().rsplit(".", 1)[-1]] = failed + last[:300]
        if lasts and all(_is_refusal(last) for last in lasts) and not result.failures:
            counts["refused"] += 1
            refusals[lasts[0][:160]] = refusals.get(lasts[0][:160], 0) + 1
        elif lasts:
            counts["errors"] += 1
        elif result.failures or result.unexpectedSuccesses:
            counts["failed"] += 1
        elif result.skipped:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1

    tests = list(_flatten(suite))
    for test in tests:  # set by numba-cuda's own test runner; a failed FileCheck reads it to dump the IR
        test._dump_failed_filechecks = False
    classes = [type(t) for t in tests]
    for i, test in enumerate(tests):
        result = unittest.TestResult()
        kind = classes[i]
        if i == 0 or classes[i - 1] is not kind:  # the class's fixtures, as a suite runs them (an IPC
            try:                                   # test's process pool, ...): one test at a time skips them
                kind.setUpClass()
                failed_setup = None
            except unittest.SkipTest as e:
                failed_setup = ("skip", str(e))
            except Exception as e:  # noqa: BLE001 - each of the class's tests reports it
                failed_setup = ("error", f"{type(e).__name__}: {e}")
        if failed_setup is not None:
            if failed_setup[0] == "skip":
                result.skipped.append((test, failed_setup[1]))
            else:
                result.errors.append((test, f"setUpClass: {failed_setup[1]}"))
            record(result)
            continue
        if side == "flowdsl" and target == "sim":
            import flowdsl.sim

            def main(comm, test=test, result=result):
                _SyncLaunches.comm = comm
                test.run(result)
            try:
                flowdsl.sim.spawn(main, nranks=1)
            except Exception as e:  # noqa: BLE001 - a kernel's failure ends its simulation: the test's error
                result.errors.append((test, f"{type(e).__module__}.{type(e).__name__}: {e}".replace("\n", " ")))
        else:
            test.run(result)
        record(result)
        if i + 1 == len(tests) or classes[i + 1] is not kind:
            try:
                kind.tearDownClass()
            except Exception:  # noqa: BLE001, S110 - the tests are counted; a teardown's failure changes none
                pass
    return {"module": module, "side": side, **counts, "refusals": refusals, "problems": problems}


def _is_refusal(last_line: str) -> bool:
    return any(name in last_line for name in ("flowdsl.errors.", "flowdsl.sim.errors.", "FlowDSLError",
                                               "UsageError", "UnsupportedFeatureError", "KernelTypingError"))


def _flatten(suite):
    for item in suite:
        if hasattr(item, "__iter__"):
            yield from _flatten(item)
        else:
            yield item


# ---- the driver ------------------------------------------------------------------------------------------------

def _run(module: str, side: str, target: str, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if target == "sim":
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", module, side, target], capture_output=True,
                              text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"module": module, "side": side, "timed_out": True, "seconds": timeout}
    line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("{")), None)
    if line is None:  # the module did not import, or the process died
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"module": module, "side": side, "crashed": tail[:200], "seconds": time.monotonic() - start}
    return dict(json.loads(line), seconds=time.monotonic() - start)


def _all_modules() -> list[str]:
    import pkgutil

    import numba.cuda.tests.cudapy as package

    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name.startswith("test_"))


def _cell(r: dict) -> str:
    if r.get("timed_out"):
        return f"timed out ({r['seconds']:.0f} s)"
    if "crashed" in r:
        return f"did not run: {r['crashed']}"
    if "not_applicable" in r:
        return f"not applicable: {r['not_applicable']}"
    return (f"{r['passed']}/{r['run']} passed, {r['failed']} failed, {r['refused']} refused, {r['errors']} errors, "
            f"{r['skipped']} skipped")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=("sim", "gpu"), default="sim")
    ap.add_argument("--modules", nargs="+", help="modules of numba.cuda.tests.cudapy (default: a set covering "
                    "every feature family on the simulator; 'all': every module)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per module and side")
    ap.add_argument("--json", type=Path, help="write every row here")
    ap.add_argument("--jobs", type=int, default=1, help="modules run at once (each side is its own process)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child)), flush=True)
        return 0
    modules = args.modules or list(SIM_MODULES)
    if modules == ["all"]:
        modules = _all_modules()
    import numba_cuda

    print(f"numba-cuda {numba_cuda.__version__}'s tests (numba.cuda.tests.cudapy) on the {args.target}: plain "
          "numba-cuda, then through @flowdsl.kernel", flush=True)
    rows = []
    totals = {"numba": {"passed": 0, "run": 0}, "flowdsl": {"passed": 0, "run": 0, "refused": 0}}
    from concurrent.futures import ThreadPoolExecutor, as_completed  # noqa: PLC0415 - threads that wait for child processes

    def both(module):
        return _run(module, "numba", args.target, args.timeout), _run(module, "flowdsl", args.target, args.timeout)

    done = {}
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {pool.submit(both, m): m for m in modules}
        for future in as_completed(futures):
            done[futures[future]] = future.result()
            if args.json:  # what has finished so far, in case the run is cut short
                _write_json(args.json, args.target, [{"module": m, "numba": p, "flowdsl": f}
                                                      for m, (p, f) in done.items()], None)
    for module in modules:
        plain, mine = done[module]
        rows.append({"module": module, "numba": plain, "flowdsl": mine})
        for side, r in (("numba", plain), ("flowdsl", mine)):
            for k in totals[side]:
                totals[side][k] += r.get(k, 0)
        print(f"{module:<28} numba-cuda: {_cell(plain)}\n{'':<28} flowdsl:    {_cell(mine)}", flush=True)
        for text, n in sorted(mine.get("refusals", {}).items(), key=lambda kv: -kv[1])[:3]:
            print(f"{'':<32}refused x{n}: {text}", flush=True)
    n, f = totals["numba"], totals["flowdsl"]
    ratio = f["passed"] / n["passed"] if n["passed"] else float("nan")
    print(f"\ntotal: numba-cuda {n['passed']} of {n['run']} passed; flowdsl {f['passed']} of {f['run']} passed, "
          f"{f['refused']} refused by name; flowdsl / numba-cuda passes = {ratio:.3f}", flush=True)
    if args.json:
        _write_json(args.json, args.target, rows, totals)
    return 0


def _write_json(path: Path, target: str, rows: list, totals: dict | None) -> None:
    import numba_cuda

    path.write_text(json.dumps({"target": target, "numba_cuda": numba_cuda.__version__, "rows": rows,
                                "totals": totals}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
