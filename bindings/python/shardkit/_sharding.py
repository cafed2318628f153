"""The sharding API in JAX's spellings: Mesh, P, NamedSharding, ShardedArray, shard_map and the axis collectives.

A ShardedArray remembers the framework its data came from (NumPy, JAX, Warp, PyTorch, CuPy), so local blocks and
gathered arrays come back in it. Inside a shard_map body, psum/all_gather/... act on the body's blocks over named
mesh axes, like jax.lax's collectives inside jax.experimental.shard_map.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterable, Mapping, Sequence, Union, cast, overload

from . import _core, _hooks, _spec_tree
from ._core import Mesh, NamedSharding, PartitionSpec
from ._sharded_array import ShardedArray, _framework, _unwrap

P = PartitionSpec

# What the sharding functions accept for an array: anything DLPack speaks (NumPy, JAX, PyTorch, CuPy, Warp, a shardkit
# Array), a scalar or a sequence. What they return is an array of the caller's framework.
ArrayLike = Any
# A mesh axis name, or several (the collective then runs over all of them, row-major).
AxisName = Union[str, Sequence[str]]
# One P for every value, or a pytree of them (tuples, lists, dicts): a prefix of the values' structure, as in JAX.
Specs = Union[PartitionSpec, Sequence[Any], Mapping[Any, Any]]

__all__ = [
    "Mesh", "P", "PartitionSpec", "NamedSharding", "ShardedArray", "distribute", "from_local", "gather",
    "process_allgather", "reshard", "visualize_sharding", "shard_map", "Infer", "matmul", "choose_matmul_algorithm", "psum", "pmean", "pmax", "pmin",
    "all_gather", "psum_scatter", "ppermute", "all_to_all", "pbroadcast", "axis_index", "axis_size",
]


def distribute(x: ArrayLike, sharding: NamedSharding, root: int = 0, *, device: str | None = None) -> ShardedArray:
    """Cuts root's global array ``x`` by ``sharding`` and sends every rank its block (collective). Other ranks may
    pass their own copy or None. Blocks land on this rank's device (its GPU, or the host) unless ``device`` says
    otherwise ("cpu", "cuda:0")."""
    return ShardedArray(_core.distribute(x, sharding, root, device), _framework(x))


def from_local(local: ArrayLike, global_shape: Sequence[int], sharding: NamedSharding) -> ShardedArray:
    """Wraps this rank's block, without communication."""
    return ShardedArray(_core.from_local(local, list(global_shape), sharding), _framework(local))


def gather(x: ShardedArray, root: int = 0) -> Any:
    """The global array on ``root`` (None elsewhere). Collective."""
    return _core.gather(_unwrap(x), root, _framework(x))


def process_allgather(x: Any) -> Any:
    """The global array on every rank, as jax.experimental.multihost_utils.process_allgather. Collective.
    Non-sharded arrays are returned as they are. Inside jax.jit (a traced block) it is part of the compiled program."""
    if not isinstance(x, (ShardedArray, _core.ShardedArray)):
        return x
    if isinstance(x, ShardedArray) and x._x is None and _hooks.is_jax_tracer(x._leaf):
        return _jax().process_allgather(x)
    return _core.process_allgather(_unwrap(x), _framework(x))


def reshard(x: ShardedArray, sharding: NamedSharding) -> ShardedArray:
    """The same global array with another sharding of the same mesh (fewest collectives). Collective. Under jax.jit
    (a ShardedArray holding a tracer): compiled, as a traced shard_map of the identity from its sharding to this one
    (reshard's plan where it is compiled, else all_gathers and a slice)."""
    if isinstance(x, ShardedArray) and _hooks.is_jax_tracer(x._leaf):
        if sharding.mesh != x.sharding.mesh:
            raise _core.InvalidArgument(f"reshard: {sharding!r} is not on the array's mesh {x.sharding.mesh!r}")
        spec = sharding.spec
        return cast(ShardedArray, shard_map(lambda b: b, mesh=sharding.mesh, in_specs=spec, out_specs=spec)(x))
    return ShardedArray(_core.reshard(_unwrap(x), sharding), _framework(x))


def visualize_sharding(x: ShardedArray | Sequence[int], sharding: NamedSharding | None = None, *,
                       print_on_rank: int | None = 0) -> str:
    """A text grid of which ranks hold which block of ``x`` (a ShardedArray, or a global shape with ``sharding``);
    printed on ``print_on_rank`` (None: not printed)."""
    shape: Sequence[int]
    if sharding is None:
        sx = _unwrap(x)
        shape, sharding = sx.shape, sx.sharding
    else:
        shape = list(cast("Sequence[int]", x))  # a global shape, when a sharding is given
    text = _core.visualize_sharding(list(shape), sharding)
    if print_on_rank is not None and _core.rank() == print_on_rank:
        print(text)
    return text


def matmul(a: ShardedArray, b: ShardedArray, *, algorithm: str = "auto", overlap: bool | None = None) -> ShardedArray:
    """C = A @ B on 2-d sharded operands (collective). ``algorithm``: "auto" (chosen from the shardings), "local"
    (A rows-sharded x B replicated: no communication), "allgather" / "reduce_scatter" (collective matmul: a ring of
    transfers overlapped with the local GEMMs), or "summa" (2-d mesh). Operands held in another layout are resharded
    to the algorithm's. Local products run on BLAS (host) or cuBLAS (GPU). ``overlap``: True / False force the
    transfers to overlap the GEMMs or not; None (default) overlaps on GPUs, and on the host only when each rank has a
    core to spare for its transfers (see ``_core.matmul_overlap_default``)."""
    return ShardedArray(_core.matmul(_unwrap(a), _unwrap(b), algorithm, overlap), _framework(a))


def choose_matmul_algorithm(a: ShardedArray, b: ShardedArray) -> str:
    """The algorithm matmul(a, b) would use for these shardings."""
    return _core.choose_matmul_algorithm(_unwrap(a), _unwrap(b))


# ---- shard_map ------------------------------------------------------------------------------------------------------

# The contexts of traced shard_map bodies (shardkit.jax's TracedContexts), innermost last.
_traced: list[Any] = []


def _jax() -> _hooks.JaxLayer:
    """The JAX layer, where a value is known to be JAX's (a JAX value exists only once JAX, and so the layer, is
    loaded)."""
    layer = _hooks.jax_layer()
    assert layer is not None, "a JAX value without shardkit.jax loaded"
    return layer


def _jit_key(mesh: Mesh) -> contextlib.AbstractContextManager[object]:
    """While a body runs: jax.jit's caches keyed by its mesh (shardkit.jax's body_scope), once JAX is loaded."""
    layer = _hooks.jax_layer()
    return contextlib.nullcontext() if layer is None else layer.body_scope(mesh)


def _context(x: object = None) -> Any:
    """The context of the shard_map body running on this thread (set by the core around the body), or of the traced
    body being traced; JAX tracers inside an eager body (a jit-compiled body) get the traced collectives."""
    if _traced:
        return _traced[-1]
    if x is not None and _hooks.is_jax_tracer(x):
        return _jax().traced_context(_core.current_context().mesh)
    return _core.current_context()


class _InferType:
    """The default of shard_map's ``in_specs``: each argument keeps the sharding it has (JAX's ``Infer``)."""

    def __repr__(self) -> str:
        return "Infer"


Infer = _InferType()


class _UnsetType:
    """The default of shard_map's ``check_vma`` and ``check_rep``: not given (checks on unless one says otherwise)."""

    def __repr__(self) -> str:
        return "UNSET"


_UNSET = _UnsetType()


def _check_flag(check_vma: bool | _UnsetType, check_rep: bool | _UnsetType) -> bool:
    """check_vma (JAX's current name) with check_rep as its alias; both given must agree."""
    if check_rep is _UNSET:
        return True if check_vma is _UNSET else bool(check_vma)
    if check_vma is _UNSET:
        return bool(check_rep)
    if bool(check_vma) != bool(check_rep):
        raise _core.InvalidArgument(
            f"shard_map: check_vma={check_vma!r} and check_rep={check_rep!r} disagree; check_rep is the old name of "
            "check_vma, pass only check_vma")
    return bool(check_vma)


def _mesh_of(mesh: Mesh | None, args: Sequence[object]) -> Mesh:
    """The mesh given, or the one the ShardedArray arguments live on (JAX takes it from the context)."""
    if mesh is not None:
        return mesh
    for a in args:
        if isinstance(a, (ShardedArray, _core.ShardedArray)):
            return a.sharding.mesh
    raise _core.InvalidArgument(
        "shard_map: no mesh given and no ShardedArray argument to take one from; pass mesh=sk.Mesh(...)")


def _check_axis_names(mesh: Mesh, axis_names: Iterable[str] | None) -> None:
    """JAX's axis_names: the axes f is manual over (empty: all). shardkit runs every mesh axis manually."""
    if axis_names is None:
        return
    names = set(axis_names)
    unknown = sorted(names - set(mesh.axis_names))
    if unknown:
        raise _core.InvalidArgument(
            f"shard_map: axis_names names {unknown}, not axes of {mesh!r}")
    if names and names != set(mesh.axis_names):
        auto = [a for a in mesh.axis_names if a not in names]
        raise _core.InvalidArgument(
            f"shard_map: axis_names={sorted(names)} leaves mesh axes {auto} automatic, which shardkit does not do "
            "(there is no compiler to partition over them): leave axis_names out (every axis manual), or build the "
            "shard_map over a mesh with only the axes you name")


@overload
def shard_map(f: Callable[..., Any], /, *, out_specs: Specs, in_specs: Specs | _InferType = Infer,
              mesh: Mesh | None = None, axis_names: Iterable[str] | None = frozenset(),
              check_vma: bool | _UnsetType = _UNSET, check_rep: bool | _UnsetType = _UNSET) -> Callable[..., Any]: ...


@overload
def shard_map(f: None = None, /, *, out_specs: Specs, in_specs: Specs | _InferType = Infer, mesh: Mesh | None = None,
              axis_names: Iterable[str] | None = frozenset(), check_vma: bool | _UnsetType = _UNSET,
              check_rep: bool | _UnsetType = _UNSET) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


def shard_map(f: Callable[..., Any] | None = None, /, *, out_specs: Specs, in_specs: Specs | _InferType = Infer,
              mesh: Mesh | None = None, axis_names: Iterable[str] | None = frozenset(),
              check_vma: bool | _UnsetType = _UNSET,
              check_rep: bool | _UnsetType = _UNSET) -> Callable[..., Any]:
    """As jax.shard_map: ``f`` runs once per rank on its blocks of the arguments.

    ``in_specs`` is a P, or a pytree of them that is a prefix of the arguments' structure (a tuple with one entry per
    argument, a dict for a dict argument, ...; one P stands for every array of the subtree it matches), as in JAX.
    An array with spec s is cut by NamedSharding(mesh, s): a ShardedArray held that way hands its block over as it is,
    one held otherwise is resharded first; plain arrays (NumPy, JAX, ...) are global arrays every rank holds. Left out
    (JAX's ``Infer``), each ShardedArray keeps its own spec and plain arrays are replicated (P()). ``mesh`` left out is
    the mesh of the ShardedArray arguments. ``out_specs``, a prefix of the outputs' structure in the same way, says how
    the blocks f returns make up the results; a mesh axis an out_spec does not name is a promise that the blocks are
    equal along it, checked when ``check_vma`` is on (``check_rep`` is its old name, still accepted). ``axis_names``,
    the axes f is manual over, may only be empty or every mesh axis: shardkit has no automatic axes.
    Use as ``shard_map(f, mesh=..., in_specs=..., out_specs=...)(*args)`` or as a decorator. The call returns f's
    output structure with a ShardedArray for every array, holding this rank's block only (where the out_spec names no
    mesh axis, that block is the whole value), eagerly and under jax.jit alike; sk.process_allgather gives the global
    value (inside jax.jit too).
    """
    check = _check_flag(check_vma, check_rep)
    if in_specs is None:
        raise _core.InvalidArgument(
            "shard_map: in_specs=None (JAX's static inputs) is not supported: close over static values in f, or "
            "leave in_specs out to keep each argument's own sharding")
    if f is None:
        return functools.partial(shard_map, out_specs=out_specs, in_specs=in_specs, mesh=mesh,
                                 axis_names=axis_names, check_vma=check)

    @functools.wraps(f)
    def wrapped(*args: Any) -> Any:
        # in_specs is a prefix of the arguments' structure, out_specs of the outputs' (shardkit._spec_tree).
        leaves, ins, rebuild_args = _spec_tree.flatten(P() if in_specs is Infer else in_specs, args, "in_specs")
        if in_specs is Infer:  # each ShardedArray keeps its own spec; plain arrays are replicated
            ins = [a.sharding.spec if isinstance(a, (ShardedArray, _core.ShardedArray)) else P() for a in leaves]
        m = _mesh_of(mesh, leaves)
        _check_axis_names(m, axis_names)
        if any(_hooks.is_jax_tracer(a._leaf if isinstance(a, ShardedArray) else a) for a in leaves):
            return _jax().shard_map(f, m, leaves, ins, rebuild_args, out_specs, _traced, check)  # the traced one
        # Blocks and results go back in the framework of the first argument.
        framework = _framework(leaves[0]) if leaves else "numpy"
        sharded = []
        for a in leaves:
            if isinstance(a, (ShardedArray, _core.ShardedArray)):
                sharded.append(_unwrap(a))
            else:
                # A global array every rank holds: replicated, cut by its in_spec without communication.
                arr = _core.asarray(a)
                sharded.append(_core.from_local(arr, list(arr.shape), NamedSharding(m, P())))
        rebuild_out: list[Callable[[list[Any]], Any]] = []

        def body(ctx: _core.ShardContext, blocks: Sequence[Any]) -> tuple[list[Any], list[PartitionSpec]]:
            with _jit_key(m):
                result = f(*rebuild_args(list(blocks)))
            outs, specs, rebuild = _spec_tree.flatten(out_specs, result, "out_specs")
            rebuild_out.append(rebuild)
            return outs, specs  # the core takes the out_specs from here (the outputs' structure is known now)

        results = _core.shard_map(body, m, ins, [], sharded, check, framework)
        return rebuild_out[0]([ShardedArray(r, framework) for r in results])

    return wrapped


# ---- axis collectives (inside a shard_map body) --------------------------------------------------------------------

# psum/pmax/pmin are implemented in C++ (a NumPy block's sum is computed into a NumPy result directly); a Python
# scalar gives a Python scalar (weakly typed, as JAX's psum(1, axis)); axis_index_groups is refused there.
psum = _core.psum


def pmean(x: ArrayLike, axis_name: AxisName, *, axis_index_groups: None = None) -> Any:
    """Mean over the ranks along the named axes. Integers and bool give JAX's psum(x) / n: float64 for 64-bit
    integers, float32 for the others; a Python scalar gives a Python float."""
    _core.refuse_axis_index_groups(axis_index_groups, "pmean")
    return _context(x).pmean(x, axis_name)


pmax = _core.pmax
pmin = _core.pmin


def all_gather(x: ArrayLike, axis_name: AxisName, *, axis_index_groups: None = None, axis: int = 0, tiled: bool = False,
               to: str = "varying") -> Any:
    """The blocks of the ranks along the named axes: stacked in a new dimension ``axis`` (tiled=False) or
    concatenated along it (tiled=True). ``to``: "varying" (JAX's default) or "invarying" give the same values here
    (shardkit does not type values by how they vary; the result is equal along the axes either way); "reduced" is
    refused."""
    _core.refuse_axis_index_groups(axis_index_groups, "all_gather")
    if to not in ("varying", "invarying"):
        raise _core.InvalidArgument(
            f"all_gather: to={to!r} is not supported: shardkit has no reduced values; use to='varying' (the default) "
            "or to='invarying' (the same values)")
    return _context(x).all_gather(x, axis_name, axis, tiled)


def psum_scatter(x: ArrayLike, axis_name: AxisName, *, scatter_dimension: int = 0, axis_index_groups: None = None,
                 tiled: bool = False) -> Any:
    """Sum over the named axes, each rank keeping its part of ``scatter_dimension``."""
    _core.refuse_axis_index_groups(axis_index_groups, "psum_scatter")
    return _context(x).psum_scatter(x, axis_name, scatter_dimension, tiled)


def ppermute(x: ArrayLike, axis_name: AxisName, perm: Iterable[Sequence[int]]) -> Any:
    """Sends x along (source, destination) pairs of axis indices; ranks nobody sends to get zeros."""
    return _context(x).ppermute(x, axis_name, [tuple(p) for p in perm])


def all_to_all(x: ArrayLike, axis_name: AxisName, split_axis: int, concat_axis: int, *, axis_index_groups: None = None,
               tiled: bool = False) -> Any:
    """Splits ``split_axis`` across the ranks of the named axes and concatenates what arrives along
    ``concat_axis`` (JAX's shape rules for tiled and untiled)."""
    _core.refuse_axis_index_groups(axis_index_groups, "all_to_all")
    return _context(x).all_to_all(x, axis_name, split_axis, concat_axis, tiled)


def pbroadcast(x: ArrayLike, axis_name: AxisName, source: int) -> Any:
    """The block of the rank at axis index ``source``, on every rank along the named axes."""
    return _context(x).pbroadcast(x, axis_name, source)


def axis_index(axis_name: AxisName) -> int:
    """This rank's index along the named axes (row-major over a tuple)."""
    return _context().axis_index(axis_name)


def axis_size(axis_name: AxisName) -> int:
    """The number of ranks along the named axes."""
    return _context().axis_size(axis_name)
