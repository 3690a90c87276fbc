"""Enums shared by the device surface, the lowering and the simulator.

Contents: :class:`MemoryOrder`, :class:`ThreadScope`, :class:`CoopKind`,
:class:`Protocol`, :class:`RedOp`.
Values mirror libcu++ (``cuda::memory_order``, ``cuda::thread_scope``) exactly,
so they pass straight through to the support library.
"""

from __future__ import annotations

import enum

__all__ = ["MemoryOrder", "ThreadScope", "CoopKind", "Protocol", "RedOp", "ConstantEnumMeta"]


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
    """Reduction operators of the collectives (values match ``ncclRedOp_t``)."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4
