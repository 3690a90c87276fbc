"""The host communicator: bootstrap, symmetric allocation, windows, device communicators.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import DeviceTimeoutError, UsageError
from ..host.arrays import cuda_array_interface, is_torch, torch_bits
from .._release import format_version
from . import nccl
from ..host import checks, streams
from .memory import (DevComm, SymmetricAllocation, Window, array_at, device_pointer, gin_backends_of, gin_support_of,
                     require_gpu, resources_changed)
from .support import abi_layout
from .wait_record import GRACE, WaitRecord, aborted_error, resolve_timeout, wait_for_device

__all__ = ["init", "Communicator", "REQUIREMENT_FIELDS", "requirement_fields"]

#: keyword of device_communicator() -> field of ncclDevCommRequirements (the table lives in flowdsl.host.checks).
REQUIREMENT_FIELDS = checks.REQUIREMENT_FIELDS


def requirement_fields(requirements: dict, given, layout: dict, version) -> dict:
    """``ncclDevCommRequirements``' fields to write for checked ``requirements`` (``given``: the keys the user
    passed), in the layout of NCCL ``version``: a default for a field this release lacks is left out (NCCL 2.28
    enables GIN itself), a field the user asked for is refused naming the release that has it."""
    requirements = dict(requirements)
    if requirements.get("cft_barrier_count"):
        requirements["cft_caps"] = int(requirements.get("cft_caps", 0)) | 1  # NCCL_CFT
    present = layout["requirements_fields"]
    checks.refuse_lacking(requirements, given, {k for k in requirements if checks.REQUIREMENT_FIELDS[k] not in present},
                          version)
    return {checks.REQUIREMENT_FIELDS[k]: int(v) for k, v in requirements.items()
            if checks.REQUIREMENT_FIELDS[k] in present}


#: The environment variable that turns the collectives' cross-rank check on (``1``) for every communicator.
CHECK_COLLECTIVES_ENV = "FLOWDSL_CHECK_COLLECTIVES"


#: Bytes of NCCL's unique id (``NCCL_UNIQUE_ID_BYTES``).
UNIQUE_ID_BYTES = 128
#: Key of the unique id in the TCP store of a torchrun job.
_STORE_KEY = "flowdsl_nccl_unique_id"


_EXCHANGE_FIX = "Check that every rank runs the same flowdsl and that no other job shares MASTER_ADDR:MASTER_PORT."


def decode_unique_id(value, source: str, fix: str = _EXCHANGE_FIX) -> bytes:
    """NCCL's unique id as received from ``source``: raw bytes of NCCL's length, or a UsageError.

    The id crosses process boundaries as plain bytes, never pickled: whoever can write to
    an unauthenticated TCP store could otherwise make every rank run code of their choice.
    """
    if isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    if not isinstance(value, bytes):
        raise UsageError(f"Cannot initialise a multi-rank communicator: {source} holds a {type(value).__name__}, "
                         f"not NCCL's unique id ({UNIQUE_ID_BYTES} raw bytes). {fix}")
    if len(value) != UNIQUE_ID_BYTES:
        raise UsageError(f"Cannot initialise a multi-rank communicator: {source} holds {len(value)} bytes, but "
                         f"NCCL's unique id has {UNIQUE_ID_BYTES}. {fix}")
    return value


def exchange_through_store(store, rank: int, uid: bytes | None) -> bytes:
    """Rank 0 puts the unique id's raw bytes into ``store`` (a ``TCPStore``); every rank reads them back."""
    if rank == 0:
        store.set(_STORE_KEY, decode_unique_id(uid, "rank 0's new unique id"))
    return decode_unique_id(store.get(_STORE_KEY), f"the TCP store's key {_STORE_KEY!r}")


def broadcast_through_mpi(mpi_comm, uid: bytes | None) -> bytes:
    """The unique id from MPI rank 0, as a buffer of bytes (``Bcast``; ``bcast`` would pickle)."""
    buf = np.zeros(UNIQUE_ID_BYTES, np.uint8)
    if uid is not None:
        buf[:] = np.frombuffer(decode_unique_id(uid, "rank 0's new unique id"), np.uint8)
    mpi_comm.Bcast(buf, root=0)
    return decode_unique_id(buf.tobytes(), "MPI's broadcast")


def _broadcast_through_torch(group, uid: bytes | None) -> bytes:
    """The unique id from the group's rank 0, as a tensor of bytes (``broadcast_object_list`` would pickle)."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    backend = str(dist.get_backend(group))
    on_gpu = "nccl" in backend and "gloo" not in backend  # an NCCL-only group moves CUDA tensors only
    data = torch.zeros(UNIQUE_ID_BYTES, dtype=torch.uint8,
                       device=torch.device("cuda", torch.cuda.current_device()) if on_gpu else "cpu")
    if uid is not None:
        data.copy_(torch.frombuffer(bytearray(decode_unique_id(uid, "rank 0's new unique id")), dtype=torch.uint8))
    dist.broadcast(data, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return decode_unique_id(data.cpu().numpy().tobytes(), "torch.distributed's broadcast")


def _exchange_unique_id(rank: int, nranks: int, *, group=None, mpi_comm=None) -> bytes:
    """Rank 0 makes an NCCL unique id; every rank gets it through torch.distributed, MPI or a TCP store."""
    from nccl.core import get_unique_id  # noqa: PLC0415

    uid = get_unique_id().as_bytes if rank == 0 else None
    if mpi_comm is not None:
        return broadcast_through_mpi(mpi_comm, uid)
    import torch.distributed as dist  # noqa: PLC0415

    if group is not None or dist.is_initialized():
        return _broadcast_through_torch(group, uid)
    if "MASTER_ADDR" in os.environ:
        # Under torchrun the agent already serves the store at MASTER_PORT: every rank is a client.
        serve = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ.get("MASTER_PORT", "29500")),
                              nranks, serve)
        return exchange_through_store(store, rank, uid)
    raise UsageError("Cannot initialise a multi-rank communicator: no way to share NCCL's unique id. "
                     "Launch with torchrun, pass group= (torch.distributed) or mpi_comm= (mpi4py), or pass "
                     "unique_id= explicitly.")


def init(nranks: int | None = None, rank: int | None = None, unique_id: bytes | None = None, *,
         group=None, mpi_comm=None, device: int | None = None, check_collectives: bool | None = None,
         wait_timeout: float | None = None) -> "Communicator":
    """Create a :class:`Communicator`.

    Sources, in order: explicit ``nranks, rank, unique_id``; a ``torch.distributed``
    process group (``group=``); an mpi4py communicator (``mpi_comm=``); the
    torchrun environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``);
    otherwise a single rank.

    Args:
        device: CUDA device of this rank. Defaults to ``LOCAL_RANK`` (or 0).
        check_collectives: Compare every collective call's arguments (collective, count, dtype,
            op, root, algorithm, config) across ranks before it launches, and raise
            :class:`~flowdsl.errors.CollectiveMismatchError` on every rank where they differ. It
            all-gathers 128 bytes per rank with NCCL and waits for the stream on every call: for
            debugging. Defaults to the environment variable ``FLOWDSL_CHECK_COLLECTIVES`` (``1``: on;
            unset or ``0``: off). The simulator always checks.
        wait_timeout: Seconds a device-side wait may last before it gives up and
            ``comm.synchronize()`` raises :class:`~flowdsl.DeviceTimeoutError` (0: never).
            Defaults to ``$FLOWDSL_WAIT_TIMEOUT``, else 300.
    """
    wait_timeout = resolve_timeout(wait_timeout)
    require_gpu("initialise a flowdsl communicator")
    if mpi_comm is not None:
        nranks, rank = mpi_comm.Get_size(), mpi_comm.Get_rank()
    elif group is not None:
        import torch.distributed as dist  # noqa: PLC0415

        nranks, rank = dist.get_world_size(group), dist.get_rank(group)
    elif nranks is None:
        nranks = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
    nranks = checks.count_of(nranks, "nranks", "initialise a communicator")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < nranks:
        raise UsageError(f"Cannot initialise a communicator: rank must be an int in [0, {nranks}), got {rank!r}")
    if check_collectives is None:
        check_collectives = _env_flag(CHECK_COLLECTIVES_ENV)
    if device is None:
        device = int(os.environ.get("LOCAL_RANK", "0"))
    if isinstance(unique_id, (bytes, bytearray, memoryview)):
        unique_id = decode_unique_id(unique_id, "unique_id=", "Pass rank 0's nccl.core.get_unique_id().as_bytes.")
    if unique_id is None:
        if nranks == 1:
            from nccl.core import get_unique_id  # noqa: PLC0415

            unique_id = get_unique_id().as_bytes
        else:
            unique_id = _exchange_unique_id(rank, nranks, group=group, mpi_comm=mpi_comm)
    comm = Communicator(nranks, int(rank), unique_id, device)
    comm.check_collectives = bool(check_collectives)
    comm.wait_timeout = wait_timeout
    return comm


def _env_flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise UsageError(f"Cannot read {name}={os.environ[name]!r}: set it to 1 (on) or 0 (off)")


class Communicator:
    """One rank's NCCL communicator and the resources it owns.

    Use as a context manager, or call :meth:`close`, which releases device
    communicators and windows first, then symmetric memory, then the NCCL
    communicator.

    Attributes:
        check_collectives: Whether the collectives compare their arguments across ranks before
            each launch (see :func:`init`).
    """

    check_collectives = False
    #: The contract's: a GPU rank's memory, streams that CUDA graphs capture, a process of its own.
    memory_device = "cuda"
    cuda_graphs = True
    own_thread = True

    def __init__(self, nranks: int, rank: int, unique_id: bytes, device: int = 0, *,
                 wait_timeout: float | None = None):
        import cupy  # noqa: PLC0415
        from nccl.core import Communicator as NcclCommunicator  # noqa: PLC0415
        from nccl.core import UniqueId  # noqa: PLC0415
        from numba import cuda  # noqa: PLC0415

        self.device = device
        cupy.cuda.Device(device).use()
        cuda.select_device(device)
        uid = unique_id if not isinstance(unique_id, (bytes, bytearray)) else UniqueId.from_bytes(bytes(unique_id))
        self._nccl = NcclCommunicator.init(nranks, rank, uid)
        self.nranks = nranks
        self.rank = rank
        self.nccl_version = nccl.loaded_version()
        self._resources: list = []
        self._allocations: list[SymmetricAllocation] = []
        self._closed = False
        self._aborted = False
        self._wait_record = WaitRecord(resolve_timeout(wait_timeout), rank)

    # -- resource bookkeeping ------------------------------------------------------------
    def track(self, resource) -> None:
        self._check_open("create a resource")
        self._resources.append(resource)

    def _untrack(self, resource) -> None:
        if resource in self._resources:
            self._resources.remove(resource)
        if resource in self._allocations:
            self._allocations.remove(resource)

    def _check_open(self, operation: str) -> None:
        checks.communicator_open(self._closed, operation)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def open_resources(self) -> list:
        """Resources not yet closed (windows, device communicators, symmetric buffers)."""
        return list(self._resources)

    # -- memory --------------------------------------------------------------------------------
    def alloc(self, shape, dtype=np.float32, *, like: str = "cupy"):
        """A symmetric buffer from ``ncclMemAlloc``, as a CuPy array (or ``like="torch"``: a PyTorch
        tensor), no copy.

        The memory lives until the communicator is closed or ``comm.free(buf)``.

        Raises:
            UsageError: ``dtype`` is not one of :data:`flowdsl.host.checks.SUPPORTED_DTYPES`, the
                shape is not non-negative ints, or ``like`` is not ``"cupy"`` / ``"torch"`` (or
                PyTorch is not installed), all before anything is allocated.
        """
        self._check_open("allocate symmetric memory")
        dtype, shape = checks.alloc_dtype(dtype), checks.alloc_shape(shape)
        like = checks.alloc_like(like)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        allocation = SymmetricAllocation(self, nbytes)
        self._allocations.append(allocation)
        array = array_at(allocation.ptr, shape, dtype, allocation)
        if like == "torch":
            return checks.torch_module("allocate symmetric memory with like='torch'").from_dlpack(array)
        return array

    def _allocation_of(self, ptr: int, nbytes: int) -> SymmetricAllocation | None:
        for allocation in self._allocations:
            if not allocation.closed and allocation.contains(ptr, nbytes):
                return allocation
        return None

    def free(self, buf) -> None:
        """Return a buffer from :meth:`alloc` to NCCL now (windows over it must be closed first)."""
        ptr, nbytes = device_pointer(buf)
        allocation = self._allocation_of(ptr, nbytes)
        if allocation is None:
            raise UsageError("Cannot free this buffer: it was not allocated by comm.alloc on this communicator.")
        for res in self._resources:
            if isinstance(res, Window) and allocation.contains(res.ptr, res.nbytes):
                raise UsageError("Cannot free this buffer: a window is still registered over it. Close it first.")
        allocation.close()

    def register(self, buf, *, cft_counted: bool = False) -> Window:
        """Register ``buf`` (from :meth:`alloc`) as a symmetric window. Collective.

        Args:
            buf: A buffer from :meth:`alloc`.
            cft_counted: Register it for CFT counted writes (``NCCL_WIN_CFT_COUNTED``):
                the destination of :func:`flowdsl.cft.put_counted`, holding its counters.

        Raises:
            UsageError: ``buf`` is not (part of) a buffer from ``comm.alloc`` of
                this communicator (a NumPy array, other device memory), is empty, or
                is not contiguous.
        """
        self._check_open("register a window")
        if isinstance(buf, np.ndarray) or (is_torch(buf) and not buf.is_cuda):
            raise checks.host_array_error(buf)
        cai = cuda_array_interface(buf)
        if cai is None and is_torch(buf):  # bfloat16, fp8, uint16-64: as their bits
            buf = torch_bits(buf)
            cai = cuda_array_interface(buf)
        if cai is not None:
            ptr, nbytes = device_pointer(buf, "register")
            dtype = np.dtype(cai["typestr"])
        elif hasattr(buf, "__dlpack__"):
            import cupy  # noqa: PLC0415

            buf = cupy.from_dlpack(buf)
            ptr, nbytes = device_pointer(buf, "register")
            dtype = buf.dtype
        else:
            raise checks.not_a_buffer_error(buf)
        if self._allocation_of(ptr, nbytes) is None:
            raise UsageError(checks.NOT_FROM_ALLOC)
        return Window(self, buf, nbytes, ptr, dtype, cft_counted=cft_counted)

    # -- device communicator ---------------------------------------------------------------
    def device_communicator(self, *, for_kernel=None, grid=None, **requirements) -> DevComm:
        """Create a device communicator. Collective.

        Args:
            for_kernel: A ``@flowdsl.kernel``; requirements it needs are derived from it
                (e.g. one LSA barrier per block of ``grid`` when it uses ``lsa.barrier``).
            grid: The launch grid of ``for_kernel``.
            **requirements: ``ncclDevCommRequirements``' fields in snake_case
                (``flowdsl.host.checks.DEVICE_REQUIREMENTS``): ``lsa_barrier_count``, ``barrier_count``,
                ``rail_gin_barrier_count``, ``world_gin_barrier_count``, ``gin_context_count``,
                ``gin_signal_count``, ``gin_counter_count``, ``gin_connection_type`` (a
                :class:`flowdsl.GinConnectionType`; FULL by default when GIN resources are asked for),
                ``gin_custom_stride``, ``gin_exclusive_contexts``, ``gin_queue_depth``, ``gin_traffic_class``,
                ``gin_strong_signals_required`` (True unless set: a backend without strong signals, EFA GDA,
                takes the device communicator only with it False, and NCCL's legacy signals are strong exactly
                where it is True), ``gin_va_signals_required``, ``gin_force_enable``, ``gin_type`` (a
                :class:`flowdsl.GinBackend`; left out, NCCL picks), ``cft_barrier_count``, ``cft_caps`` (NCCL >= 2.31; ``cft_barrier_count`` > 0 also asks for CFT,
                ``cft_caps=1``).
        """
        self._check_open("create a device communicator")
        given = set(requirements)
        requirements = checks.device_requirements(requirements, for_kernel, grid, gin_support_of(self),
                                                  gin_backends_of(self))
        if requirements.get("lsa_multimem"):
            self._check_multimem()
        layout = abi_layout(self.nccl_version)
        fields = requirement_fields(requirements, given, layout, self.nccl_version)
        return DevComm(self, fields, layout, self.nccl_version)

    def _check_multimem(self) -> None:
        """Refuse multimem where this GPU or NCCL's settings have none, before NCCL would create multicast
        objects for it (``cuMulticastCreate``)."""
        why = self._multimem_missing()
        if why is not None:
            raise checks.multimem_unavailable(why)

    def _multimem_missing(self) -> str | None:
        """What lacks NVLink SHARP here (None: nothing): NCCL's settings, then the GPU (asked of the driver,
        which creates nothing for it)."""
        if os.environ.get("NCCL_NVLS_ENABLE", "").strip() == "0":
            return "NCCL_NVLS_ENABLE=0 turns NVLink SHARP off in NCCL"
        from .memory import multicast_supported  # noqa: PLC0415

        if not multicast_supported(self.device):
            return f"GPU {self.device} does not multicast (CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED is 0)"
        return None

    @property
    def supports_multimem(self) -> bool:
        """Whether ``device_communicator(lsa_multimem=True)`` would be accepted here (NVLink SHARP: this GPU
        multicasts and NCCL's NVLS is not turned off); asks the driver, creates nothing. The simulator's
        communicator has the same property (``flowdsl.sim.spawn(..., multimem=True)``)."""
        return self._multimem_missing() is None

    @property
    def cft_missing(self) -> str | None:
        """What kernels using :mod:`flowdsl.cft` (counted writes included: the CFT programs of
        :mod:`flowdsl.collectives`) lack on this communicator, or None where they can run: NCCL >= 2.32,
        flowdsl's CFT build for the loaded release, nvJitLink >= 13.3, an sm_100 or newer GPU
        (``flowdsl.runtime.support.cft_missing``; ``flowdsl info`` says the same of the machine). Creates
        nothing. Whether NCCL's CFT domain spans every node (``cftSize``) is not known before a device
        communicator exists. The simulator's communicator has the same property."""
        from ..lowering.target import linker_cuda_version  # noqa: PLC0415
        from .memory import device_arch  # noqa: PLC0415
        from .support import cft_missing  # noqa: PLC0415

        try:
            linker = linker_cuda_version()
        except Exception:  # noqa: BLE001 - no nvJitLink to ask
            linker = None
        missing = cft_missing(self.nccl_version, device_arch(self.device), linker)
        return "needs " + "; ".join(missing) if missing else None

    # -- synchronisation, timeouts and teardown -------------------------------------------------
    @property
    def wait_timeout(self) -> float:
        """Seconds a device-side wait may last before it gives up (0: never); settable, and read
        by running kernels at their next check."""
        return self._wait_record.timeout

    @wait_timeout.setter
    def wait_timeout(self, seconds: float) -> None:
        self._wait_record.timeout = seconds

    def device_error(self) -> DeviceTimeoutError | None:
        """The timeout a kernel of this communicator recorded, or None (cheap: one host read).

        Kernels whose waits gave up ran to their end with wrong results; ``synchronize``
        raises this error, and so does every later ``synchronize``.
        """
        return self._wait_record.error("run kernels on this communicator")

    @property
    def nccl(self):
        """NCCL's host communicator (an ``nccl.core.Communicator`` of nccl4py): what ``algorithm="nccl"``
        and the cross-rank check of the collectives use. None on the simulator."""
        return self._nccl

    def barrier(self) -> None:
        """Host barrier: returns once every rank has called it, with this rank's launched work
        finished. Collective (an all-reduce of one element through NCCL's host communicator, on
        the current CuPy stream, between two :meth:`synchronize`)."""
        self._check_open("enter the host barrier")
        import cupy  # noqa: PLC0415
        from nccl.core import NcclRedOp  # noqa: PLC0415

        token = self.__dict__.get("_barrier_token")
        if token is None:
            with cupy.cuda.Device(self.device):
                token = self._barrier_token = cupy.zeros(1, cupy.int32)
        self.synchronize()
        with nccl.without_torch_probe():
            self._nccl.allreduce(token, token, NcclRedOp.SUM, stream=cupy.cuda.get_current_stream().ptr)
        self.synchronize()

    def exchange(self, words, stream=None, *, label: str = "comm.exchange()") -> np.ndarray:
        """Every rank's ``words`` (int64, one length on every rank) as an ``(nranks, len)`` array: NCCL's
        all-gather on ``stream`` (a handle), read back, the stream waited for. Collective."""
        self._check_open(f"call {label}")
        import cupy  # noqa: PLC0415

        words = np.ascontiguousarray(words, np.int64).reshape(-1)
        buffers = self.__dict__.setdefault("_exchange_buffers", {})
        if words.size not in buffers:
            with cupy.cuda.Device(self.device):
                buffers[words.size] = (cupy.zeros(words.size, np.int64), cupy.zeros(words.size * self.nranks, np.int64))
        send, recv = buffers[words.size]
        handle = int(stream or 0)
        out = np.empty(words.size * self.nranks, np.int64)
        # Copies in stream order on the handle itself (CuPy's stream wrappers of a handle are deprecated).
        runtime = cupy.cuda.runtime
        with cupy.cuda.Device(self.device):
            runtime.memcpyAsync(send.data.ptr, words.ctypes.data, words.nbytes, runtime.memcpyHostToDevice, handle)
            with nccl.without_torch_probe():
                self._nccl.allgather(send, recv, stream=handle)
            runtime.memcpyAsync(out.ctypes.data, recv.data.ptr, out.nbytes, runtime.memcpyDeviceToHost, handle)
            runtime.streamSynchronize(handle)
        return out.reshape(self.nranks, words.size)

    def synchronize(self) -> None:
        """Wait for all work on this rank's device.

        While it waits it watches the communicator's wait record, so it never hangs on a
        device-side wait: waits give up after ``wait_timeout`` or on :meth:`abort`.

        Raises:
            DeviceTimeoutError: A device-side wait of this communicator gave up (the message
                says who waited for what, from which peer).
            ResourceClosedError: The communicator was aborted meanwhile.
            UsageError: The current CuPy or PyTorch stream is capturing a CUDA graph: waiting
                for the whole device is illegal then and would invalidate the capture.
        """
        import cupy  # noqa: PLC0415

        for handle in streams.current_streams(self.device):
            streams.refuse_during_capture(
                handle, "synchronize", "waiting for the whole device is illegal while a stream captures (it "
                "would invalidate the capture)",
                fix="Synchronize after the capture ends (after end_capture() or the torch.cuda.graph block)")
        finished = wait_for_device(cupy.cuda.Device(self.device).synchronize, self._wait_record)
        error = self._wait_record.error("synchronize")
        if error is not None:
            if not finished:
                error.add_note(f"The device was still busy {GRACE:g} s after its waits gave up: a kernel spins "
                               "outside flowdsl's bounded waits (a loop without flowdsl.wait.poll, a CFT wait, a "
                               "GIN flush).")
            raise error
        if self._wait_record.aborted or not finished:
            raise aborted_error(device_busy=not finished)

    def abort(self) -> None:
        """End this rank's spinning kernels and release the communicator without its peers.

        Every bounded wait of this communicator's kernels gives up at its next check and the
        kernels run to their end; then NCCL's communicator is aborted (``ncclCommAbort``)
        and every resource is released without collective calls. Safe from another thread
        (a thread blocked in :meth:`synchronize` then raises). A second call does nothing.
        """
        if self._closed:
            return
        self._closed = self._aborted = True
        self._wait_record.abort()
        import cupy  # noqa: PLC0415

        idle = wait_for_device(cupy.cuda.Device(self.device).synchronize, self._wait_record, limit=GRACE)
        allocations = list(self._allocations)
        for res in list(self._resources):
            res._closed = True  # NCCL's abort releases windows and device communicators
            self._untrack(res)
        resources_changed()
        self._nccl.abort()
        if idle:  # memory (and the record) a kernel may still use are left alone
            for allocation in allocations:
                allocation._release()
            self._wait_record.close()

    def close(self) -> None:
        """Close every resource still open (device communicators, windows, memory), then NCCL's communicator.

        Never hangs: it waits for the device up to ``wait_timeout`` (its kernels' waits give
        up by then), and when the device is still busy, or a wait gave up (a peer may be
        gone, so collective teardown could hang), it aborts instead (:meth:`abort`).
        """
        if self._closed:
            return
        import cupy  # noqa: PLC0415

        limit = self.wait_timeout + GRACE if self.wait_timeout else None
        idle = wait_for_device(cupy.cuda.Device(self.device).synchronize, self._wait_record, limit=limit)
        if not idle or self._wait_record.stopped:
            self.abort()
            return
        for kind in (DevComm, Window, SymmetricAllocation):
            for res in [r for r in self._resources if isinstance(r, kind)]:
                res.close()
        self._closed = True
        self.__dict__.pop("_barrier_token", None)
        self._nccl.destroy()
        self._wait_record.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"Communicator(rank={self.rank}, nranks={self.nranks}, device={self.device}, "
                f"nccl={format_version(self.nccl_version)})")

