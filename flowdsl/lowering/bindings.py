"""Binding the device surface to numba: importing this module registers every primitive's typing and
lowering (each module of this package that mirrors one of the surface's, ``coop``, ``team``, ``lsa``,
``mem``, ``gin``, ``cft``, ``flow``, ``wait``, registers its own when imported), and the
``@flowdsl.device`` functions (those made before it and, from then on, each as it is made). :mod:`flowdsl.lowering.compiler` imports it: nothing binds until something compiles, so
``import flowdsl`` and the simulator never pay for it.
"""

from __future__ import annotations

from numba.core import types as numba_types
from numba.cuda.extending import lower_getattr_generic, typeof_impl
from numba.cuda.typing.templates import AttributeTemplate, infer_getattr

from ..enums import ConstantEnumMeta, GinFenceLevel, MemoryOrder, Protocol, RedOp, ThreadScope
from . import cft, coop, flow, gin, lsa, mem, team, wait  # noqa: F401 - each registers its bindings
from .devices import bind_device_functions
from .generic import bind_spec_lowerings
from .types import ConstantEnumClass, bind_attributes


@typeof_impl.register(ConstantEnumMeta)
def _typeof_constant_enum(val, c):
    return ConstantEnumClass(val)


def _typeof_constant_member(val, c):
    """A member captured as a constant (a factory's closure) is its integer value."""
    return numba_types.IntegerLiteral(int(val))


for _enum in (MemoryOrder, ThreadScope, Protocol, RedOp, GinFenceLevel):
    typeof_impl.register(_enum)(_typeof_constant_member)


@infer_getattr
class _ConstantEnumAttribute(AttributeTemplate):
    key = ConstantEnumClass

    def generic_resolve(self, ty, attr):
        if attr in ty.instance_class.__members__:
            return numba_types.IntegerLiteral(int(ty.instance_class[attr]))
        return None


@lower_getattr_generic(ConstantEnumClass)
def _lower_constant_enum_member(context, builder, ty, value, attr):
    return context.get_constant(numba_types.int64, int(ty.instance_class[attr]))


bind_spec_lowerings()  # the primitives that are one C call, from their specs (every surface module is imported)
bind_attributes()
bind_device_functions()
