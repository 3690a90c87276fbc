"""How the device communicator's rank fields compile (each calls its support function). The ``flowdsl.team``
primitives are lowered from their specs (``generic.py``): a team is a struct of ``(nranks, rank, stride)`` and
crosses the C ABI as those three ints (``flowdsl.cft.team``'s lowering, in ``cft.py``, reads it back the same way)."""

from __future__ import annotations

from numba.cuda.extending import overload_attribute

from .declarations import DECLARED
from .intrinsics import devcomm_ptr
from .types import DevCommType

__all__: list[str] = []


def _overload_comm_field(name: str) -> None:
    """``comm.<name>`` of a device communicator: its support function ``flowdsl_comm_<name>``."""
    fn = DECLARED[f"flowdsl_comm_{name}"]

    @overload_attribute(DevCommType, name)
    def field(comm):
        return lambda comm: fn(devcomm_ptr(comm))


for _field in ("rank", "nranks", "lsa_rank", "lsa_size", "gin_context_count"):
    _overload_comm_field(_field)

