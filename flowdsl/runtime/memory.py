"""Host resources owned by a communicator: symmetric buffers, windows, device communicators.

Every resource derives from :class:`Resource`: ``close()`` is idempotent, the
resource is a context manager, and the communicator closes whatever is still
open when it is closed itself (windows and device communicators before the
memory under them).
"""

from __future__ import annotations

import ctypes
import struct

import numpy as np

from ..enums import GinBackend
from ..errors import NoDeviceError, UsageError
from ..host.arrays import cuda_array_interface, is_torch, torch_bits
from .._release import format_version
from . import nccl
from ..host import checks

__all__ = ["Resource", "SymmetricAllocation", "Window", "DevComm", "array_at", "device_pointer", "require_gpu", "GinBackend", "GIN_BACKENDS",
           "gin_backend_of", "gin_backends_in"]


#: Counts the changes of resources that launches pack (closing, re-typing): a launch replayed
#: from a CUDA graph (:mod:`flowdsl._launch`) checks it has not moved since the graph was made.
changes = 0


def resources_changed() -> None:
    global changes  # noqa: PLW0603 - one counter for every resource: closing any is rare
    changes += 1


class Resource:
    """Base of communicator-owned resources: idempotent ``close()``, usable in ``with``."""

    kind = "resource"

    def __init__(self, comm):
        self._comm = comm
        self._closed = False
        comm.track(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise checks.resource_closed(self.kind, operation)

    def close(self) -> None:
        """Release the resource (collective where NCCL's call is); a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        resources_changed()
        try:
            self._release()
        finally:
            self._comm._untrack(self)

    def _release(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def device_pointer(array, operation: str = "free") -> tuple[int, int]:
    """``(address, nbytes)`` of a C-contiguous device array (CUDA Array Interface).

    For ``operation="register"`` the array must also hold at least one element
    (:func:`flowdsl.host.checks.register_layout`, the simulator's rule too).
    """
    cai = cuda_array_interface(array)
    if cai is None and is_torch(array) and array.is_cuda:  # bfloat16, fp8, uint16-64: as their bits
        cai = cuda_array_interface(torch_bits(array))
    if cai is None:
        raise UsageError(f"Cannot use {type(array).__name__} as a device buffer: it has no "
                         "__cuda_array_interface__. Allocate it with comm.alloc(shape, dtype).")
    dtype = np.dtype(cai["typestr"])
    shape, strides = cai["shape"], cai.get("strides")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if operation == "register":
        checks.register_layout(shape, strides, dtype.itemsize)
    elif nbytes and not checks.contiguous(shape, strides, dtype.itemsize):
        raise UsageError(f"Cannot {operation} a non-contiguous array: pass the whole buffer from comm.alloc.")
    return int(cai["data"][0]), nbytes


class SymmetricAllocation(Resource):
    """Memory from ``ncclMemAlloc`` (cuMem VMM), which symmetric windows require."""

    kind = "symmetric buffer"

    def __init__(self, comm, nbytes: int):
        from nccl.core import mem_alloc  # noqa: PLC0415

        super().__init__(comm)
        self._buffer = mem_alloc(max(int(nbytes), 1))
        self.ptr = int(self._buffer.handle)
        self.nbytes = int(nbytes)

    def contains(self, ptr: int, nbytes: int) -> bool:
        return self.ptr <= ptr and ptr + nbytes <= self.ptr + max(self.nbytes, 1)

    def _release(self) -> None:
        self._buffer.close()


def array_at(ptr: int, shape, dtype, owner):
    """A CuPy array of ``shape`` and ``dtype`` over device memory at ``ptr`` that ``owner`` keeps alive (a
    symmetric allocation's buffer; the bytes a window registers: nccl4py names a buffer's element type and
    refuses those NCCL has none for, uint16 (bfloat16), int16, bool, so a window registers uint8)."""
    import cupy  # noqa: PLC0415

    nbytes = max(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, 1)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, nbytes, owner), 0))


class Window(Resource):
    """A symmetric window over a buffer from ``comm.alloc`` (``NCCL_WIN_COLL_SYMMETRIC``).

    In kernels it has the numba type ``Window(dtype)``: views default to the
    registered buffer's dtype. ``handle`` is the ``ncclWindow_t``.
    """

    kind = "window"

    def __init__(self, comm, array, nbytes: int, ptr: int, dtype: np.dtype, cft_counted: bool = False):
        from nccl.core import WindowFlag  # noqa: PLC0415

        from .nccl import without_torch_probe  # noqa: PLC0415

        super().__init__(comm)
        self.array = array
        self.nbytes = nbytes
        self.ptr = ptr
        self.dtype = np.dtype(dtype)
        self.cft_counted = bool(cft_counted)
        try:
            # NCCL_WIN_CFT_COUNTED (0x08): CFT counted writes may target it (flowdsl.cft.put_counted).
            flags = WindowFlag.COLL_SYMMETRIC | (WindowFlag(0x08) if cft_counted else WindowFlag.DEFAULT)
            with without_torch_probe():
                self._nccl_window = comm._nccl.register_window(array_at(ptr, (nbytes,), np.uint8, array), flags)
        except Exception:
            self._closed = True
            comm._untrack(self)
            raise
        self.handle = int(self._nccl_window.handle)
        from ..lowering.backend import numpy_to_type  # noqa: PLC0415
        from ..lowering.types import WindowType  # noqa: PLC0415 - numba at first use, not at import

        self._type = WindowType(numpy_to_type(self.dtype))

    #: The :class:`flowdsl.flow.Staging` that :func:`flowdsl.flow.staging` made this window for, or None.
    flow_staging = None

    @property
    def communicator(self):
        return self._comm

    def _made_staging(self, staging) -> None:
        """Mark the window as made by :func:`flowdsl.flow.staging`: kernels see a ``StagingWindow``."""
        from ..lowering.types import WindowType  # noqa: PLC0415

        self.flow_staging = staging
        self._type = WindowType(self._type.dtype, staging=True)
        resources_changed()

    @property
    def _numba_type_(self):
        self._check_open("pass a window to a kernel")
        return self._type

    def _release(self) -> None:
        self._nccl_window.close()


#: ncclGinType_t / ncclNetDeviceType -> backend. EFA GDA offers weak signals only; the proxy (and GDAKI, GPI)
#: strong ones.
GIN_BACKENDS = {int(b): b for b in GinBackend}


def gin_backend_of(comm) -> GinBackend | None:
    """The communicator's GIN backend, or None if there is none or NCCL cannot say (2.28 has no query)."""
    try:
        return GIN_BACKENDS.get(int(comm._nccl.gin_type))
    except Exception:  # noqa: BLE001 - ncclCommQueryProperties is missing before NCCL 2.29
        return None


def gin_backends_of(comm) -> frozenset | None:
    """The GIN backends NCCL found for the communicator (``ncclCommProperties.ginSupport``, nccl4py's
    ``available_gin_types``), or None where NCCL cannot say (2.28 has no query)."""
    try:
        types = comm._nccl.properties.available_gin_types
    except Exception:  # noqa: BLE001 - ncclCommQueryProperties is missing before NCCL 2.29
        return None
    return None if types is None else frozenset(GIN_BACKENDS[int(t)] for t in types if int(t) in GIN_BACKENDS)


def gin_support_of(comm):
    """The widest GIN connection type the communicator has (a :class:`flowdsl.GinConnectionType`, NCCL's
    ``ncclCommProperties``: ``ginConnectionType`` from 2.31, else FULL where ``ginType`` names a transport
    reaching every rank, RAIL where only ``railedGinType`` does, NONE where neither), or None where NCCL
    cannot say (2.28 has no query)."""
    from ..enums import GinConnectionType  # noqa: PLC0415

    try:
        props = comm._nccl.properties
        kind = getattr(props, "gin_connection_type", None)
        if kind is not None:
            return GinConnectionType(int(kind))
        if int(props.gin_type):
            return GinConnectionType.FULL
        return GinConnectionType.RAIL if int(props.railed_gin_type) else GinConnectionType.NONE
    except Exception:  # noqa: BLE001 - ncclCommQueryProperties is missing before NCCL 2.29
        return None


def gin_backends_in(raw: bytes, layout: dict) -> frozenset | None:
    """The backends of the GIN connections an ``ncclDevComm`` struct records (what its device code
    dispatches on), or None when the layout does not say where they are."""
    if "gin_types" not in layout:
        return None
    count_at, types_at = layout["gin_types"]
    return frozenset(GIN_BACKENDS.get(t) for t in raw[types_at:types_at + raw[count_at]])


def gin_context_count_in(raw: bytes, layout: dict) -> int:
    """The ``ginContextCount`` an ``ncclDevComm`` struct records (0 when the layout does not say where)."""
    if "gin_context_count" not in layout:
        return 0
    offset, size = layout["gin_context_count"]
    return int.from_bytes(raw[offset:offset + size], "little")


class DevComm(Resource):
    """A device communicator (``ncclDevComm``) created for the loaded NCCL's device ABI.

    It travels into kernels by value, as the ABI's struct. ``requirements``
    records what it was created with (barrier counts, GIN signals, ...).
    """

    kind = "device communicator"

    def __init__(self, comm, requirements: dict, layout: dict, abi: tuple[int, int, int]):
        super().__init__(comm)
        self.requirements = dict(requirements)
        self.abi = abi
        self._layout = layout
        reqs = bytearray.fromhex(layout["requirements_initializer"])
        for name, value in requirements.items():
            offset, size = layout["requirements_fields"][name]
            fmt = {1: "<B", 4: "<i"}[size]
            struct.pack_into(fmt, reqs, offset, int(value))
        self._reqs = (ctypes.c_char * len(reqs)).from_buffer_copy(bytes(reqs))
        size = layout["dev_comm_size"]
        self._struct = (ctypes.c_char * (size + (-size) % 8))()
        lib = nccl.library()
        try:
            nccl.check(lib.ncclDevCommCreate(ctypes.c_void_p(comm._nccl.ptr), ctypes.addressof(self._reqs),
                                             ctypes.addressof(self._struct)),
                       "create the device communicator (ncclDevCommCreate)")
        except Exception:
            self._closed = True
            comm._untrack(self)
            raise
        raw = bytes(self._struct)
        backends = gin_backends_in(raw, layout)
        #: The GIN contexts a kernel may use (``ncclDevComm::ginContextCount``; the requirement is NCCL's hint),
        #: as kernels read it: ``comm.gin_context_count``.
        self.gin_context_count = gin_context_count_in(raw, layout)
        #: The GIN backend of its connections (None: no GIN connection, or not one backend for all). A
        #: kernel that uses GIN is linked for it at its first launch with this device communicator.
        self.gin_backend = gin_backend_of(comm) if backends is None else (
            next(iter(backends)) if len(backends) == 1 else None)
        # Unsigned 64-bit kernel parameters (a plain int above 2**63 would not fit ssize_t), then the
        # communicator's wait record (bounded device waits read their limit there and record a timeout).
        self._word_values = struct.unpack(f"<{len(raw) // 8}Q", raw) + (comm._wait_record.device_address,)
        self._words = tuple(ctypes.c_uint64(w) for w in self._word_values)
        from ..lowering.types import DevCommType, devcomm_words  # noqa: PLC0415

        self._type = DevCommType(self.abi, devcomm_words(size))

    @property
    def communicator(self):
        return self._comm

    def _kernel_words(self) -> tuple:
        """The ``ncclDevComm`` struct as the u64 kernel parameters it travels in."""
        self._check_open("pass a device communicator to a kernel")
        return self._words

    def _kernel_word_values(self) -> tuple:
        """The same words as ints (for a launch that packs them into one buffer)."""
        self._check_open("pass a device communicator to a kernel")
        return self._word_values

    @property
    def _numba_type_(self):
        self._check_open("pass a device communicator to a kernel")
        return self._type

    @property
    def rank(self) -> int:
        return self._comm.rank

    @property
    def nranks(self) -> int:
        return self._comm.nranks

    def _release(self) -> None:
        nccl.check(nccl.library().ncclDevCommDestroy(ctypes.c_void_p(self._comm._nccl.ptr),
                                                     ctypes.addressof(self._struct)),
                   "destroy the device communicator (ncclDevCommDestroy)")

    def __repr__(self):
        return (f"DevComm(rank={self.rank}, nranks={self.nranks}, nccl={format_version(self.abi)}, "
                f"requirements={self.requirements})")


def require_gpu(operation: str) -> None:
    """Refuse ``operation`` with :class:`flowdsl.NoDeviceError` unless the CUDA driver starts and sees a GPU."""
    try:
        from cuda.bindings import driver  # noqa: PLC0415

        err, = driver.cuInit(0)[:1]
        ok = int(err) == 0
        if ok:
            err, count = driver.cuDeviceGetCount()
            ok = int(err) == 0 and count > 0
    except Exception:  # noqa: BLE001 - any failure here means "no usable GPU"
        ok = False
    if not ok:
        raise NoDeviceError(f"Cannot {operation}: no CUDA GPU is available (the driver did not initialise "
                            "or reports no device). Run on a machine with an NVIDIA GPU, or run the same "
                            "program on the CPU simulator with flowdsl.sim.spawn(main, nranks=N).")


def multicast_supported(device: int) -> bool:
    """Whether GPU ``device`` multicasts (``CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED``: an NVSwitch system
    with NVLink SHARP); asked of the driver, which creates nothing for it."""
    from cuda.bindings import driver  # noqa: PLC0415

    err, dev = driver.cuDeviceGet(int(device))
    if int(err) != 0:
        return False
    err, value = driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, dev)
    return int(err) == 0 and bool(value)


def device_arch(device: int) -> str | None:
    """``"sm_XY"`` of GPU ``device`` (its compute capability, asked of the driver), or None where it cannot say."""
    from cuda.bindings import driver  # noqa: PLC0415

    err, dev = driver.cuDeviceGet(int(device))
    if int(err) != 0:
        return None
    attr = driver.CUdevice_attribute
    cc = []
    for which in (attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR):
        err, value = driver.cuDeviceGetAttribute(which, dev)
        if int(err) != 0:
            return None
        cc.append(int(value))
    return f"sm_{cc[0]}{cc[1]}"


class HostArrayCopies:
    """Device copies of host NumPy arrays for one launch on stream handle ``stream`` (numba-cuda's device
    arrays, as numba-cuda's own launch makes them; :mod:`flowdsl.host.transfers` says when)."""

    def __init__(self, stream: int, kernel_name: str = "a kernel"):
        from numba import cuda  # noqa: PLC0415 - a launch with host arrays: numba-cuda is loaded already

        require_gpu(f"launch {kernel_name} with a host NumPy array")  # not numba's CudaSupportError
        self.cuda = cuda
        # Stream 0 as numba's 0, not its default_stream() object: a device array holding that object fails
        # to give its __cuda_array_interface__ (its handle's __int__ returns an enum: numba-cuda 0.30.4).
        self.stream = cuda.external_stream(stream) if stream else 0

    def copy_in(self, host: np.ndarray):
        contiguous = host.flags.c_contiguous or host.flags.f_contiguous
        return self.cuda.to_device(host if contiguous else np.ascontiguousarray(host), stream=self.stream)

    def empty_like(self, host: np.ndarray):
        if host.flags.c_contiguous or host.flags.f_contiguous:
            return self.cuda.device_array_like(host, stream=self.stream)
        return self.cuda.device_array(host.shape, host.dtype, stream=self.stream)

    def copy_out(self, device, host: np.ndarray) -> None:
        if host.flags.c_contiguous or host.flags.f_contiguous:
            device.copy_to_host(host, stream=self.stream)
        else:  # a strided view: through a dense copy
            np.copyto(host, device.copy_to_host(stream=self.stream))
        if self.stream:  # results on return, pinned host memory included (numba-cuda's promise); stream 0's
            self.stream.synchronize()  # copies are synchronous already
