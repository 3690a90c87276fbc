"""Host side of the collectives: checks, staging resources, the launch.

Everything about the arguments is checked before anything is launched, and then
compared across ranks (always on the simulator, on GPUs with ``check_collectives``:
:mod:`flowdsl.collectives._agree`). Each communicator gets one :class:`_FlowState` per :class:`FlowConfig` (a staging
window and a device communicator), created at first use and closed with the
communicator.
"""

from __future__ import annotations

import functools
import reprlib
import weakref
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .._flow_staging import lsa_team_size
from ..enums import Protocol, RedOp
from .._release import arch_cc
from ..errors import UsageError
from ..host import checks
from ..host.arrays import is_torch
from ..runtime.nccl import without_torch_probe
from ..host.streams import refuse_during_capture, stream_handle
from . import _agree, cost
from ._config import ALGORITHMS, DTYPES, FP8_REDUCTIONS_FROM_SM, OPS, FlowConfig, default_config
from ._ops import DEVICE, PreMulSum, host_bits
from .programs import PROGRAMS

__all__ = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"]

#: torch dtypes by name (torch.uint32 and torch.uint64 exist from PyTorch 2.3).
_TORCH_DTYPES = {"torch.int8": "int8", "torch.uint8": "uint8", "torch.int32": "int32", "torch.uint32": "uint32",
                 "torch.int64": "int64", "torch.uint64": "uint64", "torch.float16": "float16",
                 "torch.float32": "float32", "torch.float64": "float64", "torch.bfloat16": "bfloat16",
                 "torch.float8_e4m3fn": "float8_e4m3fn", "torch.float8_e5m2": "float8_e5m2"}


class _State:
    """What the collectives make on a communicator and track with it (``comm.track``): ``closed`` once
    :meth:`close` has released it (``comm.open_resources`` lists it until then)."""

    closed = False


class _FlowState(_State):
    """A communicator's staging window and device communicator for one :class:`FlowConfig`."""

    def __init__(self, comm, config: FlowConfig):
        from ..flow import MAX_CONNECTIONS, staging  # noqa: PLC0415

        self.comm, self.config = comm, config
        self.lsa_size = lsa_team_size(comm)
        self.gin = self.lsa_size < comm.nranks
        self.window = staging(comm, config, gin=self.gin)  # zeroed on every rank, typed StagingWindow
        self.buffer = self.window.flow_staging.buffer
        reqs = {}
        if self.gin:  # ready and credit signals per (channel, connection), one context
            reqs = {"gin_context_count": 1, "gin_signal_count": 2 * config.channels * MAX_CONNECTIONS}
        self.devcomm = comm.device_communicator(**reqs)
        self._one_shot = None  # (buffer, window) of one-shot all-reduces, made at first use
        comm.synchronize()

    def one_shot_window(self, operation: str, stream=None):
        """The window one-shot all-reduces write into (epochs and LL lines, zeroed), made at first use."""
        if self._one_shot is None:
            from .programs import one_shot_words  # noqa: PLC0415

            if stream is not None and self.comm.cuda_graphs:
                refuse_during_capture(stream, operation, "the first one-shot call allocates and registers its "
                                      "window (not capturable)")
            buffer = self.comm.alloc(one_shot_words(self.comm.nranks), np.uint64)
            _fill(buffer, 0)
            self._one_shot = (buffer, self.comm.register(buffer))
            self.comm.synchronize()  # zero on every rank before any peer writes into it
        return self._one_shot[1]

    def close(self):
        if self.closed:
            return
        self.closed = True
        self.comm.__dict__.pop("_flowdsl_plans", None)  # their launches hold this device communicator
        buffers = [self.buffer]
        if self._one_shot is not None:
            buffers.append(self._one_shot[0])
            self._one_shot[1].close()
            self._one_shot = None
        for res in (self.devcomm, self.window):
            res.close()
        for buf in buffers:
            self.comm.free(buf)


def _fill(buf, value):
    if hasattr(buf, "fill"):
        buf.fill(value)
    else:
        buf[...] = value


_CLOSED = ("Cannot run a collective: the communicator is closed, and with it its device communicator. "
           "Create one with flowdsl.init()")


def _closed(comm) -> bool:
    return comm.closed


def _state(comm, config: FlowConfig, operation: str = "run a collective", stream: int | None = None,
           own: str | None = None) -> _FlowState:
    """The communicator's :class:`_FlowState` for ``config``, created at first use (:func:`_made_once`). ``own``:
    the collective that has a staging window and device communicator of its own (all_to_all: its inboxes join
    other ranks than the ring's and tree's, and a Flow inbox keeps one sender across launches)."""
    return _made_once(comm, config if own is None else (config, own), lambda: _FlowState(comm, config), operation,
                      stream, "the first call on this communicator (and config) allocates and registers its staging "
                      "window and creates a device communicator (not capturable)")


def _made_once(comm, key, make, operation: str, stream: int | None, why: str):
    """The communicator's state under ``key``, ``make()`` at first use and tracked with the communicator's
    resources; not while ``stream`` captures a CUDA graph (creating one allocates, registers and synchronizes:
    ``why``)."""
    if _closed(comm):
        raise UsageError(_CLOSED)
    states = comm.__dict__.setdefault("_flowdsl_collectives", {})
    st = states.get(key)
    if st is None:
        if stream is not None and comm.cuda_graphs:
            refuse_during_capture(stream, operation, why)
        st = states[key] = make()
        comm.track(st)
    return st


class _WindowState(_State):
    """A device communicator made with ``devcomm`` and a window of ``words`` u64 that every rank registers
    (with ``register``), zeroed on every rank before any uses it; closed, and the buffer freed, together."""

    def __init__(self, comm, words: int, devcomm: dict, register: dict):
        self.comm = comm
        self.devcomm = comm.device_communicator(**devcomm)
        self.buffer = comm.alloc(words, np.uint64)
        _fill(self.buffer, 0)  # comm.alloc does not zero
        self.window = comm.register(self.buffer, **register)
        comm.synchronize()  # zero on every rank before any peer reads or adds to it

    def close(self):
        if self.closed:
            return
        self.closed = True
        self.comm.__dict__.pop("_flowdsl_plans", None)  # their launches hold this device communicator
        for res in (self.devcomm, self.window):
            res.close()
        self.comm.free(self.buffer)


class _MultimemState(_WindowState):
    """What multimem all-reduces of one :class:`FlowConfig` use: a device communicator with ``lsa_multimem``
    and one LSA barrier per channel (a block syncs its own), and a window every rank registers, that the
    message goes through a chunk at a time (:func:`multimem_window_bytes`; zeroed: the padding a call reads
    before it writes). No Flow staging."""

    def __init__(self, comm, config: FlowConfig):
        super().__init__(comm, multimem_window_bytes(config, lsa_team_size(comm)) // 8,
                         {"lsa_multimem": True, "lsa_barrier_count": config.channels}, {})


def multimem_window_bytes(config: FlowConfig, lsa_size: int) -> int:
    """Bytes of a multimem all-reduce's window per rank: what one connection's slots of every channel hold
    (``channels x nslots x slot_bytes``: 12 MiB for ``FlowConfig()``, 512 bytes for the simulator tests' tiny
    shape, so their messages cross chunks), and at least one 16-byte vector per block and LSA rank."""
    return max(config.channels * config.nslots * config.slot_bytes, config.channels * lsa_size * 16)


def _multimem_state(comm, config: FlowConfig, operation: str, stream: int | None) -> _MultimemState:
    """The communicator's :class:`_MultimemState` for ``config``, created at first use (:func:`_made_once`)."""
    return _made_once(comm, (config, "multimem"), lambda: _MultimemState(comm, config), operation, stream,
                      "the first multimem call on this communicator (and config) allocates and registers its window "
                      "and creates a device communicator (not capturable)")


def _multimem_available(comm, kernel_dtype: str, redop) -> bool:
    """Whether a multimem all_reduce can take this call: one LSA team, NVLink SHARP, and a multimem form of
    the type and operator (what :func:`_check_multimem` refuses otherwise)."""
    from .programs import multimem_form  # noqa: PLC0415

    return (lsa_team_size(comm) == comm.nranks and comm.supports_multimem
            and multimem_form(kernel_dtype, RedOp.SUM if redop is None else redop) is not None)


_NOT_MULTIMEM = "Use 'ring', 'tree', 'one_shot' or 'auto'"


def _check_multimem(comm, dtype: str, kernel_dtype: str, redop) -> None:
    """Refuse a multimem all_reduce this communicator, type or operator cannot run, before anything is made."""
    from .. import mem  # noqa: PLC0415
    from .programs import multimem_form  # noqa: PLC0415

    lsa_size = lsa_team_size(comm)
    if lsa_size < comm.nranks:
        raise UsageError(f"Cannot all_reduce with algorithm='multimem': the NVLink switch reaches one LSA team, and "
                         f"this communicator spans several ({comm.nranks} ranks, {lsa_size} per team). Use 'ring', "
                         "'tree' or 'auto'")
    if not comm.supports_multimem:
        raise UsageError("Cannot all_reduce with algorithm='multimem': this communicator has no NVLink SHARP "
                         "(comm.supports_multimem is False: no NVSwitch that multicasts, NCCL_NVLS_ENABLE=0, or a "
                         f"simulator spawned without multimem=True). {_NOT_MULTIMEM}")
    op = RedOp.SUM if redop is None else redop
    if multimem_form(kernel_dtype, op) is None:
        takes = {}
        for table in (mem.MULTIMEM_VECTOR_OPS, mem.MULTIMEM_SCALAR_OPS):
            for t, ops in table.items():
                takes.setdefault("bfloat16" if t == "uint16" else t, set()).update(ops)
        has = "; ".join(f"{t} {'/'.join(o.name.lower() for o in sorted(ops))}" for t, ops in takes.items())
        raise UsageError(f"Cannot all_reduce {dtype} with op={op.name.lower()} and algorithm='multimem': PTX's "
                         f"multimem.ld_reduce has no such form (it reduces {has}; avg is its sum, divided). "
                         f"{_NOT_MULTIMEM}")


class _CftState(_WindowState):
    """What the all_gather with its far phase over CFT uses for one :class:`FlowConfig`: a counted window
    (``comm.register(buf, cft_counted=True)``) laid out for ``config.channels`` by
    :func:`~flowdsl.collectives.programs.cft_all_gather_layout` (a u64 counter per channel, then each channel's
    far and share slots), zeroed once (the counters only ever rise), and a device communicator with one CFT
    barrier and one LSA barrier per channel. No Flow staging."""

    def __init__(self, comm, config: FlowConfig):
        from .programs import cft_all_gather_layout  # noqa: PLC0415

        nbytes, _ = cft_all_gather_layout(config.channels, comm.nranks // lsa_team_size(comm))
        super().__init__(comm, nbytes // 8, {"cft_barrier_count": config.channels,
                                             "lsa_barrier_count": config.channels}, {"cft_counted": True})


def _cft_state(comm, config: FlowConfig, operation: str, stream: int | None) -> _CftState:
    """The communicator's :class:`_CftState` for ``config``, created at first use (:func:`_made_once`)."""
    return _made_once(comm, (config, "hierarchical_cft"), lambda: _CftState(comm, config), operation, stream,
                      "the first hierarchical_cft call on this communicator (and config) allocates and registers its "
                      "counted window and creates a device communicator (not capturable)")


#: The algorithms whose far phase goes over CFT (sm_100, NCCL >= 2.32).
CFT_ALGORITHMS = ("hierarchical_cft",)


def cft_refusal(collective: str, comm, algorithm: str = "hierarchical_cft") -> str | None:
    """Why ``collective`` cannot run with its far phase over CFT on ``comm`` (None: it can): what
    :func:`hierarchical_refusal` says of the layout (several nodes of several ranks, node by node), then what
    the communicator lacks for CFT (``comm.cft_missing``: the NCCL release, the GPU, the CFT build; on the
    simulator a release simulated before 2.32). One function for the GPU and the simulator."""
    why = hierarchical_refusal(collective, comm, algorithm)
    if why is not None:
        return why
    missing = comm.cft_missing  # the host contract's (flowdsl.host.contract.Communicator)
    if missing is not None:
        return (f"Cannot {collective} with algorithm={algorithm!r}: its far phase goes over CFT, and this "
                f"communicator cannot run CFT kernels ({missing}). Use 'hierarchical' (the far phase over GIN) "
                "or 'auto'")
    return None


# ---- argument checks ---------------------------------------------------------------------------

class _Buffer:
    """What the launch needs of one array argument."""

    __slots__ = ("array", "dtype", "size", "ptr", "device", "name", "nbytes")

    def __init__(self, array, name, operation, sim=False):
        self.array, self.name = array, name
        cai = getattr(array, "__cuda_array_interface__", None) if not is_torch(array) else None
        if is_torch(array):
            self._from_torch(array, operation, sim)  # torch has no __cuda_array_interface__ for fp8
        elif cai is not None:
            self._from_cai(array, cai, operation)
        elif isinstance(array, np.ndarray) and getattr(array, "__flowdsl_sim__", False) is not False:
            self._check_contiguous(array.shape, array.strides, array.itemsize, operation)
            self.dtype, self.size, self.ptr, self.device = array.dtype.name, array.size, array.ctypes.data, None
            self.nbytes = array.nbytes
        elif isinstance(array, np.ndarray):
            raise UsageError(f"Cannot {operation}: {name} is a NumPy array in host memory. Pass a CuPy array "
                             "or a PyTorch CUDA tensor (e.g. from comm.alloc)")
        else:
            raise UsageError(f"Cannot {operation}: {name} ({type(array).__name__}) is not a device array. Pass a "
                             "CuPy array or a PyTorch CUDA tensor")
        if self.dtype == "uint16":  # NumPy and CuPy have no bfloat16: uint16 arrays carry its bits
            self.dtype = "bfloat16"
        if self.dtype not in DTYPES:
            raise UsageError(f"Cannot {operation}: {name} has dtype {self.dtype}; the collectives take "
                             f"{', '.join(DTYPES)}")

    def _check_contiguous(self, shape, strides, itemsize, operation):
        if not checks.contiguous(shape, strides, itemsize):
            raise UsageError(f"Cannot {operation}: {self.name} is not contiguous (shape {tuple(shape)}, strides "
                             f"{tuple(strides)} bytes). Pass a contiguous array (.contiguous() / "
                             "cupy.ascontiguousarray)")

    def _from_torch(self, t, operation, sim):
        if not t.is_cuda and not sim:  # on the simulator CPU tensors stand for device memory
            raise UsageError(f"Cannot {operation}: {self.name} is a PyTorch tensor in host memory. Move it to "
                             "the GPU (.cuda())")
        self._check_contiguous(t.shape, [s * t.element_size() for s in t.stride()], t.element_size(), operation)
        self.dtype = _TORCH_DTYPES.get(str(t.dtype), str(t.dtype).removeprefix("torch."))
        self.size, self.ptr, self.device = t.numel(), t.data_ptr(), t.device.index
        self.nbytes = self.size * t.element_size()

    def _from_cai(self, array, cai, operation):
        shape, strides = cai["shape"], cai.get("strides")
        self._check_contiguous(shape, strides, np.dtype(cai["typestr"]).itemsize, operation)
        torch_dtype = str(getattr(array, "dtype", ""))
        self.dtype = _TORCH_DTYPES.get(torch_dtype) or np.dtype(cai["typestr"]).name
        self.size = int(np.prod(shape, dtype=np.int64))
        self.nbytes = self.size * np.dtype(cai["typestr"]).itemsize
        self.ptr = cai["data"][0]
        dev = getattr(array, "device", None)
        self.device = getattr(dev, "id", None) if not hasattr(dev, "index") else dev.index

    def same_memory(self, other) -> bool:
        """Whether both name the same memory (an in-place call). Empty arrays name none: CuPy gives every
        empty array one address (0), so a pointer comparison alone took two of them for one buffer."""
        return self is other or (self.ptr == other.ptr and self.nbytes > 0 and other.nbytes > 0)

    def overlaps(self, other) -> bool:
        """Whether any byte of one is a byte of the other."""
        return self is other or (self.nbytes > 0 and other.nbytes > 0 and self.ptr < other.ptr + other.nbytes
                                 and other.ptr < self.ptr + self.nbytes)

    def kernel_array(self):
        """The array as the kernel sees it: 1-D, bfloat16 as uint16, fp8 as uint8 (a CPU tensor on the
        simulator stays a tensor: the simulator's launch takes it as the rank's device memory, as a GPU
        launch takes a CUDA tensor; a NumPy view of it would be a host array, copied in and out)."""
        a = self.array
        if "torch" in type(a).__module__:
            a = _torch_storage(a, self.dtype)
        return a.reshape(-1)


def _torch_storage(t, dtype):
    """bfloat16 and fp8 tensors as the uint16 / uint8 bits the kernels take."""
    if dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import torch  # noqa: PLC0415

        return t.view(torch.uint16 if dtype == "bfloat16" else torch.uint8)
    return t


#: dtype= overrides: the storage each element type may be given in.
_OVERRIDES = {"float8_e4m3fn": "uint8", "float8_e5m2": "uint8", "bfloat16": "bfloat16"}



#: The collectives that reduce (take ``op=``) and those with a root (take ``root=``).
_REDUCING = ("all_reduce", "reduce_scatter", "reduce")
_ROOTED = ("broadcast", "reduce")
# Collectives whose src and dst must be apart (NCCL's all-to-all is not in place either).
_APART = ("all_to_all",)


def _is_communicator(comm) -> bool:
    return comm is not None and hasattr(comm, "alloc")


def _check(operation, comm, src, dst, *, op=None, root=None, algorithm="auto", ratio_in=1, ratio_out=1,
           dtype=None):
    """Check the arguments; return (src, dst, count, redop, root, scalar) (``scalar``: premulsum's, else None)."""
    if not _is_communicator(comm):
        raise UsageError(f"Cannot {operation}: {_named(comm)} is not a flowdsl communicator. Pass the one "
                         "from flowdsl.init() (or the simulator's)")
    if _closed(comm):
        raise UsageError(_CLOSED)
    _refuse_after_a_timeout(comm)
    sim = comm.memory_device == "cpu"  # host memory stands for the rank's GPU memory
    s = _Buffer(src, "src", operation, sim)
    d = s if dst is None or dst is src else _Buffer(dst, "dst", operation, sim)
    if dtype is not None:
        storage = _OVERRIDES.get(str(dtype))
        if storage is None:
            raise UsageError(f"Cannot {operation} with dtype={dtype!r}: dtype= names what uint8 or uint16 "
                             f"arrays hold: one of {', '.join(_OVERRIDES)}")
        for b in {id(s): s, id(d): d}.values():
            if b.dtype != storage:
                raise UsageError(f"Cannot {operation} with dtype={dtype!r}: {b.name} is {b.dtype}; {dtype} "
                                 f"travels in {'uint16' if storage == 'bfloat16' else storage} arrays")
            b.dtype = str(dtype)
    if operation in _APART and d.overlaps(s):
        raise UsageError(f"Cannot {operation} {'in place' if d.same_memory(s) else 'with dst overlapping src'}: a "
                         "rank's block for a peer would be overwritten by the peer's block before it is sent. Pass a "
                         "dst of its own")
    if d.dtype != s.dtype:
        raise UsageError(f"Cannot {operation}: src is {s.dtype} but dst is {d.dtype}. Pass arrays of one dtype")
    want_dev = comm.device
    for b in (s, d):
        if b.device is not None and want_dev is not None and b.device != want_dev:
            raise UsageError(f"Cannot {operation}: {b.name} is on device {b.device} but the communicator "
                             f"uses device {want_dev}. Move it there first")
    n = comm.nranks
    # src holds ratio_in * count elements, dst ratio_out * count.
    if s.size % ratio_in:
        raise UsageError(f"Cannot {operation}: src has {s.size} elements, not a multiple of nranks={n}. "
                         f"Pass nranks * count elements")
    count = s.size // ratio_in
    if d.size != count * ratio_out:
        per_src = f"src's {s.size} elements / nranks={n}" if ratio_in > 1 else f"src's {s.size} elements"
        per_dst = f", times nranks={n}" if ratio_out > 1 else ""
        raise UsageError(f"Cannot {operation}: dst has {d.size} elements but {count * ratio_out} are needed "
                         f"({per_src}{per_dst}). Pass a dst of {count * ratio_out} elements")
    redop = _redop(operation, op) if operation in _REDUCING else None
    root = _root(operation, root, n) if operation in _ROOTED else None
    if algorithm not in ALGORITHMS:
        raise UsageError(f"Cannot {operation}: unknown algorithm {algorithm!r}. Use one of "
                         f"{', '.join(repr(a) for a in ALGORITHMS)}")
    scalar = _scalar(operation, op, s, dtype, comm, sim) if redop == RedOp.PREMULSUM else None
    if redop is not None and s.dtype.startswith("float8") and count > 0 and not sim:
        _refuse_fp8_below_sm90(operation, s.dtype, comm)
    return s, d, count, redop, root, scalar


def _refuse_fp8_below_sm90(operation, dtype, comm) -> None:
    """NCCL reduces fp8 on sm_90 and newer only (and lets empty calls through): what NCCL refuses, the
    collectives refuse (the simulator models no GPU, so it takes fp8 as an sm_90 would)."""
    arch = comm.__dict__.get("_flowdsl_arch")
    if arch is None:
        from .._targets import device_target  # noqa: PLC0415

        arch = comm.__dict__["_flowdsl_arch"] = device_target().arch
    if arch_cc(arch) < divmod(FP8_REDUCTIONS_FROM_SM, 10):
        raise UsageError(f"Cannot {operation} {dtype} on this {arch} GPU: NCCL reduces fp8 only on sm_90 and newer "
                         "(\"FP8 reduction support begins with sm90\"), and the collectives refuse what NCCL "
                         "refuses. Reduce in bfloat16 or float16, or all_gather / broadcast the fp8 values (copies "
                         "take fp8 on any GPU)")


_NAMED = ", ".join(name for name, redop in OPS.items() if redop != RedOp.PREMULSUM)


def _redop(operation, op) -> RedOp:
    """``op=`` as a :class:`RedOp`: a name of :data:`OPS`, a RedOp, or a :class:`PreMulSum` (None is no
    operator; ``premulsum`` needs its scalar, so only a PreMulSum is that)."""
    if isinstance(op, PreMulSum):
        return RedOp.PREMULSUM
    redop = OPS.get(op) if isinstance(op, str) else (
        RedOp(op) if isinstance(op, RedOp) or (type(op) is int and op in tuple(RedOp)) else None)
    if redop is None:
        raise UsageError(f"Cannot {operation}: unknown op {op!r}. Use one of {_NAMED} or "
                         "flowdsl.collectives.premul_sum(scalar) (or a flowdsl.RedOp)")
    if redop == RedOp.PREMULSUM:
        raise UsageError(f"Cannot {operation} with op={op!r}: premulsum multiplies each rank's input by that rank's "
                         "scalar, and none was given. Pass op=flowdsl.collectives.premul_sum(scalar)")
    return redop


class _Scalar(NamedTuple):
    """A premulsum call's scalar as the kernel takes it: the host immediate's ``bits``, or the device
    array (``buffer``, checked like the data's arrays); ``op`` is the PreMulSum."""

    op: PreMulSum
    bits: int = 0
    buffer: "_Buffer | None" = None


def _scalar(operation, op: PreMulSum, s, dtype, comm, sim) -> _Scalar:
    """``op``'s scalar checked against the data (``s``, of the call's element type, ``dtype=`` applied): a
    host immediate converted to that type, or a one-element device array of it."""
    if op.residence != DEVICE:
        return _Scalar(op, host_bits(op, s.dtype, operation))
    b = _Buffer(op.scalar, "premul_sum's scalar", operation, sim)
    if dtype is not None and b.dtype == _OVERRIDES.get(str(dtype)):  # uint8 codes of the call's fp8 format
        b.dtype = str(dtype)
    if b.dtype != s.dtype:
        storage = {"bfloat16": "a torch.bfloat16 tensor or a uint16 array of its bits"}.get(s.dtype, s.dtype)
        raise UsageError(f"Cannot {operation} {s.dtype} with {op!r}: its scalar is {b.dtype}, and NCCL takes the "
                         f"scalar in the data's type. Pass a one-element array of {storage}")
    want = comm.device
    if b.device is not None and want is not None and b.device != want:
        raise UsageError(f"Cannot {operation}: premul_sum's scalar is on device {b.device} but the communicator "
                         f"uses device {want}. Move it there first")
    return _Scalar(op, 0, b)


def _root(operation, root, nranks) -> int:
    """``root=`` as a rank: an int (not a float or a string) in ``0 .. nranks-1``."""
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
        raise UsageError(f"Cannot {operation}: root must be an int rank (0..{nranks - 1}), got {root!r} "
                         f"({type(root).__name__})")
    if not 0 <= int(root) < nranks:
        raise UsageError(f"Cannot {operation}: root {root} is not a rank of this communicator (0..{nranks - 1})")
    return int(root)


class _Plan:
    """A checked, typed and packed call: what a repeated call with the same arrays launches.

    It holds its arrays weakly, so a cached plan never keeps memory alive: a call with another
    array, or a new array that took a freed one's ``id``, is planned afresh. ``run(src, dst)``
    launches; ``algorithm`` is the program it runs (what ``algorithm="auto"`` chose).
    ``agree`` compares the call's signature across ranks again (None: nothing to compare).
    """

    __slots__ = ("run", "src", "dst", "pointer", "ptrs", "algorithm", "agree")

    def __init__(self, run, src, dst, algorithm=None):
        self.run, self.algorithm, self.agree = run, algorithm, None
        self.src = weakref.ref(src)
        self.dst = _no_array if dst is None else weakref.ref(dst)
        kinds = {type(src), type(dst)} - {type(None)}
        self.pointer = _pointer_reader(kinds.pop()) if len(kinds) == 1 else _any_pointer
        self.ptrs = self._pointers(src, dst)

    def valid(self, src, dst) -> bool:
        """Whether ``src`` and ``dst`` are the planned arrays, still over the planned memory."""
        return (self.src() is src and self.dst() is dst
                and (self.pointer is None or self._pointers(src, dst) == self.ptrs))

    def _pointers(self, src, dst):
        return None if self.pointer is None else (self.pointer(src), None if dst is None else self.pointer(dst))


def _no_array():
    return None


def _pointer_reader(kind):
    """How to read (data pointer, size) of arrays of type ``kind``, or None where an array's
    identity fixes its memory (CuPy's ``data`` is read-only; NumPy's simulated arrays). A PyTorch
    tensor can be re-pointed in place (``set_``, ``.data =``)."""
    module = kind.__module__ or ""
    if module.startswith("torch"):
        return lambda array: (array.data_ptr(), array.numel())
    if module.startswith("cupy") or issubclass(kind, np.ndarray):
        return None
    return _any_pointer


def _any_pointer(array):
    data_ptr = getattr(array, "data_ptr", None)
    if data_ptr is not None:  # PyTorch (fp8 tensors have no __cuda_array_interface__)
        return data_ptr(), array.numel()
    interface = getattr(array, "__cuda_array_interface__", None)
    return (interface["data"][0], tuple(interface["shape"])) if interface else (id(array), None)


def _weakly_referable(*arrays) -> bool:
    return all(a is None or type(a).__weakrefoffset__ for a in arrays)


_MAX_PLANS = 64


def _remember(comm, key, plan):
    plans = comm.__dict__.setdefault("_flowdsl_plans", {})
    if len(plans) >= _MAX_PLANS:
        plans.pop(next(iter(plans)))
    plans[key] = plan


def _planned(comm, key, src, dst):
    """The plan of an earlier call with the same arrays and options, or None (the fast path)."""
    plan = getattr(comm, "_flowdsl_plans", _NO_PLANS).get(key)
    if plan is not None and plan.valid(src, dst) and not comm.closed:  # a closed one: the first call says so
        return plan
    return None


_NO_PLANS: dict = {}


def _first_call(collective, comm, src, dst, key, stream, algorithm, config, **check_kwargs):
    """Check everything, compare the call across ranks, plan, remember the plan under ``key`` and
    launch it (``stream``: a handle)."""
    agree = _agree.agreement(comm) if _is_communicator(comm) else None  # else _check refuses it
    try:
        s, d, count, redop, root, scalar = _check(collective, comm, src, dst, algorithm=algorithm, **check_kwargs)
    except UsageError:
        if agree is not None and not _closed(comm):
            agree.refused(collective, stream)  # the other ranks raise too instead of waiting for this one
        raise
    if agree is not None:  # before anything is created or launched
        sig = _agree.signature(collective, count, s.dtype, redop, root, algorithm, config)
        agree(sig, stream)
    planned = _plan(collective, comm, s, d, count, redop, root or 0, algorithm, stream, config, scalar)
    if _weakly_referable(src, dst):  # other array types are checked and planned at every call
        plan = _Plan(planned.run, src, dst, planned.algorithm)
        if agree is not None:
            plan.agree = functools.partial(agree, sig, stream, True)
        _remember(comm, key, plan)
    planned.run(src, dst)
    return src if dst is None else dst


class _Planned(NamedTuple):
    """What :func:`_plan` decided: ``run(src, dst)`` launches it; ``algorithm`` is the program."""

    run: Callable
    algorithm: str


class LaunchShape(NamedTuple):
    """How a call runs: ``algorithm`` is its program (what ``"auto"`` chose) or ``"nccl"``;
    ``protocol`` and ``grid`` (blocks, one per channel) are the launch's (None for ``"nccl"``)."""

    algorithm: str
    protocol: Protocol | None
    grid: int | None


def launch_shape(collective: str, comm, count: int, dtype: str, algorithm: str = "auto",
                 config: FlowConfig | None = None, *, torch_arrays: bool = False, op=None) -> LaunchShape:
    """The program, protocol and grid a call of ``count`` ``dtype`` elements per rank gets: what
    the launch uses, for references that must know the order a program combines in
    (:mod:`flowdsl.collectives.exact`). ``torch_arrays``: the call passes torch tensors (NCCL's
    host collective then knows bfloat16 and fp8). ``op``: the call's operator (a :class:`flowdsl.RedOp`;
    None: ``SUM``), which decides whether a multimem all-reduce can take it. Raises the call's own
    ``UsageError`` where the call would be refused for its algorithm."""
    from ._library import storage  # noqa: PLC0415

    kernel_dtype = storage(dtype)[0]
    nccl_knows = comm.nccl is not None and (kernel_dtype == dtype or torch_arrays)
    return _launch_shape(collective, comm, count, dtype, kernel_dtype, algorithm, config or default_config(comm),
                         nccl_knows, op)


def _launch_shape(collective, comm, count, dtype, kernel_dtype, algorithm, config, nccl_knows,
                  redop=None) -> LaunchShape:
    nbytes = count * np.dtype(kernel_dtype).itemsize
    if algorithm == "auto":
        multimem = collective == "all_reduce" and _multimem_available(comm, kernel_dtype, redop)
        algorithm = cost.choose(collective, comm.nranks, lsa_team_size(comm), nbytes, nccl_available=nccl_knows,
                                one_shot_available=_one_shot_fits(comm, count, kernel_dtype),
                                multimem_available=multimem, config=config,
                                hierarchical_available=hierarchical_refusal(collective, comm) is None)
    if algorithm == "nccl" and comm.nccl is not None and not nccl_knows:
        raise UsageError(f"Cannot {collective} {dtype} held in {kernel_dtype} arrays with algorithm='nccl': "
                         "NCCL would take them for integers. Pass torch tensors of that dtype, or use "
                         "'ring', 'tree' or 'auto'")
    if algorithm != "nccl" and (algorithm, collective) not in PROGRAMS:
        has = [c for (a, c) in PROGRAMS if a == algorithm]
        raise UsageError(f"Cannot {collective} with algorithm={algorithm!r}: only "
                         f"{', '.join(has) if has else 'no collective'} {'have' if len(has) > 1 else 'has'} "
                         f"a {algorithm} program. Use 'ring' or 'auto'")
    if algorithm == "nccl":
        return LaunchShape("nccl", None, None)
    if algorithm == "hierarchical":
        why = hierarchical_refusal(collective, comm)
        if why is not None:
            raise UsageError(why)
    if algorithm in CFT_ALGORITHMS:  # no Flow, no protocol: blocks by the message as a Flow program's channels
        why = cft_refusal(collective, comm, algorithm)
        if why is not None:
            raise UsageError(why)
        return LaunchShape(algorithm, None, cost.channels_for(nbytes, comm.nranks, config, Protocol.SIMPLE))
    if algorithm == "multimem":  # no Flow, no protocol: blocks by the message as a Flow program's channels
        _check_multimem(comm, dtype, kernel_dtype, redop)
        return LaunchShape("multimem", None, cost.channels_for(nbytes, comm.nranks, config, Protocol.SIMPLE))
    protocol = config.protocol if config.protocol is not None else cost.protocol_for(nbytes, comm.nranks)
    grid = cost.channels_for(nbytes, comm.nranks, config, protocol)
    if collective == "all_to_all" and comm.nranks > 1:  # every round a channel at least (a block runs several)
        grid = min(config.channels, max(grid, comm.nranks - 1))
    if algorithm == "one_shot":
        grid = cost.one_shot_blocks(count, comm.nranks)
    return LaunchShape(algorithm, protocol, grid)


def _plan(collective, comm, s, d, count, redop, root, algorithm, stream, config, scalar=None) -> _Planned:
    config = config or default_config(comm)
    from ._library import kernel_for, storage  # noqa: PLC0415

    kernel_dtype, fp8 = storage(s.dtype)
    # NCCL's host collective reads the element type from the array: a uint8 or uint16 array
    # standing for fp8 or bfloat16 would be summed as integers there.
    nccl_knows = comm.nccl is not None and (kernel_dtype == s.dtype
                                                               or "torch" in type(s.array).__module__)
    algorithm, protocol, grid = _launch_shape(collective, comm, count, s.dtype, kernel_dtype, algorithm, config,
                                              nccl_knows, redop)
    if algorithm == "nccl" and scalar is not None and scalar.buffer is not None and kernel_dtype != s.dtype \
            and "torch" not in type(scalar.buffer.array).__module__:
        raise UsageError(f"Cannot {collective} with algorithm='nccl' and {scalar.op!r}: its scalar is {s.dtype} "
                         f"held in a {kernel_dtype} array, which NCCL would take for an integer. Pass a torch "
                         f"tensor of {s.dtype}, or use 'ring', 'tree' or 'auto'")
    if algorithm == "nccl":
        if comm.nccl is None:
            raise UsageError(f"Cannot {collective} with algorithm='nccl': this communicator has no NCCL host "
                             "communicator (the simulator). Use 'ring' or 'tree'")
        dtype = s.dtype  # not s in the closure: a cached plan must not keep the call's arrays alive
        return _Planned(lambda src, dst: _run_nccl(collective, comm, src, src if dst is None else dst, redop, root,
                                                   stream, scalar, dtype), "nccl")
    if algorithm in CFT_ALGORITHMS:  # its own kernel signature: (comm, win, src, dst, count, channels)
        st = _cft_state(comm, config, collective, stream)
        kernel = kernel_for(algorithm, collective, RedOp.SUM, dtype=kernel_dtype)
        launch = kernel[grid, config.threads, stream].prepare(st.devcomm, st.window, s.kernel_array(),
                                                              d.kernel_array(), count, config.channels)
        return _Planned(lambda src, dst: launch(), algorithm)
    if algorithm == "multimem":
        st = _multimem_state(comm, config, collective, stream)
        gin, window = False, st.window
    else:
        st = _state(comm, config, collective, stream, own=_own_staging(collective, algorithm))
        gin, window = st.gin, st.window
    if collective == "all_to_all":
        _check_all_to_all_channels(comm, config, algorithm)
    if algorithm == "one_shot":
        _check_one_shot(comm, st, count, kernel_dtype)
        window = st.one_shot_window(collective, stream)
    kernel = kernel_for(algorithm, collective, redop if redop is not None else RedOp.SUM, gin, fp8,
                        ll128=protocol == Protocol.LL128, dtype=kernel_dtype)
    src, dst = s.kernel_array(), d.kernel_array()
    vectors = int(s.ptr % 16 == 0 and d.ptr % 16 == 0)
    # premulsum's scalar: a device array the kernel reads, or (an empty one and) the host immediate's bits.
    bits = scalar.bits if scalar is not None else 0
    scalar_at = scalar.buffer.kernel_array() if scalar is not None and scalar.buffer is not None else dst[:0]
    launch = kernel[grid, config.threads, stream].prepare(
        st.devcomm, window, src, dst, count, int(root or 0), int(s.same_memory(d)), config.channels,
        config.nslots, config.slot_bytes // 8, int(protocol or 0), vectors, bits, scalar_at)
    return _Planned(lambda src, dst: launch(), algorithm)


#: Collectives with a staging window of their own (:func:`_state`).
_OWN_STAGING = ("all_to_all",)


def _own_staging(collective: str, algorithm: str) -> str | None:
    """Which staging window of its own a call uses (None: the ring and tree programs' one). The hierarchical
    programs join rail and node neighbours on their connections, so they have one (all_gather and
    reduce_scatter share it: the same neighbours on the same numbers), and the hierarchical all_to_all another."""
    if algorithm == "hierarchical":
        return "hierarchical all_to_all" if collective == "all_to_all" else "hierarchical"
    return collective if collective in _OWN_STAGING else None


def _check_all_to_all_channels(comm, config, algorithm="pairwise") -> None:
    from ..flow import MAX_CONNECTIONS  # noqa: PLC0415
    from .programs import HIERARCHICAL_ROUNDS_PER_CHANNEL  # noqa: PLC0415

    per = HIERARCHICAL_ROUNDS_PER_CHANNEL if algorithm == "hierarchical" else MAX_CONNECTIONS
    needed = -(-(comm.nranks - 1) // per)
    if config.channels < needed:
        rounds = "hierarchical rounds take 2 connections each, so 2 rounds" if algorithm == "hierarchical" \
            else f"pairwise rounds take {MAX_CONNECTIONS} connections"
        raise UsageError(f"Cannot all_to_all over {comm.nranks} ranks with FlowConfig(channels={config.channels}): "
                         f"its {comm.nranks - 1} {rounds} a channel, so at least {needed} channels. Pass "
                         f"FlowConfig(channels={needed}) or more")


def hierarchical_refusal(collective: str, comm, algorithm: str = "hierarchical") -> str | None:
    """Why ``collective`` cannot run hierarchically on ``comm`` (None: it can): it needs several nodes (LSA
    teams) of several ranks each, the same number on every node, laid out node by node (rank ``r`` is LSA rank
    ``r % L`` of node ``r // L``: NCCL's LSA team is ``L`` consecutive ranks, its rail every ``L``-th).
    ``algorithm``: the name the refusal gives the call (``"hierarchical_cft"`` too, :func:`cft_refusal`)."""
    n, lsa_size = comm.nranks, lsa_team_size(comm)
    lsa_rank = getattr(comm, "lsa_rank", None)
    head = f"Cannot {collective} with algorithm={algorithm!r}: "
    instead = "Use 'ring' or 'auto'" + (" ('pairwise' for all_to_all)" if collective == "all_to_all" else "")
    if lsa_size >= n:
        return (head + f"this communicator is one LSA team ({n} ranks on one node), so nothing crosses the network "
                f"and there is no rail to gather along. {instead}")
    if n % lsa_size or (lsa_rank is not None and int(lsa_rank) != comm.rank % lsa_size):
        where = f"{n} ranks do not split into LSA teams of {lsa_size}" if n % lsa_size else \
            f"rank {comm.rank} is LSA rank {lsa_rank}"
        return (head + f"the ranks are not laid out node by node with as many on every node ({where}; the rails "
                f"need rank r to be LSA rank r % {lsa_size}). Launch the same number of ranks on every node, "
                "numbered node by node (torchrun does), or use 'ring' or 'auto'")
    if lsa_size == 1:
        return (head + f"every node holds one rank ({n} nodes), so the rail is the whole ring and there is nothing "
                f"to do inside a node. {instead}")
    return None


def _one_shot_fits(comm, count: int, kernel_dtype: str) -> bool:
    """Whether a one-shot all_reduce can take ``count`` elements: one LSA team, and its LL lines
    fit the one-shot window (8-byte elements take two lines)."""
    from .programs import one_shot_fits  # noqa: PLC0415

    return lsa_team_size(comm) == comm.nranks and one_shot_fits(count, np.dtype(kernel_dtype).itemsize)


def _check_one_shot(comm, st, count, kernel_dtype):
    from .programs import ONE_SHOT_LINES  # noqa: PLC0415

    if st.gin:
        raise UsageError(f"Cannot all_reduce with algorithm='one_shot': it stores into every peer's memory, and "
                         f"this communicator spans several LSA teams ({comm.nranks} ranks, {st.lsa_size} per team). "
                         "Use 'ring', 'tree' or 'auto'")
    if not _one_shot_fits(comm, count, kernel_dtype):
        per = ONE_SHOT_LINES // (2 if np.dtype(kernel_dtype).itemsize == 8 else 1)
        raise UsageError(f"Cannot all_reduce {count} elements with algorithm='one_shot': its window holds "
                         f"{per} {kernel_dtype} elements per rank. Use 'ring', 'tree' or 'auto' for larger messages")


def _named(value) -> str:
    """What an error calls a value passed in the communicator's place: its type and a short repr (an array's
    whole repr is lines of numbers)."""
    return f"a {type(value).__module__}.{type(value).__qualname__} ({reprlib.repr(value)})"


def _nranks(comm):
    nranks = getattr(comm, "nranks", None)
    if nranks is None:
        raise UsageError(f"Cannot run a collective: {_named(comm)} is not a flowdsl communicator. Pass the one "
                         "from flowdsl.init() (or the simulator's)")
    return nranks


def _run_nccl(collective, comm, src, dst, redop, root, stream, scalar=None, dtype=None):
    nccl_comm = comm.nccl
    if nccl_comm is None:
        raise UsageError(f"Cannot {collective} with algorithm='nccl': this communicator has no NCCL host "
                         "communicator (the simulator). Use 'ring' or 'tree'")
    from nccl.core import NcclRedOp  # noqa: PLC0415

    ops = {RedOp.SUM: NcclRedOp.SUM, RedOp.PROD: NcclRedOp.PROD, RedOp.MIN: NcclRedOp.MIN,
           RedOp.MAX: NcclRedOp.MAX, RedOp.AVG: NcclRedOp.AVG}
    kw = {"stream": stream}  # the resolved handle: NCCL's collectives are capturable on it
    with without_torch_probe():
        op = _nccl_premul_sum(collective, comm, nccl_comm, scalar, dtype) if redop == RedOp.PREMULSUM \
            else ops.get(redop)
        _call_nccl(nccl_comm, collective, src, dst, op, root, kw)


#: NCCL PreMulSum operators a communicator keeps (ncclRedOpCreatePreMulSum per distinct scalar), at most.
_MAX_NCCL_OPS = 16


def _nccl_premul_sum(collective, comm, nccl_comm, scalar, dtype):
    """The NCCL PreMulSum operator of ``scalar`` (created at first use, kept per communicator: one per
    host value, or per device array, whose value NCCL reads when the collective runs)."""
    create = getattr(nccl_comm, "create_pre_mul_sum", None)
    if create is None:
        raise UsageError(f"Cannot {collective} with {scalar.op!r} and algorithm='nccl': this nccl4py has no "
                         "create_pre_mul_sum (ncclRedOpCreatePreMulSum). Install nccl4py 0.6 or newer, or use "
                         "'ring', 'tree' or 'auto'")
    from nccl.core import NcclDataType  # noqa: PLC0415

    datatype = NcclDataType[{"float8_e4m3fn": "FLOAT8E4M3", "float8_e5m2": "FLOAT8E5M2"}.get(dtype, dtype.upper())]
    cache = comm.__dict__.setdefault("_flowdsl_nccl_premul", {})
    key = (dtype, scalar.op.key, scalar.bits)
    op = cache.get(key)
    if op is None:
        if len(cache) >= _MAX_NCCL_OPS:
            old = cache.pop(next(iter(cache)))
            old.close()  # NCCL may destroy an operator once the collectives given it are enqueued
            resources = getattr(nccl_comm, "_resources", None)
            if isinstance(resources, list) and old in resources:
                resources.remove(old)
        if scalar.buffer is None:  # NCCL copies a host immediate's bytes when it makes the operator
            from ._library import storage  # noqa: PLC0415

            unsigned = np.dtype(f"u{np.dtype(storage(dtype)[0]).itemsize}")
            value = np.array([scalar.bits & ((1 << 8 * unsigned.itemsize) - 1)], unsigned)
            op = create(value.view(storage(dtype)[0]), datatype)
        else:
            op = create(scalar.buffer.array, datatype)
        cache[key] = op
    return op


def _call_nccl(nccl_comm, collective, src, dst, op, root, kw):
    if collective == "all_reduce":
        nccl_comm.allreduce(src, dst, op, **kw)
    elif collective == "all_gather":
        nccl_comm.allgather(src, dst, **kw)
    elif collective == "reduce_scatter":
        nccl_comm.reduce_scatter(src, dst, op, **kw)
    elif collective == "broadcast":
        nccl_comm.broadcast(src, dst, int(root), **kw)
    elif collective == "all_to_all":
        nccl_comm.alltoall(src, dst, **kw)
    else:
        nccl_comm.reduce(src, dst, op, int(root), **kw)


def _refuse_after_a_timeout(comm) -> None:
    """Raise the timeout a kernel of ``comm`` recorded, if one did: the kernels whose waits gave up ran
    on with garbage, so this rank's step counters and one-shot call count no longer match its peers',
    and a further call could take stale data for fresh."""
    error = comm.device_error()
    if error is not None:
        error.add_note("flowdsl's collectives refuse every call after a timeout: the communicator's connections are "
                       "out of step with its peers', and a further call could return stale data. Call comm.abort() "
                       "on every rank and create a new communicator.")
        raise error


def _ran_planned(comm, key, src, dst) -> bool:
    """Run the call planned for ``key`` (a repeated call: the hot path); False if there is none."""
    plan = _planned(comm, key, src, dst)
    if plan is None:
        return False
    _refuse_after_a_timeout(comm)
    if plan.agree is not None:
        plan.agree()
    plan.run(src, dst)
    return True


# ---- public entry points -----------------------------------------------------------------------

def _op_key(op):
    """``op`` in a plan's key: a premul_sum by its scalar's value (or its device array's identity and
    address), so that the cached plan holds no device array alive."""
    return op.key if type(op) is PreMulSum else op


def all_reduce(comm, src, dst=None, *, op="sum", algorithm="auto", stream=None, config=None, dtype=None):
    """``dst = op over ranks of src`` on every rank.

    ``algorithm``, ``stream``, ``config`` and ``dtype`` are every collective's (:mod:`flowdsl.collectives`).

    Args:
        comm: The flowdsl communicator (every rank calls it, in the same order as its other collectives).
        src: This rank's input, a device array.
        dst: The output, ``src``'s size and type; ``None`` works in place (into ``src``).
        op: ``"sum"``, ``"prod"``, ``"min"``, ``"max"``, ``"avg"`` (a :class:`flowdsl.RedOp` too), or
            :func:`premul_sum` ``(scalar)``: each rank's ``src`` times that rank's scalar, summed.

    Returns:
        The output array (``dst``, or ``src`` in place).
    """
    stream = stream_handle(stream, (src,), "all_reduce")
    key = ("all_reduce", id(src), id(dst), _op_key(op), 0, algorithm, stream, config, dtype)
    if _ran_planned(comm, key, src, dst):
        return src if dst is None else dst
    return _first_call("all_reduce", comm, src, dst, key, stream, algorithm, config, op=op, dtype=dtype)


def all_gather(comm, src, dst, *, algorithm="auto", stream=None, config=None, dtype=None):
    """``dst[r*count:(r+1)*count] = src@r`` on every rank.

    ``algorithm``, ``stream``, ``config`` and ``dtype`` are every collective's (:mod:`flowdsl.collectives`).

    Args:
        comm: The flowdsl communicator.
        src: This rank's ``count`` elements (in place: ``dst``'s slice ``rank * count``).
        dst: ``nranks * count`` elements.

    Returns:
        ``dst``.
    """
    stream = stream_handle(stream, (src,), "all_gather")
    key = ("all_gather", id(src), id(dst), None, 0, algorithm, stream, config, dtype)
    if _ran_planned(comm, key, src, dst):
        return src if dst is None else dst
    return _first_call("all_gather", comm, src, dst, key, stream, algorithm, config, ratio_out=_nranks(comm),
                       dtype=dtype)


def reduce_scatter(comm, src, dst, *, op="sum", algorithm="auto", stream=None, config=None, dtype=None):
    """``dst@r = op over ranks q of src@q[r*count:(r+1)*count]``.

    ``algorithm``, ``stream``, ``config`` and ``dtype`` are every collective's (:mod:`flowdsl.collectives`).

    Args:
        comm: The flowdsl communicator.
        src: ``nranks * count`` elements on every rank.
        dst: This rank's ``count`` elements (in place: ``src``'s slice ``rank * count``).
        op: As :func:`all_reduce` takes it.

    Returns:
        ``dst``.
    """
    stream = stream_handle(stream, (src,), "reduce_scatter")
    key = ("reduce_scatter", id(src), id(dst), _op_key(op), 0, algorithm, stream, config, dtype)
    if _ran_planned(comm, key, src, dst):
        return src if dst is None else dst
    return _first_call("reduce_scatter", comm, src, dst, key, stream, algorithm, config, op=op,
                       ratio_in=_nranks(comm), dtype=dtype)


def broadcast(comm, src, dst=None, *, root=0, algorithm="auto", stream=None, config=None, dtype=None):
    """``dst = src@root`` on every rank.

    ``algorithm``, ``stream``, ``config`` and ``dtype`` are every collective's (:mod:`flowdsl.collectives`).

    Args:
        comm: The flowdsl communicator.
        src: The data, read on ``root`` only.
        dst: The output; ``None`` works in place (into ``src``).
        root: The rank whose ``src`` is sent.

    Returns:
        The output array.
    """
    stream = stream_handle(stream, (src,), "broadcast")
    key = ("broadcast", id(src), id(dst), None, root, algorithm, stream, config, dtype)
    if _ran_planned(comm, key, src, dst):
        return src if dst is None else dst
    return _first_call("broadcast", comm, src, dst, key, stream, algorithm, config, root=root, dtype=dtype)


def reduce(comm, src, dst=None, *, op="sum", root=0, algorithm="auto", stream=None, config=None, dtype=None):
    """``dst@root = op over ranks of src``.

    ``algorithm``, ``stream``, ``config`` and ``dtype`` are every collective's (:mod:`flowdsl.collectives`).

    Args:
        comm: The flowdsl communicator.
        src: This rank's input.
        dst: The output, written on ``root`` only; ``None`` works in place (into ``src``).
        op: As :func:`all_reduce` takes it.
        root: The rank that receives the result.

    Returns:
        The output array.
    """
    stream = stream_handle(stream, (src,), "reduce")
    key = ("reduce", id(src), id(dst), _op_key(op), root, algorithm, stream, config, dtype)
    if _ran_planned(comm, key, src, dst):
        return src if dst is None else dst
    return _first_call("reduce", comm, src, dst, key, stream, algorithm, config, op=op, root=root,
                       dtype=dtype)


def all_to_all(comm, src, dst, *, algorithm="auto", stream=None, config=None, dtype=None):
    """``dst[j*count:(j+1)*count] = src@j[r*count:(r+1)*count]`` on every rank ``r`` (NCCL's AllToAll: block
    ``j`` of a rank's ``src`` goes to rank ``j``).

    ``algorithm`` (``"pairwise"``, ``"nccl"`` or ``"auto"``), ``stream``, ``config`` and ``dtype`` are every
    collective's (:mod:`flowdsl.collectives`). The first call on a communicator and config makes the
    all-to-alls' own staging window and device communicator.

    Args:
        comm: The flowdsl communicator.
        src: ``nranks * count`` elements: block ``j`` for rank ``j``.
        dst: ``nranks * count`` elements, apart from ``src``: block ``i`` from rank ``i``.

    Returns:
        ``dst``.
    """
    stream = stream_handle(stream, (src,), "all_to_all")
    key = ("all_to_all", id(src), id(dst), None, 0, algorithm, stream, config, dtype)
    if _ran_planned(comm, key, src, dst):
        return dst
    n = _nranks(comm)
    return _first_call("all_to_all", comm, src, dst, key, stream, algorithm, config, ratio_in=n, ratio_out=n,
                       dtype=dtype)
