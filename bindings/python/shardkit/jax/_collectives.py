"""The axis collectives of a traced shard_map body on JAX tracers (TracedContext), and the marks at its boundary that
turn each rank's share of a cotangent into cotangents (replicated, vary): shardkit's primitive (shardkit.jax._ops)
bound over the mesh-axis communicators, each collective as the plan C++ makes for it says (shardkit::plan_axis), as the
eager ShardContext runs it."""

from __future__ import annotations

import jax.numpy as jnp

from .. import _core
from . import _ops


def axes_of(axis_name):
    """The mesh axes an axis_name argument names (one name, or a tuple or list of them), as a tuple."""
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
        return int(self.mesh.axis_index(list(axes_of(axis_name)), self.mesh.rank))

    def axis_size(self, axis_name):
        return int(self.mesh.axis_size(list(axes_of(axis_name))))

    def _run(self, what, x, axis_name, **args):
        x = jnp.asarray(x)
        axes = list(axes_of(axis_name))
        plan = _core._plan_axis(what, self.mesh, axes, list(x.shape), x.dtype.name, **args)
        comm = _ops.comm_handle(self.mesh.axis_comm(axes))
        if plan.input != x.dtype.name:
            x = x.astype(plan.input)
        x = _moves(x, plan.before)
        site = _core._call_site_id()  # the body's line, for the flight recorder of the compiled call
        if what == "ppermute":
            # One operation (this rank's exchange, chosen when lowered): linear, its transpose the reverse exchange.
            (y,) = _ops.bind(x, op="ppermute", comm=comm, dest=plan.dest, source=plan.source, send_tag=plan.tag,
                             recv_tag=plan.tag, sm=True, site=site, peers=plan.peers)
        else:
            (y,) = _ops.bind(x, op=plan.op, comm=comm, reduce=plan.reduce, root=plan.root, sm=True, site=site)
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


def replicated(x, holders):
    """x, marked as a value `holders` ranks hold alike: each rank's share of its cotangent is 1/holders of it."""
    if holders == 1:
        return x
    (out,) = _ops.bind(jnp.asarray(x), op="replicated", comm=-1, root=int(holders), sm=True)
    return out


def vary(x, mesh, axes):
    """x, a value the ranks along mesh `axes` hold alike, marked where code that varies over them reads it: its
    cotangent is the psum over `axes` of their shares (JAX's pvary)."""
    x = jnp.asarray(x)
    if not axes or mesh.axis_size(list(axes)) == 1:
        return x
    (out,) = _ops.bind(x, op="pvary", comm=_ops.comm_handle(mesh.axis_comm(list(axes))), sm=True)
    return out
