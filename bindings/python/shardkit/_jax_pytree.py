"""ShardedArray as a JAX pytree: its one leaf is this rank's block, the global shape and the sharding are static
(aux data), so jax.jit, grad, the lax loops, jax.tree.map and optax take and return ShardedArrays with their sharding.
Rebuilding communicates nothing and checks nothing (JAX rebuilds pytrees from tracers and placeholders too).

Registered once JAX is imported (shardkit never imports JAX itself: shardkit/__init__.py waits for it).
"""

from __future__ import annotations

import jax

from ._sharding import ShardedArray


def _flatten(x):
    if x._leaf is None:  # a C++ array: its block in its framework, kept (the block never changes)
        x._leaf = x.local
    return (x._leaf,), (x.shape, x.sharding)


def _unflatten(aux, children):
    shape, sharding = aux
    return ShardedArray._of_leaf(children[0], shape, sharding)


def register():
    jax.tree_util.register_pytree_node(ShardedArray, _flatten, _unflatten)
