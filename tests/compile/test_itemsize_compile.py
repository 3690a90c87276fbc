"""``flowdsl.mem.itemsize`` is a constant of the compiled code: no division by an element size survives.

An array's ``.itemsize`` attribute is a field of the array's struct, a kernel parameter read at run
time, so ``16 // a.itemsize`` is a division instruction (Flow's steps had a hundred of them in the
slot loop before they took ``mem.itemsize``).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import flowdsl
from flowdsl import mem

pytestmark = pytest.mark.compile


@flowdsl.kernel
def lanes_and_bytes(a, out, n):
    out[0] = 16 // mem.itemsize(a)          # elements of a 16-byte pack
    out[1] = n * 8 // mem.itemsize(a)       # elements in n uint64 words


@flowdsl.kernel
def lanes_by_attribute(a, out, n):
    out[0] = 16 // a.itemsize
    out[1] = n * 8 // a.itemsize


def _divisions(ptx: str) -> list[str]:
    return re.findall(r"^\s*(?:div|rem)\.\w+", ptx, re.M)


@pytest.mark.parametrize("dtype, lanes", [(np.float16, 8), (np.float32, 4), (np.float64, 2), (np.uint8, 16)])
def test_itemsize_folds_to_a_constant(linked_ptx, dtype, lanes):
    argtypes = flowdsl.FlowKernel.argtypes_for(np.zeros(4, dtype), np.zeros(2, np.int64), 1, nccl="2.28.9")
    ptx = linked_ptx(lanes_and_bytes, argtypes)
    assert _divisions(ptx) == []
    assert re.search(rf"(?:mov|st\.global)\.[bu]64\s+[^;]*,\s*{lanes};", ptx), ptx


def test_the_attribute_is_read_at_run_time(linked_ptx):
    """Why the primitive exists: the same code with ``a.itemsize`` divides at run time."""
    argtypes = flowdsl.FlowKernel.argtypes_for(np.zeros(4, np.float32), np.zeros(2, np.int64), 1, nccl="2.28.9")
    assert _divisions(linked_ptx(lanes_by_attribute, argtypes)) != []

