"""flowdsl: NCCL Device API kernels (LSA, barriers, memory-model ops) written in Python.

Host side: :func:`init` → :class:`Communicator` (``alloc``, ``register``,
``device_communicator``, ``synchronize``). Kernels: :func:`kernel`,
:func:`device`. Device surface: :mod:`flowdsl.coop`, :mod:`flowdsl.team`,
:mod:`flowdsl.lsa`, :mod:`flowdsl.gin`, :mod:`flowdsl.cft`, :mod:`flowdsl.mem`. CPU simulator: :mod:`flowdsl.sim`.
"""

from __future__ import annotations

from ._version import __version__
from .enums import CoopKind, MemoryOrder, ThreadScope
from . import lowering as _lowering  # registers the device surface's overloads
from . import cft, coop, gin, lsa, mem, team
from ._kernel import FlowKernel, device, kernel
from .errors import (DeviceOnlyError, FeatureUnavailableError, FlowDSLError, NoDeviceError,
                     ResourceClosedError, UsageError)
from .runtime.communicator import Communicator, init
from .runtime.memory import DevComm, Window

__all__ = [
    "__version__", "init", "Communicator", "Window", "DevComm", "kernel", "device", "FlowKernel",
    "coop", "team", "lsa", "gin", "cft", "mem", "MemoryOrder", "ThreadScope", "CoopKind",
    "FlowDSLError", "UsageError", "NoDeviceError", "ResourceClosedError", "FeatureUnavailableError",
    "DeviceOnlyError",
]
