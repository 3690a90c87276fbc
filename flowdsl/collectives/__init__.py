"""NCCL's GENK collectives (ring and tree) as flowdsl programs, compiled at first use.

Host entry points take CuPy arrays or PyTorch tensors (any object with
``__cuda_array_interface__``; simulator buffers inside :func:`flowdsl.sim.spawn`)
on a flowdsl communicator: :func:`all_reduce`, :func:`all_gather`,
:func:`reduce_scatter`, :func:`broadcast`, :func:`reduce`. ``algorithm`` is
``"ring"``, ``"tree"`` (all_reduce only), ``"nccl"`` (NCCL's own host
collective) or ``"auto"`` (the cost model in :mod:`flowdsl.collectives.cost`). ``op`` is one of
:data:`OPS` by name, or :func:`premul_sum` ``(scalar)`` (NCCL's pre-multiplied sum).

The first call of a (collective, dtype, op, arch, NCCL ABI) compiles the program
and caches it on disk; :func:`precompile` (``python -m flowdsl precompile``)
builds the whole library ahead of time, :func:`load` loads it onto the GPU. The programs are in
:mod:`flowdsl.collectives.programs`.
"""

from __future__ import annotations

from ._config import DTYPES, OPS, SIMULATOR_CONFIG, FlowConfig
from ._host import all_gather, all_reduce, broadcast, reduce, reduce_scatter
from ._ops import PreMulSum, premul_sum
from ._library import library, load, precompile

__all__ = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "premul_sum", "PreMulSum",
           "precompile", "load", "library", "FlowConfig", "SIMULATOR_CONFIG", "DTYPES", "OPS"]
