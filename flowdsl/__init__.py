"""flowdsl: NCCL Device API kernels (LSA, barriers, memory-model ops) written in Python.

Host side: :func:`init` → :class:`Communicator` (``alloc``, ``register``,
``device_communicator``, ``synchronize``). Kernels: :func:`kernel`,
:func:`device`. Device surface: :mod:`flowdsl.coop`, :mod:`flowdsl.team`,
:mod:`flowdsl.lsa`, :mod:`flowdsl.gin`, :mod:`flowdsl.cft`, :mod:`flowdsl.mem`, :mod:`flowdsl.flow`,
:mod:`flowdsl.wait` (bounded waits: a hang ends in :class:`DeviceTimeoutError`). Collectives (ring/tree,
written on Flow): :mod:`flowdsl.collectives`. CPU simulator: :mod:`flowdsl.sim`; test helpers:
:mod:`flowdsl.testing`.

``flowdsl.flow``, ``flowdsl.collectives``, ``flowdsl.sim`` and ``flowdsl.testing`` are
imported at their first use (``import flowdsl`` is enough to reach them), and so are
:func:`kernel`, :class:`FlowKernel` (they need numba) and
:class:`FeatureUnavailableError` (a numba typing error): ``import flowdsl`` imports
neither numba nor a CUDA library. Compiling binds the device surface to numba-cuda
(``flowdsl.lowering.bindings``); the simulator never does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._version import __version__
from .enums import CoopKind, GinBackend, GinConnectionType, GinFenceLevel, MemoryOrder, Protocol, RedOp, ThreadScope
from . import cft, coop, lsa, mem, team, gin, wait  # docs/api.md lists the device modules in this order
from . import _device_api  # noqa: F401 - gives each device function numba-cuda's dispatcher API
from ._devices import device
from .errors import (CollectiveMismatchError, DeviceOnlyError, DeviceTimeoutError, FlowDSLError, NoDeviceError,
                     ResourceClosedError, UsageError)
from .errors import CacheWarning
from .runtime.communicator import Communicator, init
from .runtime.memory import DevComm, Window

if TYPE_CHECKING:  # imported at first use (below); named here for readers and the API reference
    from ._kernel import FlowKernel, kernel
    from .errors import FeatureUnavailableError, KernelTypingError

#: Submodules imported at first attribute access (``flowdsl.sim.spawn(...)`` after ``import flowdsl``).
_LAZY_SUBMODULES = frozenset({"flow", "collectives", "sim", "testing"})
#: Names imported from a module at first attribute access: name -> module.
_LAZY_NAMES = {"kernel": "._kernel", "FlowKernel": "._kernel", "FeatureUnavailableError": ".errors",
               "KernelTypingError": ".errors"}

__all__ = [
    "__version__", "init", "Communicator", "Window", "DevComm", "kernel", "device", "FlowKernel",
    "coop", "team", "lsa", "gin", "cft", "mem", "flow", "wait", "collectives", "sim", "testing",
    "MemoryOrder", "ThreadScope", "CoopKind", "Protocol", "RedOp", "GinBackend", "GinConnectionType",
    "GinFenceLevel", "FlowDSLError", "UsageError", "NoDeviceError", "ResourceClosedError", "CollectiveMismatchError",
    "DeviceTimeoutError", "FeatureUnavailableError", "KernelTypingError", "DeviceOnlyError",
    "CacheWarning",
]


def __getattr__(name: str):
    import importlib  # noqa: PLC0415

    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")  # binds flowdsl.<name>: called once
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(_LAZY_NAMES[name], __name__), name)
        globals()[name] = value  # later lookups find it without this call
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY_SUBMODULES | set(_LAZY_NAMES))
