"""Kernels and configured launches pickled as numba-cuda pickles its dispatchers: the Python function by value
(numba-cuda's cloudpickle), the options beside it, nothing compiled (the unpickled kernel compiles, or finds its
cubin on disk, where it runs). A device function the kernel reaches that cannot be imported by name travels as
its code and options and is made a device function again where it is unpickled (numba-cuda learns of it there).
For a kernel handed to another process (``multiprocessing`` with spawn, a pool, a task queue).
"""

from __future__ import annotations

import io
import pickle
import types

from ._devices import bare_copy, device

__all__ = ["dumps"]


def _pickler(buffer):
    from numba.cuda.cloudpickle import cloudpickle  # noqa: PLC0415 - numba-cuda's copy, as its dispatchers use

    class _Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            options = getattr(obj, "__flowdsl_jit_options__", None) if isinstance(obj, types.FunctionType) else None
            if options is not None and not cloudpickle._should_pickle_by_reference(obj):
                return _device_again, (bare_copy(obj), obj.overloads.declared, obj.__flowdsl_inline__, dict(options))
            return super().reducer_override(obj)

    return _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)


def dumps(value) -> bytes:
    """``value`` pickled with flowdsl's device functions reduced to their code and options."""
    buffer = io.BytesIO()
    _pickler(buffer).dump(value)
    return buffer.getvalue()


def _device_again(fn, signature, inline, options):
    return device(fn, signature=signature, inline=inline, **options)
