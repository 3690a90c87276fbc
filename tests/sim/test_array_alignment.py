"""``alignment=`` of ``cuda.local.array`` and ``cuda.shared.array`` on the simulator as on GPUs: honoured (the
array's address a multiple of it) where numba-cuda's compiler takes it, refused in its words where that refuses
it. numba-cuda's own validator (``numba.cuda.cudaimpl._validate_alignment``) is the reference. (numba-cuda's own
simulator refuses every ``alignment=``, "not supported in cudasim": its two tests that check that refusal fail
on flowdsl's simulator by design, as the GPU takes the alignment.)"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from numba.cuda.cudaimpl import _validate_alignment

import flowdsl
from flowdsl.testing import run_ranks

pytestmark = pytest.mark.sim


def _kernel(kind: str, alignment):
    if kind == "local":
        @flowdsl.kernel
        def k(out):
            a = cuda.local.array(3, np.uint8, alignment=alignment)
            a[0] = 1
            out[0] = a.ctypes.data
    else:
        @flowdsl.kernel
        def k(out):
            a = cuda.shared.array(3, np.uint8, alignment=alignment)
            a[0] = 1
            out[0] = a.ctypes.data
    return k


def _address(kind, alignment) -> int:
    def main(comm):
        out = np.zeros(1, np.uint64)
        _kernel(kind, alignment)[1, 1](out)
        comm.synchronize()
        return int(out[0])
    return run_ranks(main, nranks=1)[0]


@pytest.mark.parametrize("kind", ["local", "shared"])
@pytest.mark.parametrize("alignment", [-1, 0, 3, 4, 17, 33, 8, 16, 64, 256])
def test_an_alignment_is_honoured_or_refused_as_numba_cudas_compiler_does(kind, alignment):
    try:
        _validate_alignment(alignment)
    except ValueError as e:  # the GPU's refusal: the same class and words
        with pytest.raises(ValueError, match=f"^{e}: cuda.{kind}.array\\(..., alignment={alignment}\\)") as got:
            _address(kind, alignment)
        assert isinstance(got.value, flowdsl.UsageError)
        assert "Give a power of 2 that is a multiple of 8" in str(got.value)
    else:
        assert _address(kind, alignment) % alignment == 0


@pytest.mark.parametrize("alignment", [1.0, "16", True])
def test_an_alignment_that_is_not_an_integer_constant_is_a_typing_error(alignment):
    with pytest.raises(flowdsl.KernelTypingError, match="RequireLiteralValue: alignment must be a constant integer"):
        _address("shared", alignment)
