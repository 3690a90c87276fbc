"""flowdsl: NCCL Device API kernels (LSA, barriers, memory-model ops) written in Python.

Host side: :func:`init` → :class:`Communicator` (``alloc``, ``register``,
``device_communicator``, ``synchronize``). Kernels: :func:`kernel`,
:func:`device`. Device surface: :mod:`flowdsl.coop`, :mod:`flowdsl.team`,
:mod:`flowdsl.lsa`, :mod:`flowdsl.gin`, :mod:`flowdsl.cft`, :mod:`flowdsl.mem`, :mod:`flowdsl.flow`,
:mod:`flowdsl.wait` (bounded waits: a hang ends in :class:`DeviceTimeoutError`). Collectives (ring/tree,
written on Flow): :mod:`flowdsl.collectives`. CPU simulator: :mod:`flowdsl.sim`; test helpers:
:mod:`flowdsl.testing`.

``flowdsl.flow``, ``flowdsl.collectives``, ``flowdsl.sim`` and ``flowdsl.testing`` are
imported at their first use (``import flowdsl`` is enough to reach them), so that
``import flowdsl`` stays fast.
"""

from __future__ import annotations

from ._version import __version__
from .enums import CoopKind, GinBackend, MemoryOrder, Protocol, RedOp, ThreadScope
from . import lowering as _lowering  # registers the device surface's overloads
from . import cft, coop, gin, lsa, mem, team, wait
from ._kernel import FlowKernel, device, kernel
from .errors import (CollectiveMismatchError, DeviceOnlyError, DeviceTimeoutError, FeatureUnavailableError,
                     FlowDSLError, NoDeviceError, ResourceClosedError, UsageError)
from .errors import CacheWarning
from .runtime.communicator import Communicator, init
from .runtime.memory import DevComm, Window

#: Submodules imported at first attribute access (``flowdsl.sim.spawn(...)`` after ``import flowdsl``).
_LAZY_SUBMODULES = frozenset({"flow", "collectives", "sim", "testing"})

__all__ = [
    "__version__", "init", "Communicator", "Window", "DevComm", "kernel", "device", "FlowKernel",
    "coop", "team", "lsa", "gin", "cft", "mem", "flow", "wait", "collectives", "sim", "testing",
    "MemoryOrder", "ThreadScope", "CoopKind", "Protocol", "RedOp", "GinBackend",
    "FlowDSLError", "UsageError", "NoDeviceError", "ResourceClosedError", "CollectiveMismatchError",
    "DeviceTimeoutError", "FeatureUnavailableError", "DeviceOnlyError",
    "CacheWarning",
]


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        import importlib  # noqa: PLC0415

        return importlib.import_module(f"{__name__}.{name}")  # binds flowdsl.<name>: called once
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY_SUBMODULES)
