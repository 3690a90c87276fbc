"""The collectives' plan cache: a repeated call is fast, and a cached plan keeps no array alive."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

from flowdsl import collectives as coll
from flowdsl.sim import spawn

pytestmark = pytest.mark.sim


def test_plans_hold_arrays_weakly_and_a_new_array_under_an_old_id_is_planned_afresh():
    def main(comm):
        rng = np.random.default_rng(comm.rank)
        buf = comm.alloc(64, np.float32)
        ints = comm.alloc(64, np.int32)
        out = comm.alloc(64, np.float32)
        out_ints = comm.alloc(64, np.int32)
        sent, freed = [], []
        for i in range(4):
            x, y = buf[16 * i:16 * (i + 1)], out[16 * i:16 * (i + 1)]
            x[:] = rng.standard_normal(16).astype(np.float32)
            y[:] = np.nan
            sent.append(np.array(x))
            coll.all_reduce(comm, x, y, algorithm="ring")
            refs = (weakref.ref(x), weakref.ref(y))
            del x, y  # the next slices may take these ids: they are other arrays
            freed.append(all(r() is None for r in refs))
        # Same memory and size, another dtype: a plan for float32 must not run on it.
        ints[:] = rng.integers(-1000, 1000, 64, dtype=np.int32)
        out_ints[:] = -1
        coll.all_reduce(comm, ints[:16], out_ints[:16], algorithm="ring")
        comm.synchronize()
        return sent, np.array(out), np.array(ints[:16]), np.array(out_ints[:16]), freed

    results = spawn(main, nranks=2)
    expected = np.concatenate([sum(r[0][i] for r in results) for i in range(4)])
    expected_ints = sum(r[2] for r in results)
    for _, out, _, out_ints, freed in results:
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(out_ints, expected_ints)
        assert freed == [True] * 4


def test_a_repeated_call_reuses_its_plan():
    def main(comm):
        x = comm.alloc(8, np.float32)
        y = comm.alloc(8, np.float32)
        x[:] = comm.rank + 1
        coll.all_reduce(comm, x, y, algorithm="ring")
        plans = comm.__dict__["_flowdsl_plans"]
        first = dict(plans)
        coll.all_reduce(comm, x, y, algorithm="ring")
        reused = [plans[k] is first[k] for k in first]
        comm.synchronize()
        return np.array(y), reused

    for y, reused in spawn(main, nranks=2):
        np.testing.assert_array_equal(y, np.full(8, 3, np.float32))
        assert reused == [True]
