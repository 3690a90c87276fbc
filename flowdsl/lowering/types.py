"""Numba types for flowdsl's opaque device values, and their data models.

A device communicator travels into the kernel *by value*, as the words of the
C ``ncclDevComm`` struct of its NCCL ABI (kernel parameters live in constant
memory, as in a C++ kernel taking ``ncclDevComm`` by value), then one word more:
the address of its communicator's wait record (:mod:`flowdsl.wait`; the support
library finds it right after the struct). Support functions receive a pointer to
a local copy; after LTO inlining the copy folds away.
A window travels as its ``ncclWindow_t`` handle plus its size in bytes.
"""

from __future__ import annotations

from numba.core import types
from numba.cuda import models
from numba.cuda.datamodel.models import OpaqueModel
from numba.cuda.extending import register_model

from ..enums import CoopKind

__all__ = [
    "DevCommType", "WindowType", "OneValueType", "MultimemViewType", "TeamType", "CoopType", "SessionType", "LsaBarrierSessionType",
    "team_type", "ArgumentMarshaller", "ConstantEnumClass", "devcomm_words", "bind_attributes",
    "register_struct_model",
]


def devcomm_words(dev_comm_size: int) -> int:
    """Kernel words of a device communicator: ``ncclDevComm`` (``dev_comm_size`` bytes, padded to
    8) and the wait record's address."""
    return -(-dev_comm_size // 8) + 1


class DevCommType(types.Type):
    """A device communicator of NCCL device ABI ``abi``: ``nwords`` u64, ``ncclDevComm`` and the
    wait record's address (:func:`devcomm_words`)."""

    def __init__(self, abi: tuple[int, int, int], nwords: int):
        self.abi = tuple(abi)
        self.nwords = nwords
        super().__init__(name=f"DevComm(nccl={'.'.join(map(str, abi))})")

    @property
    def key(self):
        return self.abi, self.nwords

    @property
    def words_type(self):
        return types.UniTuple(types.uint64, self.nwords)


class WindowType(types.Type):
    """A registered window whose elements are ``dtype`` (``ncclWindow_t`` + size).

    ``staging``: made by :func:`flowdsl.flow.staging` (zeroed on every rank before any
    peer could write), the only windows :func:`flowdsl.flow.processor` takes. Same data.
    """

    def __init__(self, dtype: types.Type, staging: bool = False):
        self.dtype = dtype
        self.staging = bool(staging)
        super().__init__(name=f"{'StagingWindow' if staging else 'Window'}({dtype})")

    @property
    def key(self):
        return self.dtype, self.staging


class OneValueType(types.Type):
    """A type told apart by one value: kept as the attribute named ``field``, its key, named
    ``<label>(value)``."""

    label = "OneValue"
    field = "value"

    def __init__(self, value):
        setattr(self, self.field, value)
        super().__init__(name=f"{self.label}({value})")

    @property
    def key(self):
        return getattr(self, self.field)


class MultimemViewType(OneValueType):
    """A multimem view of ``dtype`` elements (:func:`flowdsl.lsa.multimem_view`): the multicast address of
    its first element and how many it holds. Not an array: a plain load or store of a multimem address is
    undefined in PTX, so only ``flowdsl.mem``'s multimem operations take it."""

    label, field = "MultimemView", "dtype"


class TeamType(types.Type):
    """``ncclTeam``: ``nranks``, ``rank``, ``stride``."""

    def __init__(self):
        super().__init__(name="Team")


team_type = TeamType()


class CoopType(types.Type):
    """A coop of one kind; its run-time word is the lane mask or the packed warp span."""

    def __init__(self, kind: CoopKind):
        self.kind = CoopKind(kind)
        super().__init__(name=f"Coop({self.kind.name.lower()})")

    @property
    def key(self):
        return self.kind


class SessionType(types.Type):
    """A session a coop opens on a device communicator (a barrier's, a CFT session): typed by both, named
    ``<label>(comm, coop)``."""

    label = "Session"

    def __init__(self, comm: DevCommType, coop: CoopType):
        self.comm, self.coop = comm, coop
        super().__init__(name=f"{self.label}({comm}, {coop})")

    @property
    def key(self):
        return self.comm, self.coop


class LsaBarrierSessionType(SessionType):
    """An LSA barrier session: the communicator, the coop and the barrier index."""

    label = "LsaBarrierSession"


class ConstantEnumClass(types.Dummy):
    """An enum class (``MemoryOrder``, ``ThreadScope``) whose members type as int literals."""

    def __init__(self, cls):
        self.instance_class = cls
        super().__init__(name=f"ConstantEnumClass({cls.__name__})")

    @property
    def key(self):
        return self.instance_class


def register_struct_model(type_class, members) -> None:
    """Give ``type_class`` a struct data model whose members, ``(name, numba type)`` pairs, are
    ``members(fe_type)`` (they may depend on the type's parameters)."""

    class Model(models.StructModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, members(fe_type))

    Model.__name__ = Model.__qualname__ = f"_{type_class.__name__.removesuffix('Type')}Model"
    register_model(type_class)(Model)


register_model(ConstantEnumClass)(OpaqueModel)
register_struct_model(DevCommType, lambda fe: [("words", fe.words_type)])
register_struct_model(WindowType, lambda fe: [("handle", types.voidptr), ("nbytes", types.uint64)])
register_struct_model(MultimemViewType, lambda fe: [("data", types.CPointer(fe.dtype)), ("count", types.int64)])
register_struct_model(TeamType, lambda fe: [("nranks", types.int32), ("rank", types.int32), ("stride", types.int32)])
register_struct_model(CoopType, lambda fe: [("word", types.uint32)])
register_struct_model(LsaBarrierSessionType, lambda fe: [("comm", fe.comm), ("coop", fe.coop), ("index", types.uint32)])


def bind_attributes() -> None:
    """Device-side attributes of teams and windows (called by :mod:`flowdsl.lowering.bindings`:
    registering them imports numba-cuda's lowering, which loading a cached kernel does not need)."""
    from numba.cuda.extending import make_attribute_wrapper  # noqa: PLC0415

    for attr in ("nranks", "rank", "stride"):
        make_attribute_wrapper(TeamType, attr, attr)
    make_attribute_wrapper(WindowType, "handle", "_handle")
    make_attribute_wrapper(WindowType, "nbytes", "nbytes")


class ArgumentMarshaller:
    """Kernel-launch extension: host DevComm/Window objects → flat kernel parameters.

    The flattened tuple types have the same parameter layout as the data
    models above, so the kernel receives exactly the struct it was typed with.
    """

    def __init__(self, features=frozenset(), linked_for=None):
        #: What a kernel stored in numba-cuda's disk cache (``cache=True``) needs beside its cubin, pickled with
        #: it: its flowdsl features and what it was linked for (flowdsl/_numba_cache.py).
        self.features = frozenset(features)
        self.linked_for = linked_for

    def prepare_args(self, ty, val, stream=None, retr=None):
        if isinstance(ty, DevCommType):
            # ints: numba-cuda's launcher packs a tuple's members itself (the words as ctypes values are the
            # fast path's, flowdsl/_launch_params.py)
            return ty.words_type, val._kernel_word_values()
        if isinstance(ty, WindowType):
            return types.UniTuple(types.uint64, 2), (val.handle, val.nbytes)
        return ty, val
