"""flowdsl's exceptions. Messages read "Cannot {operation}: {reason}. {fix}".

Contents: :class:`FlowDSLError`, :class:`UsageError`, :class:`NoDeviceError`,
:class:`ResourceClosedError`, :class:`CollectiveMismatchError`, :class:`CacheWarning`, and
(re-exported) :class:`FeatureUnavailableError`, :class:`DeviceOnlyError`.
"""

from __future__ import annotations

from ._stubs import DeviceOnlyError
from .lowering.target import FeatureUnavailableError

__all__ = ["FlowDSLError", "UsageError", "NoDeviceError", "ResourceClosedError", "CollectiveMismatchError",
           "FeatureUnavailableError", "DeviceOnlyError", "CacheWarning"]


class FlowDSLError(Exception):
    """Base class of flowdsl's own errors."""


class CacheWarning(UserWarning):
    """The kernel disk cache was damaged, cannot be written, or cannot key a kernel: it compiles instead."""


class UsageError(FlowDSLError, ValueError):
    """An argument is wrong: the message names it and says what to pass instead."""


class NoDeviceError(FlowDSLError, RuntimeError):
    """No CUDA GPU (or driver) is available for an operation that needs one."""


class ResourceClosedError(FlowDSLError, RuntimeError):
    """A window, device communicator or communicator was used after ``close()``."""


class CollectiveMismatchError(FlowDSLError, RuntimeError):
    """Ranks called a collective differently (another collective, count, dtype, op, root, algorithm or
    config), or one rank did not call it at all.

    Raised on every rank, before anything is launched: always on the simulator, and on GPUs with
    ``flowdsl.init(check_collectives=True)`` (or ``FLOWDSL_CHECK_COLLECTIVES=1``).

    Attributes:
        collective: The collective the ranks were calling (or the first rank's, when they called different ones).
        differences: ``{argument: {value: [ranks]}}`` for every argument that differs.
    """

    collective: str | None = None
    differences: dict | None = None
