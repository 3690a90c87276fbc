"""flowdsl's multi-rank CPU simulator.

Runs flowdsl programs (host code and unchanged ``@flowdsl.kernel`` functions)
on simulated ranks on the CPU: every simulated GPU thread is a greenlet,
scheduled cooperatively in a seeded random order; window memory is numpy.
Importing this package installs the simulator's dispatch and launch hooks
into ``flowdsl._stubs``.

The public names: :func:`spawn`, :data:`SEMANTICS` / :func:`implements` (the primitive
table), the errors :class:`SimulationError`, :class:`UnsupportedFeatureError`,
:class:`DeadlockError`, :class:`LivelockError`, :class:`WindowAccessError`, :class:`IndexAccessError`,
:class:`BarrierIndexError`, :class:`CollectiveMismatchError`,
:class:`UsageError`, :class:`GinCoverageError`, :class:`GinResourceError`,
:class:`GinBackendError`, :class:`CftCoverageError`, :class:`DataRaceError` (see
``flowdsl.sim.races``: data races found by happens-before), :class:`WaitTimeoutError` (threads
stuck in bounded waits: the GPU's :class:`flowdsl.DeviceTimeoutError` diagnosis, see
``flowdsl.sim.timeouts``), :class:`StaleDataError` (a wait took a line another call wrote: see
``flowdsl.wait.accepted``), and :func:`last_stats`. Each module
of the device surface has its module here (``coop``, ``team``, ``lsa``, ``mem``, ``gin``, ``cft``,
``wait``); GIN and CFT operations cross one simulated network
(``flowdsl.sim.network``).
"""

from __future__ import annotations

from .. import _stubs
from . import _state
from . import host as _host
from . import cft, coop, flow, gin, lsa, mem, team, wait  # noqa: F401 - each registers its primitives' semantics
from .errors import (BarrierIndexError, CftCoverageError, CollectiveMismatchError, DataRaceError, DeadlockError,
                     GinBackendError, GinCoverageError, GinResourceError, IndexAccessError, LivelockError, SimulationError,
                     StaleDataError, StalledError, UnsupportedFeatureError, UsageError, WaitTimeoutError,
                     WindowAccessError)
from .host import SimulatedOverload, launch, spawn
from .semantics import SEMANTICS, dispatch, implements

__all__ = [
    "spawn", "SEMANTICS", "implements", "last_stats",
    "SimulationError", "UnsupportedFeatureError", "DeadlockError", "LivelockError", "StalledError",
    "WindowAccessError", "BarrierIndexError", "CollectiveMismatchError", "UsageError",
    "GinCoverageError", "GinResourceError", "GinBackendError", "CftCoverageError", "DataRaceError",
    "WaitTimeoutError", "StaleDataError", "IndexAccessError",
]


def last_stats() -> dict:
    """Counters of the last finished :func:`spawn`: ``steps`` (scheduler steps), ``threads``."""
    return dict(_host.last_run or {})


_stubs.set_simulator_dispatch(dispatch)
_stubs.set_simulator_launch(launch, lambda: _state.cur is not None, SimulatedOverload)
