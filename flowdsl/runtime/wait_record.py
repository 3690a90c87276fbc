"""The wait record: where a communicator's bounded device waits read their limit and report.

One block of pinned, device-mapped host memory per communicator (``cuMemHostAlloc``
with ``DEVICEMAP``): kernels read the abort word and the limit from it, and the
first wait to time out writes what it waited on; the host reads it while kernels
run. Word layout (uint64), shared with ``prebuilt/src/flowdsl_support.cu``: see
the constants below.
"""

from __future__ import annotations

import ctypes
import threading
import time

from ..errors import DeviceTimeoutError, DriverError
from ..host.timeouts import DEFAULT_TIMEOUT, TIMEOUT_ENV, aborted_error, resolve_timeout

__all__ = ["WaitRecord", "resolve_timeout", "wait_for_device", "aborted_error", "DEFAULT_TIMEOUT", "TIMEOUT_ENV",
           "WORDS"]

#: Seconds kernels are given to leave once their waits gave up (they do within milliseconds).
GRACE = 10.0

# Word indices.
STOP, DONE, WHAT, _UNUSED, BLOCK, THREAD, EXPECTED, SEEN, PEER, INDEX, WAITED_NS, TIMEOUT_NS = range(12)
WORDS = 16
# Values of the stop word.
RUNNING, ABORTED, TIMED_OUT = 0, 1, 2


def _check(result, operation: str):
    err, *rest = result
    if int(err) != 0:
        raise DriverError(f"Cannot {operation}: CUDA driver error {err}")
    return rest[0] if len(rest) == 1 else rest


class WaitRecord:
    """The wait record of the communicator of world rank ``rank``, mapped into the current CUDA context
    (the communicator's device), with the limit ``timeout`` seconds (0: off).

    The device writes no rank into the record (its check gets the record's address alone, not
    the communicator: :func:`flowdsl.lowering.intrinsics.wait_record_ptr`); a timeout names ``rank``.
    """

    def __init__(self, timeout: float, rank: int):
        self.rank = rank
        from cuda.bindings import driver  # noqa: PLC0415

        flags = driver.CU_MEMHOSTALLOC_DEVICEMAP | driver.CU_MEMHOSTALLOC_PORTABLE
        self._host = int(_check(driver.cuMemHostAlloc(WORDS * 8, flags), "allocate the wait record"))
        self.device_address = int(_check(driver.cuMemHostGetDevicePointer(self._host, 0),
                                         "map the wait record for the device"))
        self._words = (ctypes.c_uint64 * WORDS).from_address(self._host)
        ctypes.memset(self._host, 0, WORDS * 8)
        self.timeout = timeout

    @property
    def timeout(self) -> float:
        """The limit in seconds (0: off); kernels read it at their next check, running ones too."""
        return self._words[TIMEOUT_NS] / 1e9

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._words[TIMEOUT_NS] = int(resolve_timeout(seconds) * 1e9)

    @property
    def stopped(self) -> bool:
        """Whether waits give up now (an abort, or a wait timed out)."""
        return self._words[STOP] != RUNNING

    @property
    def aborted(self) -> bool:
        return self._words[STOP] == ABORTED and not self._words[DONE]

    def abort(self) -> None:
        """Make every wait of this communicator give up at its next check (a recorded timeout stays)."""
        if self._words[STOP] == RUNNING:
            self._words[STOP] = ABORTED

    def error(self, operation: str) -> DeviceTimeoutError | None:
        """The timeout the device recorded, as an exception, or None."""
        if not self._words[DONE]:
            return None
        from ..wait import PRIMITIVE_NAMES  # noqa: PLC0415

        w = self._words
        peer = ctypes.c_int64(w[PEER]).value
        fields = dict(rank=self.rank, block=int(w[BLOCK]), thread=int(w[THREAD]),
                      primitive=PRIMITIVE_NAMES.get(int(w[WHAT]), f"wait kind {int(w[WHAT])}"), index=int(w[INDEX]),
                      peer=peer, expected=int(w[EXPECTED]), seen=int(w[SEEN]), waited_s=w[WAITED_NS] / 1e9,
                      timeout_s=self.timeout)
        return DeviceTimeoutError(DeviceTimeoutError.describe(operation, **fields), **fields)

    def close(self) -> None:
        """Free the memory (after the device is done with it)."""
        if self._host:
            from cuda.bindings import driver  # noqa: PLC0415

            self._words = (ctypes.c_uint64 * WORDS)(*self._words)  # what it said stays readable
            driver.cuMemFreeHost(self._host)
            self._host = 0


def wait_for_device(synchronize, record: WaitRecord, limit: float | None = None) -> bool:
    """Run ``synchronize()`` (blocking) while watching ``record``; True once it returned.

    Returns False, leaving it running in a daemon thread, when the waits gave up
    :data:`GRACE` seconds ago and the device is still busy (a kernel spins outside
    flowdsl's bounded waits), or after ``limit`` seconds. A long kernel that waits for
    nobody is never cut short otherwise. Exceptions of ``synchronize`` are re-raised.
    """
    outcome: list = []

    def run():
        try:
            synchronize()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome.append(exc)

    worker = threading.Thread(target=run, name="flowdsl-synchronize", daemon=True)
    worker.start()
    start = time.monotonic()
    stopped_at = None
    while True:
        worker.join(0.05)
        if not worker.is_alive():
            break
        now = time.monotonic()
        if stopped_at is None and record.stopped:
            stopped_at = now
        if (stopped_at is not None and now - stopped_at > GRACE) or (limit is not None and now - start > limit):
            return False
    if outcome and outcome[0] is not None:
        raise outcome[0]
    return True
