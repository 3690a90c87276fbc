"""``stream=`` on the simulator: the forms the GPU accepts run, the ones it refuses are refused alike."""

from __future__ import annotations

import numpy as np
import pytest

import flowdsl
from flowdsl import collectives as coll
from flowdsl.host.streams import stream_handle
from flowdsl.sim import spawn

pytestmark = pytest.mark.sim


class TorchLikeStream:
    cuda_stream = 0x3000


class ProtocolStream:
    def __cuda_stream__(self):
        return (0, 0x1000)


@flowdsl.kernel
def fill(out, value):
    out[0] = value


def _message(stream, operation):
    with pytest.raises(flowdsl.UsageError) as info:
        stream_handle(stream, (), operation)
    return str(info.value)


def test_simulator_refuses_a_bad_stream_with_the_gpus_message():
    expected = _message(object(), "all_reduce")

    def main(comm):
        x = comm.alloc(8, np.float32)
        x[:] = comm.rank + 1
        y = comm.alloc(8, np.float32)
        try:
            coll.all_reduce(comm, x, y, stream=object())
        except flowdsl.UsageError as e:
            return str(e)
        return None

    assert spawn(main, nranks=2) == [expected, expected]


def test_simulator_refuses_a_bad_stream_for_a_kernel_launch_and_a_copy():
    expected_launch = _message("s", "launch fill")
    expected_set = _message(1.5, "set a buffer")

    def main(comm):
        out = comm.alloc(1, np.float32)
        messages = []
        try:
            fill[1, 1, "s"](out, 2.0)
        except flowdsl.UsageError as e:
            messages.append(str(e))
        try:
            out.set(np.ones(1, np.float32), stream=1.5)
        except flowdsl.UsageError as e:
            messages.append(str(e))
        return messages

    assert spawn(main, nranks=1) == [[expected_launch, expected_set]]


def test_simulator_runs_every_accepted_stream_form_and_keys_plans_by_handle():
    def main(comm):
        x = comm.alloc(8, np.float32)
        x[:] = comm.rank + 1
        y = comm.alloc(8, np.float32)
        results = []
        for stream in (None, 0, TorchLikeStream(), TorchLikeStream(), ProtocolStream(), np.int64(0x1000)):
            y[:] = np.nan
            coll.all_reduce(comm, x, y, stream=stream, algorithm="ring")
            comm.synchronize()
            results.append(np.array(y))
        out = comm.alloc(1, np.float32)
        fill[1, 1, TorchLikeStream()](out, 5.0)
        comm.synchronize()
        plans = comm.__dict__["_flowdsl_plans"]
        return results, float(out[0]), sorted(key[6] for key in plans)

    for results, filled, handles in spawn(main, nranks=2):
        for y in results:
            np.testing.assert_array_equal(y, np.full(8, 3, np.float32))
        assert filled == 5.0
        # One plan per stream handle: None and 0 are both the legacy default stream; two
        # stream objects with one handle share a plan, and so do the protocol and its int.
        assert handles == [0, 0x1000, 0x3000]
