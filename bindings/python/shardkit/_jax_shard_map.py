"""sk.shard_map under JAX tracing: ``jax.jit(sk.shard_map(f, ...))`` and jit-compiled bodies.

A traced shard_map takes global JAX values that every rank holds (as a plain-array argument of the eager shard_map),
cuts this rank's block by each in_spec (static slices: the rank is known when tracing), traces ``f`` on the blocks, and
assembles every output into the global value on each rank by tiled all-gathers along the out_spec's axes. Inside the
body the axis collectives (psum, all_gather, psum_scatter, ppermute, all_to_all, pbroadcast, ...) act on tracers
through shardkit's primitive (shardkit._jax) over the mesh-axis communicators: the same XLA FFI handler, the same
operation table as every other path.
"""

from __future__ import annotations

import jax.numpy as jnp

from . import _core
from . import _jax


def _axes(axis_name):
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _moves(x, moves):
    """Applies a plan's shape moves: ("move", from, to) as jnp.moveaxis, ("reshape", shape)."""
    for kind, *a in moves:
        x = jnp.moveaxis(x, a[0], a[1]) if kind == "move" else x.reshape(a[0])
    return x


class TracedContext:
    """The axis collectives of a shard_map body on JAX tracers: each runs the plan that C++ makes for it
    (shardkit::plan_axis, as the eager ShardContext does): its checks, shape moves, table operation and partners."""

    def __init__(self, mesh):
        self.mesh = mesh

    def axis_index(self, axis_name):
        return int(self.mesh.axis_index(list(_axes(axis_name)), self.mesh.rank))

    def axis_size(self, axis_name):
        return int(self.mesh.axis_size(list(_axes(axis_name))))

    def _run(self, what, x, axis_name, **args):
        x = jnp.asarray(x)
        axes = list(_axes(axis_name))
        plan = _core._plan_axis(what, self.mesh, axes, list(x.shape), x.dtype.name, **args)
        comm = _jax.comm_handle(self.mesh.axis_comm(axes))
        if plan.input != x.dtype.name:
            x = x.astype(plan.input)
        x = _moves(x, plan.before)
        site = _core._call_site_id()  # the body's line, for the flight recorder of the compiled call
        if what == "ppermute":
            # One operation (this rank's exchange, chosen when lowered): linear, its transpose the reverse exchange.
            (y,) = _jax.bind(x, op="ppermute", comm=comm, dest=plan.dest, source=plan.source, send_tag=plan.tag,
                             recv_tag=plan.tag, sm=True, site=site)
        else:
            (y,) = _jax.bind(x, op=plan.op, comm=comm, reduce=plan.reduce, root=plan.root, sm=True, site=site)
        y = _moves(y, plan.after)
        if plan.output != y.dtype.name:
            y = y.astype(plan.output)
        return y / plan.divide if plan.divide != 1 else y

    def psum(self, x, axis_name):
        return self._run("psum", x, axis_name)

    def pmax(self, x, axis_name):
        return self._run("pmax", x, axis_name)

    def pmin(self, x, axis_name):
        return self._run("pmin", x, axis_name)

    def pmean(self, x, axis_name):
        return self._run("pmean", x, axis_name)

    def all_gather(self, x, axis_name, axis=0, tiled=False):
        return self._run("all_gather", x, axis_name, dim=axis, tiled=tiled)

    def psum_scatter(self, x, axis_name, scatter_dimension=0, tiled=False):
        return self._run("psum_scatter", x, axis_name, dim=scatter_dimension, tiled=tiled)

    def ppermute(self, x, axis_name, perm):
        return self._run("ppermute", x, axis_name, perm=[(int(s), int(d)) for s, d in perm])

    def all_to_all(self, x, axis_name, split_axis, concat_axis, tiled=False):
        return self._run("all_to_all", x, axis_name, dim=split_axis, concat_dim=concat_axis, tiled=tiled)

    def pbroadcast(self, x, axis_name, source):
        return self._run("pbroadcast", x, axis_name, source=int(source))


def _block(x, sharding):
    """This rank's block of the global value x (static slices)."""
    index = sharding.index(list(x.shape), sharding.mesh.rank)
    return x[tuple(slice(a, b) for a, b in index)]


def _assemble(block, ctx, spec):
    """The global value from this rank's block: tiled all-gathers along the out_spec's named dimensions, marked as held
    by every rank of the mesh (each rank's share of its cotangent is 1/n of it: see shardkit._jax)."""
    for dim, axes in enumerate(spec):
        if axes is None:
            continue
        block = ctx.all_gather(block, axes, axis=dim, tiled=True)
    (out,) = _jax.bind(block, op="replicated", comm=-1, root=int(ctx.mesh.size), sm=True)
    return out


def run(f, mesh, in_specs, out_specs, single_out, args, stack):
    """The traced shard_map: blocks in, f traced with a TracedContext on `stack`, global values out."""
    from ._sharding import NamedSharding  # noqa: PLC0415  (a cycle at import time)

    if len(in_specs) != len(args):
        raise _core.InvalidArgument(f"in_specs has {len(in_specs)} entries for {len(args)} arguments")
    blocks = []
    for a, spec in zip(args, in_specs):
        a = jnp.asarray(a)
        sharding = NamedSharding(mesh, spec)
        sharding.validate(list(a.shape))
        blocks.append(_block(a, sharding))
    ctx = TracedContext(mesh)
    stack.append(ctx)
    try:
        with _jax.mesh_key(mesh):  # jit-compiled functions in the body are traced for this mesh
            result = f(*blocks)
    finally:
        stack.pop()
    results = [result] if single_out else list(result)
    if len(results) != len(out_specs):
        raise _core.InvalidArgument(f"out_specs has {len(out_specs)} entries but the function returned {len(results)}")
    outs = [_assemble(jnp.asarray(r), ctx, spec) for r, spec in zip(results, out_specs)]
    return outs[0] if single_out else tuple(outs)
