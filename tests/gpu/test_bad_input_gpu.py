"""Bad input on a real GPU: clear errors before anything is launched, nothing left registered."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_unsupported_dtype(comm):
    import flowdsl

    with pytest.raises(flowdsl.UsageError, match="Cannot allocate symmetric memory of dtype complex64"):
        comm.alloc(16, np.complex64)


def test_buffer_not_from_comm_alloc(comm):
    import cupy

    import flowdsl

    before = list(comm.open_resources)
    with pytest.raises(flowdsl.UsageError, match=r"need memory from comm.alloc"):
        comm.register(cupy.zeros(1024, np.float32))
    assert comm.open_resources == before


def test_devcomm_from_another_communicator():
    import flowdsl
    from flowdsl.examples.allgather_lsa import allgather_lsa

    with flowdsl.init() as a, flowdsl.init() as b:
        src = a.alloc(256, np.float32)
        out = a.alloc(256, np.float32)
        with a.register(out) as win, b.device_communicator(lsa_barrier_count=1) as foreign:
            with pytest.raises(flowdsl.UsageError, match="come from different communicators"):
                allgather_lsa[1, 256](foreign, src, win, 256)


def test_closed_window_is_refused(comm):
    import flowdsl
    from flowdsl.examples.allgather_lsa import allgather_lsa

    src = comm.alloc(256, np.float32)
    out = comm.alloc(256, np.float32)
    win = comm.register(out)
    win.close()
    win.close()  # idempotent
    with comm.device_communicator(lsa_barrier_count=1) as dcomm:
        with pytest.raises(flowdsl.ResourceClosedError, match="this window was closed"):
            allgather_lsa[1, 256](dcomm, src, win, 256)


def test_wrong_argument_type_is_a_typing_error(comm):
    from numba.core.errors import TypingError

    from flowdsl.examples.allgather_lsa import allgather_lsa

    src = comm.alloc(256, np.float32)
    out = comm.alloc(256, np.float32)
    with comm.register(out) as win, comm.device_communicator(lsa_barrier_count=1) as dcomm:
        with pytest.raises(TypingError, match=r"flowdsl.lsa.barrier requires a device communicator"):
            allgather_lsa[1, 256](win, src, win, 256)


def test_bad_launch_configuration(comm):
    import flowdsl
    from flowdsl.examples.allgather_lsa import allgather_lsa

    with pytest.raises(flowdsl.UsageError, match="the grid must be a positive int"):
        allgather_lsa[0, 256]


def test_communicator_close_releases_everything():
    import flowdsl

    c = flowdsl.init()
    buf = c.alloc(1024, np.float32)
    c.register(buf)
    c.device_communicator(lsa_barrier_count=4)
    assert len(c.open_resources) == 3
    c.close()
    assert c.open_resources == []
    with pytest.raises(flowdsl.ResourceClosedError, match="the communicator was closed"):
        c.alloc(4, np.float32)
