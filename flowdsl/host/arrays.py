"""Device arrays as the host code meets them: CuPy, numba-cuda, PyTorch tensors and other
``__cuda_array_interface__`` holders.

PyTorch raises ``KeyError`` (not ``AttributeError``) from ``__cuda_array_interface__`` for the dtypes
that interface cannot name (bfloat16, the float8 types, uint16, uint32, uint64), and ``RuntimeError``
for a tensor that requires grad, so ``hasattr`` and ``getattr(x, name, None)`` raise for them.
"""

from __future__ import annotations

__all__ = ["cuda_array_interface", "is_torch", "torch_bits"]


def is_torch(x) -> bool:
    """Whether ``x`` is a PyTorch tensor (without importing torch)."""
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def cuda_array_interface(x):
    """``x.__cuda_array_interface__``, or None where ``x`` has none (a host array, a CPU tensor, a
    PyTorch tensor of a dtype the interface cannot name: read those through ``data_ptr()``)."""
    try:
        return getattr(x, "__cuda_array_interface__", None)
    except (KeyError, RuntimeError, TypeError):
        return None


def torch_bits(t):
    """PyTorch tensor ``t`` as a view of its bits in the signed integer type of its element size (which
    the interface names): how a tensor of bfloat16, fp8 or uint16-64 is registered and freed."""
    import torch  # noqa: PLC0415 - only for a tensor, so torch is there

    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
