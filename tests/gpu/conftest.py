"""What the one-GPU tests share: a communicator per test module (one rank per GPU)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def comm():
    """A communicator for the module's tests, closed after the last."""
    import flowdsl

    with flowdsl.init() as c:
        yield c


@pytest.fixture(scope="module")
def nothing_left_open(comm):
    """After the module's last test: no test left a window or device communicator of ``comm`` open.

    Symmetric memory lives until the communicator closes; windows and device communicators
    must have been closed by each test. Use it with ``pytest.mark.usefixtures``.
    """
    import flowdsl

    yield
    left = [r for r in comm.open_resources if isinstance(r, (flowdsl.Window, flowdsl.DevComm))]
    assert left == [], f"a test left {left} open"
