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


class TracedContext:
    """The axis collectives of a shard_map body on JAX tracers (ShardContext's methods, JAX's shape rules)."""

    def __init__(self, mesh):
        self.mesh = mesh

    def _comm(self, axis_name):
        return _jax.comm_handle(self.mesh.axis_comm(list(_axes(axis_name))))

    def axis_index(self, axis_name):
        return int(self.mesh.axis_index(list(_axes(axis_name)), self.mesh.rank))

    def axis_size(self, axis_name):
        return int(self.mesh.axis_size(list(_axes(axis_name))))

    def _reduce(self, x, axis_name, op, name):
        # The eager body's rule (C++ axis_reduction): bool counts as int32 for psum, is or/and for pmax/pmin; a dtype
        # the reduction is not defined for is refused now, while tracing, not when the compiled program runs.
        x = jnp.asarray(x)
        reduce, dtype = _core._axis_reduction(int(op), x.dtype.name, name)
        if dtype != x.dtype.name:
            x = x.astype(dtype)
        (out,) = _jax.bind(x, op="allreduce", comm=self._comm(axis_name), reduce=reduce, sm=True)
        return out

    def psum(self, x, axis_name):
        return self._reduce(x, axis_name, _core.ReduceOp.SUM, "psum")

    def pmax(self, x, axis_name):
        return self._reduce(x, axis_name, _core.ReduceOp.MAX, "pmax")

    def pmin(self, x, axis_name):
        return self._reduce(x, axis_name, _core.ReduceOp.MIN, "pmin")

    def pmean(self, x, axis_name):
        return self.psum(x, axis_name) / self.axis_size(axis_name)

    def all_gather(self, x, axis_name, axis=0, tiled=False):
        x = jnp.asarray(x)
        (g,) = _jax.bind(x, op="allgather", comm=self._comm(axis_name), sm=True)  # (n, *x.shape), axis-index order
        axis = axis % (x.ndim + (0 if tiled else 1))
        if not tiled:
            return jnp.moveaxis(g, 0, axis)
        g = jnp.moveaxis(g, 0, axis)  # (..., n, x.shape[axis], ...)
        return g.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 1:])

    def psum_scatter(self, x, axis_name, scatter_dimension=0, tiled=False):
        x = jnp.asarray(x)
        n = self.axis_size(axis_name)
        d = scatter_dimension % x.ndim
        if x.shape[d] % n:
            raise _core.InvalidArgument(f"psum_scatter: dimension {d} of size {x.shape[d]} is not divisible by {n}")
        if not tiled and x.shape[d] != n:
            raise _core.InvalidArgument(f"psum_scatter: dimension {d} must have size {n} when tiled=False")
        y = jnp.moveaxis(x, d, 0)
        y = y.reshape((n, y.shape[0] // n) + y.shape[1:])
        (out,) = _jax.bind(y, op="reduce_scatter", comm=self._comm(axis_name), reduce=int(_core.ReduceOp.SUM),
                           sm=True)
        out = jnp.moveaxis(out, 0, d)  # (.., x.shape[d] / n, ..)
        return out if tiled else jnp.squeeze(out, d)

    def ppermute(self, x, axis_name, perm):
        x = jnp.asarray(x)
        comm = self._comm(axis_name)
        perm = tuple((int(s), int(d)) for s, d in perm)
        n = self.axis_size(axis_name)
        srcs, dsts = [s for s, _ in perm], [d for _, d in perm]
        # Checked on the whole list, so every rank raises alike (before any rank enters a collective).
        if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts) or not all(0 <= i < n for i in srcs + dsts):
            raise _core.InvalidArgument(f"ppermute: {list(perm)} is not a permutation of axis indices 0..{n - 1}")
        # One operation (this rank's sendrecv, send, receive or zeros, chosen when lowered): linear, its transpose
        # the inverse permutation.
        (out,) = _jax.bind(x, op="ppermute", comm=comm, perm=perm, sm=True)
        return out

    def all_to_all(self, x, axis_name, split_axis, concat_axis, tiled=False):
        x = jnp.asarray(x)
        n = self.axis_size(axis_name)
        s = split_axis % x.ndim
        if x.shape[s] % n or (not tiled and x.shape[s] != n):
            raise _core.InvalidArgument(f"all_to_all: split axis {s} of size {x.shape[s]} does not split {n} ways")
        y = jnp.moveaxis(x, s, 0)
        y = y.reshape((n, y.shape[0] // n) + y.shape[1:])
        (out,) = _jax.bind(y, op="alltoall", comm=self._comm(axis_name), sm=True)  # block j came from rank j
        out = jnp.moveaxis(out, 1, s + 1)  # (n, *x.shape with split axis divided by n)
        if not tiled:
            out = jnp.squeeze(out, s + 1)  # untiled: the split axis goes; a new axis of size n at concat_axis
            return jnp.moveaxis(out, 0, concat_axis % out.ndim)
        c = concat_axis % x.ndim
        out = jnp.moveaxis(out, 0, c)
        shape = list(out.shape)
        return out.reshape(shape[:c] + [shape[c] * shape[c + 1]] + shape[c + 2:])

    def pbroadcast(self, x, axis_name, source):
        (out,) = _jax.bind(jnp.asarray(x), op="bcast", comm=self._comm(axis_name), root=int(source), sm=True)
        return out


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
