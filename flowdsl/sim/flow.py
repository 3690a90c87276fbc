"""What Flow's own primitives do in the simulator: :func:`flowdsl.flow.reduction` makes the
:class:`flowdsl.flow.Reduction` the steps read (its arguments checked by its spec first, as the
GPU's typing checks them); ``connect``'s and ``processor``'s refusals raise with the GPU's words; and
``step_ends`` checks that the two ends of each step agree (count, element type, protocol), which the GPU
cannot. The rest of Flow is device code the simulator runs as it is."""

from __future__ import annotations

from . import _state
from .._flow_elements import (Reduction, bad_channel_text, bad_connection_text, bad_layout_text,
                              missing_gin_context_text, scale_refusal)
from ..enums import Protocol, RedOp
from .errors import KernelTypingError, UsageError, sim_error
from .races import user_line
from .semantics import implements

__all__: list[str] = []


@implements("flowdsl.flow.reduction")
def _flow_reduction(op, nranks, fp8, scale):
    if op == RedOp.PREMULSUM and scale is None:  # the GPU refuses a constant PREMULSUM without one when it types it
        raise sim_error(KernelTypingError, scale_refusal())
    return Reduction(op, nranks, fp8, scale)


@implements("flowdsl.flow.missing_gin_context")
def _flow_missing_gin_context(peer):
    raise sim_error(UsageError, missing_gin_context_text(int(peer)))


@implements("flowdsl.flow.bad_connection")
def _flow_bad_connection(peer, number, remote_number, last_rank):
    raise sim_error(UsageError, bad_connection_text(int(peer), int(number), int(remote_number), int(last_rank)))


@implements("flowdsl.flow.bad_channel")
def _flow_bad_channel(channel, channels):
    raise sim_error(UsageError, bad_channel_text(int(channel), int(channels)))


@implements("flowdsl.flow.bad_layout")
def _flow_bad_layout(channels, nslots, slot_words, needed, held):
    raise sim_error(UsageError, bad_layout_text(*(int(v) for v in (channels, nslots, slot_words, needed, held))))


@implements("flowdsl.flow.connection_ends")
def _flow_connection_ends(peer, channel, number, remote_number, sending):
    world = _state.sched.world
    ends = world.__dict__.setdefault("flow_connections", {})  # (rank, peer, channel, sending) -> {(number, remote)}
    key = (_state.cur.rank, int(peer), int(channel), bool(sending))
    pairs = ends.setdefault(key, {})
    pair = (int(number), int(remote_number))
    if pair not in pairs:
        pairs[pair] = user_line()


@implements("flowdsl.flow.step_ends")
def _flow_step_ends(peer, channel, inbox, step, n, data, protocol, sending):
    world = _state.sched.world
    # (receiving rank, channel, inbox, slot) -> what the end that got there first noted, by direction: the
    # second end compares when its step starts, so ends that disagree are named even where the step then
    # cannot move (another protocol's wire format never completes).
    notes = world.__dict__.setdefault("flow_steps", ({}, {}))
    key = (int(peer), int(channel), int(inbox), int(step))
    end = (_state.cur.rank, int(n), str(data.dtype), Protocol(int(protocol)).name, user_line())
    mine, theirs = (notes[1], notes[0]) if sending else (notes[0], notes[1])
    other = theirs.pop(key, None)
    if other is None:
        mine[key] = end
        return
    sent, received = (end, other) if sending else (other, end)
    if sent[1:4] != received[1:4]:
        raise sim_error(UsageError, (
            f"The two ends of a Flow step disagree: rank {sent[0]} sends {sent[1]} elements of {sent[2]} "
            f"({sent[3]}) at {sent[4]} into inbox {inbox} of channel {channel}, and rank {received[0]} receives "
            f"{received[1]} of {received[2]} ({received[3]}) at {received[4]}. Both ends of a connection take the "
            "same element count, type and protocol in each step (on a GPU the bytes move as they are: wrong "
            "values or a hang, no error)"))
