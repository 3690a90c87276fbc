"""fp8 on the GPU against the table: every pair of codes, every operator, both formats.

On sm_89 and newer :func:`flowdsl.flow.combine` converts with the GPU's instructions
(``cvt ... e4m3x2`` / ``e5m2x2``); the simulator and older GPUs use bit arithmetic, which
``tests/compile/test_collectives_compile.py`` holds against the same table
(``flowdsl/_fp8.py``). Here all 65,536 pairs of codes are combined on the GPU (outputs
poisoned first) and compared bit for bit with NumPy over the table's values (a NaN result is
code 0x7F: the GPU's NaNs are positive).
"""

from __future__ import annotations

import numpy as np
import pytest

from flowdsl import RedOp

pytestmark = pytest.mark.gpu


def _reference(op, va, vb):
    """The combine in float32, as the kernels do (exact here: fp8 values have few bits), on NumPy."""
    a, b = va.astype(np.float32), vb.astype(np.float32)
    with np.errstate(all="ignore"):
        return {RedOp.SUM: a + b, RedOp.PROD: a * b, RedOp.MIN: np.where(a < b, a, b),
                RedOp.MAX: np.where(a > b, a, b)}[op]


@pytest.mark.parametrize("fmt", [1, 2], ids=["e4m3fn", "e5m2"])
def test_every_pair_of_codes_combines_as_the_table_says(fmt):
    import cupy

    from flowdsl import _fp8
    from tests.fp8_kernels import fp8_combine

    codes = np.arange(256, dtype=np.uint8)
    a, b = np.repeat(codes, 256), np.tile(codes, 256)
    table = _fp8.values(fmt)
    da, db = cupy.asarray(a), cupy.asarray(b)
    out = cupy.empty(a.size, np.uint8)
    for op in (RedOp.SUM, RedOp.PROD, RedOp.MIN, RedOp.MAX):
        out.fill(0xA5)
        fp8_combine[(a.size + 255) // 256, 256](da, db, out, int(op), fmt)
        got = out.get()
        value = _reference(op, table[a], table[b])
        expected = _fp8.to_fp8(value.astype(np.float64), fmt)
        bad = np.flatnonzero(got != expected)
        assert bad.size == 0, [(op.name, int(a[i]), int(b[i]), float(value[i]), int(got[i]), int(expected[i]))
                               for i in bad[:5]]
