"""Enums shared by the device surface, the lowering and the simulator.

Values mirror libcu++ (``cuda::memory_order``, ``cuda::thread_scope``) and NCCL
(``ncclRedOp_t``, ``ncclNetDeviceType``) exactly, so they pass straight through to
the support library.
"""

from __future__ import annotations

import enum

__all__ = ["MemoryOrder", "ThreadScope", "CoopKind", "Protocol", "RedOp", "GinBackend", "GinConnectionType",
           "GinFenceLevel", "ConstantEnumMeta"]


class ConstantEnumMeta(enum.EnumMeta):
    """Metaclass of enums whose members are compile-time constants in kernels.

    The lowering types ``MemoryOrder.ACQUIRE`` as the integer literal 2 (numba
    types plain enum members without their value), so inline PTX can be chosen
    and wrong values rejected when the kernel is compiled.
    """


class MemoryOrder(enum.IntEnum, metaclass=ConstantEnumMeta):
    """``cuda::memory_order`` (values match libcu++)."""

    RELAXED = 0
    CONSUME = 1
    ACQUIRE = 2
    RELEASE = 3
    ACQ_REL = 4
    SEQ_CST = 5


class ThreadScope(enum.IntEnum, metaclass=ConstantEnumMeta):
    """``cuda::thread_scope`` (values match libcu++).

    ``SYSTEM`` orders with the host and with peer GPUs over NVLink/PCIe;
    ``DEVICE`` with the whole GPU; ``BLOCK`` within a CTA.
    """

    SYSTEM = 0
    DEVICE = 1
    BLOCK = 2
    THREAD = 3


class CoopKind(enum.IntEnum):
    """Which group of threads performs a collective call (NCCL's ``ncclCoop*``)."""

    THREAD = 0
    WARP = 1
    LANES = 2
    WARP_SPAN = 3
    CTA = 4


class Protocol(enum.IntEnum, metaclass=ConstantEnumMeta):
    """How :mod:`flowdsl.flow` moves a slot of data to a peer (NCCL's three protocols).

    ``SIMPLE``: bulk data, then one flag per slot (bandwidth). ``LL``: 8-byte lines of
    4 data bytes and a 4-byte flag written together (latency). ``LL128``: 128-byte
    lines of 120 data bytes and an 8-byte flag (in between).
    """

    SIMPLE = 0
    LL = 1
    LL128 = 2


class RedOp(enum.IntEnum, metaclass=ConstantEnumMeta):
    """Reduction operators of the collectives (values match ``ncclRedOp_t``).

    ``PREMULSUM`` is NCCL's ``ncclRedOpCreatePreMulSum``: every rank multiplies its own input by
    its own scalar, then the products are summed. NCCL has no constant for it (it makes each one
    at run time, numbered from ``ncclNumOps``, 5); flowdsl's is that first number, for its own
    kernels, where the scalar travels with the reduction (:func:`flowdsl.flow.reduction`).
    """

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4
    PREMULSUM = 5


class GinConnectionType(enum.IntEnum):
    """Which ranks a device communicator's GIN connects (NCCL's ``ncclGinConnectionType_t``, the
    ``gin_connection_type`` requirement; NCCL 2.28 has none).

    ``FULL``: every rank (what ``gin_force_enable`` asks, and flowdsl's default when a device
    communicator asks for GIN resources and names no type); ``RAIL``: the rail team only (no world GIN
    barrier); ``CUSTOM_STRIDE``: ranks ``gin_custom_stride`` apart. ``NONE``: no GIN. NCCL's
    ``CUSTOM_ARRAY`` (a list of peers) is not offered.
    """

    NONE = 0
    FULL = 1
    RAIL = 2
    CUSTOM_STRIDE = 3
    CUSTOM_ARRAY = 4


class GinFenceLevel(enum.IntEnum, metaclass=ConstantEnumMeta):
    """What a GIN or hybrid barrier's ``sync`` drains (NCCL's ``ncclGinFenceLevel``, bit flags of the same
    values; NCCL 2.28 has ``NONE`` only, there named ``Relaxed``).

    ``NONE``: synchronisation only. ``PUT``: once the barrier returns, the puts every member issued to this
    rank before it are visible here. ``GET``: once it returns, this rank's gets issued before it have landed.
    ``PUT_GET``: both, NCCL 2.32's default and flowdsl's (``PUT | GET`` on the host).
    """

    NONE = 0
    PUT = 1
    GET = 2
    PUT_GET = 3


class GinBackend(enum.IntEnum):
    """A GIN backend: how a device communicator's GIN connections reach the network.

    Values match NCCL's ``ncclNetDeviceType``, which ``ncclDevComm`` records per GIN
    connection (the device code dispatches on it). The one table of backends for the
    GPU runtime, the support builds (one GIN build each) and the simulator's
    ``gin_backend=`` option (:attr:`option`).
    """

    PROXY = 2
    GDAKI = 3
    GPI = 4
    EFA_GDA = 5

    @property
    def strong_signals(self) -> bool:
        """Whether it offers strong signals (EFA GDA offers weak ones only)."""
        return self is not GinBackend.EFA_GDA

    @property
    def option(self) -> str:
        """Its lower-case name: the simulator's ``gin_backend=`` value and the support build's suffix."""
        return self.name.lower()

    @classmethod
    def from_option(cls, name) -> GinBackend | None:
        """The backend ``name`` names (``"proxy"``, ``"EFA_GDA"``, a member), or None if it names none."""
        if isinstance(name, cls):
            return name
        return cls.__members__.get(str(name).upper())
