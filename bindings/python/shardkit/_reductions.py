"""Reductions over pytrees that hold ShardedArrays, with the value of the global arrays: tree_sum, tree_global_norm.

A ShardedArray's pytree leaf is this rank's block, so a reduction written over a tree's leaves (jax.tree.reduce,
optax.global_norm, optax.clip_by_global_norm, LAMB's trust ratio) reduces this rank's blocks only: each rank gets a
value of its own, and none is the global one. These functions give the global value, the same on every rank:

- a ShardedArray counts each element of its global array once: its blocks' sums are added over the mesh axes its spec
  shards (the ranks along the other axes hold the same blocks, which are not added again), with one psum per mesh and
  set of such axes for the whole tree, run by sk.shard_map (so eagerly, on NumPy or JAX blocks, and under jax.jit,
  compiled into the program, alike; and jax.grad of a result is the derivative of the global value);
- an array that is no ShardedArray is one every rank holds (as in shard_map): it counts once, summed here, without
  communication.

Sums are computed in each array's own namespace (NumPy, or jax.numpy for JAX arrays and tracers: the Array API's
``__array_namespace__``) and come back in it, with that namespace's dtype for the sum of one array.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import _core, _spec_tree
from ._core import Mesh, PartitionSpec
from ._sharded_array import ShardedArray
from ._sharding import psum, shard_map

__all__ = ["tree_sum", "tree_global_norm", "leaf_sums"]


def tree_sum(tree: Any) -> Any:
    """The sum of every element of every array in ``tree`` (a pytree of ShardedArrays, arrays every rank holds and
    numbers), as optax.tree_utils.tree_sum of the global arrays: the same value on every rank. Collective over the
    meshes of the tree's ShardedArrays; works eagerly and under jax.jit."""
    return sum(leaf_sums(_spec_tree.tree_leaves(tree)[0], square=False))


def tree_global_norm(tree: Any, *, squared: bool = False) -> Any:
    """The L2 norm of every element of every array in ``tree``, as optax.global_norm (optax.tree.norm) of the global
    arrays: the same value on every rank; its square with ``squared=True``. Replicated blocks and arrays every rank
    holds count once. Collective over the meshes of the tree's ShardedArrays; works eagerly and under jax.jit."""
    total = sum(leaf_sums(_spec_tree.tree_leaves(tree)[0], square=True))
    return total if squared else _namespace(total).sqrt(total)


def leaf_sums(leaves: Sequence[Any], square: bool) -> list[Any]:
    """For each value of ``leaves`` (ShardedArrays, arrays every rank holds, numbers): the sum of its global array's
    elements (of their squared magnitudes where ``square``), the same on every rank. One psum per mesh and set of
    sharding axes, for all the leaves at once."""
    out: list[Any] = [None] * len(leaves)
    groups: dict[tuple[Mesh, tuple[str, ...]], list[int]] = {}
    arrays = [ShardedArray(x) if isinstance(x, _core.ShardedArray) else x for x in leaves]
    for i, x in enumerate(arrays):
        axes = _sharded_axes(x)
        if axes:
            groups.setdefault((x.sharding.mesh, axes), []).append(i)
        else:  # one block holds the whole array (or every rank holds it): nothing to add up across ranks
            out[i] = _local_sum(x.local if isinstance(x, ShardedArray) else x, square)
    for (mesh, axes), members in groups.items():
        for i, s in zip(members, _group_sums([arrays[i] for i in members], mesh, axes, square)):
            out[i] = s
    return out


def _sharded_axes(x: Any) -> tuple[str, ...]:
    """The mesh axes (of more than one rank) along which the blocks of x differ: those its spec names. None for an
    array every rank holds."""
    if not isinstance(x, ShardedArray):
        return ()
    mesh, replicated = x.sharding.mesh, set(x.sharding.replicated_axes)
    return tuple(a for a in mesh.axis_names if a not in replicated and mesh.axis_size([a]) > 1)


def _group_sums(arrays: list[ShardedArray], mesh: Mesh, axes: tuple[str, ...], square: bool) -> list[Any]:
    """The global sums of ShardedArrays on `mesh` whose blocks differ along `axes`: their blocks' sums, stacked and
    psum'ed over `axes` in one shard_map (the psum makes its out_spec P() true: checking it would cost a collective)."""
    dtypes: list[Any] = []

    def body(*blocks: Any) -> Any:
        sums = [_local_sum(b, square) for b in blocks]
        dtypes[:] = [s.dtype for s in sums]
        return psum(_namespace(sums[0]).stack(sums), axes)  # stacked in the promoted dtype; each cast back below

    specs = tuple(a.sharding.spec for a in arrays)
    total = shard_map(body, mesh=mesh, in_specs=specs, out_specs=PartitionSpec(), check_vma=False)(*arrays).local
    return [_as(total[k], d) for k, d in enumerate(dtypes)]


def _as(x: Any, dtype: Any) -> Any:
    """x (one of the stacked sums) in the dtype of its array's own sum: the real part where that is real (a stack with
    a complex array's sum is complex)."""
    if np.issubdtype(x.dtype, np.complexfloating) and not np.issubdtype(dtype, np.complexfloating):
        x = x.real
    return x.astype(dtype)


def _local_sum(x: Any, square: bool) -> Any:
    """The sum of the elements of x (of their squared magnitudes where `square`), in x's namespace."""
    xp = _namespace(x)
    x = xp.asarray(x)
    if square:
        x = x.real * x.real + x.imag * x.imag if np.issubdtype(x.dtype, np.complexfloating) else x * x
    return xp.sum(x)


def _namespace(x: Any) -> Any:
    """The Array API namespace of x: jax.numpy for JAX arrays and tracers, NumPy for NumPy arrays and numbers."""
    get = getattr(x, "__array_namespace__", None)
    return get() if get is not None else np
