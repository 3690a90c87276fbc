"""Flow connections across launches: every step kind, shared channels, reused connection numbers.

A connection's counters live in the staging window, so a connection continues where
the previous launch stopped; each counter has one writer, and a step writes back
only the counters of the directions it uses. These tests relaunch every step kind
of :mod:`flowdsl.flow` (at least three launches each) on one staging window:

- a *chain* of three blocks on one channel of each rank: block 0 sends, block 1
  receives and sends, block 2 receives. On one rank it is "a rank sending to
  itself": two blocks hold the two ends of each connection, and every one of the
  four counters of connection numbers 0 and 1 of the channel has another writer;
- a *ring relay*: rank 0 sends on connection 0 to rank 1 from block 0 and receives
  on connection 0 from the last rank in block 1, the other ranks pass it on;
- the direct steps, on a rank sending to itself and around a ring (all-gather).

Every topology runs on one node and on two (GIN between the nodes, under reordered
delivery), under every protocol. Inputs are random, outputs poisoned before each
launch, and results compared with NumPy.
"""

from __future__ import annotations

import collections
import functools

import numpy as np
import pytest
from numba import cuda

import flowdsl
from flowdsl import Protocol, flow
from flowdsl.collectives import FlowConfig, check
from flowdsl.collectives._config import OPS as _OPS
from flowdsl.collectives.programs import gin_context, no_gin_context
from flowdsl.sim import spawn

pytestmark = pytest.mark.sim

PROTOCOLS = (Protocol.SIMPLE, Protocol.LL, Protocol.LL128)
# Two 128-byte slots per connection: a step of ~100 elements crosses several slots and waits for credits.
# Two warps: the second is the sync warp, as on GPUs.
CFG = FlowConfig(channels=2, nslots=2, slot_bytes=128, threads=64)
# Its layout as the kernels take it: numbers (a GPU kernel cannot read a FlowConfig global).
CHANNELS, NSLOTS, SLOT_WORDS = CFG.channels, CFG.nslots, CFG.slot_bytes // 8
FIRST = ("send", "copy_send")
MIDDLE = ("recv_reduce_send", "recv_copy_send", "recv_reduce_copy_send")
LAST = ("recv", "recv_reduce_copy")
# Every (first, middle, last) combination once: each step kind runs in at least four launches.
COMBOS = [(f, m, la) for f in range(len(FIRST)) for m in range(len(MIDDLE)) for la in range(len(LAST))]
DTYPES = ("float32", "int32", "float16", "float64", "bfloat16", "int64", "uint8", "int8", "uint32", "uint64")
# The kernels here take the operator at run time and no scalar: premulsum's pre-multiply is the
# collectives' programs' (tests/sim/test_collectives.py).
OPS = {name: op for name, op in _OPS.items() if name != "premulsum"}


# ---- kernels -------------------------------------------------------------------------------------

@flowdsl.device
def _first_step(proc, out, kind, x, out0, offset, n):
    if kind == 0:
        flow.send(proc, out, x, offset, n)
    else:
        flow.copy_send(proc, out, x, out0, offset, n)


@flowdsl.device
def _middle_step(proc, inp, out, kind, y, out1, offset, n, red):
    if kind == 0:
        flow.recv_reduce_send(proc, inp, out, y, offset, n, red)
    elif kind == 1:
        flow.recv_copy_send(proc, inp, out, out1, offset, n)
    else:
        flow.recv_reduce_copy_send(proc, inp, out, y, out1, offset, n, red)


@flowdsl.device
def _last_step(proc, inp, kind, z, out2, offset, n, red):
    if kind == 0:
        flow.recv(proc, inp, out2, offset, n)
    else:
        flow.recv_reduce_copy(proc, inp, z, out2, offset, n, red)


@functools.cache
def chain_kernel(gin_peers):
    """Block 0 sends (number 1 into inbox 0) to rank ``r + hop``; block 1 receives (inbox 0) from
    rank ``r - hop`` and sends (number 0 into inbox 1); block 2 receives (inbox 1). Each block takes
    ``[offset, offset + n)`` in two steps, so counters continue within a launch too."""
    context = gin_context if gin_peers else no_gin_context

    @flowdsl.kernel
    def chain(comm, stage, x, y, z, out0, out1, out2, offset, n, first, middle, last, op, hop, channel,
              channels, nslots, slot_words, protocol):
        proc = flow.processor(comm, stage, context(comm), channels, nslots, slot_words, protocol, channel)
        nxt = (comm.rank + hop) % comm.nranks
        prv = (comm.rank + comm.nranks - hop) % comm.nranks
        red = flow.reduction(op, 2)
        half = n // 2
        for lo, m in ((offset, half), (offset + half, n - half)):
            if cuda.blockIdx.x == 0:
                _first_step(proc, flow.connect(proc, nxt, 1, 0), first, x, out0, lo, m)
            elif cuda.blockIdx.x == 1:
                _middle_step(proc, flow.connect(proc, prv, 0, 1), flow.connect(proc, nxt, 0, 1), middle, y,
                             out1, lo, m, red)
            else:
                _last_step(proc, flow.connect(proc, prv, 1, 0), last, z, out2, lo, m, red)

    return chain


@functools.cache
def relay_kernel(gin_peers):
    """A ring on connection number 0: rank 0's block 0 sends to rank 1, ranks 1 .. R-1 pass it on
    (block 0), rank 0's block 1 receives it from rank R-1. One rank: rank 0 sends to itself."""
    context = gin_context if gin_peers else no_gin_context

    @flowdsl.kernel
    def relay(comm, stage, x, y, z, out0, out1, out2, offset, n, first, middle, last, op, channel,
              channels, nslots, slot_words, protocol):
        proc = flow.processor(comm, stage, context(comm), channels, nslots, slot_words, protocol, channel)
        r, nr = comm.rank, comm.nranks
        inp = flow.connect(proc, (r + nr - 1) % nr, 0, 0)
        out = flow.connect(proc, (r + 1) % nr, 0, 0)
        red = flow.reduction(op, 2)
        if r == 0 and cuda.blockIdx.x == 0:
            _first_step(proc, out, first, x, out0, offset, n)
        elif r == 0:
            _last_step(proc, inp, last, z, out2, offset, n, red)
        elif cuda.blockIdx.x == 0:
            _middle_step(proc, inp, out, middle, y, out1, offset, n, red)

    return relay


@flowdsl.device
def _direct_ring_piece(proc, win, x, n, lo, m, first):
    """Elements ``[lo, lo + m)`` of every rank's piece around the ring (one rank: to itself, number 1)."""
    r, nr = proc.comm.rank, proc.comm.nranks
    nxt = flow.connect(proc, (r + 1) % nr, 1 if nr == 1 else 0, 0)
    prv = flow.connect(proc, (r + nr - 1) % nr, 0, 0)
    if first == 0:
        flow.direct_copy_send(proc, nxt, x, lo, win, r * n + lo, m)
    else:
        flow.copy(x, lo, flowdsl.lsa.local_view(win), r * n + lo, m, cuda.threadIdx.x, cuda.blockDim.x, 0)
        cuda.syncthreads()
        flow.direct_send(proc, nxt, win, r * n + lo, m)
    for s in range(1, nr - 1):
        j = (r + nr - s) % nr
        flow.direct_recv_copy_send(proc, prv, nxt, win, j * n + lo, m)
    if nr > 1:
        flow.direct_recv(proc, prv, win, ((r + 1) % nr) * n + lo, m)


@functools.cache
def direct_kernel(gin_peers):
    """Direct steps into ``win``. One rank: three blocks on one channel pass ``x`` to themselves
    through ``win[0:n]``, numbered as the chain. Several ranks: a ring all-gather of ``x`` into
    ``win[r*n:(r+1)*n]`` on connection number 0. ``first`` picks ``direct_copy_send`` (0), or a
    local ``copy`` and ``direct_send`` (1)."""
    context = gin_context if gin_peers else no_gin_context

    @flowdsl.kernel
    def direct(comm, stage, win, x, n, first, channel, channels, nslots, slot_words):
        proc = flow.processor(comm, stage, context(comm), channels, nslots, slot_words, Protocol.SIMPLE, channel)
        r, nr = comm.rank, comm.nranks
        half = n // 2
        for lo, m in ((0, half), (half, n - half)):  # two steps per launch: counters continue within it too
            if nr == 1 and cuda.blockIdx.x == 1:
                flow.direct_recv_copy_send(proc, flow.connect(proc, r, 0, 1), flow.connect(proc, r, 0, 1), win, lo, m)
            elif nr == 1 and cuda.blockIdx.x == 2:
                flow.direct_recv(proc, flow.connect(proc, r, 1, 0), win, lo, m)
            else:
                _direct_ring_piece(proc, win, x, n, lo, m, first)

    return direct


# ---- host side -----------------------------------------------------------------------------------

def _lsa_size(comm):
    return getattr(comm, "lsa_size", comm.nranks)  # the GPU tests run on one node


def _staging(comm):
    """The staging window for CFG (with GIN outboxes across nodes) and a device communicator."""
    gin_peers = _lsa_size(comm) < comm.nranks
    reqs = ({"gin_context_count": 1, "gin_signal_count": 2 * CFG.channels * flow.MAX_CONNECTIONS}
            if gin_peers else {})
    return gin_peers, flow.staging(comm, CFG), comm.device_communicator(**reqs)


def _array(comm, values, dtype):
    a = comm.alloc(values.size, check.storage_dtype(dtype))
    a.set(values)  # CuPy's set; the simulator's buffers have it too
    return a


def _poisoned(comm, size, dtype):
    a = comm.alloc(size, check.storage_dtype(dtype))
    a.fill(check.poison(dtype))
    return a


def _store(values, dtype):
    """Reference values rounded to the element type, as a slot carries them."""
    if dtype == "bfloat16":
        return check.bf16_bits(values)
    return np.asarray(values).astype(check.storage_dtype(dtype))


def _combined(a, b, dtype, op, finished):
    """``a op b`` (finished: ``avg`` divides by 2), in float64/int64, rounded to the element type."""
    return _store(check.reference("all_reduce", [a, b], dtype, op if finished or op != "avg" else "sum")[0], dtype)


def _after_middle(kind, v, y, dtype, op):
    if MIDDLE[kind] == "recv_copy_send":
        return v
    return _combined(v, y, dtype, op, MIDDLE[kind] == "recv_reduce_copy_send")


def _after_last(kind, v, z, dtype, op):
    return v if LAST[kind] == "recv" else _combined(v, z, dtype, op, True)


class _Launch:
    """One launch's inputs (random, per rank), poisoned outputs, and parameters."""

    def __init__(self, comm, i, seed):
        rng = np.random.default_rng(seed * 1000 + i)
        self.dtype = DTYPES[i % len(DTYPES)]
        self.op = tuple(OPS)[i % len(OPS)]
        self.first, self.middle, self.last = COMBOS[i % len(COMBOS)]
        self.offset = (0, 3, 16)[i % 3]
        self.n = int(rng.integers(60, 130))
        size = self.offset + self.n
        # Every rank draws every rank's inputs (same seed), so each can compute its reference.
        self.x, self.y, self.z = zip(*(check.inputs(rng, self.dtype, self.op, 3, size) for _ in range(comm.nranks)))
        self.args = [_array(comm, v[comm.rank], self.dtype) for v in (self.x, self.y, self.z)]
        self.outs = [_poisoned(comm, size, self.dtype) for _ in range(3)]

    def results(self):
        return [o.get()[self.offset:] for o in self.outs]  # CuPy's get; the simulator's buffers have it

    def inputs_of(self, rank):
        s = slice(self.offset, None)
        return self.x[rank][s], self.y[rank][s], self.z[rank][s]


def _check_outputs(got, expected, launch, what):
    for name, g, e in zip(("out0", "out1", "out2"), got, expected):
        if e is None:
            poison = np.full(g.size, check.poison(launch.dtype), check.storage_dtype(launch.dtype))
            assert np.array_equal(g.view(np.uint8), poison.view(np.uint8)), \
                f"{what}: {name} was written though no step stores into it"
        else:
            check.compare(g, _values_of(e, launch.dtype), launch.dtype, 3, f"{what} {name}")


def _values_of(stored, dtype):
    return check.reference("broadcast", [stored], dtype, None)[0]


def _spawn(main, nranks, nodes, seed):
    return spawn(main, nranks=nranks, nodes=nodes, seed=seed, gin_delivery="reordered" if nodes > 1 else "ordered")


def _layout():
    return CFG.channels, CFG.nslots, CFG.slot_bytes // 8


# ---- the tests -----------------------------------------------------------------------------------

def _chain_expected(launch, rank, hop, nranks):
    """What ranks' ``out0``, ``out1``, ``out2`` hold after a chain launch (None: poison)."""
    x, _, _ = launch.inputs_of((rank + nranks - 2 * hop) % nranks)
    x_prev, y_prev, _ = launch.inputs_of((rank + nranks - hop) % nranks)
    x_me, y_me, z_me = launch.inputs_of(rank)
    dtype, op = launch.dtype, launch.op
    out0 = x_me if FIRST[launch.first] == "copy_send" else None
    out1 = None if MIDDLE[launch.middle] == "recv_reduce_send" else _after_middle(launch.middle, x_prev, y_me, dtype, op)
    out2 = _after_last(launch.last, _after_middle(launch.middle, x, y_prev, dtype, op), z_me, dtype, op)
    return out0, out1, out2


def chain_main(protocol, seed):
    """``main(comm)`` (simulated or GPU ranks): every (first, middle, last) step kind combination,
    relaunched on one staging window, on each rank itself (channel 0) and, across nodes, from a rank
    to the same place on the next node (channel 1). Returns True; raises on a wrong element."""
    def main(comm):
        gin_peers, stage, dcomm = _staging(comm)
        hops = (0,) if _lsa_size(comm) == comm.nranks else (0, _lsa_size(comm))
        with stage, dcomm:
            for i in range(len(COMBOS)):
                for channel, hop in enumerate(hops):
                    launch = _Launch(comm, i, seed + channel)
                    chain_kernel(gin_peers)[3, CFG.threads](
                        dcomm, stage, *launch.args, *launch.outs, launch.offset, launch.n, launch.first,
                        launch.middle, launch.last, int(OPS[launch.op]), hop, channel, *_layout(), int(protocol))
                    comm.synchronize()
                    what = (f"rank {comm.rank} launch {i} hop {hop} {FIRST[launch.first]} > "
                            f"{MIDDLE[launch.middle]} > {LAST[launch.last]} ({launch.dtype}, {launch.op})")
                    _check_outputs(launch.results(), _chain_expected(launch, comm.rank, hop, comm.nranks),
                                   launch, what)
        return True
    return main


def _run_chain(nranks, nodes, protocol, seed):
    assert all(_spawn(chain_main(protocol, seed), nranks, nodes, seed))


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.name)
def test_chain_on_one_rank_every_step_kind_relaunched(protocol):
    """A rank sending to itself: two blocks hold the two ends of each connection of one channel."""
    _run_chain(1, 1, protocol, seed=1)


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.name)
def test_chain_on_two_nodes_every_step_kind_relaunched(protocol):
    """Two nodes of one rank: the chain on each rank, and the chain across the nodes (GIN)."""
    _run_chain(2, 2, protocol, seed=2)


def _relay_expected(launch, rank, nranks):
    dtype, op = launch.dtype, launch.op
    x0, _, z0 = launch.inputs_of(0)
    values = [x0]  # what rank k sends on
    for k in range(1, nranks):
        values.append(_after_middle(launch.middle, values[-1], launch.inputs_of(k)[1], dtype, op))
    if rank == 0:
        return (x0 if FIRST[launch.first] == "copy_send" else None, None,
                _after_last(launch.last, values[-1], z0, dtype, op))
    stored = {"recv_copy_send": values[rank - 1], "recv_reduce_copy_send": values[rank]}
    return None, stored.get(MIDDLE[launch.middle]), None


def _run_relay(nranks, nodes, protocol, seed):
    def main(comm):
        gin_peers, stage, dcomm = _staging(comm)
        with stage, dcomm:
            for i in range(len(COMBOS)):
                launch = _Launch(comm, i, seed)
                relay_kernel(gin_peers)[2, CFG.threads](
                    dcomm, stage, *launch.args, *launch.outs, launch.offset, launch.n, launch.first, launch.middle,
                    launch.last, int(OPS[launch.op]), 1, *_layout(), int(protocol))
                comm.synchronize()
                what = (f"rank {comm.rank} launch {i} {FIRST[launch.first]} > {MIDDLE[launch.middle]} > "
                        f"{LAST[launch.last]} ({launch.dtype}, {launch.op})")
                _check_outputs(launch.results(), _relay_expected(launch, comm.rank, comm.nranks), launch, what)
        return True
    assert all(_spawn(main, nranks, nodes, seed))


RELAYS = [(1, 1), (3, 1), (2, 2), (4, 2)]


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.name)
@pytest.mark.parametrize("nranks,nodes", RELAYS, ids=[f"{n}ranks-{k}nodes" for n, k in RELAYS])
def test_ring_relay_reusing_connection_zero_relaunched(nranks, nodes, protocol):
    """Rank 0 sends on connection 0 (block 0) and receives on connection 0 (block 1, same channel)."""
    _run_relay(nranks, nodes, protocol, seed=nranks + 10 * nodes)


DIRECT = [(1, 1), (3, 1), (2, 2), (4, 2)]


@pytest.mark.parametrize("nranks,nodes", DIRECT, ids=[f"{n}ranks-{k}nodes" for n, k in DIRECT])
def test_direct_steps_relaunched(nranks, nodes):
    """direct_copy_send / copy + direct_send, direct_recv_copy_send, direct_recv over six launches
    (direct steps have no protocol: they write the receiver's window, then one flag or signal)."""
    nmax = 130

    def main(comm):
        gin_peers, stage, dcomm = _staging(comm)
        nr = comm.nranks
        out = comm.alloc(nr * nmax, np.float32)
        with stage, dcomm, comm.register(out) as win:
            for i in range(6):
                rng = np.random.default_rng(100 * nranks + i)
                n = int(rng.integers(60, nmax + 1))
                pieces = [rng.standard_normal(n).astype(np.float32) for _ in range(nr)]
                x = _array(comm, pieces[comm.rank], "float32")
                out.fill(np.nan)
                comm.barrier()  # no peer writes into this window before it is poisoned
                direct_kernel(gin_peers)[3 if nr == 1 else 1, CFG.threads](dcomm, stage, win, x, n, i % 2, 1,
                                                                          *_layout())
                comm.synchronize()
                got = out.get()
                assert np.array_equal(got[:nr * n], np.concatenate(pieces)), f"rank {comm.rank} launch {i}"
                assert np.isnan(got[nr * n:]).all(), f"rank {comm.rank} launch {i}: wrote past the pieces"
        return True
    assert all(_spawn(main, nranks, nodes, seed=nranks))


# ---- the staging window ------------------------------------------------------------------------------

def test_staging_is_zeroed_registered_and_records_its_layout():
    def main(comm):
        stage = flow.staging(comm, CFG)
        layout = stage.flow_staging
        words = flow.staging_words(CFG.channels, CFG.nslots, CFG.slot_bytes // 8, True)
        return (layout.channels, layout.nslots, layout.slot_words, layout.with_outbox,
                layout.buffer.size == words, bool((layout.buffer.get() == 0).all()), stage.nbytes == 8 * words)
    assert spawn(main, nranks=4, nodes=2) == [(2, 2, 16, True, True, True, True)] * 4
    assert spawn(lambda comm: flow.staging(comm, CFG).flow_staging.with_outbox, nranks=2) == [False] * 2


@pytest.mark.parametrize("zeroed", [False, True], ids=["as-allocated", "zeroed-by-hand"])
def test_staging_from_comm_alloc_is_refused_before_data_moves(zeroed):
    """A window the library did not make is refused when the processor is built (the GPU refuses
    it when the kernel is typed, with the same message): never silently wrong data."""
    def main(comm):
        buf = comm.alloc(flow.staging_words(CFG.channels, CFG.nslots, CFG.slot_bytes // 8, False), np.uint64)
        if zeroed:
            buf.fill(0)
        launch = _Launch(comm, 0, seed=3)
        with comm.register(buf) as win, comm.device_communicator() as dcomm:
            chain_kernel(False)[3, CFG.threads](
                dcomm, win, *launch.args, *launch.outs, launch.offset, launch.n, launch.first, launch.middle,
                launch.last, int(OPS[launch.op]), 0, 0, *_layout(), int(Protocol.SIMPLE))
            comm.synchronize()
    with pytest.raises(flowdsl.KernelTypingError, match=r"^Cannot build a Flow processor over Window\(uint64\): its staging "
                       r"window must come from flowdsl.flow.staging\(comm, config\)\..* comm.alloc does not zero "
                       r"memory.* Make it with stage = flowdsl.flow.staging\(comm, config\)"):
        spawn(main, nranks=1)


def test_staging_refuses_a_bad_layout():
    layout = collections.namedtuple("Layout", "channels nslots slot_bytes")

    def main(comm):
        errors = []
        for config in (None, "big", layout(2, 1, 128), layout(0, 2, 128), layout(2, 2, 100)):
            with pytest.raises(flowdsl.UsageError) as info:
                flow.staging(comm, config)
            errors.append(str(info.value))
        return errors
    errors = spawn(main, nranks=1)[0]
    assert all("pass a flowdsl.collectives.FlowConfig" in e for e in errors[:2]), errors
    assert all("channels >= 1, nslots >= 2 and slot_bytes a positive multiple of 128" in e for e in errors[2:]), errors


@flowdsl.kernel
def _processor_protocol(comm, stage, out, protocol, ll128):
    proc = flow.processor(comm, stage, None, CHANNELS, NSLOTS, SLOT_WORDS, protocol, -1, ll128)
    if cuda.blockIdx.x == 0 and cuda.threadIdx.x == 0:
        out[0] = proc.protocol
        out[1] = proc.ll128
        out[2] = proc.inbox_at


def test_a_processor_built_without_ll128_runs_ll128_requests_as_ll():
    """``ll128=0`` (a kernel built without LL128's code) takes a ``Protocol.LL128`` request as LL,
    LL's slots included; ``ll128=1`` (the default) keeps it."""
    def main(comm):
        gin_peers, stage, dcomm = _staging(comm)
        out = comm.alloc(3, np.int64)
        seen = {}
        with stage, dcomm:
            for protocol, ll128 in ((Protocol.LL128, 1), (Protocol.LL128, 0), (Protocol.LL, 0)):
                out.fill(-1)
                _processor_protocol[1, CFG.threads](dcomm, stage, out, int(protocol), ll128)
                comm.synchronize()
                seen[(protocol, ll128)] = tuple(int(v) for v in out.get())
        return seen

    (seen,) = spawn(main, nranks=1)
    assert seen[(Protocol.LL128, 1)][:2] == (Protocol.LL128, 1)
    assert seen[(Protocol.LL128, 0)] == (Protocol.LL, 0, seen[(Protocol.LL, 0)][2])
    assert seen[(Protocol.LL128, 1)][2] != seen[(Protocol.LL, 0)][2]


@flowdsl.kernel
def ring_without_gin(comm, stage, x, y, n):
    proc = flow.processor(comm, stage, None, CHANNELS, NSLOTS, SLOT_WORDS, Protocol.SIMPLE)
    nxt = flow.connect(proc, (comm.rank + 1) % comm.nranks, 0, 0)
    prv = flow.connect(proc, (comm.rank + comm.nranks - 1) % comm.nranks, 0, 0)
    flow.send(proc, nxt, x, 0, n)
    flow.recv(proc, prv, y, 0, n)


def test_a_connection_across_nodes_without_a_gin_context_is_refused_naming_the_fix():
    """It was reported as a data race inside Flow's steps, whose fix pointed elsewhere."""
    def main(comm):
        with flow.staging(comm, CFG) as stage, comm.device_communicator() as dcomm:
            x, y = comm.alloc(64, np.float32), comm.alloc(64, np.float32)
            x.set(np.arange(64, dtype=np.float32))
            ring_without_gin[1, CFG.threads](dcomm, stage, x, y, 64)
            comm.synchronize()

    with pytest.raises(flowdsl.sim.UsageError, match=r"Cannot connect to world rank \d: it is outside this rank's "
                                                     r"LSA team, and the Flow processor has no GIN context \(ctx=None\)"
                                                     r".*Give flow.processor a GIN context, gin.context\(comm, 0\)"):
        spawn(main, nranks=4, nodes=2)
    spawn(main, nranks=2)  # one node: every peer is LSA, and ctx=None is right


def staged(launch):
    """``main(comm)``: ``launch(comm, dcomm, stage)`` in a Flow staging window of ``CFG`` and a device
    communicator, then wait for the rank's kernels."""
    def main(comm):
        with flow.staging(comm, CFG) as stage, comm.device_communicator() as dcomm:
            launch(comm, dcomm, stage)
            comm.synchronize()
    return main


@flowdsl.kernel
def connect_to(comm, stage, peer, number, remote_number):
    proc = flow.processor(comm, stage, None, CHANNELS, NSLOTS, SLOT_WORDS, Protocol.SIMPLE)
    flow.connect(proc, peer, number, remote_number)


@pytest.mark.parametrize("peer,number,remote", [(2, 0, 0), (-1, 0, 0), (1, 4, 0), (1, 0, 4), (1, -1, 0)])
def test_a_connection_to_no_rank_or_past_the_inboxes_is_refused_naming_the_ranges(peer, number, remote):
    """A peer outside the world or a connection number past MAX_CONNECTIONS was taken as it was: a far peer
    asked for a GIN context, a number past the inboxes wrote another connection's (a data race at best)."""
    main = staged(lambda comm, dcomm, stage: connect_to[1, CFG.threads](dcomm, stage, peer, number, remote))
    with pytest.raises(flowdsl.sim.UsageError, match=rf"Cannot make a Flow connection to peer {peer} with number "
                                                     rf"{number} and remote_number {remote}: the peer must be a world "
                                                     r"rank, 0 to 1, and both numbers 0 to 3"):
        spawn(main, nranks=2)


@flowdsl.kernel
def processor_over(comm, stage, channels, nslots, slot_words):
    flow.processor(comm, stage, None, channels, nslots, slot_words, Protocol.SIMPLE)


@pytest.mark.parametrize("layout", [(CFG.channels, CFG.nslots, CFG.slot_bytes),  # bytes for words
                                    (CFG.channels * 8, CFG.nslots, CFG.slot_bytes // 8),
                                    (CFG.channels, 1, CFG.slot_bytes // 8), (CFG.channels, CFG.nslots, 20)])
def test_a_processor_layout_its_staging_does_not_hold_is_refused(layout):
    """slot_words given in bytes (8 times the window) was taken: its slots ran past the staging window."""
    channels, nslots, slot_words = layout
    with pytest.raises(flowdsl.sim.UsageError, match=rf"Cannot build a Flow processor with channels={channels}, "
                                                     rf"nslots={nslots}, slot_words={slot_words}: a layout needs "
                                                     r"nslots of 2 or more and slot_words a positive multiple of 16, "
                                                     r"and this one needs \d+ words of staging where the window "
                                                     r"holds \d+"):
        spawn(lambda comm: _run_processor(comm, layout), nranks=1)
    fewer = (1, CFG.nslots, CFG.slot_bytes // 8)  # fewer channels than staged: allowed (a smaller grid)
    spawn(lambda comm: _run_processor(comm, fewer), nranks=1)


def _run_processor(comm, layout):
    with flow.staging(comm, CFG) as stage, comm.device_communicator() as dcomm:
        processor_over[1, CFG.threads](dcomm, stage, *layout)
        comm.synchronize()


def test_ends_with_different_block_sizes_are_reported_with_that_fix():
    def main(comm):
        with flow.staging(comm, CFG) as stage, comm.device_communicator() as dcomm:
            x, y = comm.alloc(32, np.float32), comm.alloc(32, np.float32)
            x.set(np.arange(32, dtype=np.float32))
            ring_without_gin[1, 64 if comm.rank == 0 else 32](dcomm, stage, x, y, 32)
            comm.synchronize()

    with pytest.raises(flowdsl.sim.SimulationError) as err:
        spawn(main, nranks=2)
    assert "the two ends of a connection run different numbers of threads (launch both ends with the same block " \
           "size" in str(err.value), str(err.value)[:1500]


@flowdsl.kernel
def pass_on(comm, stage, x, y, n_send, n_recv, protocol):
    proc = flow.processor(comm, stage, None, CHANNELS, NSLOTS, SLOT_WORDS, protocol, 0)
    if comm.rank == 0:
        flow.send(proc, flow.connect(proc, 1, 0, 0), x, 0, n_send)
    else:
        flow.recv(proc, flow.connect(proc, 0, 0, 0), y, 0, n_recv)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("mismatch", ["count", "dtype"])
def test_ends_of_a_step_that_disagree_are_reported_naming_both(protocol, mismatch):
    """A receive of fewer elements than were sent (in as many slots), or of another element type, moved
    wrong values without a sound (a GPU cannot tell): the simulator names both ends' calls."""
    def main(comm):
        with flow.staging(comm, CFG) as stage, comm.device_communicator() as dcomm:
            x = comm.alloc(40, np.float32)
            x.set(np.arange(40, dtype=np.float32))
            y = comm.alloc(40, np.int32 if mismatch == "dtype" else np.float32)
            pass_on[1, CFG.threads](dcomm, stage, x, y, 40, 38 if mismatch == "count" else 40, int(protocol))
            comm.synchronize()

    received = "38 of float32" if mismatch == "count" else "40 of int32"
    with pytest.raises(flowdsl.sim.UsageError, match=rf"The two ends of a Flow step disagree: rank 0 sends 40 elements "
                                                     rf"of float32 \({protocol.name}\) at test_flow_connections.py:\d+ "
                                                     rf"\(pass_on\) into inbox 0 of channel 0, and rank 1 receives "
                                                     rf"{received} \({protocol.name}\) at test_flow_connections.py"):
        spawn(main, nranks=2)


@flowdsl.kernel
def pass_on_in_protocols(comm, stage, x, y, send_protocol, recv_protocol):
    if comm.rank == 0:
        proc = flow.processor(comm, stage, None, CHANNELS, NSLOTS, SLOT_WORDS, send_protocol, 1)
        flow.send(proc, flow.connect(proc, 1, 0, 0), x, 0, x.size)
    else:
        proc = flow.processor(comm, stage, None, CHANNELS, NSLOTS, SLOT_WORDS, recv_protocol, 1)
        flow.recv(proc, flow.connect(proc, 0, 0, 0), y, 0, y.size)


@pytest.mark.parametrize("sender, receiver", [(Protocol.LL, Protocol.SIMPLE), (Protocol.SIMPLE, Protocol.LL128)])
def test_ends_of_a_step_in_different_protocols_are_named_before_the_step_hangs(sender, receiver):
    """Another protocol's wire format never completes the step (the receiver waits for flags that the sender
    writes elsewhere): the ends are compared when the second one starts, not after it moved."""
    main = staged(lambda comm, dcomm, stage: pass_on_in_protocols[1, CFG.threads](
        dcomm, stage, comm.alloc(40, np.float32), comm.alloc(40, np.float32), int(sender), int(receiver)))
    with pytest.raises(flowdsl.sim.UsageError, match=rf"The two ends of a Flow step disagree: rank 0 sends 40 elements "
                                                     rf"of float32 \({sender.name}\) .* and rank 1 receives 40 of "
                                                     rf"float32 \({receiver.name}\)"):
        spawn(main, nranks=2)


@flowdsl.kernel
def crossed_numbers(comm, stage, x, y):
    proc = flow.processor(comm, stage, None, CHANNELS, NSLOTS, SLOT_WORDS, Protocol.SIMPLE, 0)
    if comm.rank == 0:
        flow.send(proc, flow.connect(proc, 1, 0, 1), x, 0, x.size)  # fills rank 1's inbox 1
    else:
        flow.recv(proc, flow.connect(proc, 0, 0, 0), y, 0, y.size)  # reads inbox 0


def test_ends_whose_connection_numbers_do_not_match_are_reported_as_such():
    """It was a wait that gave up with "a peer never got there ... or raise the limit": each end waits for the
    other, and the report now says the numbers do not match (and that no limit helps)."""
    main = staged(lambda comm, dcomm, stage: crossed_numbers[1, CFG.threads](
        dcomm, stage, comm.alloc(200, np.float32), comm.alloc(200, np.float32)))

    with pytest.raises(flowdsl.sim.WaitTimeoutError) as err:
        spawn(main, nranks=2)
    text = str(err.value)
    assert "The two ends of a Flow connection do not mirror each other: rank 0 sends to rank 1 on channel 0 as " \
        "flow.connect(proc, 1, 0, 1)" in text and "on rank 1, flow.connect(proc, 0, 1, 0)" in text, text
    assert "raise the limit" not in text.split("The simulator's report:")[0]


@flowdsl.kernel
def _relay_with_receive_numbers(comm, stage, x, y, count, recv_number, recv_remote):
    proc = flow.processor(comm, stage, None, 1, 2, 16, 0, 0)
    r, n = comm.rank, comm.nranks
    if cuda.blockIdx.x == 0:
        flow.send(proc, flow.connect(proc, (r + 1) % n, 0, 0), x, 0, count)
    else:
        flow.recv(proc, flow.connect(proc, (r - 1 + n) % n, recv_number, recv_remote), y, 0, count)


@pytest.mark.parametrize("recv_number, recv_remote", [(0, 1), (1, 0)])
def test_two_ends_that_do_not_mirror_each_other_are_named_in_the_deadlock_report(recv_number, recv_remote):
    """A sender's flow.connect(proc, peer, 0, 0) and its receiver's (proc, sender, 0, 1) or (1, 0): the report says
    which two connects disagree and the receiver's fix, not a cycle of full inboxes (every rank is there)."""
    def main(comm):
        x, y = comm.alloc(600, np.float32), comm.alloc(600, np.float32)
        with flow.staging(comm, FlowConfig(channels=1, nslots=2, slot_bytes=128, threads=32)) as stage, \
                comm.device_communicator() as dc:
            _relay_with_receive_numbers[2, 32](dc, stage, x, y, 600, recv_number, recv_remote)
            comm.synchronize()

    with pytest.raises(flowdsl.sim.WaitTimeoutError) as err:
        spawn(main, nranks=3)
    msg = str(err.value)
    assert "The two ends of a Flow connection do not mirror each other: rank 0 sends to rank 1 on channel 0 as " \
           "flow.connect(proc, 1, 0, 0) at test_flow_connections.py:" in msg, msg
    assert f"rank 1 receives from rank 0 on that channel as flow.connect(proc, 0, {recv_number}, {recv_remote}) " \
           "at test_flow_connections.py:" in msg, msg
    assert "on rank 1, flow.connect(proc, 0, 0, 0)" in msg and "cycle of full inboxes" not in msg, msg


@flowdsl.kernel
def _on_channel(comm, stage, x, y, channel):
    proc = flow.processor(comm, stage, None, 1, NSLOTS, SLOT_WORDS, Protocol.SIMPLE, channel)
    flow.send(proc, flow.connect(proc, comm.rank, 0, 0), x, 0, 8)


@pytest.mark.parametrize("channel", [1, 5, -1], ids=["one-past", "far-past", "the-second-block"])
def test_a_channel_past_the_staging_layout_is_refused_naming_the_fix(channel):
    """It ran on another channel's slots (the simulator passed it, or reported a race or a window access inside
    flowdsl); the processor refuses it, on the GPU too (a printed message and a trap)."""
    def main(comm):
        with flow.staging(comm, FlowConfig(channels=1, nslots=NSLOTS, slot_bytes=SLOT_WORDS * 8, threads=32)) as st, \
                comm.device_communicator() as dcomm:
            _on_channel[2 if channel < 0 else 1, 32](dcomm, st, comm.alloc(8, np.float32), comm.alloc(8, np.float32),
                                                     channel)
            comm.synchronize()

    with pytest.raises(flowdsl.sim.UsageError, match=rf"Cannot build a Flow processor on channel {max(channel, 1)}: "
                                                     r"its staging is laid out for channels=1"):
        spawn(main, nranks=1)


@flowdsl.kernel
def _ends_on_their_blocks_channels(comm, stage, x, y):
    proc = flow.processor(comm, stage, None, 2, 2, 16, Protocol.SIMPLE)  # channel: the block's index
    if cuda.blockIdx.x == 0:
        flow.send(proc, flow.connect(proc, (comm.rank + 1) % comm.nranks, 0, 0), x, 0, x.size)
    else:
        flow.recv(proc, flow.connect(proc, (comm.rank - 1) % comm.nranks, 0, 0), y, 0, y.size)


def test_two_ends_on_different_channels_are_named_in_the_deadlock_report():
    def main(comm):
        with flow.staging(comm, FlowConfig(channels=2, nslots=2, slot_bytes=128, threads=32)) as stage, \
                comm.device_communicator() as dcomm:
            _ends_on_their_blocks_channels[2, 32](dcomm, stage, comm.alloc(600, np.float32),
                                                  comm.alloc(600, np.float32))
            comm.synchronize()

    with pytest.raises(flowdsl.sim.WaitTimeoutError) as err:
        spawn(main, nranks=2)
    assert "The two ends of a Flow connection are on different channels: rank 0 sends to rank 1 on channel 0 at " \
           "test_flow_connections.py:" in str(err.value) and "rank 1 receives from rank 0 on channel 1" in \
           str(err.value), str(err.value)[:2000]
