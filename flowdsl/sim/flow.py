"""What Flow's own primitive does in the simulator: :func:`flowdsl.flow.reduction` makes the
:class:`flowdsl.flow.Reduction` the steps read (its arguments checked by its spec first, as the
GPU's typing checks them). The rest of Flow is device code the simulator runs as it is."""

from __future__ import annotations

from .._flow_elements import Reduction
from .semantics import implements

__all__: list[str] = []


@implements("flowdsl.flow.reduction")
def _flow_reduction(op, nranks, fp8=0):
    return Reduction(op, nranks, fp8)
