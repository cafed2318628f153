"""sk.shard_map under JAX tracing: ``jax.jit(sk.shard_map(f, ...))`` and jit-compiled bodies.

A traced shard_map takes ShardedArrays (the block of one whose sharding is the in_spec goes to the body as it is, with
no communication; one held otherwise is resharded as reshard's plan says, compiled) and global JAX values that every
rank holds (cut by the in_spec: static slices, the rank is known when tracing), traces ``f`` on the blocks, and returns
for every output a ShardedArray that holds this rank's block, as the eager shard_map does. Nothing is gathered unless
the program asks: ``sk.process_allgather`` of a traced ShardedArray assembles the global value by tiled all-gathers.
Inside the body the axis collectives (psum, all_gather, psum_scatter, ppermute, all_to_all, pbroadcast, ...) act on
tracers through shardkit's primitive (shardkit.jax._collectives) over the mesh-axis communicators: the same XLA FFI
handler, the same operation table as every other path.

Derivatives are those of the global function, as jax.shard_map's: the gradient with respect to a ShardedArray is, on
every rank, its block of the gradient of the global function (and with respect to a global array, the whole gradient on
every rank), whether check_vma is on or off. The collectives shardkit runs take pmap's exact transposes (each rank's
cotangent of a value is its share; shardkit.jax._ops); the boundary turns shares into cotangents as jax.shard_map's
transpose does with check_vma=False: an argument block is marked "pvary" over the mesh axes it does not vary over (its
cotangent is the psum of the shares over them), an output block "replicated" over the axes its out_spec does not name
(each rank's share of its cotangent is 1/k of it, k ranks holding it alike).

``jax.grad`` called inside a body follows jax.shard_map's rules for the check_vma given. With check_vma=False the body
is traced with shardkit's collectives (TracedContext): pmap's rules, psum's transpose a psum. With check_vma=True JAX
traces the body (shardkit.jax._check_vma): jax.shard_map on an abstract mesh of the mesh's axis names and sizes, the
body's collectives JAX's own (JaxContext, after shardkit's checks), so JAX types every value by the mesh axes it varies
over and applies its rules: psum of a varying value transposes to a copy, an unvarying value read by varying code (JAX's
pvary) to a psum, and a psum'ed loss's gradient is that of the global loss. shardkit then runs the traced body's
equations on this rank's blocks (_interpret): JAX's axis collectives (the transposes' included) as shardkit's
collectives, pvary as the identity, calls inline, control-flow bodies run the same way. A call of a function with custom
derivative rules (jax.custom_jvp, jax.custom_vjp: jax.nn.relu, ...) that stays in the traced body (one beside a
jax.grad, or relu's value in its own derivative) runs as a function with the same rules (_custom_call), so that they
hold for derivatives taken outside the shard_map while a jax.grad in the same body keeps JAX's rules: its value is its
jaxpr run by shardkit, its rule JAX's jvp (custom_jvp) or vjp (custom_vjp) of the call traced as code of the body (JAX's
types, the function's own collectives included) and run by shardkit; a custom_vjp's backward is given and gives whole
cotangents, where shardkit's transposes carry each rank's share, and runs its forward again. Nothing falls back to
pmap's rules: a call whose equation shardkit cannot read (another JAX release's parameters) is refused
(NotImplementedError). Bodies that jax.shard_map's check_vma=True refuses (a scan carry that starts unvarying and
becomes varying, ...) are refused with JAX's message, and an output that varies over a mesh axis its out_spec does not
name is refused at trace time (_check_out_spec), as jax.shard_map does; eagerly the blocks are compared instead (the
core's check_replication). """

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import _core, _spec_tree
from .._core import NamedSharding
from .._sharded_array import ShardedArray
from . import _check_vma, _ops
from ._collectives import TracedContext, axes_of, replicated, vary


def _block(x, sharding):
    """This rank's block of the global value x (static slices)."""
    index = sharding.index(list(x.shape), sharding.mesh.rank)
    return x[tuple(slice(a, b) for a, b in index)]


def holders(sharding):
    """How many ranks hold each block alike: the mesh's size over the number of distinct blocks."""
    blocks = 1
    for d in range(len(sharding.spec)):
        blocks *= sharding.num_shards(d)
    return int(sharding.mesh.size) // blocks


def process_allgather(x):
    """The global value of a ShardedArray whose block is traced: one all_gather along each of its spec's named
    dimensions (_gather). Each rank's share of its cotangent is 1/m of it, m ranks gathering: the all-gathers'
    transposes (psum_scatters) add the shares up to each block's cotangent."""
    sharding = x.sharding
    whole = _gather(jnp.asarray(x._leaf), sharding, x.shape)
    return replicated(whole, int(sharding.mesh.size) // holders(sharding))


def _gather(block, sharding, shape):
    """The global value (of `shape`) from this rank's traced block: one all_gather per sharded dimension, in the
    order of the members' axis index (their blocks' order along it). Uneven blocks are padded to the largest one
    along the dimension and trimmed after: every member's bounds are static (the sharding's index of each rank)."""
    mesh = sharding.mesh
    ctx = TracedContext(mesh)
    for dim, axes in enumerate(sharding.spec):
        if axes is None or sharding.num_shards(dim) == 1:
            continue
        if not sharding.uneven:
            block = ctx.all_gather(block, axes, axis=dim, tiled=True)
            continue
        names = list(axes_of(axes))
        bounds = {}
        for r in range(int(mesh.size)):
            bounds[int(mesh.axis_index(names, r))] = sharding.index(list(shape), r)[dim]
        widths = [bounds[k][1] - bounds[k][0] for k in range(len(bounds))]
        pad = [(0, 0)] * block.ndim
        pad[dim] = (0, max(widths) - block.shape[dim])
        stacked = ctx.all_gather(jnp.pad(block, pad), axes, axis=dim, tiled=False)  # (..., members, widest, ...)
        block = jnp.concatenate(
            [jax.lax.slice_in_dim(jax.lax.index_in_dim(stacked, k, axis=dim, keepdims=False), 0, w, axis=dim)
             for k, w in enumerate(widths)], axis=dim)
    return block


def _argument_block(i, a, spec, mesh):
    """This rank's block of argument value `a` (a ShardedArray or a global array) for `spec`; with a ShardedArray
    held as `spec` says, its block as it is (no communication)."""
    if not isinstance(a, ShardedArray):
        a = jnp.asarray(a)
        want = NamedSharding(mesh, spec)
        want.validate(list(a.shape))
        return _block(vary(a, mesh, mesh.axis_names), want), False  # every rank holds it
    if a.sharding.mesh != mesh:
        raise _core.InvalidArgument(f"shard_map: argument {i} lives on {a.sharding.mesh!r}, not on the shard_map's "
                                    f"{mesh!r}")
    want = NamedSharding(mesh, spec, a.sharding.uneven)
    want.validate(list(a.shape))
    block = vary(a._leaf, mesh, a.sharding.replicated_axes)  # the ranks that hold its block alike
    return _reshard(i, block, a, want), a.sharding.uneven


def _reshard(i, block, a, want):
    """This rank's block of ShardedArray `a` as `want` holds it, compiled as reshard's plan says (shardkit::
    plan_reshard): kept, sliced, one all_gather over the plan's axes (its members' blocks tile the target block), or
    one all_to_all where mesh axes move from one dimension to another. Any other plan, and uneven blocks in a
    collective: the global value by all_gathers, then sliced (_gather)."""
    plan = _core._plan_reshard(list(a.shape), a.sharding, want, int(want.mesh.rank))
    kind, source, target = plan["kind"], plan["source"], plan["target"]
    if kind == "keep":
        return block
    if kind == "local":
        return block[tuple(slice(t0 - s0, t1 - s0) for (s0, _), (t0, t1) in zip(source, target))]
    if kind == "all_gather" and not a.sharding.uneven:  # (an all_gather of unequal blocks is not traced)
        ctx = TracedContext(want.mesh)
        # Stacked in member order (the axis communicator's, as reshard's): each member's block goes to its place.
        stacked = ctx.all_gather(block, plan["gather_axes"], axis=0, tiled=False)
        out = jnp.zeros(tuple(t1 - t0 for t0, t1 in target), block.dtype)
        for k, member in enumerate(plan["members"]):
            box = a.sharding.index(list(a.shape), member)
            out = out.at[tuple(slice(b0 - t0, b1 - t0) for (b0, b1), (t0, _) in zip(box, target))].set(stacked[k])
        return out
    moved = _moved_axes(a.sharding.spec, want.spec, block.ndim) if kind == "all_to_all" else None
    if moved is not None and not a.sharding.uneven:
        # The mesh axes move from one dimension to another: the axis all_to_all, split along the new dimension and
        # concatenated along the old one (its members in axis-index order, the blocks' order along both).
        old, new, axes = moved
        return TracedContext(want.mesh).all_to_all(block, axes, new, old, tiled=True)
    # Any other plan (an all_to_all that is not one move, blocks of unequal sizes): the global value by all_gathers,
    # then this rank's block of it. More bytes than the plan moves, but compiled and exact.
    return _block(_gather(block, a.sharding, a.shape), want)


def _moved_axes(source, target, ndim):
    """(old dimension, new dimension, axes) where `target` is `source` with one dimension's mesh axes moved to a
    dimension that had none; else None."""
    def dims(spec):
        out = [tuple(axes_of(e)) if e is not None else () for e in spec]
        return out + [()] * (ndim - len(out))
    s, t = dims(source), dims(target)
    changed = [d for d in range(ndim) if s[d] != t[d]]
    if len(changed) != 2:
        return None
    for old, new in (changed, changed[::-1]):
        if s[old] and not s[new] and not t[old] and t[new] == s[old]:
            return old, new, list(s[old])
    return None


def _global_shape(block, sharding, uneven):
    """The global shape of an output from this rank's block. Uneven blocks: the sum of the blocks along each sharded
    dimension, added up now, while tracing (every rank traces the same calls, as the eager shard_map adds them up when
    it runs)."""
    shape = list(block.shape)
    for d in range(len(sharding.spec)):
        n = sharding.num_shards(d)
        if n == 1:
            continue
        if not uneven:
            shape[d] *= n
        else:
            comm = sharding.mesh.axis_comm(list(axes_of(sharding.spec[d])))
            total, _ = comm.allreduce(np.array([shape[d]], np.int64), _core.ReduceOp.SUM)
            shape[d] = int(np.asarray(total)[0])
    return tuple(shape)


def _check_out_spec(j, sharding, varies):
    """With check_vma on, as jax.shard_map: output j may vary only over the mesh axes its out_spec names (an axis it
    leaves out is a promise that the blocks are equal along it, which the output's type must keep)."""
    broken = [a for a in sharding.replicated_axes if a in varies]
    if broken:
        axes, spec = ", ".join(repr(a) for a in broken), sharding.spec
        raise _core.InvalidArgument(
            f"shard_map: out_specs[{j}] = {spec!r} does not name mesh axis {axes}, so it promises that output {j} is "
            f"the same on every rank along it, but output {j} varies over {axes} (its type, as check_vma=True traces "
            f"the body): name the axis in the out_spec, make the output unvarying along it (psum or pmean over it), "
            f"or pass check_vma=False to trust the out_spec unchecked")


def run(f, mesh, leaves, in_specs, rebuild_args, out_specs, stack, check_vma=False):
    """The traced shard_map: blocks in (a ShardedArray's own block where its sharding is the in_spec), f traced with a
    TracedContext on `stack` (with check_vma: by JAX, shardkit.jax._check_vma), a ShardedArray holding this rank's
    block out for every output."""
    blocks, uneven = [], False
    for i, (a, spec) in enumerate(zip(leaves, in_specs)):
        block, u = _argument_block(i, a, spec, mesh)
        blocks.append(block)
        uneven = uneven or u
    varying = None
    if check_vma:
        result, varying = _check_vma.traced_by_jax(f, mesh, blocks, in_specs, rebuild_args, stack)
    else:
        ctx = TracedContext(mesh)
        stack.append(ctx)
        try:
            with _ops.mesh_key(mesh):  # jit-compiled functions in the body are traced for this mesh
                result = f(*rebuild_args(blocks))
        finally:
            stack.pop()
    outs, specs, rebuild = _spec_tree.flatten(out_specs, result, "out_specs")
    if varying is not None:
        for j, (r, spec) in enumerate(zip(outs, specs)):
            _check_out_spec(j, NamedSharding(mesh, spec), varying.get(id(r), frozenset()))
    wrapped = []
    for j, (r, spec) in enumerate(zip(outs, specs)):
        r = jnp.asarray(r)
        if len(spec) > r.ndim:
            raise _core.InvalidArgument(f"shard_map: out_specs[{j}] = {spec!r} is longer than the rank {r.ndim} of "
                                        f"output {j}")
        sharding = NamedSharding(mesh, spec, uneven)
        shape = _global_shape(r, sharding, uneven)
        wrapped.append(ShardedArray._of_leaf(replicated(r, holders(sharding)), shape, sharding))
    return rebuild(wrapped)
