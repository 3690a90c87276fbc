"""Division by zero on the simulator as numba-cuda compiles it (its error model): without ``debug`` a float gives
inf or NaN and an integer ``//`` or ``%`` gives 0, whether the operands are Python numbers (thread indices,
literals) or NumPy scalars (array elements); with ``debug=True`` each raises ``ZeroDivisionError`` in numba's
words, the messages of the compiled kernel's own exception table (what the GPU raises at the launch)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import flowdsl
from flowdsl.testing import run_ranks

pytestmark = pytest.mark.sim


def _divisions(out, ints, floats, which):
    zero = cuda.threadIdx.x  # a Python int on the simulator, 0 in the one thread
    i, j = ints[0], ints[1]  # NumPy int64: 7, 0
    x, y = floats[0], floats[1]  # NumPy float64: 1.5, 0.0
    if which == 0 or which < 0:
        out[0] = x / y
    if which == 1 or which < 0:
        out[1] = x // y
    if which == 2 or which < 0:
        out[2] = x % y
    if which == 3 or which < 0:
        out[3] = i // j
    if which == 4 or which < 0:
        out[4] = i % j
    if which == 5 or which < 0:
        out[5] = i / j
    if which == 6 or which < 0:
        out[6] = 7 // zero
    if which == 7 or which < 0:
        out[7] = 7 % zero
    if which == 8 or which < 0:
        out[8] = 1.5 / zero
    if which == 9 or which < 0:
        t = 3.0
        t /= zero
        out[9] = t
    if which == 10 or which < 0:
        floats[2] /= y  # a subscript's augmented division: read once, written once
        out[10] = floats[2]
    if which == 11 or which < 0:
        out[11] = -x / y
    if which == 12 or which < 0:
        out[12] = y / y


def _run(kernel, which):
    def main(comm):
        out = np.full(13, -1.0)
        floats = np.array([1.5, 0.0, 2.0])
        kernel[1, 1](out, np.array([7, 0], np.int64), floats, which)
        comm.synchronize()
        return out
    return run_ranks(main, nranks=1)[0]


def test_without_debug_a_division_by_zero_goes_on_as_numpys_error_model():
    got = _run(flowdsl.kernel(_divisions), -1)
    with np.errstate(all="ignore"):  # NumPy's own arithmetic: the error model numba-cuda compiles without debug
        f, z, i0 = np.float64(1.5), np.float64(0.0), np.int64(0)
        expect = [f / z, f // z, f % z, np.int64(7) // i0, np.int64(7) % i0, np.int64(7) / i0, np.int64(7) // i0,
                  np.int64(7) % i0, f / z, np.float64(3.0) / z, np.float64(2.0) / z, -f / z, z / z]
    np.testing.assert_array_equal(got, np.array(expect))
    assert list(got[:3]) == [np.inf, np.inf, pytest.approx(np.nan, nan_ok=True)] and got[3] == 0 == got[6]


#: What numba-cuda's compiler records for each division of ``_divisions`` with ``debug=True`` (its Python error
#: model), checked against the compiled kernel's exception table by test_the_messages_are_the_compiled_kernels.
DEBUG_MESSAGES = {0: "division by zero", 1: "division by zero", 2: "modulo by zero", 3: "integer division by zero",
                  4: "integer modulo by zero", 5: "division by zero", 6: "integer division by zero",
                  7: "integer modulo by zero", 8: "division by zero", 9: "division by zero", 10: "division by zero",
                  11: "division by zero", 12: "division by zero"}


@pytest.mark.parametrize("which", sorted(DEBUG_MESSAGES))
def test_with_debug_a_division_by_zero_raises_numbas_zero_division_error(which):
    kernel = flowdsl.kernel(_divisions, debug=True, opt=False)
    with pytest.raises(ZeroDivisionError) as e:
        _run(kernel, which)
    assert str(e.value) == f"tid=[0, 0, 0] ctaid=[0, 0, 0]: {DEBUG_MESSAGES[which]}"
    assert type(e.value) is ZeroDivisionError  # the GPU's class, not NumPy's FloatingPointError
    assert f"test_division_model.py:{_line_of(which)}" in "\n".join(e.value.__notes__)


def _line_of(which: int) -> int:
    """The line of ``_divisions`` that divides in case ``which``: the first after its ``if`` with a division."""
    import inspect

    lines, first = inspect.getsourcelines(_divisions)
    start = next(n for n, text in enumerate(lines) if f"which == {which} or" in text)
    return first + next(n for n in range(start + 1, len(lines)) if "/" in lines[n] or "%" in lines[n])


def test_a_division_by_something_else_is_unchanged_and_a_device_function_keeps_numpys_model():
    @flowdsl.device
    def ratio(a, b):
        return a / b  # numba-cuda compiles a device function with its own options: no debug, NumPy's model

    @flowdsl.kernel(debug=True, opt=False)
    def k(out, v):
        out[0] = ratio(v[0], v[1])
        out[1] = v[2] / v[0]
        out[2] = 7 // 2 + 7 % 3 - 7.0 / 2

    def main(comm):
        out = np.zeros(3)
        k[1, 1](out, np.array([2.0, 0.0, 5.0]))
        comm.synchronize()
        return out
    assert list(run_ranks(main, nranks=1)[0]) == [np.inf, 2.5, 3 + 1 - 3.5]


@pytest.mark.compile
def test_the_messages_are_the_compiled_kernels():
    """The GPU's reference: numba-cuda's compile of the same kernel with ``debug=True`` records one exception per
    message above, each a ZeroDivisionError (the exceptions its launch raises)."""
    floats = np.zeros(3)
    argtypes = flowdsl.FlowKernel.argtypes_for(floats, np.zeros(2, np.int64), floats, np.int64(0), nccl="2.28.9")
    compiled = flowdsl.kernel(_divisions, debug=True, opt=False).compile(argtypes, arch="sm_90", nccl="2.28.9")
    recorded = {(cls, args) for cls, args, _ in compiled.exceptions.values()}
    assert recorded == {(ZeroDivisionError, (m,)) for m in DEBUG_MESSAGES.values()}
