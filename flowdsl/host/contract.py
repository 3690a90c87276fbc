"""What a communicator, a window and a device communicator offer host code, on GPUs and on the
simulator alike: the one contract :class:`flowdsl.Communicator` and the simulator's communicator
both keep (``tests/compile/test_host_contract.py`` compares both classes with it, member by
member and parameter by parameter). Code written against it (the collectives, the examples, a
user's ``main(comm)``) runs on either without asking which it holds.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Communicator", "Resource", "Window", "DevComm"]


@runtime_checkable
class Communicator(Protocol):
    """One rank's communicator: symmetric memory, windows, device communicators, teardown."""

    rank: int
    nranks: int
    #: Whether the collectives compare each call's arguments across ranks before launching it.
    check_collectives: bool
    #: Where this rank's memory is, as torch names devices: ``"cuda"`` on GPUs; ``"cpu"`` on the simulator,
    #: where host memory (``comm.alloc``'s arrays, CPU tensors) stands for the rank's GPU memory.
    memory_device: str
    #: Whether work on this rank's streams can be captured in CUDA graphs (what is not capturable is then
    #: refused during a capture); False on the simulator, whose ranks have no CUDA streams.
    cuda_graphs: bool
    #: The CUDA device (its index) this rank's memory and streams are on; None on the simulator.
    device: int | None
    #: Whether the rank's host code has an OS thread of its own, with its own thread-local state (a process
    #: per GPU; on the simulator with ``spawn(..., host_threads=True)`` or one rank): what torch needs.
    own_thread: bool

    @property
    def nccl(self) -> Any:
        """NCCL's host communicator (nccl4py), or None where there is none (the simulator)."""
        ...

    @property
    def closed(self) -> bool: ...

    @property
    def wait_timeout(self) -> float: ...

    @property
    def supports_multimem(self) -> bool:
        """Whether ``device_communicator(lsa_multimem=True)`` would be accepted (NVLink SHARP; on the simulator,
        ``spawn(..., multimem=True)``)."""
        ...

    @property
    def cft_missing(self) -> str | None:
        """What kernels using :mod:`flowdsl.cft` with counted writes lack here (``"needs ..."``: NCCL >= 2.32,
        flowdsl's CFT build, nvJitLink >= 13.3, an sm_100 GPU; on the simulator, a release simulated before
        2.32), or None where they can run; creates nothing. The collectives' CFT programs are refused by it."""
        ...

    def alloc(self, shape, dtype=np.float32, *, like="cupy") -> Any: ...

    def free(self, buf) -> None: ...

    def register(self, buf, *, cft_counted=False) -> Window: ...

    def device_communicator(self, *, for_kernel=None, grid=None, **requirements) -> DevComm: ...

    @property
    def open_resources(self) -> list: ...

    def track(self, resource) -> None:
        """Own ``resource`` (anything with ``close()``, such as the collectives' state): closed with the
        communicator, listed in ``open_resources`` until then."""
        ...

    def synchronize(self) -> None: ...

    def barrier(self) -> None: ...

    def exchange(self, words, stream=None, *, label: str = "comm.exchange()") -> np.ndarray:
        """Every rank's ``words`` (a small int64 host array, one length on every rank), as an ``(nranks,
        len)`` array: an all-gather the host waits for, ordered on ``stream`` (a handle; GPUs: NCCL's, read
        back; the simulator: a host rendezvous). Collective: every rank calls it. ``label`` names the call in
        the simulator's reports. The collectives compare their calls' signatures through it."""
        ...

    def device_error(self) -> Exception | None: ...

    def abort(self) -> None: ...

    def close(self) -> None: ...


class Resource(Protocol):
    """What a communicator owns and closes: a window, a device communicator."""

    kind: str

    @property
    def closed(self) -> bool: ...

    @property
    def communicator(self) -> Communicator: ...

    def close(self) -> None: ...


@runtime_checkable
class Window(Resource, Protocol):
    """A registered symmetric window (what kernels receive)."""


@runtime_checkable
class DevComm(Resource, Protocol):
    """A device communicator (``ncclDevComm``, what kernels receive)."""

    rank: int
    nranks: int
    #: The GIN contexts a kernel may use (NCCL's ``ginContextCount``; the requirement is a hint).
    gin_context_count: int
