"""NCCL's GENK collectives (ring and tree) as flowdsl programs, compiled at first use.

Host entry points take CuPy arrays or PyTorch tensors (any object with
``__cuda_array_interface__``; simulator buffers inside :func:`flowdsl.sim.spawn`)
on a flowdsl communicator: :func:`all_reduce`, :func:`all_gather`,
:func:`reduce_scatter`, :func:`broadcast`, :func:`reduce`, :func:`all_to_all`. ``algorithm`` is
``"ring"``, ``"tree"`` (all_reduce only), ``"multimem"`` (all_reduce through the NVLink switch, where
``comm.supports_multimem``), ``"pairwise"`` (all_to_all), ``"hierarchical"`` (all_gather, reduce_scatter and
all_to_all across nodes, the far phase over GIN), ``"hierarchical_cft"`` (all_gather across nodes, the far phase
over CFT, where ``comm.cft_missing`` is None; never chosen by ``"auto"``), ``"nccl"`` (NCCL's own host
collective) or ``"auto"`` (the cost model in :mod:`flowdsl.collectives.cost`). ``op`` is one of
:data:`OPS` by name, or :func:`premul_sum` ``(scalar)`` (NCCL's pre-multiplied sum).

Every collective also takes, by keyword:

- ``algorithm``: ``"auto"`` (default), a program's name (``"ring"``, ``"tree"``, ``"one_shot"``, ...:
  the keys of :data:`flowdsl.collectives.programs.PROGRAMS`) or ``"nccl"``.
- ``stream``: where the call runs: a CuPy or PyTorch stream, anything with ``__cuda_stream__``, or a
  driver handle; ``None`` is the current stream of the arrays' framework. Calls are capturable in
  CUDA graphs once planned (the first call on a communicator and config allocates).
- ``config``: a :class:`FlowConfig` (channels, slots, threads, protocol); ``None`` is ``FlowConfig()``
  on GPUs and :data:`SIMULATOR_CONFIG` on the simulator.
- ``dtype``: the element type when the arrays cannot say it: ``"bfloat16"`` for uint16 arrays of its
  bits, ``"float8_e4m3fn"`` / ``"float8_e5m2"`` for uint8 arrays of codes (torch tensors of those
  dtypes need none). :data:`DTYPES` lists NCCL's twelve.

A collective returns its output array. Bad input raises :class:`flowdsl.UsageError` before anything is
launched, naming the problem and the fix.

The first call of a (collective, dtype, op, arch, NCCL ABI) compiles the program
and caches it on disk; :func:`precompile` (``python -m flowdsl precompile``)
builds the whole library ahead of time, :func:`load` loads it onto the GPU. The programs are in
:mod:`flowdsl.collectives.programs`.
"""

from __future__ import annotations

from ._config import DTYPES, OPS, SIMULATOR_CONFIG, FlowConfig
from ._host import all_gather, all_reduce, all_to_all, broadcast, reduce, reduce_scatter
from ._ops import PreMulSum, premul_sum
from ._library import library, load, precompile

__all__ = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "premul_sum", "PreMulSum",
           "precompile", "load", "library", "FlowConfig", "SIMULATOR_CONFIG", "DTYPES", "OPS"]
