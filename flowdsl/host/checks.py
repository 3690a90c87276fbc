"""Host-side argument checks: one set for the GPU runtime and the simulator.

What the GPU runtime refuses, the simulator refuses with the same message: both host sides
(:mod:`flowdsl.runtime.communicator` and :mod:`flowdsl.sim.host`) and the kernel launch
(:mod:`flowdsl._kernel`) call these functions instead of checking on their own. Each one
either returns the checked value or raises :class:`~flowdsl.errors.UsageError` (or
:class:`~flowdsl.errors.ResourceClosedError`) worded "Cannot {operation}: {reason}. {fix}".
"""

from __future__ import annotations

import operator

import numpy as np

from .._release import format_version
from ..errors import LaunchTypeError, ResourceClosedError, UsageError

__all__ = ["SUPPORTED_DTYPES", "numba_dtype", "DEVICE_REQUIREMENTS", "GIN_RESOURCES", "DEFAULTED_REQUIREMENTS",
           "device_requirements", "ALLOC_LIKE", "GRID_LIMITS", "BLOCK_LIMITS", "MAX_BLOCK_THREADS", "alloc_dtype",
           "alloc_shape", "alloc_like", "torch_module", "communicator_open", "resource_closed", "count_of",
           "contiguous", "register_layout", "host_array_error", "not_a_buffer_error", "NOT_FROM_ALLOC",
           "launch_shape", "multimem_unavailable", "REQUIREMENT_FIELDS", "REQUIREMENTS_LACKING",
           "refuse_lacking", "requirement_unavailable"]

#: Element types ``comm.alloc`` takes. uint16 and int16 too: bfloat16 travels as uint16 bits
#: (CuPy and NumPy have no bfloat16).
SUPPORTED_DTYPES = tuple(np.dtype(t) for t in (
    np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
    np.uint64))
#: What ``comm.alloc(..., like=)`` returns: a CuPy array (on the simulator a NumPy array with CuPy's
#: ``set``/``get``), or a PyTorch tensor over the same memory (on the simulator a CPU tensor).
ALLOC_LIKE = ("cupy", "torch")
#: CUDA's launch limits: grid (x, y, z) and block (x, y, z) extents, threads per block.
GRID_LIMITS = (2**31 - 1, 65535, 65535)
BLOCK_LIMITS = (1024, 1024, 64)
MAX_BLOCK_THREADS = 1024


def _supported_names() -> str:
    return ", ".join(str(d) for d in SUPPORTED_DTYPES)


def alloc_dtype(dtype) -> np.dtype:
    """The NumPy dtype of ``comm.alloc(shape, dtype)``: a NumPy dtype, type or name, or a numba scalar type.

    Raises:
        UsageError: ``dtype`` is None, not a dtype, or not one the symmetric memory holds.
    """
    if dtype is None:
        raise UsageError(f"Cannot allocate symmetric memory of dtype None: name an element type. Supported "
                         f"dtypes are {_supported_names()}.")
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        resolved = numba_dtype(dtype)
        if resolved is None:
            raise UsageError(f"Cannot allocate symmetric memory of dtype {dtype!r}: it is not a dtype. Supported "
                             f"dtypes are {_supported_names()}.") from None
    if resolved not in SUPPORTED_DTYPES:
        raise UsageError(f"Cannot allocate symmetric memory of dtype {resolved}: supported dtypes are "
                         f"{_supported_names()}.")
    return resolved


def numba_dtype(dtype):
    """A numba scalar type's NumPy dtype (``numba.float32``: its name is NumPy's), or None for anything
    else. Read from the name, so the host side needs no compiler."""
    if not type(dtype).__module__.startswith("numba"):
        return None
    try:
        return np.dtype(str(dtype))
    except (TypeError, ValueError):  # an array or record type's name is no dtype
        return None


def alloc_shape(shape) -> tuple[int, ...]:
    """``comm.alloc``'s shape as a tuple of non-negative ints (an int is a 1-D shape)."""
    dims = (shape,) if not isinstance(shape, (tuple, list)) else tuple(shape)
    try:
        out = tuple(operator.index(d) for d in dims if not isinstance(d, bool))
    except TypeError:
        out = ()
    if len(out) != len(dims) or any(d < 0 for d in out):
        raise UsageError(f"Cannot allocate symmetric memory of shape {shape!r}: give an int or a tuple of "
                         "non-negative ints.")
    return out


def alloc_like(like) -> str:
    """``like=`` of ``comm.alloc``, checked before anything is allocated (torch must be importable)."""
    if like not in ALLOC_LIKE:
        raise UsageError(f"Cannot allocate: like must be 'cupy' or 'torch', got {like!r}")
    if like == "torch":
        torch_module("allocate symmetric memory with like='torch'")
    return like


def torch_module(operation: str):
    """PyTorch, or a UsageError saying how to install it."""
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        raise UsageError(f"Cannot {operation}: PyTorch is not installed. Install it (pip install torch) or "
                         "use like='cupy'.") from None
    return torch


def communicator_open(closed: bool, operation: str) -> None:
    """Refuse ``operation`` on a closed communicator."""
    if closed:
        raise ResourceClosedError(f"Cannot {operation}: the communicator was closed. Use it before close(), or "
                                  "create a new one (flowdsl.init()).")


def resource_closed(kind: str, operation: str) -> ResourceClosedError:
    """The error of ``operation`` on a closed window or device communicator (``kind``)."""
    return ResourceClosedError(f"Cannot {operation}: this {kind} was closed. Create a new one.")


def count_of(value, what: str, operation: str, *, least: int = 1) -> int:
    """``value`` as an int of at least ``least`` (a rank count, a node count): no floats, no strings."""
    try:
        n = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        n = None
    if n is None or n < least:
        raise UsageError(f"Cannot {operation}: {what} must be an int >= {least}, got {value!r}"
                         f"{f' ({type(value).__name__})' if n is None else ''}.")
    return n


def contiguous(shape, strides, itemsize: int) -> bool:
    """Whether an array of ``shape`` and byte ``strides`` (None: C order) is C-contiguous.

    Extents of 1 may have any stride (NumPy and CuPy give them arbitrary ones), and an array of no
    elements is contiguous."""
    if strides is None or 0 in tuple(shape):
        return True
    step = itemsize
    for dim, stride in zip(reversed(tuple(shape)), reversed(tuple(strides))):
        if dim != 1 and stride != step:
            return False
        step *= dim
    return True


def register_layout(shape, strides, itemsize: int) -> int:
    """Bytes of a buffer to register: at least one element, contiguous."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
    if nbytes == 0:
        raise UsageError(f"Cannot register an empty buffer (shape {tuple(shape)}, 0 bytes): a window covers at "
                         "least one element. Register a buffer from comm.alloc with at least one element.")
    if not contiguous(shape, strides, itemsize):
        raise UsageError("Cannot register a non-contiguous array: windows cover contiguous memory. "
                         "Register the whole buffer from comm.alloc and index inside the kernel.")
    return nbytes


def host_array_error(buf) -> UsageError:
    """``register`` of a NumPy array the communicator did not allocate (host memory on a GPU)."""
    return UsageError(f"Cannot register {type(buf).__name__}: it is a NumPy array in host memory, and symmetric "
                      "windows need memory from comm.alloc (ncclMemAlloc) of this communicator. Allocate it with "
                      "comm.alloc(shape, dtype) and copy your data in (buf.set(array)).")


def not_a_buffer_error(buf) -> UsageError:
    """``register`` of something that is no array at all."""
    return UsageError(f"Cannot register {type(buf).__name__}: pass a buffer from comm.alloc(shape, dtype).")


#: ``register`` of device memory the communicator did not allocate.
NOT_FROM_ALLOC = ("Cannot register this buffer: symmetric windows need memory from comm.alloc (ncclMemAlloc) of "
                  "this communicator. Allocate it with comm.alloc(shape, dtype) and copy your data in.")


def launch_shape(grid, block, kernel_name: str) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """``(grid, block)`` as 3-tuples, within CUDA's limits (``k[grid, block]`` on GPUs and the simulator)."""
    g = _dims(grid, "the grid", kernel_name)
    b = _dims(block, "the block", kernel_name)
    for what, dims, limits in (("grid", g, GRID_LIMITS), ("block", b, BLOCK_LIMITS)):
        for axis, extent, limit in zip("xyz", dims, limits):
            if extent > limit:
                raise UsageError(f"Cannot launch {kernel_name}: the {what}'s {axis} extent {extent} is beyond "
                                 f"CUDA's limit of {limit} (a {what} is at most {' x '.join(map(str, limits))}). "
                                 f"Use fewer {'blocks' if what == 'grid' else 'threads'} along {axis}, or "
                                 "another axis")
    if b[0] * b[1] * b[2] > MAX_BLOCK_THREADS:
        raise UsageError(f"Cannot launch {kernel_name}: the block {block!r} has {b[0] * b[1] * b[2]} threads, "
                         f"more than CUDA's {MAX_BLOCK_THREADS} per block. Use at most {MAX_BLOCK_THREADS}")
    return g, b


def launch_bounds(bounds, kernel_name: str) -> tuple[int, ...] | None:
    """numba-cuda's ``launch_bounds``: ``max_threads`` or ``(max_threads[, min_blocks_per_sm[,
    max_blocks_per_cluster]])`` as a tuple of positive ints (None: none)."""
    if bounds is None:
        return None
    try:
        bounds = tuple(bounds)
    except TypeError:
        bounds = (bounds,)
    if len(bounds) > 3:  # numba-cuda's words
        raise UsageError(f"Cannot make kernel {kernel_name}: Got {len(bounds)} launch bounds: {bounds}. A maximum of "
                         "three are supported: (max_threads_per_block, min_blocks_per_sm, max_blocks_per_cluster)")
    if not bounds or not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b > 0 for b in bounds):
        raise UsageError(f"Cannot make kernel {kernel_name} with launch_bounds={bounds!r}: give positive ints, "
                         "max_threads_per_block first")
    return tuple(int(b) for b in bounds)


def shared_memory_carveout(carveout, kernel_name: str) -> int | None:
    """numba-cuda's ``shared_memory_carveout``: the percent of the unified L1/shared memory preferred as shared
    memory, -1 (the driver's default) to 100, or ``"default"``, ``"MaxL1"`` (0), ``"MaxShared"`` (100)."""
    if carveout is None:
        return None
    named = {"default": -1, "maxl1": 0, "maxshared": 100}
    if isinstance(carveout, str):
        if carveout.lower() not in named:
            raise UsageError(f"Cannot make kernel {kernel_name}: Invalid carveout value: {carveout}. Must be -1 to "
                             f"100 or one of {list(named)}")
        return named[carveout.lower()]
    if not isinstance(carveout, (int, np.integer)) or isinstance(carveout, bool):
        raise LaunchTypeError(f"Cannot make kernel {kernel_name}: shared_memory_carveout must be str or int, got "
                              f"{type(carveout).__name__}")
    if not -1 <= carveout <= 100:
        raise UsageError(f"Cannot make kernel {kernel_name}: Carveout must be between -1 and 100, got {carveout}")
    return int(carveout)


def within_launch_bounds(block: tuple[int, int, int], bounds, kernel_name: str) -> None:
    """Refuse a block of more threads than the kernel's ``launch_bounds`` allow (the GPU refuses the launch
    with CUDA_ERROR_INVALID_VALUE; both paths refuse it before)."""
    if bounds is not None and block[0] * block[1] * block[2] > bounds[0]:
        raise UsageError(f"Cannot launch {kernel_name} with {block[0] * block[1] * block[2]} threads a block: its "
                         f"launch_bounds allow at most {bounds[0]} (a GPU refuses it: CUDA_ERROR_INVALID_VALUE). "
                         f"Launch at most {bounds[0]} threads a block, or raise the bound")


#: Dynamic shared memory a launch may ask for without opting in (``cudaFuncAttributeMaxDynamicSharedMemorySize``).
MAX_DYNAMIC_SHARED = 48 * 1024


def dynamic_shared(nbytes, kernel_name: str) -> int:
    """The bytes of dynamic shared memory ``k[grid, block, stream, nbytes]`` gives each block (GPUs and the
    simulator: what a kernel's ``cuda.shared.array(0, dtype)`` holds)."""
    if not isinstance(nbytes, (int, np.integer)) or isinstance(nbytes, bool) or nbytes < 0:
        raise UsageError(f"Cannot launch {kernel_name} with {nbytes!r} bytes of dynamic shared memory: give a "
                         "non-negative int (k[grid, block, stream, nbytes])")
    if nbytes > MAX_DYNAMIC_SHARED:
        raise UsageError(f"Cannot launch {kernel_name} with {int(nbytes)} bytes of dynamic shared memory: a launch "
                         f"takes at most {MAX_DYNAMIC_SHARED} (48 KiB) without opting in to more. Use at most "
                         f"{MAX_DYNAMIC_SHARED} bytes")
    return int(nbytes)


def _dims(value, what: str, kernel_name: str) -> tuple[int, int, int]:
    dims = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    numba_name = "griddim" if what == "the grid" else "blockdim"  # numba-cuda's words, which its users match
    fix = f"Give {what} as a positive int or a tuple of up to 3 positive ints"
    if not 1 <= len(dims) <= 3:
        raise UsageError(f"Cannot launch {kernel_name}: {numba_name} must be a sequence of 1, 2 or 3 integers, got "
                         f"{list(dims)}. {fix}")
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dims):
        raise LaunchTypeError(f"Cannot launch {kernel_name}: {numba_name} must be a sequence of integers, got "
                              f"{list(dims)}. {fix}")
    if not all(d > 0 for d in dims):
        raise UsageError(f"Cannot launch {kernel_name}: {what} must be a positive int or a tuple of up to "
                         f"3 positive ints, got {value!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


#: What ``comm.device_communicator(**requirements)`` takes: ``ncclDevCommRequirements``' fields in
#: snake_case (the GPU runtime maps them to the C names, ``flowdsl.runtime.communicator.REQUIREMENT_FIELDS``).
DEVICE_REQUIREMENTS = ("lsa_barrier_count", "barrier_count", "rail_gin_barrier_count", "world_gin_barrier_count",
                       "gin_context_count", "gin_signal_count", "gin_counter_count", "gin_connection_type",
                       "gin_custom_stride", "gin_exclusive_contexts", "gin_queue_depth", "gin_traffic_class",
                       "gin_strong_signals_required", "gin_va_signals_required", "gin_force_enable", "gin_type",
                       "cft_caps", "cft_barrier_count", "lsa_multimem")
#: keyword of device_communicator() -> field of ncclDevCommRequirements (the GPU runtime writes these).
REQUIREMENT_FIELDS = {
    "lsa_barrier_count": "lsaBarrierCount",
    "lsa_multimem": "lsaMultimem",
    "barrier_count": "barrierCount",
    "rail_gin_barrier_count": "railGinBarrierCount",
    "gin_context_count": "ginContextCount",
    "gin_signal_count": "ginSignalCount",
    "gin_counter_count": "ginCounterCount",
    "gin_force_enable": "ginForceEnable",
    "cft_caps": "cftCaps",
    "cft_barrier_count": "cftBarrierCount",
    "world_gin_barrier_count": "worldGinBarrierCount",
    "gin_connection_type": "ginConnectionType",
    "gin_custom_stride": "ginCustomStride",
    "gin_exclusive_contexts": "ginExclusiveContexts",
    "gin_queue_depth": "ginQueueDepth",
    "gin_traffic_class": "ginTrafficClass",
    "gin_strong_signals_required": "ginStrongSignalsRequired",
    "gin_va_signals_required": "ginVaSignalsRequired",
    "gin_type": "ginType",
}
#: The requirements each release flowdsl builds for lacks (fields its ``ncclDevCommRequirements`` does not have,
#: CFT's where the release has no CFT build): the GPU runtime decides from the release's probed layout, the
#: simulator of a release (``spawn(nccl=...)``) from this table, which a test holds against those layouts.
REQUIREMENTS_LACKING = {
    "2.28.9": frozenset({"cft_caps", "cft_barrier_count", "world_gin_barrier_count", "gin_connection_type",
                         "gin_custom_stride", "gin_exclusive_contexts", "gin_queue_depth", "gin_traffic_class",
                         "gin_strong_signals_required", "gin_va_signals_required", "gin_type"}),
    "2.32.3": frozenset(),
    "2.32.6": frozenset({"cft_caps", "cft_barrier_count"}),
}


def refuse_lacking(requirements: dict, given, lacking, version) -> None:
    """Refuse a device communicator whose ``requirements`` (checked; ``given``: the keys the user passed) name
    one NCCL ``version`` lacks (``lacking``): asked for, or one without a default a release may leave out."""
    for key in requirements:
        if key in lacking and (key in given or key not in DEFAULTED_REQUIREMENTS):
            raise requirement_unavailable(key, version)


def requirement_unavailable(key: str, version) -> UsageError:
    """How both paths refuse a device communicator asked for ``key`` where NCCL ``version`` lacks its field."""
    return UsageError(f"Cannot create a device communicator with {key}: NCCL {format_version(version)} has no "
                      f"{REQUIREMENT_FIELDS[key]} (NCCL 2.28 has neither CFT nor the GIN connection fields nor the "
                      "world GIN barrier; CFT needs a release with a CFT build, 2.32.3). Install "
                      "nvidia-nccl-cu13>=2.32.3.")


#: The requirements that ask NCCL for GIN resources (NCCL >= 2.29 creates none without GIN enabled:
#: ``ncclGinResourcesRequested`` in its ``src/dev_runtime.cc``).
GIN_RESOURCES = ("gin_signal_count", "gin_counter_count", "barrier_count", "rail_gin_barrier_count",
                 "world_gin_barrier_count")
#: Requirements :func:`device_requirements` may fill in (a release without the field leaves it out).
DEFAULTED_REQUIREMENTS = ("gin_connection_type",)


def multimem_unavailable(why: str) -> UsageError:
    """How both paths refuse ``device_communicator(lsa_multimem=True)`` where there is no NVLink SHARP
    (``why``: what lacks it), before NCCL is asked (which would create multicast objects)."""
    return UsageError(f"Cannot create a device communicator with lsa_multimem=True: {why}. Multimem (NVLink SHARP) "
                      "needs GPUs joined by an NVSwitch that multicasts, with NCCL's NVLS on. Leave lsa_multimem "
                      "out and reach the LSA team with views (flowdsl.lsa.lsa_view, lsa.reduce_sum); on the "
                      "simulator, model a switch with flowdsl.sim.spawn(..., multimem=True)")


#: NCCL's words (src/dev_runtime.cc) for GIN asked of a communicator that lacks it, and for FULL of one
#: whose network connects only the rail team.
NCCL_NO_GIN = "User requested GIN but not all ranks in the communicator support GIN"
NCCL_RAIL_ONLY = ("User requested GIN connection type NCCL_GIN_CONNECTION_FULL but the communicator supports only "
                  "NCCL_GIN_CONNECTION_RAIL")


def gin_unsupported(kind, gin_support, forced=False) -> None:
    """Refuse GIN connections of ``kind`` (None: none asked) that a communicator whose widest is
    ``gin_support`` (None: unknown) lacks, as NCCL refuses them, in its words."""
    from ..enums import GinConnectionType  # noqa: PLC0415

    if kind is None or gin_support is None or kind is GinConnectionType.NONE:
        return
    asked = "gin_force_enable" if forced else f"gin_connection_type {kind.name}"
    if gin_support is GinConnectionType.NONE:
        raise UsageError(f"Cannot create a device communicator: it asks for GIN ({asked}), and not every rank of "
                         "this communicator has GIN (a network card that GPUs drive), which NCCL refuses "
                         f"(\"{NCCL_NO_GIN}\"). Ask for no GIN resources and no gin_connection_type (LSA only: "
                         "every peer in this node), or run where every rank has a GIN-capable network card")
    if kind is GinConnectionType.FULL and gin_support is GinConnectionType.RAIL:
        raise UsageError(f"Cannot create a device communicator: it asks for GIN connections to every rank ({asked}), "
                         "and this communicator's network connects only the rail team (the same local rank on "
                         f"every node), which NCCL refuses (\"{NCCL_RAIL_ONLY}\"). Pass gin_connection_type="
                         "GinConnectionType.RAIL (puts and signals to the rail team, rail barriers; no world GIN "
                         "barrier)")


#: NCCL's words (its GIN host code, ``ncclGinDevCommSetup``) when no backend of the communicator takes the
#: device communicator, and why a backend was passed over for want of strong signals.
NCCL_NO_BACKEND = "GIN: DevComm setup failed on all available backends"
NCCL_NO_STRONG = "GIN strong signals are required, but the GIN plugin does not support them."


def gin_backend_unavailable(out: dict, backends) -> None:
    """Refuse, as NCCL 2.32 does and in its words, a device communicator whose GIN no backend of the
    communicator (``backends``: a set of :class:`flowdsl.GinBackend`, None where NCCL cannot say) takes:
    NCCL tries each backend that is ``gin_type`` (if named) and offers strong signals if
    ``gin_strong_signals_required`` (True unless set False)."""
    from ..enums import GinBackend  # noqa: PLC0415

    if backends is None:
        return
    named = out.get("gin_type")
    have = ", ".join(sorted(b.option for b in backends)) or "none"
    candidates = [b for b in backends if not named or b is named]
    if not candidates:
        raise UsageError(f"Cannot create a device communicator with gin_type={GinBackend(named).name}: this "
                         f"communicator's GIN backends are {have}, which NCCL refuses (\"{NCCL_NO_BACKEND}\"). Leave "
                         "gin_type out (NCCL picks one), or name one it has")
    if out.get("gin_strong_signals_required", True) and not any(b.strong_signals for b in candidates):
        raise UsageError(f"Cannot create a device communicator: it requires strong GIN signals "
                         f"(gin_strong_signals_required, True unless set False), and the GIN backend "
                         f"{'/'.join(b.option for b in candidates)} offers weak signals only, which NCCL refuses "
                         f"(\"{NCCL_NO_STRONG}\" ... \"{NCCL_NO_BACKEND}\"). Pass gin_strong_signals_required=False "
                         "and cover each put with a signal of its own (NCCL's legacy signals, gin.signal_inc and "
                         "the GIN barriers' arrivals, are weak then)")


def device_requirements(requirements: dict, for_kernel=None, grid=None, gin_support=None,
                        gin_backends=None) -> dict:
    """A device communicator's requirements, checked: known names, values >= 0, with what
    ``for_kernel`` needs at ``grid`` added (the larger of the two for each), and NCCL's rules for GIN
    (``ncclDevCommCreate`` in its ``src/dev_runtime.cc``, in its order): GIN resources need GIN enabled,
    so a request for them that names no ``gin_connection_type`` (nor ``gin_force_enable``, which NCCL
    takes as ``FULL``) gets ``FULL``; one that names ``NONE`` is refused as NCCL refuses it; so is GIN
    asked for where the communicator has none, ``FULL`` where it connects only the rail team, and a
    world GIN barrier over ``RAIL`` connections. ``gin_support`` is the widest connection type the
    communicator has (a :class:`flowdsl.GinConnectionType`: NCCL's ``ncclCommProperties``, the
    simulator's ``spawn(gin_connections=...)``), None where it cannot be known (NCCL 2.28);
    ``gin_backends`` its GIN backends (:func:`gin_backend_unavailable`), None where unknown."""
    from ..enums import GinConnectionType  # noqa: PLC0415

    unknown = sorted(set(requirements) - set(DEVICE_REQUIREMENTS))
    if unknown:
        raise UsageError(f"Cannot create a device communicator: unknown requirement(s) {', '.join(unknown)}. "
                         f"Use the known ones: {', '.join(DEVICE_REQUIREMENTS)}")
    out = dict(requirements)
    if for_kernel is not None:
        for key, value in for_kernel.requirements(grid).items():
            if key == "gin_connection_type":  # a type, not a count: the one named stands
                if int(out.get(key, value)) == 0 and not out.get("gin_force_enable"):
                    raise UsageError(f"Cannot create a device communicator for {for_kernel.__name__}: it uses GIN, "
                                     "and gin_connection_type NONE leaves GIN off. Name another type (FULL, RAIL, "
                                     "CUSTOM_STRIDE) or leave it out")
                out.setdefault(key, value)
            else:
                out[key] = max(out.get(key, 0), value)
    for key, value in out.items():
        if key not in ("gin_traffic_class", "gin_type") and int(value) < 0:
            raise UsageError(f"Cannot create a device communicator: {key} must be >= 0, got {value}. Pass a count "
                             "of 0 or more")
    kind = out.get("gin_connection_type")
    if kind is not None:
        if int(kind) not in GinConnectionType._value2member_map_:
            raise UsageError(f"Cannot create a device communicator: gin_connection_type {kind!r} is not a "
                             f"flowdsl.GinConnectionType. Pass one of {', '.join(GinConnectionType.__members__)}")
        kind = out["gin_connection_type"] = GinConnectionType(int(kind))
        if kind is GinConnectionType.CUSTOM_ARRAY:
            raise UsageError("Cannot create a device communicator with gin_connection_type CUSTOM_ARRAY: flowdsl "
                             "does not pass NCCL a list of peers (ginCustomArray). Use FULL, RAIL or CUSTOM_STRIDE "
                             "with gin_custom_stride")
    named = out.get("gin_type")
    if named is not None:
        from ..enums import GinBackend  # noqa: PLC0415

        if isinstance(named, bool) or not isinstance(named, int) or (named and named not in set(GinBackend)):
            raise UsageError(f"Cannot create a device communicator: gin_type {named!r} is not a flowdsl.GinBackend. "
                             f"Pass one of {', '.join(GinBackend.__members__)}, or leave it out (NCCL picks)")
        out["gin_type"] = GinBackend(int(named)) if named else 0
    asked = [f"{key}={out[key]}" for key in GIN_RESOURCES if int(out.get(key, 0)) > 0]
    if asked and kind is None and not out.get("gin_force_enable"):
        kind = out["gin_connection_type"] = GinConnectionType.FULL  # as NCCL takes gin_force_enable
    if asked and kind is GinConnectionType.NONE and not out.get("gin_force_enable"):
        raise UsageError(f"Cannot create a device communicator: it asks for GIN resources ({', '.join(asked)}) "
                         "with gin_connection_type NONE, which NCCL refuses (\"User requested GIN resources but "
                         "did not request GIN to be enabled!\"). Pass gin_connection_type=GinConnectionType.FULL "
                         "(or RAIL), or ask for no GIN resources")
    if out.get("gin_force_enable"):
        kind = GinConnectionType.FULL  # NCCL: ginForceEnable overrides the type named
    gin_unsupported(kind, gin_support, out.get("gin_force_enable"))
    if (kind is not None and kind is not GinConnectionType.NONE) or out.get("gin_force_enable"):
        gin_backend_unavailable(out, gin_backends)
    if int(out.get("world_gin_barrier_count", 0)) > 0 and kind is GinConnectionType.RAIL:
        raise UsageError("Cannot create a device communicator: a world GIN barrier (world_gin_barrier_count="
                         f"{out['world_gin_barrier_count']}) needs GIN connections to every rank, and "
                         "gin_connection_type RAIL connects the rail team only, which NCCL refuses (\"Cannot create "
                         "worldGinBarrier with NCCL_GIN_CONNECTION_RAIL.\"). Pass gin_connection_type="
                         "GinConnectionType.FULL, or use rail barriers (rail_gin_barrier_count)")
    return out
