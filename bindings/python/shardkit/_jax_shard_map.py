"""sk.shard_map under JAX tracing: ``jax.jit(sk.shard_map(f, ...))`` and jit-compiled bodies.

A traced shard_map takes ShardedArrays (the block of one whose sharding is the in_spec goes to the body as it is, with
no communication; one held otherwise is resharded as reshard's plan says, compiled) and global JAX values that every
rank holds (cut by the in_spec: static slices, the rank is known when tracing), traces ``f`` on the blocks, and returns
for every output a ShardedArray that holds this rank's block, as the eager shard_map does. Nothing is gathered unless
the program asks: ``sk.process_allgather`` of a traced ShardedArray assembles the global value by tiled all-gathers.
Inside the body the axis collectives (psum, all_gather, psum_scatter, ppermute, all_to_all, pbroadcast, ...) act on
tracers through shardkit's primitive (shardkit._jax) over the mesh-axis communicators: the same XLA FFI handler, the
same operation table as every other path.

Derivatives are those of the global function, as jax.shard_map's: the gradient with respect to a ShardedArray is, on
every rank, its block of the gradient of the global function (and with respect to a global array, the whole gradient on
every rank), whether check_vma is on or off. The collectives shardkit runs take pmap's exact transposes (each rank's
cotangent of a value is its share; shardkit._jax); the boundary turns shares into cotangents as jax.shard_map's
transpose does with check_vma=False: an argument block is marked "pvary" over the mesh axes it does not vary over (its
cotangent is the psum of the shares over them), an output block "replicated" over the axes its out_spec does not name
(each rank's share of its cotangent is 1/k of it, k ranks holding it alike).

``jax.grad`` called inside a body follows jax.shard_map's rules for the check_vma given. With check_vma=False the body
is traced with shardkit's collectives (TracedContext): pmap's rules, psum's transpose a psum. With check_vma=True JAX
traces the body (_traced_by_jax): jax.shard_map on an abstract mesh of the mesh's axis names and sizes, the body's
collectives JAX's own (JaxContext, after shardkit's checks), so JAX types every value by the mesh axes it varies over
and applies its rules: psum of a varying value transposes to a copy, an unvarying value read by varying code (JAX's
pvary) to a psum, and a psum'ed loss's gradient is that of the global loss. shardkit then runs the traced body's
equations on this rank's blocks (_interpret): JAX's axis collectives (the transposes' included) as shardkit's
collectives, pvary as the identity, calls inline, control-flow bodies run the same way. A call of a function with custom
derivative rules (jax.custom_jvp, jax.custom_vjp: jax.nn.relu, ...) that stays in the traced body (one beside a
jax.grad, or relu's value in its own derivative) runs as a function with the same rules (_custom_call), so that they
hold for derivatives taken outside the shard_map while a jax.grad in the same body keeps JAX's rules: its value is its
jaxpr run by shardkit, its rule JAX's jvp (custom_jvp) or vjp (custom_vjp) of the call traced as code of the body
(JAX's types, the function's own collectives included) and run by shardkit; a custom_vjp's backward is given and gives
whole cotangents, where shardkit's transposes carry each rank's share, and runs its forward again. Nothing falls back
to pmap's rules: a call whose equation shardkit cannot read (another JAX release's parameters) is refused
(NotImplementedError). Bodies that jax.shard_map's check_vma=True refuses (a scan carry that starts unvarying and
becomes varying, ...) are refused with JAX's message; the out_specs stay shardkit's (not checked against the values'
types, as eagerly).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _core
from . import _jax
from . import _jax_compat as jc


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


def holders(sharding):
    """How many ranks hold each block alike: the mesh's size over the number of distinct blocks."""
    blocks = 1
    for d in range(len(sharding.spec)):
        blocks *= sharding.num_shards(d)
    return int(sharding.mesh.size) // blocks


def replicated(x, holders):
    """x, marked as a value `holders` ranks hold alike: each rank's share of its cotangent is 1/holders of it."""
    if holders == 1:
        return x
    (out,) = _jax.bind(jnp.asarray(x), op="replicated", comm=-1, root=int(holders), sm=True)
    return out


def vary(x, mesh, axes):
    """x, a value the ranks along mesh `axes` hold alike, marked where code that varies over them reads it: its
    cotangent is the psum over `axes` of their shares (JAX's pvary)."""
    x = jnp.asarray(x)
    if not axes or mesh.axis_size(list(axes)) == 1:
        return x
    (out,) = _jax.bind(x, op="pvary", comm=_jax.comm_handle(mesh.axis_comm(list(axes))), sm=True)
    return out


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
        names = list(_axes(axes))
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
    from ._sharding import NamedSharding, ShardedArray  # noqa: PLC0415  (a cycle at import time)

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
        out = [tuple(_axes(e)) if e is not None else () for e in spec]
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
            comm = sharding.mesh.axis_comm(list(_axes(sharding.spec[d])))
            total, _ = comm.allreduce(np.array([shape[d]], np.int64), _core.ReduceOp.SUM)
            shape[d] = int(np.asarray(total)[0])
    return tuple(shape)


def run(f, mesh, leaves, in_specs, rebuild_args, out_specs, stack, check_vma=False):
    """The traced shard_map: blocks in (a ShardedArray's own block where its sharding is the in_spec), f traced with a
    TracedContext on `stack` (with check_vma: by JAX, _traced_by_jax), a ShardedArray holding this rank's block out
    for every output."""
    from . import _spec_tree  # noqa: PLC0415
    from ._sharding import NamedSharding, ShardedArray  # noqa: PLC0415  (a cycle at import time)

    blocks, uneven = [], False
    for i, (a, spec) in enumerate(zip(leaves, in_specs)):
        block, u = _argument_block(i, a, spec, mesh)
        blocks.append(block)
        uneven = uneven or u
    result = _traced_by_jax(f, mesh, blocks, in_specs, rebuild_args, stack) if check_vma else _UNTRACED
    if result is _UNTRACED:
        ctx = TracedContext(mesh)
        stack.append(ctx)
        try:
            with _jax.mesh_key(mesh):  # jit-compiled functions in the body are traced for this mesh
                result = f(*rebuild_args(blocks))
        finally:
            stack.pop()
    outs, specs, rebuild = _spec_tree.flatten(out_specs, result, "out_specs")
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


# ---- check_vma: the body traced by JAX ---------------------------------------------------------------------------
# With check_vma on, JAX traces the body: jax.shard_map on an abstract mesh of the mesh's axis names and sizes (no
# devices), the body's axis collectives JAX's own (JaxContext), so that JAX types every value by the mesh axes it
# varies over and applies its derivative rules to a jax.grad called inside the body (psum of a varying value
# transposes to a copy, an unvarying value read by varying code to a psum). shardkit then runs the traced body's
# equations (_interpret) on this rank's blocks: JAX's axis collectives as shardkit's (TracedContext), pvary as the
# identity, calls inline, control flow with its bodies run the same way, calls of functions with custom derivative
# rules as functions with those rules (_custom_call). Derivatives taken outside the shard_map follow shardkit's rules
# for the collectives it runs (exact per-rank transposes, the boundary marks) and the custom rules.


class JaxContext(TracedContext):
    """The axis collectives of a body that JAX traces: shardkit's checks (plan_axis, with its messages), then JAX's
    collective, for JAX's types and derivative rules; axis_index stays this rank's index, known when tracing."""

    def _run(self, what, x, axis_name, **args):
        import jax  # noqa: PLC0415

        x = jnp.asarray(x)
        axes = tuple(_axes(axis_name))
        _core._plan_axis(what, self.mesh, list(axes), list(x.shape), x.dtype.name, **args)
        name = axes if len(axes) > 1 else axes[0]
        if what == "pbroadcast":
            # The psum of the source's value (zeros elsewhere), varying as JAX's pbroadcast: JAX has a transpose for
            # it (its pbroadcast's transpose raises on jax 0.8.3 and 0.10.2: "full must be called with scalar
            # fill_value"), the gradient of the global function. (A select on this rank's constant, not a Python
            # choice: every rank traces the same collectives.)
            mine = jnp.asarray(self.axis_index(axes) == args["source"])
            return jc.pvary(jax.lax.psum(jnp.where(mine, x, jnp.zeros_like(x)), name), axes)
        fn, table = _JAX_FORMS[what]
        return jc.keep_weak_type(getattr(jax.lax, fn)(x, name, **{keyword: args[arg] for arg, keyword, _ in table}), x)


# shardkit's axis collectives as JAX's: the jax.lax function, and for each argument of shardkit's plan, jax.lax's
# keyword and the parameter of the primitive's equation.
_TILED = ("tiled", "tiled", "tiled")
_JAX_FORMS = {
    "psum": ("psum", ()), "pmax": ("pmax", ()), "pmin": ("pmin", ()), "pmean": ("pmean", ()),
    "all_gather": ("all_gather", (("dim", "axis", "all_gather_dimension"), _TILED)),
    "psum_scatter": ("psum_scatter", (("dim", "scatter_dimension", "scatter_dimension"), _TILED)),
    "ppermute": ("ppermute", (("perm", "perm", "perm"),)),
    "all_to_all": ("all_to_all", (("dim", "split_axis", "split_axis"), ("concat_dim", "concat_axis", "concat_axis"),
                                  _TILED)),
    "pbroadcast": ("pbroadcast", (("source", "source", "source"),)),
}


_UNTRACED = object()


class BodyContext(TracedContext):
    """The collectives of a body JAX traced, run by shardkit (TracedContext), and what _in_body needs to trace more
    code as that body: the abstract mesh and the stack of traced bodies' contexts."""

    def __init__(self, mesh, abstract, stack):
        super().__init__(mesh)
        self.abstract, self.stack = abstract, stack


def _traced_by_jax(f, mesh, blocks, in_specs, rebuild_args, stack):
    """f's result on this rank's blocks, f traced by jax.shard_map (check_vma=True) on an abstract mesh like `mesh`
    and its equations run by shardkit (_interpret)."""
    import jax  # noqa: PLC0415
    from jax.sharding import AbstractMesh, PartitionSpec  # noqa: PLC0415

    names = tuple(mesh.axis_names)
    sizes = {a: int(mesh.axis_size([a])) for a in names}
    abstract = AbstractMesh(tuple(sizes[a] for a in names), names)
    # JAX's global shapes: each block times the sizes of the axes its spec names (each rank traces its own).
    shapes = []
    for b, spec in zip(blocks, in_specs):
        shape = list(b.shape)
        for d, e in enumerate(spec):
            for a in (_axes(e) if e is not None else ()):
                shape[d] *= sizes[a]
        shapes.append(jax.ShapeDtypeStruct(tuple(shape), b.dtype, weak_type=getattr(b, "weak_type", False)))
    tree = []

    def body(*bs):
        leaves, treedef = jax.tree.flatten(f(*rebuild_args(list(bs))))
        tree.append(treedef)
        return leaves

    ctx = BodyContext(mesh, abstract, stack)
    closed = _traced_as_body(ctx, body, shapes, tuple(PartitionSpec(*s) for s in in_specs))
    return tree[0].unflatten(_run_body(ctx, closed, blocks))


def _traced_as_body(ctx, fn, shapes, in_specs):
    """The jaxpr of jax.shard_map(fn) (check_vma=True) on ctx's abstract mesh, for arguments of these global shapes
    cut by in_specs, the body's collectives JAX's own (JaxContext)."""
    import jax  # noqa: PLC0415
    from jax.sharding import PartitionSpec  # noqa: PLC0415

    def body(*bs):
        # Out: each leaf behind a leading axis cut by every mesh axis, which JAX takes whether it varies or not (the
        # out_specs are shardkit's, applied by run).
        return [jnp.expand_dims(jnp.asarray(x), 0) for x in fn(*bs)]

    jsm = jax.shard_map(body, mesh=ctx.abstract, in_specs=in_specs, out_specs=PartitionSpec(tuple(ctx.mesh.axis_names)),
                        check_vma=True)
    ctx.stack.append(JaxContext(ctx.mesh))
    try:
        with _jax.mesh_key((ctx.mesh, "check_vma")):  # jit-compiled functions in the body are traced for this mesh
            return jax.make_jaxpr(jsm)(*shapes)
    finally:
        ctx.stack.pop()


def _run_body(ctx, closed, args):
    """The outputs of the shard_map body of `closed` (_traced_as_body) on this rank's values `args`."""
    top = closed.jaxpr
    (eqn,) = [e for e in top.eqns if "jaxpr" in e.params and "in_specs" in e.params]
    values = dict(zip(top.invars, args))
    values.update(zip(top.constvars, closed.consts))
    inner, consts = _closed(eqn.params["jaxpr"])
    outs = _interpret(ctx, inner, consts, [v.val if isinstance(v, jc.Literal) else values[v] for v in eqn.invars])
    return [o[0] for o in outs]


def _in_body(ctx, fn, avals, args):
    """fn's outputs on this rank's values `args`, fn traced as code of the body would be, on values of the body's types
    `avals` (each unvarying in, then varying over the axes its type says), and run by shardkit."""
    import jax  # noqa: PLC0415
    from jax.sharding import PartitionSpec  # noqa: PLC0415

    names = tuple(ctx.mesh.axis_names)

    def typed(*xs):
        return fn(*[jc.pvary(x, tuple(a for a in names if a in jc.vma(t))) if jc.vma(t) else x
                    for x, t in zip(xs, avals)])

    shapes = [jax.ShapeDtypeStruct(t.shape, t.dtype, weak_type=t.weak_type) for t in avals]
    return _run_body(ctx, _traced_as_body(ctx, typed, shapes, (PartitionSpec(),) * len(avals)), args)


def _differentiable(aval):
    return bool(jnp.issubdtype(aval.dtype, jnp.inexact))


def _float0s(aval):
    import jax  # noqa: PLC0415

    return np.zeros(aval.shape, jax.dtypes.float0)


def _custom_call(ctx, eqn, ins):
    """A call of a function with custom derivative rules (jax.custom_jvp, jax.custom_vjp) in a body JAX traced: run as
    a function with the same rules, so that they hold for derivatives taken outside the shard_map (a jax.grad inside
    the body has been applied by JAX already). Its value: its jaxpr run by shardkit. Its rules: JAX's jvp (custom_jvp)
    or vjp (custom_vjp) of the call, traced as code of the body would be (_in_body: JAX's types, so the rules' own
    collectives and varying values are those the function was written for), run by shardkit the same way.

    A custom_jvp's rule is forward: its tangents are values like the primals, and its transpose outside is that of the
    collectives shardkit runs, as the rest of the body's. A custom_vjp's backward takes and gives JAX's cotangents,
    whole on every rank that holds a value alike, where shardkit's transposes carry shares (each rank's part of the
    cotangent of a value it holds alike with others, _jax): the shares of an output's cotangent are psum'ed over the
    mesh axes the output does not vary over, and the cotangent of an argument that k ranks hold alike is shared as 1/k
    of it on each."""
    import jax  # noqa: PLC0415

    prim, params = eqn.primitive, eqn.params
    call = jc.custom_call_jaxpr(params)
    if call is None:
        raise NotImplementedError(f"shard_map with check_vma=True: {jc.custom_call_name(params)!r} has custom "
                                  f"derivative rules, and shardkit does not read their call's parameters on jax "
                                  f"{jax.__version__}; use check_vma=False for this body (pmap's rules for a jax.grad "
                                  f"inside it)")
    kind = jc.CUSTOM_DERIVATIVE_CALLS[prim]
    ins_t = [v.aval for v in eqn.invars]
    outs_t = [v.aval for v in eqn.outvars]
    d_in = [_differentiable(t) for t in ins_t]
    d_out = [_differentiable(t) for t in outs_t]
    n, m = len(ins_t), len(outs_t)

    def called(*xs):
        return jc.bind_equation(prim, xs, params)

    def primal(*xs):
        return _interpret(ctx, *_closed(call), list(xs))

    if kind == "jvp":
        f = jax.custom_jvp(primal)

        def jvp(primals, tangents):
            def jvp_in_body(*a):
                it = iter(a[n:])
                ts = [next(it) if d else _float0s(t) for t, d in zip(ins_t, d_in)]
                outs, touts = jax.jvp(called, tuple(a[:n]), tuple(ts))
                return [*outs, *(t for t, d in zip(touts, d_out) if d)]

            got = _in_body(ctx, jvp_in_body, ins_t + [t for t, d in zip(ins_t, d_in) if d],
                           [*primals, *(t for t, d in zip(tangents, d_in) if d)])
            it = iter(got[m:])
            return got[:m], [next(it) if d else _float0s(t) for t, d in zip(outs_t, d_out)]

        f.defjvp(jvp)
        return f(*ins)

    names = tuple(ctx.mesh.axis_names)

    def alike(t):  # the mesh axes whose ranks hold a value of type t alike
        return [a for a in names if a not in jc.vma(t)]

    f = jax.custom_vjp(primal)

    def bwd(xs, cts):
        whole = [ctx.psum(ct, alike(t)) if alike(t) else ct for ct, t, d in zip(cts, outs_t, d_out) if d]

        def vjp_in_body(*a):
            outs, pull = jax.vjp(called, *a[:n])
            it = iter(a[n:])
            got = pull([next(it) if d else _float0s(t) for t, d in zip(outs_t, d_out)])
            return [g for g, d in zip(got, d_in) if d]

        got = iter(_in_body(ctx, vjp_in_body, ins_t + [t for t, d in zip(outs_t, d_out) if d], [*xs, *whole]))
        out = []
        for t, d in zip(ins_t, d_in):
            g = next(got) if d else None
            k = int(ctx.mesh.axis_size(alike(t))) if d and alike(t) else 1
            out.append(g / k if k != 1 else g)
        return tuple(out)

    f.defvjp(lambda *xs: (primal(*xs), xs), bwd)
    return f(*ins)


def _interpret(ctx, jaxpr, consts, args):
    """The values of jaxpr's outputs, its equations bound in order on this rank: JAX's axis collectives run as
    shardkit's (ctx), calls inline, other equations' jaxprs replaced by ones run the same way."""
    env = {}
    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))

    def read(v):
        return v.val if isinstance(v, jc.Literal) else env[v]

    for eqn in jaxpr.eqns:
        outs = _equation(ctx, eqn, [read(v) for v in eqn.invars])
        env.update(zip(eqn.outvars, outs if eqn.primitive.multiple_results else [outs]))
    return [read(v) for v in jaxpr.outvars]


def _closed(j):
    return (j.jaxpr, j.consts) if isinstance(j, jc.ClosedJaxpr) else (j, ())


def _equation(ctx, eqn, ins):
    prim, params = eqn.primitive, eqn.params
    kind = jc.AXIS_COLLECTIVES.get(prim)
    if kind is not None:
        run = [_collective(ctx, kind, x, params) for x in ins]
        return run if prim.multiple_results else run[0]
    if prim in jc.CUSTOM_DERIVATIVE_CALLS:
        return _custom_call(ctx, eqn, ins)
    param = jc.INLINED_CALLS.get(prim)
    if param is not None and param in params:
        outs = _interpret(ctx, *_closed(params[param]), ins)
        return outs if prim.multiple_results else outs[0]
    params = {k: _rerun(ctx, v) for k, v in params.items()}
    return jc.bind_equation(prim, ins, params)


def _rerun(ctx, v):
    """A parameter, its jaxprs (a control-flow body, branches) replaced by ones that _interpret runs."""
    import jax  # noqa: PLC0415

    if isinstance(v, (tuple, list)) and v and all(isinstance(j, (jc.ClosedJaxpr, jc.Jaxpr)) for j in v):
        return type(v)(_rerun(ctx, j) for j in v)
    if not isinstance(v, (jc.ClosedJaxpr, jc.Jaxpr)):
        return v
    jaxpr, consts = _closed(v)
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in jaxpr.in_avals]
    out = jax.make_jaxpr(lambda *a: _interpret(ctx, jaxpr, consts, a))(*avals)
    return out if isinstance(v, jc.ClosedJaxpr) else out.jaxpr


def _collective(ctx, kind, x, params):
    """A JAX axis collective's equation run as shardkit's."""
    if kind == "pvary":
        return x
    if params.get("axis_index_groups") is not None:
        raise _core.InvalidArgument("shard_map: axis_index_groups is not supported")
    names = params.get("axes", params.get("axis_name"))
    if kind == "axis_index":
        return jnp.asarray(ctx.axis_index(names), jnp.int32)
    args = {arg: params[p] for arg, _, p in _JAX_FORMS[kind][1]}
    if kind == "all_to_all":  # the primitive's own split and concatenation (JAX's untiled form reshapes around it)
        args["tiled"] = True
    if kind == "ppermute":
        args["perm"] = [(int(s), int(d)) for s, d in args["perm"]]
    return ctx._run(kind, x, names, **args)
