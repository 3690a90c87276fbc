"""How a ring all-reduce's out-of-line Flow functions are called, read from its linked PTX.

The link's time is the code it compiles (ptxas is most of it). Each out-of-line step is
called from one place per call in the program (``noduplicate``: the link's optimiser
unswitched and unrolled the ring's loops into 15 call sites of 5 steps); the bounded
waits are inline in the steps (a call per slot cost more than its loop) and give the
support library's check only the wait record, so the out-of-line steps are not passed the
device communicator's ~26 words (steps took 45-48 parameters). The SIMPLE loops keep their
16-byte loads and stores and touch no local memory.
"""

from __future__ import annotations

import re

import pytest

from flowdsl import RedOp
from flowdsl.collectives import _library

pytestmark = pytest.mark.compile

_STEPS = ("_step_send", "_step_recv", "_step_recv_reduce_send", "_step_recv_reduce_copy_send",
          "_step_recv_copy_send")


def _mangled(name: str) -> str:
    return f"_ZN7flowdsl4flow{len(name)}{name}B"


def _definitions(ptx: str) -> dict[str, tuple[int, list[str]]]:
    """``symbol -> (parameters, body lines)`` of every function defined in ``ptx``."""
    found = {}
    lines = ptx.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^(\.visible \.entry|\.func)\s", line) and line.rstrip().endswith("("):
            symbol = line.split()[-1].rstrip("(")
            end = lines.index(")", i)
            start = lines.index("{", end)
            found[symbol] = (sum(p.strip().startswith(".param") for p in lines[i + 1:end]),
                             lines[start + 1:lines.index("}", start)])
    return found


def _of(definitions, name):
    (entry,) = [v for k, v in definitions.items() if k.startswith(_mangled(name))]
    return entry


def _blocks(body: list[str]) -> list[list[str]]:
    blocks, current = [], []
    for line in body:
        if re.match(r"^\$L__BB\d+_\d+:", line):
            blocks.append(current)
            current = []
        current.append(line.strip())
    return blocks + [current]


@pytest.fixture(scope="module")
def ring_all_reduce_ptx():
    """The library's ring all-reduce (float32 sum, one LSA team) linked for sm_90, as PTX."""
    import dataclasses

    from flowdsl.lowering import compiler

    kept, original = [], compiler.Linker

    class Keeping(original):
        def __init__(self, *objects, options):
            super().__init__(*objects, options=options)
            other = original(*objects, options=dataclasses.replace(options, ptx=True))
            try:
                kept.append(bytes(other.link("ptx").code).decode().rstrip("\0"))
            finally:
                other.close()

    compiler.Linker = Keeping
    try:
        _library.kernel_for("ring", "all_reduce", RedOp.SUM).compile(_library._argtypes("float32", "2.28.9"),
                                                                     arch="sm_90", nccl="2.28.9")
    finally:
        compiler.Linker = original
    return kept[-1]


def test_each_step_is_called_from_one_place_per_call_in_the_program(ring_all_reduce_ptx):
    definitions = _definitions(ring_all_reduce_ptx)
    (entry,) = [body for symbol, (_, body) in definitions.items() if "ring_all_reduce" in symbol]
    calls = [entry[i + 1].strip().rstrip(",") for i, line in enumerate(entry) if line.strip().startswith("call")]
    for step in _STEPS:
        assert sum(c.startswith(_mangled(step)) for c in calls) == 1, (step, len(calls))


def test_out_of_line_functions_are_not_passed_the_device_communicator(ring_all_reduce_ptx):
    definitions = _definitions(ring_all_reduce_ptx)
    for step in _STEPS:  # proc's other fields, two connections, two arrays, offset, n, the reduction
        assert _of(definitions, step)[0] <= 26, (step, _of(definitions, step)[0])
    for wait in ("_wait_credit", "_wait_ready"):  # inline in the steps: no function of their own
        assert not [k for k in definitions if k.startswith(_mangled(wait))], wait


def test_simple_loops_keep_their_vectors_and_touch_no_local_memory(ring_all_reduce_ptx):
    """Each step's SIMPLE pack loop loads eight 16-byte packs per source before its first store (the
    other seven stores follow, each skipped where its pack is past the part) and touches no local memory. (An LL pack's call of its out-of-line wait initialises the call's 8-byte
    result slot: numba's calling convention, one local store that stays in L1.)"""
    definitions = _definitions(ring_all_reduce_ptx)
    load, store = re.compile(r"ld\.(global\.)?v4\.f32"), re.compile(r"st\.(global\.)?v4\.f32")
    for step in _STEPS:
        blocks = _blocks(_of(definitions, step)[1])
        ahead = []  # per block: 16-byte loads before its first 16-byte store, and its stores
        for block in blocks:
            first = next((i for i, line in enumerate(block) if store.match(line)), len(block))
            ahead.append((sum(bool(load.match(line)) for line in block[:first]),
                          sum(bool(store.match(line)) for line in block)))
        loops = [block for block, (loads, stores) in zip(blocks, ahead) if loads >= 8 and stores >= 1]
        assert loops, f"{step}: no block with eight 16-byte loads in flight before its first store (SIMPLE)"
        for block in loops:
            assert not [line for line in block if re.match(r"(ld|st)\.local", line)], step

def test_a_refused_connection_prints_its_reason_and_traps_on_the_gpu():
    """The GPU's side of flow.connect's and flow.processor's refusals (the simulator raises a UsageError with the same words,
    tests/sim/test_flow_connections.py): the kernel prints the simulator's sentence, the values in its places, through
    vprintf, then traps (numba's print had put a space around each value: "channel 46 : ... channels= 24 ,")."""
    from flowdsl._flow_elements import bad_channel_text, bad_connection_text, bad_layout_text, missing_gin_context_text
    from numba import cuda, int64

    import flowdsl
    from flowdsl import flow

    @flowdsl.kernel((int64, int64))
    def refuse(peer, n):
        if cuda.threadIdx.x == 0:
            if n > 1:
                flow.bad_connection(peer, 4, 0, n)
            if n > 2:
                flow.bad_layout(n, 2, peer, 4096, 1024)
            if n > 3:
                flow.bad_channel(peer, n)
            flow.missing_gin_context(peer)

    ptx = refuse.inspect_lto_ptx((int64, int64))
    assert "trap;" in ptx and "vprintf" in ptx
    strings = [line.split("= {", 1)[1] for line in ptx.splitlines() if "flowdsl_refusal_" in line and "= {" in line]
    formats = {"".join(chr(int(b)) for b in re.findall(r"\d+", s)) for s in strings}
    ll = "%lld"
    texts = (bad_connection_text(ll, ll, ll, ll), bad_layout_text(ll, ll, ll, ll, ll), bad_channel_text(ll, ll),
             missing_gin_context_text(ll))
    assert formats == {text + "\n" for text in texts}  # the PTX leaves out the trailing NUL
