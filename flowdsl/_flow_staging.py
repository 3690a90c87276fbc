"""Flow's staging window: its layout (:func:`staging_words`), :func:`staging` makes it,
:func:`require_staging` is what a processor checks.

A connection's step counters and its LL / LL128 line flags live in the staging window and
must be 0 on every rank before the first launch: a window that is not gives silently wrong
data. ``comm.alloc`` does not zero memory (``ncclMemAlloc`` returns whatever was there; the
simulator fills buffers with poison), so :func:`flowdsl.flow.processor` takes only a window
that :func:`staging` made. On the GPU such a window has its own kernel type
(``StagingWindow``) and a processor over any other window is refused when the kernel is
typed, before it is compiled; the simulator refuses it when the processor is built, before
any data moves. Both say the same.

Layout (uint64 words): per (channel, connection) :data:`CONNECTION_STATE_WORDS` state words (the
step counters, then a ready and a credit flag per part of a slot, each in a 128-byte line of
its own: :func:`counter_word`, :func:`flag_word`), then the inbox slots of each protocol, then
(when GIN is possible) the outbox slots GIN puts are made from. The layout functions are
device functions: :mod:`flowdsl.flow` computes its offsets with them in the kernel, and
:func:`staging` sizes the window with them on the host.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ._devices import device
from .enums import Protocol
from .errors import UsageError

__all__ = ["MAX_CONNECTIONS", "MAX_PARTS", "LL_SLOT_BYTES", "LL128_SLOT_BYTES", "CONNECTION_STATE_WORDS", "SENT",
           "RECEIVED", "READY", "CREDIT", "Staging", "staging", "staging_words", "state_words", "counter_word",
           "flag_word", "protocol_slot_words", "region_words", "require_staging", "refusal", "lsa_team_size",
           "describe_word"]

#: Tells the simulator that this module's functions are device code.
__flowdsl_device_module__ = True

#: Connection numbers per channel: the ring programs use 0, the tree programs 1-3 (parent, children).
MAX_CONNECTIONS = 4
#: Parts of a slot at most: one per warp of a block of up to 1024 threads (see flowdsl/_flow_wire.py).
MAX_PARTS = 32
#: Largest LL slot (LL carries 8 data bytes in each 16-byte line) and LL128 slot; SIMPLE's may be larger.
LL_SLOT_BYTES = 64 * 1024
LL128_SLOT_BYTES = 128 * 1024
#: The counters of a connection end: slots sent, slots received (each end uses its own).
SENT, RECEIVED = 0, 1
#: The flags of a part: ready (the sender posted it), credit (the receiver freed it).
READY, CREDIT = 0, 1
_LL128_PASS_WORDS = 256  # LL128 moves 16 lines of 128 bytes a warp pass (flowdsl/_flow_wire.py)
_LINE = 16  # words of a 128-byte line: every flag has one to itself, away from its neighbours' writers
#: State words per (channel, connection): a line of counters, then a line per ready and credit flag.
CONNECTION_STATE_WORDS = _LINE * (1 + 2 * MAX_PARTS)


@device
def state_words(nchannels):
    """Words of the state of every (channel, connection)."""
    return nchannels * MAX_CONNECTIONS * CONNECTION_STATE_WORDS


@device
def counter_word(channel, number, which):
    """Word of counter ``which`` (:data:`SENT`, :data:`RECEIVED`) of connection ``number`` of ``channel``."""
    return (channel * MAX_CONNECTIONS + number) * CONNECTION_STATE_WORDS + which


@device
def flag_word(channel, number, which, part):
    """Word of flag ``which`` (:data:`READY`, :data:`CREDIT`) of part ``part`` of connection ``number``."""
    return (channel * MAX_CONNECTIONS + number) * CONNECTION_STATE_WORDS + _LINE * (1 + which * MAX_PARTS + part)


@device
def protocol_slot_words(slot_words, protocol):
    """Words of one slot of ``protocol`` when SIMPLE's slots are ``slot_words`` long."""
    if protocol == Protocol.LL:
        return min(slot_words, LL_SLOT_BYTES // 8)
    if protocol == Protocol.LL128:  # whole warp passes of 16 lines (2 KiB): at least one
        return max(_LL128_PASS_WORDS, min(slot_words, LL128_SLOT_BYTES // 8) // _LL128_PASS_WORDS * _LL128_PASS_WORDS)
    return slot_words


@device
def region_words(channels, nslots, slot_words, protocol):
    """Words of one protocol's slots for every (channel, connection)."""
    return channels * MAX_CONNECTIONS * nslots * protocol_slot_words(slot_words, protocol)


@device
def staging_words(channels, nslots, slot_words, with_outbox):
    """Size of a staging window in uint64 words (host and device).

    Each protocol has its own slots: a line flag must never be read from bytes another
    protocol left in the slot.
    """
    boxes = (region_words(channels, nslots, slot_words, Protocol.SIMPLE)
             + region_words(channels, nslots, slot_words, Protocol.LL)
             + region_words(channels, nslots, slot_words, Protocol.LL128))
    return state_words(channels) + boxes * (2 if with_outbox else 1)


@dataclass(frozen=True)
class Staging:
    """What a staging window was laid out for (``window.flow_staging``).

    Attributes:
        channels: Channels of the layout. Pass the same ``channels``, ``nslots`` and ``slot_words``
            to :func:`flowdsl.flow.processor` in every launch (the layout must not move while
            connections continue).
        nslots: Slots per connection.
        slot_words: uint64 words per slot.
        with_outbox: Room for GIN outboxes, needed when a peer is outside the LSA team.
        buffer: The symmetric buffer under the window (released with the communicator).
    """

    channels: int
    nslots: int
    slot_words: int
    with_outbox: bool
    buffer: object = field(repr=False, compare=False)


_COUNTER_NAMES = ("sent", "received")
_FLAG_NAMES = ("ready", "credit")


def describe_word(layout: Staging, word: int) -> str:
    """What uint64 word ``word`` of a staging window laid out as ``layout`` is, for reports:
    a counter, a flag or a line of a slot, with its channel and connection."""
    state = state_words(layout.channels)
    if word < state:
        conn, at = divmod(word, CONNECTION_STATE_WORDS)
        channel, number = divmod(conn, MAX_CONNECTIONS)
        where = f"channel {channel}, connection {number}"
        line, k = divmod(at, _LINE)
        if line == 0:
            return f"the {_COUNTER_NAMES[k]} counter of {where}" if k < 2 else f"an unused word of {where}'s state"
        which, part = divmod(line - 1, MAX_PARTS)
        return f"the {_FLAG_NAMES[which]} flag of part {part} of {where}" if k == 0 else \
            f"an unused word of {where}'s state"
    at = word - state
    for box in ("inbox", "outbox"):
        for protocol in Protocol:
            size = region_words(layout.channels, layout.nslots, layout.slot_words, protocol)
            if at < size:
                per = protocol_slot_words(layout.slot_words, protocol)
                slot, line = divmod(at, per)
                conn, slot = divmod(slot, layout.nslots)
                channel, number = divmod(conn, MAX_CONNECTIONS)
                return (f"line {line} of {protocol.name} {box} slot {slot} of channel {channel}, connection "
                        f"{number}")
            at -= size
    return f"word {word} past the layout"


def refusal(got: str) -> str:
    """The message for a processor built over ``got``, a window :func:`staging` did not make."""
    return (f"Cannot build a Flow processor over {got}: its staging window must come from "
            "flowdsl.flow.staging(comm, config). Flow's counters and line flags live in that window and must "
            "be 0 on every rank before the first launch, and comm.alloc does not zero memory: a window from "
            "comm.register(comm.alloc(...)) gives silently wrong data. Make it with "
            "stage = flowdsl.flow.staging(comm, config), which allocates, zeroes and registers it")


def require_staging(stage) -> None:
    """Refuse ``stage`` unless :func:`staging` made it (the simulator's check; on the GPU the
    same check is part of typing, ``lowering/flow.py``)."""
    if getattr(stage, "flow_staging", None) is None:
        from .errors import KernelTypingError  # noqa: PLC0415 - the GPU's typing refuses it (numba is loaded)

        dtype = getattr(stage, "dtype", None)
        got = f"Window({dtype})" if hasattr(stage, "_made_staging") else type(stage).__name__
        raise KernelTypingError(refusal(got))


def lsa_team_size(comm) -> int:
    """Ranks of ``comm``'s LSA team: ``comm.lsa_size``, else ``LOCAL_WORLD_SIZE`` when it divides the
    ranks, else all of them."""
    size = getattr(comm, "lsa_size", None)
    if size:
        return int(size)
    local = os.environ.get("LOCAL_WORLD_SIZE")
    return int(local) if local and comm.nranks % int(local) == 0 else comm.nranks


def staging(comm, config, *, gin: bool | None = None):
    """A zeroed staging window for Flow, the same on every rank. Collective.

    Allocates ``flowdsl.flow.staging_words(...)`` words, zeroes them, waits for the zeroes
    (so no peer can write into the window before), and registers the window. Keep it (and
    the device communicator, whose GIN signals count with it) for as long as its connections
    continue: counters carry over from launch to launch.

    Args:
        comm: The communicator (GPU or simulator).
        config: The layout: anything with ``channels``, ``nslots`` and ``slot_bytes``, such as
            a :class:`flowdsl.collectives.FlowConfig`. Pass ``config.channels``, ``config.nslots``
            and ``config.slot_bytes // 8`` to :func:`flowdsl.flow.processor`.
        gin: Leave room for GIN outboxes (peers outside the LSA team). Default: whether the
            communicator spans several LSA teams (``comm.lsa_size``, else ``LOCAL_WORLD_SIZE``).

    Returns:
        The registered window; ``window.flow_staging`` is its :class:`Staging`.

    Raises:
        UsageError: ``config`` is not a layout (channels >= 1, nslots >= 2, slot_bytes a
            positive multiple of 128).
    """
    try:
        channels, nslots, slot_bytes = int(config.channels), int(config.nslots), int(config.slot_bytes)
    except (AttributeError, TypeError, ValueError):
        raise UsageError(f"Cannot make Flow staging from {config!r}: pass a flowdsl.collectives.FlowConfig "
                         "(or anything with integer channels, nslots and slot_bytes)") from None
    if channels < 1 or nslots < 2 or slot_bytes < 128 or slot_bytes % 128:
        raise UsageError(f"Cannot make Flow staging for channels={channels}, nslots={nslots}, "
                         f"slot_bytes={slot_bytes}: channels >= 1, nslots >= 2 and slot_bytes a positive "
                         "multiple of 128 are needed")
    with_outbox = lsa_team_size(comm) < comm.nranks if gin is None else bool(gin)
    buffer = comm.alloc(staging_words(channels, nslots, slot_bytes // 8, with_outbox), np.uint64)
    buffer.fill(0)
    comm.synchronize()  # zero here before registering: no peer writes before it returns from register
    window = comm.register(buffer)
    window._made_staging(Staging(channels, nslots, slot_bytes // 8, with_outbox, buffer))
    return window
