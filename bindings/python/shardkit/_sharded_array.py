"""ShardedArray: a global array cut across a mesh, as the Python API holds it (the C++ array, or a leaf JAX rebuilt),
and how the sharding functions take one apart (_unwrap) and find the framework of a value (_framework)."""

from __future__ import annotations

from typing import Any, Sequence, cast

from . import _core, _hooks
from ._core import Mesh, NamedSharding, PartitionSpec


class ShardedArray:
    """A global array cut across a mesh. ``local`` is this rank's block, in the framework the data came from.

    With JAX imported it is a JAX pytree (shardkit.jax._pytree): its one leaf is the block, the global shape and the
    sharding are static, so jax.jit, grad, the lax loops and jax.tree.map take and return ShardedArrays. What JAX
    rebuilds holds the leaf it was given (a jax.Array, a tracer, ...) and reaches the C++ array (without a copy) only
    when an eager operation needs it."""

    __slots__ = ("_x", "_framework", "_leaf", "_shape", "_sharding")

    def __init__(self, x: _core.ShardedArray | None, framework: str = "numpy", *, leaf: Any = None,
                 shape: Sequence[int] = (), sharding: NamedSharding | None = None) -> None:
        self._x = x
        self._framework = framework
        self._leaf = leaf
        self._shape = tuple(x.shape) if x is not None else tuple(shape)
        self._sharding = x.sharding if x is not None else sharding

    @classmethod
    def _of_leaf(cls, leaf: Any, shape: Sequence[int], sharding: NamedSharding) -> ShardedArray:
        """This rank's block `leaf` (any object: JAX rebuilds pytrees from tracers and placeholders too) with the
        static metadata; nothing is checked or copied."""
        return cls(None, "", leaf=leaf, shape=shape, sharding=sharding)

    def _core(self) -> _core.ShardedArray:
        """The C++ array (made from the leaf, without communication or a copy, the first time it is needed)."""
        if self._x is None:
            if _hooks.is_jax_tracer(self._leaf):
                raise _core.InvalidArgument(
                    f"this ShardedArray{self._shape} holds a JAX tracer (it is being traced by jax.jit, grad, ...): "
                    "inside a traced function use sk.shard_map and sk.process_allgather on it, or call this outside")
            self._x = _core.from_local(self._leaf, list(self._shape), self._sharding)
        return self._x

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def dtype(self) -> str:
        if self._leaf is not None:
            return str(self._leaf.dtype)
        return self._x.dtype if self._x is not None else "None"

    @property
    def sharding(self) -> NamedSharding:
        return cast(NamedSharding, self._sharding)

    @property
    def mesh(self) -> Mesh:
        return self.sharding.mesh

    @property
    def spec(self) -> PartitionSpec:
        return self.sharding.spec

    @property
    def device(self) -> str:
        return self._core().device

    @property
    def framework(self) -> str:
        if not self._framework:
            self._framework = "jax" if _hooks.is_jax_tracer(self._leaf) else _framework(self._leaf)
        return self._framework

    @property
    def local(self) -> Any:
        """This rank's block (read-only), in the array's framework. Traced (inside jax.jit, grad, ...), its cotangent is
        this rank's block of the global value's cotangent (see shardkit.jax._shard_map)."""
        if self._x is None or self._leaf is not None:
            return self._leaf
        return self._x.local(self._framework)

    def __repr__(self) -> str:
        return f"ShardedArray(shape={self.shape}, dtype={self.dtype}, {self.sharding!r}, framework={self.framework})"


def _unwrap(x: object) -> _core.ShardedArray:
    if isinstance(x, ShardedArray):
        return x._core()
    if isinstance(x, _core.ShardedArray):
        return x
    raise _core.InvalidArgument(f"expected a ShardedArray, got {type(x).__name__}")


def _framework(x: object, default: str = "numpy") -> str:
    if isinstance(x, ShardedArray):
        return x.framework
    if x is None:
        return default
    f = _core.framework_of(x)
    return default if f in ("other", "shardkit") else f


def is_sharded(x: object) -> bool:
    """Whether x is a ShardedArray (the Python one, or the C++ one)."""
    return isinstance(x, (ShardedArray, _core.ShardedArray))
