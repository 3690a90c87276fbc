"""Multimem on a GPU without NVLink SHARP (the machines here keep NVLink multicast off): every way in is refused
on the host, in the simulator's words, before NCCL would create a multicast object; the collectives never
pick it. (What multimem computes is tested on the simulator and by the compile tests.)"""

from __future__ import annotations

import os

import numpy as np
import pytest

import flowdsl
from flowdsl import collectives

# No nothing_left_open: the collectives keep their window and device communicator for later calls.
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(os.environ.get("NCCL_NVLS_ENABLE") != "0",
                                 reason="asking NCCL for multimem with NVLS on would create multicast objects: "
                                        "these machines must keep NCCL_NVLS_ENABLE=0")]


def test_a_device_communicator_with_multimem_is_refused_before_nccl(comm):
    assert comm.supports_multimem is False
    before = list(comm.open_resources)
    with pytest.raises(flowdsl.UsageError, match=r"lsa_multimem=True: NCCL_NVLS_ENABLE=0 turns NVLink SHARP off "
                                                 r"in NCCL\. Multimem \(NVLink SHARP\) needs"):
        comm.device_communicator(lsa_multimem=True)
    assert list(comm.open_resources) == before  # refused before anything was made


def test_the_multimem_all_reduce_is_refused_and_auto_runs_another(comm):
    src, dst = comm.alloc(1 << 16, np.float32), comm.alloc(1 << 16, np.float32)
    src[...] = 1.0
    with pytest.raises(flowdsl.UsageError, match="multimem"):
        collectives.all_reduce(comm, src, dst, algorithm="multimem")
    collectives.all_reduce(comm, src, dst)  # "auto": a program that runs here
    comm.synchronize()
    np.testing.assert_array_equal(dst.get(), src.get() * comm.nranks)
