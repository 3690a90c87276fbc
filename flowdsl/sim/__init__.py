"""flowdsl's multi-rank CPU simulator.

Runs flowdsl programs (host code and unchanged ``@flowdsl.kernel`` functions)
on simulated ranks on the CPU: every simulated GPU thread is a greenlet,
scheduled cooperatively in a seeded random order; window memory is numpy.
Importing this package installs the simulator's dispatch and launch hooks
into ``flowdsl._stubs``.

Contents: :func:`spawn`, :data:`SEMANTICS` / :func:`implements` (the primitive
table), the errors :class:`SimulationError`, :class:`UnsupportedFeatureError`,
:class:`DeadlockError`, :class:`LivelockError`, :class:`WindowAccessError`,
:class:`BarrierIndexError`, :class:`CollectiveMismatchError`,
:class:`UsageError`, :class:`GinCoverageError`, :class:`GinResourceError`,
:class:`GinBackendError`, :class:`CftCoverageError`, :class:`DataRaceError` (see
``flowdsl.sim.races``: data races found by happens-before), :class:`WaitTimeoutError` (threads
stuck in bounded waits: the GPU's :class:`flowdsl.DeviceTimeoutError` diagnosis, see
``flowdsl.sim.timeouts``), and :func:`last_stats`. GIN
(puts, signals, counters, GIN barriers over a simulated network) is modelled in
``flowdsl.sim.gin``, CFT (LE-addressed puts and gets, counted writes and the
receiver's fence rule, CFT barriers) in ``flowdsl.sim.cft``, on the same network.
"""

from __future__ import annotations

from .. import _stubs
from . import _state
from . import host as _host
from . import gin as _gin  # noqa: F401 - registers flowdsl.gin's semantics
from . import cft as _cft  # noqa: F401 - registers flowdsl.cft's semantics
from . import timeouts as _timeouts  # noqa: F401 - registers flowdsl.wait's semantics
from .errors import (BarrierIndexError, CftCoverageError, CollectiveMismatchError, DataRaceError, DeadlockError,
                     GinBackendError, GinCoverageError, GinResourceError, LivelockError, SimulationError,
                     UnsupportedFeatureError, UsageError, WaitTimeoutError, WindowAccessError)
from .host import launch, spawn
from .semantics import SEMANTICS, dispatch, implements

__all__ = [
    "spawn", "SEMANTICS", "implements", "last_stats",
    "SimulationError", "UnsupportedFeatureError", "DeadlockError", "LivelockError",
    "WindowAccessError", "BarrierIndexError", "CollectiveMismatchError", "UsageError",
    "GinCoverageError", "GinResourceError", "GinBackendError", "CftCoverageError", "DataRaceError",
    "WaitTimeoutError",
]


def last_stats() -> dict:
    """Counters of the last finished :func:`spawn`: ``steps`` (scheduler steps), ``threads``."""
    return dict(_host.last_run or {})


_stubs.set_simulator_dispatch(dispatch)
_stubs.set_simulator_launch(launch, lambda: _state.cur is not None)
