"""One cost model for the collectives: which algorithm, protocol and channel count a call gets.

A call's time is estimated as ``launch + hops * hop_latency + bus_bytes / bandwidth``, per
algorithm. ``bus_bytes`` is the message's bus size as nccl-tests defines it (all_reduce
``2(n-1)/n``, all_gather and reduce_scatter ``(n-1)/n`` of the whole buffer, broadcast and
reduce 1). A Flow program's bandwidth is that of its channels (each block moves a measured
rate) up to the link's (LSA inside a node, GIN across); the one-shot all-reduce writes every
byte, as LL lines twice its size, to every peer; NCCL's host collective has its own floor and
bandwidth; the multimem all-reduce moves each byte once per rank through the NVLink switch, plus
a copy in and out of its window. :data:`CONSTANTS` holds every number; docs/collectives.md says which were measured
on 2 H200s over NVLink and which remain assumptions.
"""

from __future__ import annotations

import math

from ..enums import Protocol

__all__ = ["CONSTANTS", "HIERARCHICAL_AUTO", "NOT_MODELLED", "estimate", "choose", "protocol_for", "channels_for", "one_shot_blocks"]

CONSTANTS = {
    # Time per call back to back at 8 bytes, microseconds: host launch and kernel (flowdsl's one-shot
    # all-reduce 6.5, its ring broadcast 7.3); NCCL's host collective through nccl4py (20-23).
    "launch_us": {"flowdsl": 6.0, "nccl": 20.0},
    # Latency of one hop of a Flow program (slot posted to slot seen), microseconds: fitted to the
    # ring programs' times on 2 H200s from 8 bytes to 2 MiB (GIN: assumed).
    "hop_us": {"lsa": {Protocol.SIMPLE: 4.0, Protocol.LL: 2.0, Protocol.LL128: 4.0},
               "gin": {Protocol.SIMPLE: 8.0, Protocol.LL: 5.0, Protocol.LL128: 6.0}},
    # What one channel (block) moves, GB/s, per protocol (2 H200s: SIMPLE 64 x 5.3 = 339 GB/s; LL
    # 1.8 with one channel; LL128 about 1).
    "channel_gbps": {Protocol.SIMPLE: 5.3, Protocol.LL: 1.8, Protocol.LL128: 1.0},
    # Bytes of a message per channel before another channel is worth its start.
    "channel_bytes": {Protocol.SIMPLE: 16 * 1024, Protocol.LL: 2 * 1024, Protocol.LL128: 8 * 1024},
    # Bus bandwidth of the link, GB/s: NVLink 4 on H200 (the ring programs reach 350-370 with 128
    # channels at 1 GiB), a 400 Gb/s NIC (assumed).
    "link_gbps": {"lsa": 360.0, "gin": 45.0},
    # NCCL's host collective at large sizes, bus GB/s (2 H200s, 1 GiB).
    "nccl_gbps": {"all_reduce": 330.0, "all_gather": 284.0, "reduce_scatter": 284.0, "broadcast": 364.0,
                  "reduce": 370.0, "all_to_all": 284.0},  # all_to_all: assumed as all_gather (not measured)
    # One-shot all-reduce on top of the launch: latency (us) and message bytes per second (GB/s), from
    # 6.5 us at 8 B and 12.9 us at 1 MiB on 2 H200s.
    "one_shot": {"us": 0.5, "gbps": 160.0},
    # Multimem all-reduce (NVLink SHARP), PROVISIONAL: no GPU here has an NVSwitch that multicasts, so
    # nothing of it is measured. ``us``: its two LSA barriers per chunk, taken as two LL hops; ``gbps``: the
    # message's bytes per second over NVLink, each byte crossing a rank's link once each way (the switch
    # reduces and multicasts: NCCL's NVLS reaches about 1.3-1.5x the ring's bus bandwidth), assumed at
    # the link's bus bandwidth; the copies into and out of its window go at the local copy's rate.
    "multimem": {"us": 4.0, "gbps": 360.0},
    # One rank: bytes per second of the local copy (H200, 1 GiB, measured): flowdsl's copy
    # loop, and NCCL's copy-engine memcpy.
    "local_gbps": {"flowdsl": 1950.0, "nccl": 2016.0},
    # LL carries messages up to this many bytes per rank; SIMPLE the larger ones. LL128 is never
    # chosen: on 2 H200s it was slower than one of the others at every size (docs/performance.md).
    "ll_bytes": 16 * 1024,
}

_RING_HOPS = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1,
              "reduce_scatter": lambda n: n - 1, "broadcast": lambda n: n - 1, "reduce": lambda n: n - 1,
              "all_to_all": lambda n: 1}  # all_to_all: pairwise rounds, each one hop, in parallel
# Bus bytes as a multiple of the bytes per rank (nccl-tests' definition).
_BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: n - 1,
        "reduce_scatter": lambda n: n - 1, "broadcast": lambda n: 1, "reduce": lambda n: 1,
        "all_to_all": lambda n: n - 1}  # all_to_all: the bytes of one block per rank


def protocol_for(nbytes: int, nranks: int) -> Protocol:
    """The protocol for a message of ``nbytes`` per rank."""
    return Protocol.LL if nbytes <= CONSTANTS["ll_bytes"] else Protocol.SIMPLE


def channels_for(nbytes: int, nranks: int, config, protocol: Protocol | None = None) -> int:
    """Blocks for a call: one per ``channel_bytes`` of the protocol, at most ``config.channels``; a
    one-rank call is a local copy that uses no staging, so it may fill the GPU (8 blocks of 256
    threads per SM of an H200)."""
    if nranks == 1:
        return min(max(1, -(-nbytes // (64 * 1024))), 1056)
    protocol = protocol_for(nbytes, nranks) if protocol is None else protocol
    return min(max(1, -(-nbytes // CONSTANTS["channel_bytes"][protocol])), config.channels)


def one_shot_blocks(count: int, nranks: int) -> int:
    """Blocks of a one-shot all-reduce: one per 1024 elements, two per thread of 512, since each
    thread waits for its lines one after another (at most ``ONE_SHOT_BLOCKS``)."""
    from .programs import ONE_SHOT_BLOCKS  # noqa: PLC0415

    return min(max(1, -(-count // 1024)), ONE_SHOT_BLOCKS)


def estimate(collective: str, algorithm: str, nranks: int, lsa_size: int, nbytes: int, config=None) -> float:
    """Estimated microseconds of one call (``config``: the FlowConfig whose channels it may use)."""
    c = CONSTANTS
    if algorithm in NOT_MODELLED:
        from ..errors import UsageError  # noqa: PLC0415

        raise UsageError(f"Cannot estimate {collective} with algorithm={algorithm!r}: the cost model has no "
                         "constants for CFT (no machine with a CFT fabric has run it), and 'auto' never picks it. "
                         "Estimate 'hierarchical' (its far phase over GIN) instead")
    if nranks == 1:
        who = "nccl" if algorithm == "nccl" else "flowdsl"
        return c["launch_us"][who] + nbytes / (c["local_gbps"][who] * 1e3)
    bus = _BUS[collective](nranks) * nbytes
    if algorithm == "nccl":
        return c["launch_us"]["nccl"] + bus / (c["nccl_gbps"][collective] * 1e3)
    if algorithm == "one_shot":  # every rank's LL lines to every peer: grows with the peers
        return c["launch_us"]["flowdsl"] + c["one_shot"]["us"] + (nranks - 1) * nbytes / (c["one_shot"]["gbps"] * 1e3)
    if algorithm == "multimem":  # the message once over the switch whatever the ranks, and two local copies
        return (c["launch_us"]["flowdsl"] + c["multimem"]["us"] + nbytes / (c["multimem"]["gbps"] * 1e3)
                + 2 * nbytes / (c["local_gbps"]["flowdsl"] * 1e3))
    transport = "gin" if lsa_size < nranks else "lsa"
    proto = protocol_for(nbytes, nranks)
    max_channels = config.channels if config is not None else 24
    channels = min(max(1, -(-nbytes // c["channel_bytes"][proto])), max_channels)
    bw = min(c["link_gbps"][transport], channels * c["channel_gbps"][proto]) * 1e3  # bytes per microsecond
    hop = c["hop_us"][transport][proto]
    if algorithm == "hierarchical":
        return c["launch_us"]["flowdsl"] + _hierarchical_us(collective, nranks, lsa_size, nbytes, proto, channels)
    if algorithm == "tree":
        # Up then down a tree of this depth; a rank is an inner node of one tree and a leaf of the
        # other, so twice the all-reduce's bus bytes cross its links.
        depth = max(1, math.ceil(math.log2(nranks)))
        return c["launch_us"]["flowdsl"] + 2 * depth * hop + 2 * bus / bw
    return c["launch_us"]["flowdsl"] + _RING_HOPS[collective](nranks) * hop + bus / bw


def _hierarchical_us(collective, nranks, lsa_size, nbytes, proto, channels) -> float:
    """The hierarchical programs' hops and bytes, on top of the launch: along the rail over GIN (``nodes - 1``
    hops; each rank's block, or reduced block, crosses once per other node), inside the node over LSA (the
    ring of each of the ``nodes`` gathered blocks: ``L - 1`` hops each); the all-to-all's rounds run side by side,
    each a rail hop and a node hop, the rail carrying ``(nodes - 1) L`` blocks, the node ``(L - 1) nodes``."""
    c = CONSTANTS
    L = lsa_size
    nodes = nranks // L

    def rate(transport):
        return min(c["link_gbps"][transport], channels * c["channel_gbps"][proto]) * 1e3

    if collective == "all_to_all":
        return (c["hop_us"]["gin"][proto] + c["hop_us"]["lsa"][proto] + (nodes - 1) * L * nbytes / rate("gin")
                + (L - 1) * nodes * nbytes / rate("lsa"))
    return ((nodes - 1) * c["hop_us"]["gin"][proto] + nodes * (L - 1) * c["hop_us"]["lsa"][proto]
            + (nodes - 1) * nbytes / rate("gin") + nodes * (L - 1) * nbytes / rate("lsa"))


#: Programs the model has no constants for, which ``"auto"`` never picks: the far phase over CFT (no CFT fabric
#: has run it; chosen by name, ``algorithm="hierarchical_cft"``).
NOT_MODELLED = ("hierarchical_cft",)

#: Collectives whose hierarchical program ``"auto"`` may pick. Not all_to_all: it sends as many bytes over the
#: network as the pairwise program (every block for another node crosses once either way); what it gains is
#: that each NIC talks to its own rail only, which the model does not capture, and it forwards inside the node.
HIERARCHICAL_AUTO = ("all_gather", "reduce_scatter")


def choose(collective: str, nranks: int, lsa_size: int, nbytes: int, *, nccl_available: bool = True,
           one_shot_available: bool = False, multimem_available: bool = False, hierarchical_available: bool = False,
           config=None) -> str:
    """The cheapest of ``ring``, ``tree``, ``one_shot`` and ``multimem`` (all_reduce; ``multimem_available``:
    the communicator has NVLink SHARP and the type and operator a multimem form), ``pairwise`` (all_to_all,
    its one program), ``hierarchical`` (all_gather and reduce_scatter across nodes laid out node by node:
    ``hierarchical_available``) and ``nccl`` for this call."""
    candidates = ["pairwise"] if collective == "all_to_all" else ["ring"]
    if hierarchical_available and collective in HIERARCHICAL_AUTO and 1 < lsa_size < nranks:
        candidates.append("hierarchical")
    if collective == "all_reduce":
        candidates.append("tree")
        if one_shot_available:
            candidates.append("one_shot")
        if multimem_available and lsa_size == nranks and nranks > 1:
            candidates.append("multimem")
    if nccl_available:
        candidates.append("nccl")
    return min(candidates, key=lambda a: estimate(collective, a, nranks, lsa_size, nbytes, config))
