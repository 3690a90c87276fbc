"""``cache=True``: numba-cuda's on-disk cache, kept for a flowdsl kernel as numba-cuda keeps it.

numba-cuda's own cache class, so its files (``__pycache__`` beside the kernel's source, else numba's cache
directory), its keys (the signature, the GPU and CUDA runtime, numba-cuda's release, the function's bytecode and
closure; an index stale once the source file changes) and its entries (a pickled numba kernel): numba-cuda and
flowdsl load each other's entries for the same function. flowdsl's own disk cache (:mod:`flowdsl._cache`, keyed by
content) keeps every kernel whatever ``cache`` says; this one adds numba-cuda's contract to it: entries that
travel with the source, ``stats``, ``recompile``.

An entry flowdsl stores carries what its launch needs besides the cubin in the kernel's argument marshaller (an
extension numba-cuda pickles with the kernel): the features the kernel uses, and the flowdsl build and NCCL
release it was linked for. An entry linked for another flowdsl or NCCL is a miss, compiled again and stored over
it; numba-cuda's key knows neither.
"""

from __future__ import annotations

from ._cache import Uncacheable, dependency_digest, package_digest
from ._version import __version__
from .errors import CacheRefusedError

__all__ = ["NumbaDiskCache", "refuse_linked_files", "stamp", "entry_stamp", "entry_features"]


def refuse_linked_files(name: str, link) -> None:
    """numba-cuda's rule, said at decoration: its cache key does not cover files linked beside a kernel, so an edit
    of one would be served stale."""
    if link:
        raise CacheRefusedError(
            f"Cannot cache kernel {name} with cache=True: numba-cuda's disk cache does not key the files linked "
            "beside it (Cannot pickle CUDACodeLibrary with linking files). Drop cache=True: flowdsl's own disk "
            "cache keeps such a kernel, keyed by the linked files' contents")


def stamp(target) -> tuple:
    """What a flowdsl entry was linked for beyond numba-cuda's key: flowdsl's release (its support builds) and
    device sources, and the NCCL release."""
    return (f"{__version__}:{package_digest()}", tuple(target.nccl))


class NumbaDiskCache:
    """numba-cuda's ``CUDACache`` for one kernel's function (made at decoration, as numba-cuda's ``cache=True``
    makes it: a function without a source file numba-cuda can place a cache beside is refused there)."""

    def __init__(self, py_func):
        from numba.cuda.dispatcher import CUDACache  # noqa: PLC0415

        self._py_func = py_func
        try:
            self._cache = CUDACache(py_func)
        except RuntimeError as exc:  # numba-cuda's "cannot cache function ...: no locator available for file ..."
            raise CacheRefusedError(f"Cannot cache kernel {py_func.__qualname__} with cache=True: {exc}. Define it "
                                    "in a module file (or a notebook), or drop cache=True: flowdsl's own disk cache "
                                    "keeps it") from None

    @property
    def cache_path(self) -> str:
        return self._cache.cache_path

    def load(self, argtypes: tuple, target):
        """The numba kernel stored for ``argtypes`` on this GPU, or None."""
        from numba.cuda.descriptor import cuda_target  # noqa: PLC0415

        self._refuse_device_arrays()
        kernel = self._cache.load_overload(argtypes, cuda_target.target_context)
        if kernel is not None and entry_stamp(kernel) not in (None, stamp(target)):
            kernel = None  # linked for another flowdsl or NCCL: compiled again, stored over it
        return kernel

    def save(self, argtypes: tuple, kernel) -> None:
        from numba.cuda.descriptor import cuda_target  # noqa: PLC0415

        kernel.target_context = cuda_target.target_context  # numba's save asks the kernel for its codegen
        self._cache.save_overload(argtypes, kernel)

    def flush(self) -> None:
        """Forget every entry (numba-cuda's ``recompile``)."""
        self._cache.flush()

    def _refuse_device_arrays(self) -> None:
        """numba-cuda refuses to cache a kernel that reaches a device array (its address is in the code)."""
        try:
            dependency_digest(self._py_func)
        except Uncacheable as exc:
            if exc.device_array:
                raise CacheRefusedError(
                    f"Cannot cache kernel {self._py_func.__qualname__} with cache=True: it reaches {exc} (Cannot "
                    "serialize kernels or device functions referencing global device arrays). Pass the array(s) as "
                    "arguments to the kernel instead") from None


def entry_stamp(kernel):
    """The :func:`stamp` a flowdsl entry was stored with; None for numba-cuda's own (no flowdsl marshaller)."""
    for extension in getattr(kernel, "extensions", ()):
        if hasattr(extension, "linked_for"):
            return extension.linked_for
    return None


def entry_features(kernel) -> frozenset:
    """The flowdsl features of a kernel loaded from numba-cuda's cache (none for numba-cuda's own)."""
    for extension in getattr(kernel, "extensions", ()):
        if hasattr(extension, "linked_for"):
            return extension.features
    return frozenset()
