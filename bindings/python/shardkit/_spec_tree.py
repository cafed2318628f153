"""shard_map's in_specs and out_specs as pytrees: a P applies to every array of the subtree it stands for, as in JAX,
where the specs are a prefix of the arguments' (or the outputs') structure. One rule for the eager and the traced
shard_map.

Containers are tuples, lists, dicts (keys in sorted order, as JAX's), namedtuples and None (no arrays). With JAX
loaded, the subtree under one P is flattened by jax.tree_util (the JAX layer's tree_flatten, shardkit._hooks), so any
registered pytree works there; a ShardedArray is always one value (never opened into its block).
"""

from __future__ import annotations

from typing import Any, Callable

from . import _core, _hooks
from ._core import PartitionSpec
from ._sharded_array import is_sharded

Rebuild = _hooks.Rebuild


def _node(tree: Any) -> tuple[list[Any], Callable[[list[Any]], Any], Any] | None:
    """(children, rebuild, shape) of a container, or None for a value; `shape` compares two containers' layouts."""
    if tree is None:
        return [], lambda c: None, None
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a namedtuple
        return list(tree), lambda c, t=type(tree): t(*c), (type(tree), len(tree))
    if isinstance(tree, (tuple, list)):
        return list(tree), lambda c, t=type(tree): t(c), ("sequence", len(tree))
    if isinstance(tree, dict):
        keys = sorted(tree)
        return [tree[k] for k in keys], lambda c, k=keys: dict(zip(k, c)), ("dict", tuple(keys))
    return None


def tree_leaves(tree: Any) -> tuple[list[Any], Rebuild]:
    """Every value of `tree` (a ShardedArray is one value) and the function rebuilding it from new ones."""
    layer = _hooks.jax_layer()
    if layer is not None and not is_sharded(tree):
        return layer.tree_flatten(tree, is_sharded)
    node = _node(tree)
    if node is None:
        return [tree], lambda c: c[0]
    children, rebuild, _ = node
    parts = [tree_leaves(c) for c in children]
    return [x for p, _ in parts for x in p], _joined(parts, rebuild)


def _joined(parts: list[tuple[list[Any], Rebuild]], rebuild: Callable[[list[Any]], Any]) -> Rebuild:
    def join(values: list[Any]) -> Any:
        out, i = [], 0
        for leaves, sub in parts:
            out.append(sub(values[i:i + len(leaves)]))
            i += len(leaves)
        return rebuild(out)
    return join


def flatten(specs: Any, tree: Any, what: str) -> tuple[list[Any], list[PartitionSpec], Rebuild]:
    """The values of `tree`, the P of each (from `specs`, a prefix of `tree`), and the function that rebuilds `tree`'s
    structure from one new value per value. Raises InvalidArgument naming `what` where `specs` is not a prefix."""
    if isinstance(specs, PartitionSpec):
        leaves, rebuild = tree_leaves(tree)
        return leaves, [specs] * len(leaves), rebuild
    spec_node, tree_node = _node(specs), _node(tree)
    if spec_node is None:
        raise _core.InvalidArgument(f"{what} must be a P(...) or a pytree (tuple, list, dict) of them, got {specs!r}")
    if tree_node is None or spec_node[2] != tree_node[2]:
        raise _core.InvalidArgument(
            f"{what} = {specs!r} is not a prefix of the structure it applies to ({_describe(tree)}): give one P per "
            "value, or one P for a whole subtree")
    parts, specs_out = [], []
    for s, t in zip(spec_node[0], tree_node[0]):
        leaves, leaf_specs, rebuild = flatten(s, t, what)
        parts.append((leaves, rebuild))
        specs_out.extend(leaf_specs)
    return [x for p, _ in parts for x in p], specs_out, _joined(parts, tree_node[1])


def _describe(tree: Any) -> str:
    node = _node(tree)
    if node is None:
        return "one value"
    kind = node[2]
    if kind is None:
        return "None"
    if kind[0] == "dict":
        return f"a dict with keys {list(kind[1])}"
    return f"a {type(tree).__name__} of {len(node[0])}"
