"""shardkit's JAX layer: its collectives as JAX primitives, shard_map under JAX tracing, ShardedArray as a pytree.

Nothing here is for users to import or call: shardkit loads this package once JAX is imported (shardkit._after_jax;
``import shardkit`` never imports JAX), and then ``sk.shard_map``, ``sk.mpi.*``, ``sk.process_allgather`` and the
rest take JAX arrays and tracers (docs/jax.md).

Dependencies point one way: this package imports shardkit's core modules, and they never import it. Loading it
registers ShardedArray as a JAX pytree and what the core calls on JAX values (shardkit._hooks.JaxLayer); its entry
points connect it to XLA and to the C++ side at their first use (_ops.activate).

    _compat      every JAX internal the layer uses, for the JAX releases it was tested on (the one module that reads
                 JAX's private modules)
    _ops         the primitive shardkit_collective: abstract evaluation, lowering to the XLA FFI handler, vmap, jvp
                 and transpose rules, shardkit.mpi's calls with JAX values (dispatch), the mesh in jax.jit's cache key
    _collectives the axis collectives of a traced shard_map body (TracedContext) and the boundary's marks
    _shard_map   the traced shard_map: argument blocks, compiled resharding, outputs, process_allgather
    _check_vma   check_vma=True: the body traced by jax.shard_map, its equations run by shardkit
    _pytree      ShardedArray as a pytree, and JAX's pytrees for the core's trees
    _optax       shardkit.optax's transforms: optax's clip_by_global_norm and trust ratio (lamb, lars) with global norms
"""

from __future__ import annotations

from .. import _hooks
from . import _compat, _ops, _optax, _pytree, _shard_map
from ._collectives import TracedContext

__all__: list[str] = []


def _activated(fn):
    """fn, run once the layer is connected to XLA and the C++ side (_ops.activate, done at the first call)."""
    def run(*args, **kwargs):
        _ops.activate()
        return fn(*args, **kwargs)
    return run


def _is_tracer(x):
    return isinstance(x, _compat.Tracer)


# Registered last: a load that fails before these lines registers nothing (shardkit._after_jax warns, JAX unchanged).
_pytree.register()
_hooks.register_jax(_hooks.JaxLayer(
    is_tracer=_is_tracer,
    traced_context=_activated(TracedContext),
    shard_map=_activated(_shard_map.run),
    process_allgather=_activated(_shard_map.process_allgather),
    body_scope=_activated(_ops.mesh_key),
    tree_flatten=_pytree.tree_flatten,
    tree_children=_pytree.tree_children,
    optax=_optax,
))
