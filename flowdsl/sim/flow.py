"""What Flow's own primitive does in the simulator: :func:`flowdsl.flow.reduction` makes the
:class:`flowdsl.flow.Reduction` the steps read (its arguments checked by its spec first, as the
GPU's typing checks them). The rest of Flow is device code the simulator runs as it is."""

from __future__ import annotations

from .._flow_elements import (Reduction, bad_connection_text, bad_layout_text, missing_gin_context_text,
                              scale_refusal)
from ..enums import RedOp
from .errors import KernelTypingError, UsageError
from .scheduler import sim_error
from .semantics import implements

__all__: list[str] = []


@implements("flowdsl.flow.reduction")
def _flow_reduction(op, nranks, fp8=0, scale=None):
    if op == RedOp.PREMULSUM and scale is None:  # the GPU refuses a constant PREMULSUM without one when it types it
        raise sim_error(KernelTypingError, scale_refusal())
    return Reduction(op, nranks, fp8, scale)


@implements("flowdsl.flow.missing_gin_context")
def _flow_missing_gin_context(peer):
    raise sim_error(UsageError, missing_gin_context_text(int(peer)))


@implements("flowdsl.flow.bad_connection")
def _flow_bad_connection(peer, number, remote_number, nranks):
    raise sim_error(UsageError, bad_connection_text(int(peer), int(number), int(remote_number), int(nranks) - 1))


@implements("flowdsl.flow.bad_layout")
def _flow_bad_layout(channels, nslots, slot_words, needed, held):
    raise sim_error(UsageError, bad_layout_text(*(int(v) for v in (channels, nslots, slot_words, needed, held))))
