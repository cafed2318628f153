"""How results go back into the caller's framework (registered with the C++ core at import).

NumPy results are made in C++ directly. For the other frameworks the core hands over its own Array object, which
speaks DLPack (__dlpack__ / __dlpack_device__), and the framework's from_dlpack takes it without a copy.
"""

from __future__ import annotations

from typing import Any

from . import _core


def _numpy(a):
    # Only reached for bfloat16, which NumPy lacks: the bits, viewed as ml_dtypes.bfloat16 (as JAX does).
    bits = a.numpy()
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - ml_dtypes comes with JAX
        return bits
    return bits.view(ml_dtypes.bfloat16)


def _jax(a):
    import jax.dlpack

    return jax.dlpack.from_dlpack(a)


def _torch(a):
    import torch

    return torch.from_dlpack(a)


def _cupy(a):
    import cupy

    return cupy.from_dlpack(a)


def _warp(a):
    import warp

    return warp.from_dlpack(a)


CONVERTERS = {"numpy": _numpy, "jax": _jax, "torch": _torch, "cupy": _cupy, "warp": _warp}


def register() -> None:
    _core._set_converters(dict(CONVERTERS))


def asarray(x: Any) -> _core.Array:
    """A shardkit Array sharing x's memory (any DLPack producer, scalar or sequence)."""
    return _core.asarray(x)


def framework_of(x: object) -> str:
    """'numpy', 'jax', 'torch', 'cupy', 'warp', 'shardkit' or 'other'."""
    return _core.framework_of(x)
