"""One rank's side of the benchmark on the GPUs (torch, CuPy, flowdsl; run under torchrun)."""

from __future__ import annotations

import datetime
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from .records import (BUDGET_SIZES, COLLECTIVES, EXPECTED_PROGRAMS, FULL_SIZES, GRAPH_CALLS, GRAPH_MAX,
                      QUICK_BUDGET_SIZES, QUICK_GRAPH_SIZES,
                      QUICK_SIZES, REDUCING, ROOTED, SYMM_MAX, at_bytes, bus_bandwidth, expected_values, family,
                      fmt_bytes, label, probe_calls, reps_for, warm_calls, write_json)

ROOT = Path(__file__).resolve().parents[2]


class _Watchdog:
    """Ends the process when one block of work does not finish in time (a hung collective)."""

    def __init__(self, seconds, rank, on_fire):
        self.seconds, self.rank, self.on_fire, self.timer = seconds, rank, on_fire, None

    def arm(self, what):
        self.disarm()
        if self.seconds > 0:
            self.timer = threading.Timer(self.seconds, self._fire, args=(what,))
            self.timer.daemon = True
            self.timer.start()

    def disarm(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fire(self, what):
        print(f"[rank {self.rank}] HANG: {what} did not finish in {self.seconds:.0f} s; exiting "
              "(partial results are in the JSON)", flush=True)
        try:
            self.on_fire()
        finally:
            os._exit(3)


def _views(src, dst, count):
    """Each collective's (src, dst) in two buffers of ``nranks * count`` elements."""
    return {"all_reduce": (src[:count], dst[:count]), "all_gather": (src[:count], dst),
            "reduce_scatter": (src, dst[:count]), "broadcast": (src[:count], dst[:count]),
            "reduce": (src[:count], dst[:count])}


class Bench:
    """One rank's side of the benchmark."""

    def __init__(self, args):
        import cupy  # noqa: PLC0415
        import numpy as np  # noqa: PLC0415
        import torch  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415

        sys.path.insert(0, str(ROOT))
        import flowdsl  # noqa: PLC0415
        from flowdsl import collectives as coll  # noqa: PLC0415

        self.args, self.np, self.cupy, self.torch, self.dist, self.coll = args, np, cupy, torch, dist, coll
        self.flowdsl = flowdsl
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        self.device = torch.device("cuda", local)
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.hang_timeout + 300))
        self.world = dist.group.WORLD
        self.comm = flowdsl.init(group=self.world)
        self.rank, self.n = self.comm.rank, self.comm.nranks
        self.stream = torch.cuda.Stream()        # back-to-back timing
        self.graph_stream = torch.cuda.Stream()  # warm-up and capture of the graphs
        self.records, self.errors = [], []
        self._reported, self._missing = set(), set()
        self.nccl_group, self.nccl_ok = None, False
        self.meta = self._meta()
        self.watchdog = _Watchdog(args.hang_timeout, self.rank, self.save)
        self.t0 = time.perf_counter()

    # -- agreement between ranks (gloo, CPU): every rank takes the same branches ------------------
    def all_ok(self, ok: bool) -> bool:
        t = self.torch.tensor([1 if ok else 0], dtype=self.torch.int32)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MIN, group=self.world)
        return bool(t.item())

    def max_floats(self, values):
        if not values:
            return []
        t = self.torch.tensor([float(v) for v in values], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.world)
        return t.tolist()

    def barrier(self):
        self.dist.barrier(group=self.world)

    def say(self, *parts):
        if self.rank == 0:
            print(*parts, flush=True)

    def _meta(self):
        torch = self.torch
        meta = {"nranks": self.n, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "gpu": torch.cuda.get_device_name(self.device), "torch": torch.__version__,
                "cupy": self.cupy.__version__, "flowdsl": getattr(self.flowdsl, "__version__", "?"),
                "quick": bool(self.args.quick), "argv": sys.argv[1:], "target_ms": self.args.target_ms,
                "rounds": self.args.rounds, "dtype": "float32", "op": "sum", "placement": "out of place",
                "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")}}
        try:
            from flowdsl.runtime.nccl import loaded_version  # noqa: PLC0415

            meta["nccl"] = ".".join(map(str, loaded_version()))
        except Exception as exc:  # noqa: BLE001
            meta["nccl"] = f"? ({exc})"
        try:
            meta["torch_nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001
            pass
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader",
                                  "-i", str(self.device.index)], capture_output=True, text=True, timeout=20)
            meta["driver"] = out.stdout.strip() or "?"
        except Exception:  # noqa: BLE001
            meta["driver"] = "?"
        try:
            from flowdsl._flow_staging import lsa_team_size  # noqa: PLC0415

            meta["lsa_size"] = int(lsa_team_size(self.comm))
        except Exception:  # noqa: BLE001
            pass
        return meta

    def data(self, complete=False):
        return {"meta": self.meta, "complete": complete, "records": list(self.records), "errors": list(self.errors)}

    def save(self, complete=False):
        if self.rank == 0 and self.args.json:
            write_json(self.data(complete), self.args.json)

    def fail(self, section, collective, nbytes, version, reason):
        self.errors.append({"section": section, "collective": collective, "bytes": nbytes, "version": version,
                            "reason": reason})
        key = (section, collective, version, reason)
        if key not in self._reported:
            self._reported.add(key)
            self.say(f"  skip {section} {collective} {label(version)} at {at_bytes(nbytes)}: {reason}")

    # -- timing ------------------------------------------------------------------------------------
    def _events(self):
        return (self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True))

    def time_calls(self, fn, calls, stream):
        """us per call of ``calls`` back-to-back calls on ``stream`` (ranks lined up first)."""
        self.comm.synchronize()
        self.barrier()
        start, stop = self._events()
        with self.torch.cuda.stream(stream):
            start.record(stream)
            for _ in range(calls):
                fn()
            stop.record(stream)
        stop.synchronize()
        return start.elapsed_time(stop) * 1e3 / calls

    def time_graph(self, graph, replays, stream):
        """us per replay of ``graph``."""
        return self.time_calls(graph.replay, replays, stream)

    def measure(self, section, collective, nbytes, entries, timer):
        """Set up, check, size and time every entry, interleaved round by round.

        ``entries``: version -> dict(setup=callable returning the thing ``timer`` runs,
        check=callable(thing) -> bool or None, per_call=calls per timed unit).
        ``timer(thing, units)`` -> us per unit. Appends records; returns nothing.
        """
        args = self.args
        live = {}
        for version, e in entries.items():
            # Set up (warm up, capture), agree, then check, agree: a failure anywhere skips the
            # version on every rank, so that the ranks keep making the same calls.
            thing, reason = self._attempt(e["setup"])
            if not self.all_ok(reason is None):
                self.fail(section, collective, nbytes, version, reason or "failed on another rank")
                continue
            good = None
            if e.get("check"):
                good, reason = self._attempt(lambda e=e, thing=thing: e["check"](thing))
                if not self.all_ok(reason is None):
                    self.fail(section, collective, nbytes, version, f"check: {reason or 'failed on another rank'}")
                    continue
            checked = None if good is None else ("ok" if self.all_ok(bool(good)) else "BAD")
            live[version] = (thing, checked, e)
        if not live:
            return
        names = list(live)
        first = []
        for v in names:  # the probe that sizes R
            thing, _, e = live[v]
            us, _ = self._attempt(lambda thing=thing, e=e: timer(thing, e.get("probe", 1)) / e.get("per_call", 1))
            first.append(float("nan") if us is None else us)
        first = self.max_floats(first)
        units = {}
        for v, us in zip(names, first):
            per = live[v][2].get("per_call", 1)
            units[v] = max(1, -(-reps_for(us, args.target_ms, lo=2, hi=5000) // per))
        times = {v: [] for v in names}
        for _ in range(args.rounds):
            this = []
            for v in names:
                try:
                    us = timer(live[v][0], units[v]) / live[v][2].get("per_call", 1)
                except Exception as exc:  # noqa: BLE001
                    self.fail(section, collective, nbytes, v, f"while timing: {type(exc).__name__}: {exc}")
                    us = float("nan")
                this.append(us)
            for v, us in zip(names, self.max_floats(this)):
                times[v].append(us)
        for v in names:
            rounds = times[v]
            us = statistics.median(rounds) if all(x == x for x in rounds) else float("nan")
            thing, checked, e = live[v]
            rec = {"section": section, "collective": collective, "bytes": nbytes, "version": v, "family": family(v),
                   "us": us, "rounds_us": rounds, "calls": units[v] * e.get("per_call", 1),
                   "busbw": bus_bandwidth(collective, self.n, nbytes, us), "check": checked}
            if e.get("per_call", 1) > 1:
                rec["calls_per_graph"] = e["per_call"]
            if e.get("chose"):
                rec["chose"] = e["chose"]()
            self.records.append(rec)

    @staticmethod
    def _attempt(fn):
        """(fn(), None) or (None, the reason it raised)."""
        try:
            return fn(), None
        except Exception as exc:  # noqa: BLE001
            text = str(exc).strip().splitlines()
            return None, f"{type(exc).__name__}: {text[0][:200] if text else ''}".rstrip(": ")

    # -- the callables ------------------------------------------------------------------------------
    def call(self, collective, src, dst, algorithm, stream, config=None):
        f = getattr(self.coll, collective)
        kw = {"algorithm": algorithm, "stream": stream}
        if config is not None:
            kw["config"] = config
        if collective in REDUCING:
            kw["op"] = "sum"
        if collective in ROOTED:
            kw["root"] = 0
        comm = self.comm
        return lambda: f(comm, src, dst, **kw)

    def programs(self, collective):
        """The flowdsl programs of a collective (the keys of PROGRAMS); expected ones missing are reported once."""
        from flowdsl.collectives.programs import PROGRAMS  # noqa: PLC0415

        found = [alg for (alg, c) in PROGRAMS if c == collective]
        for alg in EXPECTED_PROGRAMS.get(collective, ()):
            if alg not in found and (collective, alg) not in self._missing:
                self._missing.add((collective, alg))
                self.fail("b2b", collective, None, alg, "no such program in flowdsl.collectives.programs.PROGRAMS")
        return found

    def auto_choice(self, collective, nbytes, src, dst, stream):
        """What algorithm="auto" runs: the plan's, if it says; else cost.choose's."""
        plans = self.comm.__dict__.get("_flowdsl_plans") or {}
        for key, plan in list(plans.items()):  # plans are keyed by call (the stream's handle at [6])
            if (isinstance(key, tuple) and len(key) > 6 and key[0] == collective and key[1] == id(src)
                    and key[2] == id(dst) and key[5] == "auto"):
                for attr in ("algorithm", "chose", "choice"):
                    alg = getattr(plan, attr, None)
                    if isinstance(alg, str):
                        return alg
        try:
            from flowdsl._flow_staging import lsa_team_size  # noqa: PLC0415
            from flowdsl.collectives import cost  # noqa: PLC0415

            return cost.choose(collective, self.n, lsa_team_size(self.comm), nbytes) + " (cost.choose)"
        except Exception as exc:  # noqa: BLE001
            return f"? ({type(exc).__name__})"

    def checker(self, collective, count, fn, dst, root_only):
        """Poison dst, run fn once, compare a sample of dst (on the root only for reduce)."""
        np, cupy = self.np, self.cupy

        def check(_thing):
            dst.fill(np.nan)
            self.comm.synchronize()
            self.barrier()
            with self.torch.cuda.stream(self.stream):
                fn()
            self.comm.synchronize()
            if root_only and self.rank != 0:
                return True
            idx = np.unique(np.linspace(0, dst.size - 1, num=min(dst.size, 4097)).astype(np.int64))
            got = cupy.asnumpy(dst[cupy.asarray(idx)])
            return bool(np.array_equal(got, expected_values(collective, self.n, count, idx)))
        return check

    def symm(self):
        """(module, group name, {version: op}) or a reason string."""
        if getattr(self, "_symm", None) is not None:
            return self._symm
        try:
            import torch.distributed._symmetric_memory as symm_mem  # noqa: PLC0415
        except Exception as exc:  # noqa: BLE001
            self._symm = f"torch.distributed._symmetric_memory: {type(exc).__name__}: {exc}"
            return self._symm
        ops = self.torch.ops.symm_mem
        table = {}
        for version, names in (("symm_one_shot", ("one_shot_all_reduce_out", "one_shot_all_reduce")),
                               ("symm_two_shot", ("two_shot_all_reduce_out", "two_shot_all_reduce_"))):
            for name in names:
                if hasattr(ops, name):
                    table[version] = name
                    break
        self._symm = (symm_mem, table)
        return self._symm

    def _symm_groups(self):
        """Groups to rendezvous over, in order: the gloo world, then the NCCL group."""
        names = [self.world.group_name]
        if self.nccl_group is not None and not isinstance(self.nccl_group, str):
            names.append(self.nccl_group.group_name)
        return names

    def symm_entry(self, version, count, stream_for_ops, cache):
        """A setup that returns the SymmetricMemory call (buffers shared by the versions at a size)."""
        torch = self.torch

        def setup():
            got = self.symm()
            if isinstance(got, str):
                raise RuntimeError(got)
            symm_mem, table = got
            if version not in table:
                raise RuntimeError(f"torch.ops.symm_mem has none of the {version[5:]} all-reduce ops "
                                   f"(torch {torch.__version__})")
            if "t" not in cache:
                t = symm_mem.empty(count, dtype=torch.float32, device=self.device)
                t.zero_()  # two-shot reduces in place: zeros stay zeros
                self.comm.synchronize()
                reasons = []
                for name in self._symm_groups():
                    _, reason = self._attempt(lambda name=name: symm_mem.rendezvous(t, name))
                    if reason is None:
                        cache["group"] = name
                        break
                    reasons.append(reason)
                else:
                    raise RuntimeError(f"symm_mem.rendezvous: {'; '.join(reasons)}")
                cache["t"], cache["out"] = t, torch.empty_like(t)
            t, out, group, name = cache["t"], cache["out"], cache["group"], table[version]
            op = getattr(torch.ops.symm_mem, name)
            fn = (lambda: op(t, "sum", group, out)) if name.endswith("_out") else (lambda: op(t, "sum", group))
            with torch.cuda.stream(stream_for_ops):
                for _ in range(5):
                    fn()
            self.comm.synchronize()
            return fn
        return setup

    def eager_entry(self, fn, nbytes, stream):
        def setup():
            with self.torch.cuda.stream(stream):
                for _ in range(warm_calls(nbytes)):
                    fn()
            self.comm.synchronize()
            return fn
        return setup

    # -- sections ----------------------------------------------------------------------------------
    def back_to_back(self, sizes, collectives):
        np = self.np
        stream = self.stream
        progs = {c: self.programs(c) for c in collectives}
        for nbytes in sizes:
            count = max(1, nbytes // 4)
            self.watchdog.arm(f"back-to-back sweep at {fmt_bytes(nbytes)}")
            bufs, reason = [], None
            for _ in range(2):  # src and dst: n x the bytes per rank each (all_gather's out, reduce_scatter's in)
                buf, reason = self._attempt(lambda: self.comm.alloc(self.n * count, np.float32))
                if buf is None:
                    break
                bufs.append(buf)
            if not self.all_ok(len(bufs) == 2):
                for c in collectives:
                    self.fail("b2b", c, nbytes, "all", f"alloc: {reason or 'failed on another rank'}")
                for buf in bufs:
                    self.comm.free(buf)
                self.watchdog.disarm()
                continue
            src, dst = bufs
            src.fill(self.rank + 1)
            self.comm.synchronize()
            views = _views(src, dst, count)
            symm_cache = {}
            for collective in collectives:
                s, d = views[collective]
                entries = {}
                for alg in progs[collective] + ["auto", "nccl"]:
                    fn = self.call(collective, s, d, alg, stream)
                    entries[alg] = {"setup": self.eager_entry(fn, nbytes, stream),
                                    "check": self.checker(collective, count, fn, d, collective == "reduce"),
                                    "probe": probe_calls(nbytes)}
                    if alg == "auto":
                        entries[alg]["chose"] = (lambda c=collective, s=s, d=d:
                                                 self.auto_choice(c, nbytes, s, d, stream))
                if collective == "all_reduce" and nbytes <= SYMM_MAX and not self.args.no_symm:
                    for v in ("symm_one_shot", "symm_two_shot"):
                        entries[v] = {"setup": self.symm_entry(v, count, stream, symm_cache),
                                      "probe": probe_calls(nbytes)}
                self.measure("b2b", collective, nbytes, entries,
                             lambda fn, calls: self.time_calls(fn, calls, stream))
            symm_cache.clear()
            self.comm.synchronize()
            self._size_done("back to back", nbytes, src, dst)

    def nccl_at_budget(self, ctas):
        """(NCCL's host communicator held to ``ctas`` CTAs, None) or (None, the reason): split from this
        communicator's (collective) with ``ncclConfig`` minCTAs = maxCTAs = ``ctas``, which is what
        NCCL_MIN_CTAS and NCCL_MAX_CTAS set for a whole process."""
        def split():
            from nccl.core import NCCLConfig  # noqa: PLC0415

            return self.comm.nccl.split(color=0, key=self.rank, config=NCCLConfig(min_ctas=ctas, max_ctas=ctas))
        return self._attempt(split)

    def nccl_call(self, nccl, collective, src, dst, stream):
        """A callable making NCCL's host collective on ``nccl`` (float32 sum, root 0) on ``stream``."""
        from nccl.core import NcclRedOp  # noqa: PLC0415

        handle = stream.cuda_stream
        if collective == "all_reduce":
            return lambda: nccl.allreduce(src, dst, NcclRedOp.SUM, stream=handle)
        if collective == "all_gather":
            return lambda: nccl.allgather(src, dst, stream=handle)
        if collective == "reduce_scatter":
            return lambda: nccl.reduce_scatter(src, dst, NcclRedOp.SUM, stream=handle)
        if collective == "broadcast":
            return lambda: nccl.broadcast(src, dst, 0, stream=handle)
        return lambda: nccl.reduce(src, dst, NcclRedOp.SUM, 0, stream=handle)

    def budgets(self, sizes, collectives):
        """flowdsl (auto, ``FlowConfig(channels=N)``) beside NCCL held to N CTAs, for each budget N."""
        from flowdsl.collectives import FlowConfig  # noqa: PLC0415

        np, stream = self.np, self.stream
        for ctas in self.args.budgets:
            nccl, reason = self.nccl_at_budget(ctas)
            if not self.all_ok(reason is None):
                for c in collectives:
                    self.fail("budget", c, None, f"nccl@{ctas}", f"split: {reason or 'failed on another rank'}")
                nccl = None
            config = FlowConfig(channels=ctas)
            for nbytes in sizes:
                count = max(1, nbytes // 4)
                self.watchdog.arm(f"CTA budget {ctas} at {fmt_bytes(nbytes)}")
                src, dst = self.comm.alloc(self.n * count, np.float32), self.comm.alloc(self.n * count, np.float32)
                src.fill(self.rank + 1)
                self.comm.synchronize()
                views = _views(src, dst, count)
                for collective in collectives:
                    s, d = views[collective]
                    fns = {f"auto@{ctas}": self.call(collective, s, d, "auto", stream, config)}
                    if nccl is not None:
                        fns[f"nccl@{ctas}"] = self.nccl_call(nccl, collective, s, d, stream)
                    entries = {v: {"setup": self.eager_entry(fn, nbytes, stream),
                                   "check": self.checker(collective, count, fn, d, collective == "reduce"),
                                   "probe": probe_calls(nbytes)} for v, fn in fns.items()}
                    self.measure("budget", collective, nbytes, entries,
                                 lambda fn, calls: self.time_calls(fn, calls, stream))
                self.comm.synchronize()
                self._size_done(f"CTA budget {ctas}", nbytes, src, dst)
            if nccl is not None:
                self._attempt(nccl.destroy)

    def _size_done(self, section, nbytes, src, dst):
        """After one size of ``section``: free its buffers, disarm the watchdog, say so, save what there is."""
        self.comm.free(src)
        self.comm.free(dst)
        self.watchdog.disarm()
        self.say(f"[{time.perf_counter() - self.t0:6.1f} s] {section}, {fmt_bytes(nbytes)} per rank: done")
        self.save()

    def make_nccl_group(self):
        """An NCCL process group (torch.distributed's all_reduce in the graph section; SymmetricMemory's
        second choice of group), on every rank; NCCL itself starts at its first use."""
        group, reason = self._attempt(lambda: self.dist.new_group(backend="nccl"))
        self.nccl_ok = self.all_ok(reason is None)
        self.nccl_group = group if self.nccl_ok else None
        if not self.nccl_ok:
            self.fail("graph", "all_reduce", None, "nccl_torch",
                      f"dist.new_group(backend='nccl'): {reason or 'failed on another rank'}")

    def graphs(self, sizes):
        torch, np = self.torch, self.np
        cs = self.graph_stream
        progs = self.programs("all_reduce")
        group, ok = self.nccl_group, self.nccl_ok
        for nbytes in sizes:
            count = max(1, nbytes // 4)
            self.watchdog.arm(f"graph replay at {fmt_bytes(nbytes)}")
            src = self.comm.alloc(count, np.float32)
            dst = self.comm.alloc(count, np.float32)
            src.fill(self.rank + 1)
            self.comm.synchronize()
            graphs = []

            def capture(fn, nbytes=nbytes):
                with torch.cuda.stream(cs):  # warm up on the side stream first
                    for _ in range(warm_calls(nbytes)):
                        fn()
                self.comm.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=cs, capture_error_mode="thread_local"):
                    for _ in range(GRAPH_CALLS):
                        fn()
                self.comm.synchronize()
                graphs.append(g)
                return g

            def graph_check(g):
                dst.fill(np.nan)
                self.comm.synchronize()
                self.barrier()
                with torch.cuda.stream(cs):
                    g.replay()
                self.comm.synchronize()
                idx = np.unique(np.linspace(0, dst.size - 1, num=min(dst.size, 4097)).astype(np.int64))
                got = self.cupy.asnumpy(dst[self.cupy.asarray(idx)])
                return bool(np.array_equal(got, expected_values("all_reduce", self.n, count, idx)))

            entries, eager = {}, {}
            for alg in progs + ["auto", "nccl"]:
                fn = self.call("all_reduce", src, dst, alg, cs)
                entries[alg] = {"setup": (lambda fn=fn: capture(fn)), "check": graph_check,
                                "per_call": GRAPH_CALLS}
                if alg == "auto":
                    entries[alg]["chose"] = lambda: self.auto_choice("all_reduce", nbytes, src, dst, cs)
            if ok:
                t = torch.zeros(count, dtype=torch.float32, device=self.device)
                fn = (lambda t=t: self.dist.all_reduce(t, group=group))
                entries["nccl_torch"] = {"setup": (lambda fn=fn: capture(fn)), "per_call": GRAPH_CALLS}
                eager["nccl_torch"] = {"setup": self.eager_entry(fn, nbytes, cs), "probe": probe_calls(nbytes)}
            if nbytes <= SYMM_MAX and not self.args.no_symm:
                cache = {}
                for v in ("symm_one_shot", "symm_two_shot"):
                    setup = self.symm_entry(v, count, cs, cache)
                    entries[v] = {"setup": (lambda setup=setup: capture(setup())), "per_call": GRAPH_CALLS}
            self.measure("graph", "all_reduce", nbytes, entries, lambda g, n: self.time_graph(g, n, cs))
            if eager:  # torch.distributed back to back, for the graph table's other column
                self.measure("b2b", "all_reduce", nbytes, eager, lambda fn, calls: self.time_calls(fn, calls, cs))
            self.comm.synchronize()
            del graphs[:]
            self._size_done("graph replay", nbytes, src, dst)

    def run(self):
        args = self.args
        self.say(f"{self.n} ranks on {self.meta['gpu']}, NCCL {self.meta['nccl']}, torch {self.meta['torch']}, "
                 f"flowdsl {self.meta['flowdsl']}; target {args.target_ms} ms per measurement, {args.rounds} rounds")
        if args.precompile:
            if self.rank == 0:  # one compiler for all ranks; the others wait at the barrier below
                from flowdsl.enums import RedOp  # noqa: PLC0415

                got = self.coll.precompile(dtypes=("float32",), ops=(RedOp.SUM,), progress=False)
                self.say(f"precompile: {got}")
            self.barrier()
        try:  # load (or compile) the float32 sum kernels now, outside the timed blocks
            from flowdsl.enums import RedOp  # noqa: PLC0415

            got = self.coll.load(dtypes=("float32",), ops=(RedOp.SUM,))
            self.say(f"[{time.perf_counter() - self.t0:6.1f} s] kernels loaded: {got}")
        except Exception as exc:  # noqa: BLE001
            self.say(f"collectives.load failed ({type(exc).__name__}: {exc}); kernels load at first use")
        self.make_nccl_group()
        self.barrier()
        sizes = [s for s in (QUICK_SIZES if args.quick else FULL_SIZES) if s <= args.max_bytes]
        collectives = [c for c in COLLECTIVES if c in args.collectives]
        self.back_to_back(sizes, collectives)
        if not args.no_graph and "all_reduce" in collectives:
            gsizes = [s for s in (QUICK_GRAPH_SIZES if args.quick else sizes) if s <= GRAPH_MAX]
            self.graphs(gsizes)
        if args.budgets:
            self.budgets([s for s in (QUICK_BUDGET_SIZES if args.quick else BUDGET_SIZES) if s <= args.max_bytes],
                         collectives)
        self.meta["seconds"] = round(time.perf_counter() - self.t0, 1)

    def close(self):
        self.watchdog.disarm()
        self.comm.synchronize()
        self.barrier()
        self._symm = None
        self.comm.close()
        self.dist.destroy_process_group()
