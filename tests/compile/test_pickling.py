"""Kernels and configured launches pickle as numba-cuda's dispatchers do (numba-cuda's test_serialize): the
function and options, nothing compiled; device functions they reach are made again where unpickled. No GPU:
what the unpickled kernel compiles to is compared with the original's."""

from __future__ import annotations

import pickle
import re

import pytest
from numba import float32

import flowdsl

pytestmark = pytest.mark.compile

NCCL = "2.28.9"


def _made_here():
    @flowdsl.device(fastmath=True)
    def inner(a, b):
        return a / b

    @flowdsl.kernel("void(float32[:])", lineinfo=True)
    def foo(arr):
        arr[0] = inner(arr[0], arr[1])

    return foo


def test_a_kernel_pickles_with_its_options_and_device_functions():
    foo = _made_here()
    again = pickle.loads(pickle.dumps(foo))
    twice = pickle.loads(pickle.dumps(again))
    def code(k):  # numba numbers each function it makes in a process: the names differ by that alone
        return re.sub(r"B\d+v\d+B", "BvB", k.inspect_asm((float32[:],)))

    for k in (again, twice):
        assert k is not foo and k.signature == foo.signature and k.lineinfo
        assert "div.approx.f32" in code(k)  # the device function's own fast math travelled with it
        assert code(k) == code(foo)  # the same code, compiled again


def test_a_configured_launch_pickles_with_its_shape_unless_it_has_callbacks():
    launch = pickle.loads(pickle.dumps(_made_here()[5, 8]))
    assert (launch.griddim, launch.blockdim) == ((5, 1, 1), (8, 1, 1))
    configured = _made_here()[5, 8]
    configured.pre_launch_callbacks.append(lambda kernel, launch: None)
    with pytest.raises(pickle.PicklingError, match="Cannot pickle configured launches with pre-launch callbacks"):
        pickle.dumps(configured)
