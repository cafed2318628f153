"""Where the core modules call the JAX layer without importing it.

The core (_sharded_array, _sharding, _spec_tree, checkpoint) meets JAX's values: tracers (a ShardedArray under jax.jit,
a shard_map traced by jax.jit, a collective in a jit-compiled body) and pytree nodes JAX knows (optax and flax states).
Dependencies point one way: the JAX layer, ``shardkit.jax``, imports the core, and the core never imports it. Instead
``shardkit.jax``, loaded once jax is imported (shardkit._after_jax), fills a JaxLayer and registers it here
(register_jax); the core calls the one registered (jax_layer, is_jax_tracer). While none is registered JAX is not
loaded, and no JAX value can exist.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable

# A pytree's leaves and the function that rebuilds its structure from new ones.
Rebuild = Callable[[list[Any]], Any]


@dataclass(frozen=True)
class JaxLayer:
    """What the core calls where a value is JAX's (shardkit.jax/__init__.py fills it)."""

    is_tracer: Callable[[object], bool]
    """Whether a value is a JAX tracer (jax.jit, grad, vmap, ... are tracing it)."""
    traced_context: Callable[[Any], Any]
    """The axis collectives of a shard_map body on tracers, for a Mesh (a jit-compiled function in an eager body)."""
    shard_map: Callable[..., Any]
    """The traced shard_map: (f, mesh, leaves, in_specs, rebuild_args, out_specs, stack, check_vma) -> f's outputs
    as ShardedArrays holding traced blocks; ``stack`` is the caller's list of the traced bodies' contexts."""
    process_allgather: Callable[[Any], Any]
    """The global value of a ShardedArray whose block is a tracer, as part of the traced program."""
    body_scope: Callable[[Any], AbstractContextManager[object]]
    """A context manager around an eager shard_map body on a Mesh: jax.jit's caches keyed by that mesh."""
    tree_flatten: Callable[[Any, Callable[[Any], bool]], tuple[list[Any], Rebuild]]
    """(leaves, rebuild) of a pytree as JAX flattens it, is_leaf(x) stopping at a value."""
    tree_children: Callable[[Any], tuple[list[tuple[str, Any]], Rebuild] | None]
    """A pytree node JAX knows, one level: its (key, child) pairs and the function rebuilding it from new children;
    None where JAX takes the value for a leaf."""
    optax: Any
    """shardkit.optax's transforms (the module shardkit.jax._optax: clip_by_global_norm, scale_by_trust_ratio, lamb,
    lars), made once optax is imported."""


_layer: JaxLayer | None = None


def register_jax(layer: JaxLayer) -> None:
    """Called by shardkit.jax when it is loaded."""
    global _layer
    _layer = layer


def jax_layer() -> JaxLayer | None:
    """The JAX layer registered, or None (JAX is not loaded)."""
    return _layer


def is_jax_tracer(x: object) -> bool:
    """Whether x is a JAX tracer (False while JAX is not loaded)."""
    return _layer is not None and _layer.is_tracer(x)
