"""One cost model for the collectives: which algorithm, protocol and channel count a call gets.

A call's time is estimated as ``launch + steps * step_latency + bytes_leaving_a_GPU /
bandwidth``, per algorithm, with the link's transport (LSA inside a node, GIN across)
and the protocol's efficiency. NCCL's own host collective is a candidate too, with
its measured one-rank floor as launch cost. :data:`CONSTANTS` holds every number;
docs/collectives.md says which were measured and which are assumptions.

Contents: :data:`CONSTANTS`, :func:`estimate`, :func:`choose`, :func:`protocol_for`,
:func:`channels_for`.
"""

from __future__ import annotations

import math

from ..enums import Protocol

__all__ = ["CONSTANTS", "estimate", "choose", "protocol_for", "channels_for"]

CONSTANTS = {
    # Host launch + kernel start, microseconds (H200; see docs/performance.md).
    "launch_us": {"flowdsl": 8.0, "nccl": 22.0},
    # Latency of one pipeline step over a connection, microseconds.
    "step_us": {"lsa": {Protocol.SIMPLE: 2.0, Protocol.LL: 0.8, Protocol.LL128: 1.2},
                "gin": {Protocol.SIMPLE: 6.0, Protocol.LL: 4.0, Protocol.LL128: 5.0}},
    # Bandwidth of one link direction, GB/s: NVLink 4 on H200 (the LSA all-gather on 2 GPUs
    # reached 288 bus), a 400 Gb/s NIC (assumed).
    "link_gbps": {"lsa": 300.0, "gin": 45.0},
    # One rank: bytes per second of the local copy (H200, 1 GiB, measured): flowdsl's copy
    # loop, and NCCL's copy-engine memcpy.
    "local_gbps": {"flowdsl": 1950.0, "nccl": 2016.0},
    # Share of a slot's bytes that are data.
    "efficiency": {Protocol.SIMPLE: 1.0, Protocol.LL: 0.5, Protocol.LL128: 120 / 128},
    # Protocol by message size per rank (bytes): LL up to the first, LL128 up to the second.
    "protocol_bytes": (64 * 1024, 512 * 1024),
}

_RING_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1,
               "reduce_scatter": lambda n: n - 1, "broadcast": lambda n: n - 1, "reduce": lambda n: n - 1}
# Bytes leaving each GPU, as a multiple of the per-rank message size.
_RING_BYTES = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: n - 1,
               "reduce_scatter": lambda n: n - 1, "broadcast": lambda n: 1, "reduce": lambda n: 1}


def protocol_for(nbytes: int, nranks: int) -> Protocol:
    """The protocol for a message of ``nbytes`` per rank."""
    ll, ll128 = CONSTANTS["protocol_bytes"]
    if nbytes <= ll:
        return Protocol.LL
    if nbytes <= ll128:
        return Protocol.LL128
    return Protocol.SIMPLE


def channels_for(nbytes: int, nranks: int, config) -> int:
    """Blocks for a call: one per 64 KiB, at most ``config.channels``; a one-rank call is a local
    copy that uses no staging, so it may fill the GPU (8 blocks of 256 threads per SM of an H200)."""
    want = max(1, -(-nbytes // (64 * 1024)))
    return min(want, 1056) if nranks == 1 else min(want, config.channels)


def estimate(collective: str, algorithm: str, nranks: int, lsa_size: int, nbytes: int) -> float:
    """Estimated microseconds of one call."""
    c = CONSTANTS
    proto = protocol_for(nbytes, nranks)
    if nranks == 1:
        who = "nccl" if algorithm == "nccl" else "flowdsl"
        return c["launch_us"][who] + nbytes / (c["local_gbps"][who] * 1e3)
    transport = "gin" if lsa_size < nranks else "lsa"
    bw = c["link_gbps"][transport] * 1e3 * c["efficiency"][proto]  # bytes per microsecond
    step = c["step_us"][transport][proto]
    if algorithm == "tree":
        # Up then down a tree of this depth; a rank is an inner node (one up, two down) of one
        # tree for half the data and a leaf (one up) of the other: 2x the bytes leave each GPU.
        depth = math.ceil(math.log2(nranks + 1))
        return c["launch_us"]["flowdsl"] + 2 * depth * step + 2 * nbytes / bw
    ring = _RING_STEPS[collective](nranks) * step + _RING_BYTES[collective](nranks) * nbytes / bw
    if algorithm == "nccl":
        return c["launch_us"]["nccl"] + ring
    return c["launch_us"]["flowdsl"] + ring


def choose(collective: str, nranks: int, lsa_size: int, nbytes: int, *, nccl_available: bool = True) -> str:
    """The cheapest of ``ring``, ``tree`` (all_reduce only) and ``nccl`` for this call."""
    candidates = ["ring"] + (["tree"] if collective == "all_reduce" else []) + (["nccl"] if nccl_available else [])
    return min(candidates, key=lambda a: estimate(collective, a, nranks, lsa_size, nbytes))
