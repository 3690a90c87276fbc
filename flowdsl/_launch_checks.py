"""What a launch checks before it goes to the GPU, beyond its arguments' types: the windows and device
communicators are open and of one communicator, and the device communicator's GIN backend offers
what the kernel needs."""

from __future__ import annotations

import functools

from .errors import UsageError

__all__ = ["check_features"]


@functools.cache
def _resource_type():
    from .runtime.memory import Resource  # noqa: PLC0415

    return Resource

#: argument type -> whether it is a communicator's resource (a window, a device communicator).
_IS_RESOURCE: dict = {}

def _check_resources(name: str, args) -> None:
    """Windows and device communicators must be open and belong to one communicator."""
    owner = None
    for i, arg in enumerate(args):
        kind = type(arg)
        is_resource = _IS_RESOURCE.get(kind)
        if is_resource is None:
            is_resource = _IS_RESOURCE[kind] = issubclass(kind, _resource_type())
        if not is_resource:
            continue
        if arg._closed:
            arg._check_open(f"launch {name} (argument {i})")
        if owner is None:
            owner = arg._comm
        elif arg._comm is not owner:
            raise UsageError(f"Cannot launch {name}: its windows and device communicators come from different "
                             "communicators. Register windows and create the device communicator on the same "
                             "flowdsl communicator.")

def check_features(name: str, features, args) -> None:
    """Refuse a launch whose kernel needs what the device communicator's backend lacks."""
    from .lowering.gin import STRONG_SIGNAL_FEATURE  # noqa: PLC0415

    if STRONG_SIGNAL_FEATURE not in features:
        return
    for arg in args:
        backend = getattr(arg, "gin_backend", None)
        if backend is not None and not backend.strong_signals:
            raise UsageError(
                f"Cannot launch {name}: it issues strong GIN signals (flowdsl.gin.strong_*), but this device "
                f"communicator's GIN backend {backend.name} offers weak signals only. Use one weak signal per "
                "put (flowdsl.gin.weak_signal_inc), or run with a backend that offers strong signals (the "
                "GIN proxy, NCCL_GIN_TYPE=2).")
