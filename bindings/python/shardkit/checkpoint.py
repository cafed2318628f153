"""Sharded checkpoints: save a tree of ShardedArrays and plain values on one mesh, load it onto any other.

A step is a Zarr v3 group under ``PATH/step_<N>`` (one Zarr array per leaf, its chunk grid the save-time block grid,
each chunk file a ``sharding_indexed`` shard with crc32c on every inner chunk and on its index, written whole by one
rank); TensorStore and zarr-python read it. The group's attributes hold the tree's structure (key paths), the saved
meshes and specs, the step and your metadata, as JSON. A step appears only by a rename once every rank has written
and synced its files, so a crash never damages the last good step.

    sk.save("ckpt", {"params": params, "opt": opt_state, "step": 10})      # collective
    state = sk.load("ckpt", mesh, {"params": P("x"), "opt": P()})          # onto any mesh, any rank count
    sk.checkpoint_info("ckpt")                                            # steps, arrays, shapes, meshes, specs

The command line:

    shardkit-ckpt inspect PATH [--step N] [--verify]     (also: python -m shardkit.checkpoint inspect PATH)
"""

from __future__ import annotations

import argparse
import atexit
import json
import sys
from typing import Any, Callable, Sequence

import numpy as np

from . import _core, _hooks, _spec_tree
from ._core import Mesh, PartitionSpec, SaveHandle
from ._sharded_array import ShardedArray, _framework, _unwrap, is_sharded

__all__ = ["save", "load", "load_rank_state", "checkpoint_info", "latest_step", "steps", "wait_for_saves",
           "SaveHandle"]

# Where a step keeps per-rank state (rank_state=): each rank's JSON text as a row of a (ranks, bytes) uint8 array cut
# by rank, and the texts' lengths. A tree's key never has a '%' that starts no escape (_segment escapes '%' itself).
_RANK_STATE_BYTES = "%rank_state/bytes"
_RANK_STATE_LENGTHS = "%rank_state/lengths"
# The key of a tree that is a single leaf (an array saved alone).
_ROOT = "%leaf"

# Python scalars are saved as 0-d arrays of these dtypes and come back as the same Python type.
_SCALARS: dict[type, str] = {bool: "bool", int: "int64", float: "float64", complex: "complex128"}
_SCALAR_TYPES = {v.__name__: v for v in _SCALARS}

_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _segment(name: object) -> str:
    """A key path's part as a Zarr node name: characters other than letters, digits, '.', '_' and '-' percent-encoded,
    and the names Zarr or shardkit reserve ('', '.', '..', '__*', the metadata files) made safe."""
    text = str(name)
    out = "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in text)
    if out == "":
        return "%"
    if out.startswith("__"):
        out = "%5F" + out[1:]
    if set(out) == {"."} or out in ("zarr.json", "shardkit_manifest.json"):
        out = out.replace(".", "%2E")
    return out


class _Slot:
    """A placeholder leaf standing for a saved array (its key) while specs and templates are matched to the tree."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key


def _jax_node(tree: Any) -> tuple[list[tuple[str, Any]], Callable[[list[Any]], Any]] | None:
    """A pytree node JAX knows (a registered class: optax and flax states, ...): its (key, child) pairs and the function
    rebuilding it (the JAX layer's tree_children, shardkit._hooks); None for anything else."""
    layer = _hooks.jax_layer()
    if layer is None or is_sharded(tree) or isinstance(tree, _Slot):
        return None
    return layer.tree_children(tree)


def _flatten(tree: Any, prefix: str = "") -> tuple[list[tuple[str, Any]], Any, Callable[[list[Any]], Any]]:
    """(key, leaf) pairs of a tree in order, its structure as JSON, and the function rebuilding it from new leaves.
    Containers as shard_map's specs know them (tuples, lists, dicts in sorted key order, namedtuples, None), then any
    pytree JAX knows; ShardedArrays are leaves."""
    def child_key(name: object) -> str:
        return f"{prefix}/{_segment(name)}" if prefix else _segment(name)

    if isinstance(tree, _Slot):  # a saved key, as it was saved (a C++ program's 'params/w' included)
        return [(tree.key, tree)], {"leaf": tree.key}, lambda v: v[0]
    if is_sharded(tree):
        return [(prefix or _ROOT, tree)], {"leaf": prefix or _ROOT}, lambda v: v[0]
    node = _spec_tree._node(tree)
    if node is not None and tree is not None:
        children, rebuild, shape = node
        if isinstance(tree, dict):
            names: list[object] = sorted(tree)
            kind: dict[str, Any] = {"dict": [str(n) for n in names]}
        elif hasattr(tree, "_fields"):
            names = list(tree._fields)
            kind = {"namedtuple": type(tree).__name__, "fields": list(tree._fields)}
        else:
            names = list(range(len(children)))
            kind = {"list" if isinstance(tree, list) else "tuple": len(children)}
        return _joined([_flatten(c, child_key(n)) for n, c in zip(names, children)], rebuild, kind)
    if tree is None:
        return [], None, lambda v: None
    node = _jax_node(tree)
    if node is not None:
        pairs, unflatten = node
        return _joined([_flatten(c, child_key(k)) for k, c in pairs], unflatten,
                       {"pytree": type(tree).__name__, "keys": [k for k, _ in pairs]})
    return [(prefix or _ROOT, tree)], {"leaf": prefix or _ROOT}, lambda v: v[0]


def _joined(parts: list[tuple[list[tuple[str, Any]], Any, Callable[[list[Any]], Any]]],
            rebuild: Callable[[list[Any]], Any], kind: dict[str, Any]) -> tuple[list[tuple[str, Any]], Any,
                                                                               Callable[[list[Any]], Any]]:
    def join(values: list[Any]) -> Any:
        out, i = [], 0
        for leaves, _, sub in parts:
            out.append(sub(values[i:i + len(leaves)]))
            i += len(leaves)
        return rebuild(out)
    kind["children"] = [j for _, j, _ in parts]
    return [kv for p, _, _ in parts for kv in p], kind, join


def _skeleton(node: Any) -> Any:
    """The tree a saved structure describes, with a _Slot per leaf: dicts, lists, tuples and None as saved;
    namedtuples and other pytrees as dicts of their fields (pass ``like=`` to get the classes back)."""
    if node is None:
        return None
    if "leaf" in node:
        return _Slot(node["leaf"])
    children = [_skeleton(c) for c in node["children"]]
    if "dict" in node:
        return dict(zip(node["dict"], children))
    if "list" in node:
        return children
    if "tuple" in node:
        return tuple(children)
    names = node.get("fields", node.get("keys", []))
    return dict(zip(names, children))


def _leaf_value(key: str, leaf: Any) -> tuple[Any, dict[str, str]]:
    """What the C++ save takes for a leaf (a core ShardedArray or an array), and what the tree records of it."""
    if is_sharded(leaf):
        return _unwrap(leaf), {"kind": "sharded", "framework": _framework(leaf)}
    if type(leaf) in _SCALARS:
        return np.asarray(leaf, dtype=_SCALARS[type(leaf)]), {"kind": "scalar", "type": type(leaf).__name__}
    if isinstance(leaf, np.generic):
        return np.asarray(leaf), {"kind": "array", "framework": "numpy"}
    if isinstance(leaf, (str, bytes)) or not (hasattr(leaf, "__dlpack__") or hasattr(leaf, "__array__")):
        raise _core.InvalidArgument(
            f"save: the leaf at '{key}' is a {type(leaf).__name__}, not an array, ShardedArray or number "
            "(put other values in metadata=)")
    return leaf, {"kind": "array", "framework": _framework(leaf)}


def _rank_line() -> Mesh:
    return Mesh((_core.size(),), ("ranks",))


def save(path: str, tree: Any, step: int | None = None, *, blocking: bool = True, keep_last: int = 0,
         metadata: Any = None, comm: Any = None, chunk_bytes: int = 4 << 20, sync: bool = True,
         rank_state: Any = None, writer_nice: int | None = None) -> SaveHandle:
    """Saves `tree` as step `step` (default: one past the newest) of the checkpoint at `path`. Collective: every rank
    passes the same tree (ShardedArrays; plain NumPy/JAX arrays and Python numbers, which every rank holds alike).

    Each ShardedArray is written by the ranks holding it, each chunk file by one of them (the copies of a
    replicated block share the writing); plain arrays are split among the ranks. With ``blocking=False`` it returns
    once this rank's blocks are copied (you may overwrite them), a background thread writes, and the step is
    committed at ``handle.wait()``, the next save or exit. The background writer runs ``writer_nice`` (0 to 19;
    default 19, the lowest) below the caller's priority, so that a loop busy on every core keeps its cores.
    ``keep_last=N`` keeps the newest N steps and the one just saved: the others leave the steps at the commit and
    their files are removed in the background (``wait_for_saves`` waits for that). ``metadata`` is any JSON value,
    returned by ``checkpoint_info``. ``rank_state`` is this rank's own state that is not an array (a data loader's
    position, an RNG's state), as JSON: each rank's is kept with the world's size, and ``load_rank_state`` gives it
    back."""
    # A failure here (one rank's leaf or state the others do not share) goes into the save, whose agreement makes
    # every rank raise it: raising here alone would leave the other ranks waiting in the save.
    # A leaf that fails is left out (the others stay, so that the save runs on the same communicator as the other
    # ranks').
    entries: list[tuple[str, Any]] = []
    tree_json, metadata_json, state_json, failure = "null", "null", None, ""

    def failed(e: Exception) -> str:
        return failure or (str(e) if isinstance(e, _core.Error) else f"{type(e).__name__}: {e}")

    try:
        pairs, structure, _ = _flatten(tree)
        kinds = {}
        for key, leaf in pairs:
            try:
                value, kinds[key] = _leaf_value(key, leaf)
                entries.append((key, value))
            except Exception as e:  # noqa: BLE001  (any failure of this rank's: the save raises it on every rank)
                failure = failed(e)
        tree_json = json.dumps({"structure": structure, "leaves": kinds})
        metadata_json = json.dumps(metadata)
    except Exception as e:  # noqa: BLE001
        failure = failed(e)
    if rank_state is not None:
        try:
            state_json = json.dumps(rank_state, allow_nan=True)
        except (TypeError, ValueError) as e:
            state_json = "\0" + str(e)
    return _core.checkpoint_save(str(path), entries, step, metadata_json, tree_json, keep_last, chunk_bytes,
                                 sync, blocking, comm, state_json, failure, writer_nice)


def _axes_of(spec: PartitionSpec) -> set[str]:
    """The mesh axes a P names."""
    out: set[str] = set()
    for entry in spec:
        if isinstance(entry, str):
            out.add(entry)
        elif entry is not None:
            out.update(entry)
    return out


def _specs_for(specs: Any, skeleton: Any, keys: list[str], infos: dict[str, dict[str, Any]],
               mesh: Mesh) -> dict[str, PartitionSpec]:
    """The P of every saved sharded key: from one P, a callable (key, info) -> P, a pytree of them (a prefix of the
    tree), or, by default, the spec it was saved with where `mesh` has its axes (else replicated)."""
    if specs is None:
        out = {}
        for k in keys:
            saved = infos[k].get("spec", PartitionSpec())
            out[k] = saved if _axes_of(saved) <= set(mesh.axis_names) else PartitionSpec()
        return out
    if isinstance(specs, PartitionSpec):
        return {k: specs for k in keys}
    if callable(specs):
        out = {}
        for k in keys:
            p = specs(k, infos[k])
            if not isinstance(p, PartitionSpec):
                raise _core.InvalidArgument(f"load: specs({k!r}, ...) returned {p!r}, not a P(...)")
            out[k] = p
        return out
    slots, leaf_specs, _ = _spec_tree.flatten(specs, skeleton, "load: specs")
    return {s.key: p for s, p in zip(slots, leaf_specs) if isinstance(s, _Slot)}


def _shape_and_dtype(leaf: Any) -> tuple[list[int], str | None] | None:
    """The global shape and dtype name a like= leaf stands for, or None (a number, a placeholder)."""
    if leaf is None or isinstance(leaf, _Slot) or type(leaf) in _SCALARS or not hasattr(leaf, "shape"):
        return None
    try:
        return [int(d) for d in leaf.shape], np.dtype(leaf.dtype).name
    except TypeError:
        return [int(d) for d in leaf.shape], None


def _template_leaf_framework(leaf: Any, default: str) -> str:
    if leaf is None or isinstance(leaf, _Slot):
        return default
    if is_sharded(leaf):
        return _framework(leaf, default)
    f = _framework(leaf, default)
    return "jax" if type(leaf).__name__ == "ShapeDtypeStruct" else f


def load(path: str, mesh: Mesh, specs: Any = None, step: int | None = None, *, like: Any = None,
         framework: str = "numpy", uneven: bool | None = None, device: str | None = None) -> Any:
    """Loads step `step` (default: the newest committed one) of the checkpoint at `path` onto `mesh`: each rank
    reads only the parts of the files its blocks need. Saved ShardedArrays come back as ShardedArrays sharded by
    `specs` (one P, a pytree of P that is a prefix of the tree, or a callable ``(key, info) -> P``; by default as
    saved where the mesh has those axes); plain arrays and numbers come back whole on every rank.

    The tree's structure is the saved one (dicts, lists, tuples; other containers as dicts), or that of `like`, a
    tree of the same structure (e.g. the state you would have started from, or its shapes), whose leaves also say
    the framework of each loaded leaf; otherwise `framework` ("numpy" or "jax") does."""
    path = str(path)
    if step is None:
        done = _core.checkpoint_steps(path)
        if not done:
            raise _core.InvalidArgument(f"load: no committed step in '{path}'")
        step = done[-1]
    info = _core.checkpoint_inspect(path, step)
    saved = json.loads(info["tree_json"]) if info["tree_json"] != "null" else None
    arrays = {a["key"]: a for a in info["arrays"]}
    kinds: dict[str, dict[str, str]] = saved["leaves"] if saved else {
        k: {"kind": "array" if a["plain"] else "sharded"} for k, a in arrays.items() if not k.startswith("%rank_state/")}
    if like is not None:
        pairs, _, rebuild = _flatten(like)
        skeleton = rebuild([_Slot(k) for k, _ in pairs])
        frameworks = {k: _template_leaf_framework(v, framework) for k, v in pairs}
        for k, _ in pairs:
            if k not in arrays:
                raise _core.InvalidArgument(f"load: key '{k}' of like= is not in step {step} of '{path}'")
    else:
        skeleton = _skeleton(saved["structure"]) if saved else {k: _Slot(k) for k in kinds}
        pairs, _, rebuild = _flatten(skeleton)
        frameworks = {k: framework for k, _ in pairs}
    keys = [k for k, _ in pairs]
    sharded = [k for k in keys if kinds.get(k, {}).get("kind") == "sharded"]
    spec_of = _specs_for(specs, skeleton, sharded, arrays, mesh)
    # like='s arrays say the shape and dtype they expect (a difference is an error naming the key and both).
    expected = {k: _shape_and_dtype(v) for k, v in pairs} if like is not None else {}
    targets = []
    for k in keys:
        shape, dtype = expected.get(k) or (list(arrays[k]["shape"]), None)
        targets.append((k, spec_of.get(k, PartitionSpec()), shape, dtype))
    loaded = _core.checkpoint_load(path, mesh, targets, step, uneven, device)
    values = []
    for k, x in zip(keys, loaded):
        kind = kinds.get(k, {}).get("kind", "sharded")
        if kind == "sharded":
            values.append(ShardedArray(x, frameworks[k]))
        elif kind == "scalar":
            values.append(_SCALAR_TYPES[kinds[k]["type"]](x.local("numpy")[()]))
        else:
            values.append(x.local(frameworks[k]))
    return rebuild(values)


def load_rank_state(path: str, step: int | None = None, *,
                    merge: Callable[[list[Any], int, int], Any] | None = None) -> Any:
    """This rank's ``rank_state`` of step `step` (default: the newest committed one). On as many ranks as saved it,
    rank r gets what rank r saved. On another number of ranks it raises, unless ``merge(states, rank, size)`` says
    what this rank gets from the list of every saved rank's state: per-rank state is never dropped silently."""
    path = str(path)
    if step is None:
        step = latest_step(path)
        if step is None:
            raise _core.InvalidArgument(f"load_rank_state: no committed step in '{path}'")
    info = _core.checkpoint_inspect(path, step)
    shapes = {a["key"]: a["shape"] for a in info["arrays"]}
    if _RANK_STATE_BYTES not in shapes:
        raise _core.InvalidArgument(f"load_rank_state: step {step} of '{path}' holds no per-rank state "
                                    "(save it with rank_state=)")
    (ranks, width), size = shapes[_RANK_STATE_BYTES], _core.size()
    if ranks != size and merge is None:
        raise _core.InvalidArgument(
            f"load_rank_state: step {step} of '{path}' holds the per-rank state of {ranks} rank(s) and this job has "
            f"{size}: pass merge=(states, rank, size) -> state to say what each rank gets (none is dropped)")
    spec = PartitionSpec("ranks") if ranks == size else PartitionSpec()
    data, lengths = _core.checkpoint_load(path, _rank_line(), [(_RANK_STATE_BYTES, spec, [ranks, width], None),
                                                               (_RANK_STATE_LENGTHS, spec, [ranks], None)],
                                          step, None, "cpu")
    rows, counts = data.local("numpy"), lengths.local("numpy")
    states = [json.loads(bytes(rows[i, :counts[i]]).decode()) for i in range(rows.shape[0])]
    if ranks == size:
        return states[0]
    assert merge is not None
    return merge(states, _core.rank(), size)


def steps(path: str) -> list[int]:
    """The committed steps at `path`, ascending."""
    return list(_core.checkpoint_steps(str(path)))


def latest_step(path: str) -> int | None:
    """The newest committed step at `path`, or None."""
    done = steps(path)
    return done[-1] if done else None


def checkpoint_info(path: str, step: int | None = None, *, verify: bool = False) -> dict[str, Any]:
    """What a checkpoint holds: its committed ``steps``, and for `step` (default: the newest) its ``arrays`` (key,
    shape, dtype, saved mesh and spec, chunking, bytes), ``metadata``, the saving ``saved_ranks``, and whether it is
    ``committed`` (and, with ``verify=True``, every file's size and crc32c checked: ``verified``). Local: no
    collective."""
    done = steps(path)
    if step is None:
        if not done:
            return {"path": str(path), "steps": []}
        step = done[-1]
    info = dict(_core.checkpoint_inspect(str(path), step, verify))
    info["steps"] = done
    info["metadata"] = json.loads(info.pop("metadata_json"))
    info.pop("tree_json")
    return info


def wait_for_saves() -> None:
    """Finishes the background save in flight, if any (collective, like ``SaveHandle.wait``), and waits for the
    removals saves queued (the steps ``keep_last`` dropped, what failed saves left)."""
    _core.checkpoint_wait_for_saves()


# A background save still in flight commits at exit (before shardkit's own exit hook, registered earlier, frees MPI).
atexit.register(_core.checkpoint_wait_for_saves)


def _format_step(info: dict[str, Any]) -> str:
    state = "committed" if info["committed"] else "not committed"
    if info.get("verified"):
        state += ", verified"
    lines = [f"step {info['step']}: {state}; saved by {info['saved_ranks']} rank(s); {info['path']}"]
    if info.get("metadata") is not None:
        lines.append(f"  metadata: {json.dumps(info['metadata'])}")
    for a in info["arrays"]:
        where = "plain (every rank)" if a["plain"] else (
            f"mesh {dict(zip(a['mesh_axes'], a['mesh_shape']))} spec {a['spec']!r}")
        lines.append(f"  {a['key']}: {a['dtype']}{list(a['shape'])} {where}; chunks {list(a['chunk_shape'])}; "
                     f"{a['bytes']} bytes")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """shardkit-ckpt: looks inside a checkpoint."""
    parser = argparse.ArgumentParser(prog="shardkit-ckpt", description="Look inside a shardkit checkpoint.")
    sub = parser.add_subparsers(dest="command", required=True)
    ins = sub.add_parser("inspect", help="steps, arrays, shapes, dtypes, saved meshes and specs, bytes")
    ins.add_argument("path")
    ins.add_argument("--step", type=int, default=None, help="one step (default: every committed step)")
    ins.add_argument("--verify", action="store_true", help="check every file's size and crc32c against the manifest")
    args = parser.parse_args(argv)
    done = steps(args.path)
    if not done and args.step is None:
        print(f"{args.path}: no committed step")
        return 1
    for s in [args.step] if args.step is not None else done:
        try:
            print(_format_step(checkpoint_info(args.path, s, verify=args.verify)))
        except _core.Error as e:
            print(f"step {s}: {e}")
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
