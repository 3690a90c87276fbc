"""Kernels of 16-byte vector values (numba-cuda's vector types through ``flowdsl.mem.load_vector`` and
``store_vector``), for the compile, simulator and GPU tests."""

from __future__ import annotations

import numpy as np
from numba import cuda

import flowdsl
from flowdsl import ThreadScope, mem

#: numba-cuda's vector type of 16 bytes of each element type flowdsl.mem's vectors take.
VECTOR_TYPES = {np.dtype(np.int32): cuda.int32x4, np.dtype(np.uint32): cuda.uint32x4,
                np.dtype(np.float32): cuda.float32x4, np.dtype(np.int64): cuda.int64x2,
                np.dtype(np.uint64): cuda.uint64x2, np.dtype(np.float64): cuda.float64x2}


def lanes_reversed(dtype):
    """A kernel ``(src, dst, relaxed)``: vector ``i`` of ``dst`` is vector ``i`` of ``src``, lanes reversed, each
    vector loaded and stored whole (``relaxed``: by the ``_relaxed`` forms at device scope)."""
    make = VECTOR_TYPES[np.dtype(dtype)]
    lanes = 16 // np.dtype(dtype).itemsize
    if lanes == 4:
        @flowdsl.device
        def flipped(v):
            return make(v.w, v.z, v.y, v.x)
    else:
        @flowdsl.device
        def flipped(v):
            return make(v.y, v.x)

    @flowdsl.kernel
    def reverse(src, dst, relaxed):
        i = cuda.grid(1)
        if i < dst.size // lanes:
            if relaxed:
                mem.store_vector_relaxed(dst, i, flipped(mem.load_vector_relaxed(src, i, ThreadScope.DEVICE)),
                                         ThreadScope.DEVICE)
            else:
                mem.store_vector(dst, i, flipped(mem.load_vector(src, i)))
    return reverse


@flowdsl.kernel
def built_from_halves(src, dst):
    """``dst``'s vector ``i``: a ``float4`` built from a ``float2`` of ``src``'s lanes 2 and 3 and its lanes 0 and 1
    as scalars (numba-cuda's constructor overloads), stored through ``cuda.float32x4``'s alias."""
    i = cuda.grid(1)
    if i < dst.size // 4:
        v = mem.load_vector(src, i)
        mem.store_vector(dst, i, cuda.float4(cuda.float2(v.z, v.w), v.x, v.y))


@flowdsl.kernel
def lanes_cast(out):
    """Lanes given as other types, converted by the constructors as numba's casts convert (``out``: int64)."""
    v = cuda.uint32x4(-1, 2.9, 3, True)
    w = cuda.int64x2(-7.9, 1 << 40)
    out[0], out[1], out[2], out[3] = v.x, v.y, v.z, v.w
    out[4], out[5] = w.x, w.y


#: What :func:`lanes_cast` writes: an int wraps into uint32, a float truncates toward zero.
CAST_EXPECTED = [2**32 - 1, 2, 3, 1, -7, 1 << 40]


@flowdsl.kernel
def tuple_into_store_vector(src, dst):
    mem.store_vector(dst, 0, (src[0], src[1], src[2], src[3]))


@flowdsl.kernel
def wrong_vector_type(src, dst):
    mem.store_vector(dst, 0, cuda.int32x4(1, 2, 3, 4))


@flowdsl.kernel
def three_lanes_for_four(out):
    v = cuda.float32x4(1.0, 2.0, 3.0)
    out[0] = v.x


@flowdsl.kernel
def lane_written(out):
    v = cuda.float32x2(1.0, 2.0)
    v.x = 3.0
    out[0] = v.x


@flowdsl.kernel
def lane_indexed(out):
    v = cuda.float32x2(1.0, 2.0)
    out[0] = v[0]


#: Kernels numba-cuda refuses, each with what the simulator says (the GPU's typing says it in numba's words but for
#: the write, which numba-cuda types and cannot lower: flowdsl refuses it in the simulator's words).
REFUSED = [(three_lanes_for_four, "Cannot build a numba.cuda.float32x4 from 3 lanes: it has 4"),
           (lane_written, "Cannot set .x of a numba.cuda.float32x2: vector values are read-only in numba-cuda"),
           (lane_indexed, "Cannot index a numba.cuda.float32x2: numba-cuda reads its lanes by name. Use .x, .y")]


def random_array(dtype, n, seed):
    """``n`` random values of ``dtype`` (integers over their whole range)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(n).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)


def reference(src):
    """What :func:`lanes_reversed` writes: each 16-byte group of ``src`` reversed (NumPy)."""
    lanes = 16 // src.itemsize
    return src.reshape(-1, lanes)[:, ::-1].reshape(-1)


def halves_reference(src):
    """What :func:`built_from_halves` writes."""
    v = src.reshape(-1, 4)
    return v[:, [2, 3, 0, 1]].reshape(-1)
