"""What the collectives take: element types, operators, algorithms and the staging shape (:class:`FlowConfig`).

Shared by the host entry points (:mod:`flowdsl.collectives._host`), the cross-rank check of a
call (:mod:`flowdsl.collectives._agree`) and the kernel library (:mod:`flowdsl.collectives._library`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..enums import Protocol, RedOp
from ..errors import UsageError
from .programs import PROGRAMS

__all__ = ["DTYPES", "OPS", "ALGORITHMS", "FP8_REDUCTIONS_FROM_SM", "FlowConfig", "DEFAULT_CONFIG",
           "SIMULATOR_CONFIG", "default_config"]

#: Element types of the collectives: NCCL's twelve (``ncclDataType_t``, in its order). bfloat16 is a
#: torch.bfloat16 tensor, or a uint16 CuPy/NumPy array of its bits (neither has a bfloat16 dtype; NCCL
#: has no uint16). fp8 is a torch float8 tensor, or a uint8 array with ``dtype="float8_e4m3fn"`` /
#: ``"float8_e5m2"`` in the call. Integers wrap (sum, prod, premulsum); unsigned ones compare unsigned.
DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16",
          "float8_e4m3fn", "float8_e5m2")
#: NCCL reduces fp8 from this compute capability on ("FP8 reduction support begins with sm90"); the
#: collectives refuse fp8 reductions on older GPUs alike (copies take fp8 on any GPU).
FP8_REDUCTIONS_FROM_SM = 90
#: Reduction operators by name: NCCL's six. ``premulsum`` takes its scalar:
#: ``op=flowdsl.collectives.premul_sum(scalar)`` (the name alone is refused).
OPS = {"sum": RedOp.SUM, "prod": RedOp.PROD, "min": RedOp.MIN, "max": RedOp.MAX, "avg": RedOp.AVG,
       "premulsum": RedOp.PREMULSUM}


@dataclass(frozen=True)
class FlowConfig:
    """Staging and launch shape of the collectives.

    The defaults fit NCCL's budget: up to 24 channels (NCCL's own count on 2 H200s over NVLink)
    of 512 threads, 128 KiB SIMPLE slots (LL 64 KiB, LL128 128 KiB), 4 per connection; a call
    uses one channel per ``cost.CONSTANTS["channel_bytes"]`` of its message. The staging window
    then takes about 121 MiB per rank on one node (4 connections per channel). One channel of
    today's data path moves 36 GB/s (SIMPLE) over HBM on one H200 (docs/performance.md), so 24
    reach NVLink's bus bandwidth if a channel over NVLink moves what it does over HBM: that
    waits for two GPUs. On the simulator a call without ``config=`` takes
    :data:`flowdsl.collectives.SIMULATOR_CONFIG` (2 channels of 64 threads, 4 slots of 4 KiB), sized for a
    CPU.

    Attributes:
        channels: Blocks (channels) at most; each has its own slots and counters.
        nslots: Slots per connection (how far a sender runs ahead).
        slot_bytes: Bytes of one SIMPLE slot (a multiple of 128); LL slots are at most
            ``flowdsl.flow.LL_SLOT_BYTES``, LL128 slots whole 2 KiB passes up to
            ``flowdsl.flow.LL128_SLOT_BYTES``.
        threads: Threads per block (each warp owns a part of every slot).
        protocol: ``None`` lets the cost model choose per call, or a :class:`flowdsl.Protocol`.
    """

    channels: int = 24
    nslots: int = 4
    slot_bytes: int = 128 * 1024
    threads: int = 512
    protocol: Protocol | None = None

    def __post_init__(self):
        if self.channels < 1 or self.nslots < 2 or self.threads < 32 or self.threads % 32:
            raise UsageError(f"Cannot use {self}: channels >= 1, nslots >= 2 and threads a multiple of 32 "
                             "are needed")
        if self.slot_bytes < 128 or self.slot_bytes % 128:
            raise UsageError(f"Cannot use slot_bytes={self.slot_bytes}: give a multiple of 128 bytes")


DEFAULT_CONFIG = FlowConfig()
#: What a collective without ``config=`` uses on the simulator: a shape sized for a CPU. The GPU's
#: default there took 0.8 GB and 6 s for a 4096-element all_reduce on 4 ranks (its 121 MiB staging
#: window per rank is allocated and poisoned); this one 0.3 GB and 3 s. The programs and the data
#: path are the same; what the shape changes is how many slots, channels and warps a call cuts a
#: message into (pass ``config=`` to simulate another, e.g. ``FlowConfig()``, the GPU's).
SIMULATOR_CONFIG = FlowConfig(channels=2, nslots=4, slot_bytes=4096, threads=64)


def default_config(comm) -> FlowConfig:
    """The shape of a call that names none: ``FlowConfig()`` where the memory is a GPU's, ``SIMULATOR_CONFIG``
    where host memory stands for it (the simulator: CPU time per simulated thread)."""
    return SIMULATOR_CONFIG if comm.memory_device == "cpu" else DEFAULT_CONFIG
#: What ``algorithm=`` takes: the programs' algorithms, NCCL's host collective, or the cost model's choice.
ALGORITHMS = ("auto", *dict.fromkeys(a for (a, c) in PROGRAMS), "nccl")
