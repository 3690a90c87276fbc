"""A simulated thread that never reaches a switch point: stopped, named, after ``stall_seconds``.

The simulator switches threads only at flowdsl's memory operations, atomics, barriers and warp operations. A
kernel loop that spins on a plain load (``while flags[0] == 0: pass``) reaches none of them: the writer never
runs, and neither ``max_steps`` nor the livelock check (which count switches) sees it; the process would spin
at 100 % CPU for ever. A GPU gives no guarantee either (the compiler may keep the plain load out of the loop).
The watchdog, a daemon thread, watches the scheduler's step count while a kernel thread runs; when it has not
moved for ``stall_seconds``, it raises :class:`StalledError` in the scheduler's thread, inside the spinning
loop (``PyThreadState_SetAsyncExc``), so the report names the thread and the line.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time

from . import _state
from .errors import StalledError

__all__ = ["Watchdog"]


class Watchdog:
    """While entered, stops a kernel thread of ``sched`` that runs ``seconds`` without a scheduler step."""

    def __init__(self, sched, seconds: float):
        self.sched, self.seconds = sched, float(seconds)
        self.thread_id = threading.get_ident()  # the scheduler runs kernel threads on the spawn's thread
        self._stop = threading.Event()

    def __enter__(self):
        self._thread = None
        if self.seconds > 0:
            self._thread = threading.Thread(target=self._watch, name="flowdsl.sim watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:  # gone when spawn returns: it holds the scheduler, and with it the world
            self._thread.join()
        self._thread = self.sched = None

    def _watch(self):
        sched = self.sched
        steps, since, told = sched.steps, time.monotonic(), False
        notice = min(5.0, self.seconds / 3)  # say so before stopping it: the run may stop later than one expects
        while not self._stop.wait(min(1.0, self.seconds / 4)):
            task = _state.cur
            if sched.steps != steps or getattr(task, "launch", None) is None:  # moving, or host code running
                steps, since, told = sched.steps, time.monotonic(), False
                continue
            if time.monotonic() - since < self.seconds:
                if not told and time.monotonic() - since >= notice:
                    told = True
                    print(f"flowdsl.sim: {task.name()} of kernel {task.launch.name!r} has run {notice:g} s without "
                          "reaching a point where the simulator switches threads (a loop spinning on a plain load?); "
                          f"it is stopped at {self.seconds:g} s (spawn's stall_seconds=)", file=sys.stderr, flush=True)
                continue
            StalledError.text = (
                f"Cannot finish the simulation: {task.name()} of kernel {task.launch.name!r} ran "
                f"{self.seconds:g} s without reaching a point where the simulator switches threads (a "
                "flowdsl.mem load, store or atomic, a barrier, a warp operation). A loop that spins on a plain "
                "load (while flags[0] == 0) never lets the writer run here, and on a GPU may never see the write "
                "either: read the flag with flowdsl.mem.load_acquire (or load_relaxed) in the loop. "
                f"(seed={sched.seed}; spawn's stall_seconds= sets this limit)")
            if sched.steps == steps and _state.cur is task:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id),
                                                           ctypes.py_object(StalledError))
                return
