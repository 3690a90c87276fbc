"""The device wait limit, as ``flowdsl.init(wait_timeout=...)`` and ``$FLOWDSL_WAIT_TIMEOUT`` set it, and
what ``synchronize`` raises on an aborted communicator: the same on the GPU (:mod:`flowdsl.runtime.wait_record`)
and on the simulator.
"""

from __future__ import annotations

import math
import os

from ..errors import ResourceClosedError, UsageError

__all__ = ["DEFAULT_TIMEOUT", "TIMEOUT_ENV", "resolve_timeout", "aborted_error"]

#: Seconds a device wait may last by default: generous, a hang still ends.
DEFAULT_TIMEOUT = 300.0
#: Environment variable with the limit in seconds (0: off), read by ``flowdsl.init``.
TIMEOUT_ENV = "FLOWDSL_WAIT_TIMEOUT"


def resolve_timeout(seconds=None) -> float:
    """The wait limit in seconds: ``seconds``, else ``$FLOWDSL_WAIT_TIMEOUT``, else :data:`DEFAULT_TIMEOUT`."""
    source = "wait_timeout"
    if seconds is None:
        seconds = os.environ.get(TIMEOUT_ENV)
        source = TIMEOUT_ENV
        if seconds is None or seconds.strip() == "":
            return DEFAULT_TIMEOUT
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise UsageError(f"Cannot set the device wait limit: {source} must be a number of seconds >= 0 (0 turns "
                         f"it off), got {seconds!r}. Pass e.g. wait_timeout=60.")
    return value


def aborted_error(device_busy: bool = False) -> ResourceClosedError:
    """What ``synchronize`` raises on an aborted communicator (the GPU's and the simulator's)."""
    return ResourceClosedError("Cannot synchronize: the communicator was aborted (comm.abort()); its kernels' "
                               "waits gave up and their results are not valid"
                               + (", and the device is still busy" if device_busy else "")
                               + ". Create a new communicator with flowdsl.init().")
