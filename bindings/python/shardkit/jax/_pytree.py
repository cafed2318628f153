"""shardkit's values and trees as JAX's pytrees.

ShardedArray is a JAX pytree: its one leaf is this rank's block, the global shape and the sharding are static (aux
data), so jax.jit, grad, the lax loops, jax.tree.map and optax take and return ShardedArrays with their sharding.
Rebuilding communicates nothing and checks nothing (JAX rebuilds pytrees from tracers and placeholders too).

And the core's trees (shard_map's specs, checkpoints) open the pytree nodes JAX knows (optax and flax states, ...)
through tree_flatten and tree_children, which shardkit.jax registers with the core (shardkit._hooks).
"""

from __future__ import annotations

import jax

from .._sharded_array import ShardedArray


def _flatten(x):
    if x._leaf is None:  # a C++ array: its block in its framework, kept (the block never changes)
        x._leaf = x.local
    return (x._leaf,), (x.shape, x.sharding)


def _unflatten(aux, children):
    shape, sharding = aux
    return ShardedArray._of_leaf(children[0], shape, sharding)


def register():
    jax.tree_util.register_pytree_node(ShardedArray, _flatten, _unflatten)


def tree_flatten(tree, is_leaf):
    """(leaves, rebuild) of `tree` as jax.tree_util flattens it, stopping at the values is_leaf takes."""
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_leaf)
    return leaves, treedef.unflatten


def tree_children(tree):
    """A pytree node JAX knows (a registered class), one level: its (key, child) pairs, the keys as text, and the
    function rebuilding it from new children; None where JAX takes `tree` for a leaf."""
    children, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is not tree)
    if len(children) == 1 and children[0][1] is tree:
        return None
    if not children and jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(tree)):
        return None
    treedef = jax.tree_util.tree_structure(tree, is_leaf=lambda x: x is not tree)
    return [(_key(path[0]), child) for path, child in children], treedef.unflatten


def _key(k):
    """A key path's entry as text: a dict's key, a sequence's index, an attribute's name."""
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)
