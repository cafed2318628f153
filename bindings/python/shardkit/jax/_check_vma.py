"""check_vma=True for the traced shard_map (shardkit.jax._shard_map): the body traced by JAX.

With check_vma on, JAX traces the body: jax.shard_map on an abstract mesh of the mesh's axis names and sizes (no
devices), the body's axis collectives JAX's own (JaxContext), so that JAX types every value by the mesh axes it
varies over and applies its derivative rules to a jax.grad called inside the body (psum of a varying value
transposes to a copy, an unvarying value read by varying code to a psum). shardkit then runs the traced body's
equations (_interpret) on this rank's blocks: JAX's axis collectives as shardkit's (TracedContext), pvary as the
identity, calls inline, control flow with its bodies run the same way, calls of functions with custom derivative
rules as functions with those rules (_custom_call). Derivatives taken outside the shard_map follow shardkit's rules
for the collectives it runs (exact per-rank transposes, the boundary marks) and the custom rules.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from .. import _core
from . import _compat as jc
from . import _ops
from ._collectives import TracedContext, axes_of


class JaxContext(TracedContext):
    """The axis collectives of a body that JAX traces: shardkit's checks (plan_axis, with its messages), then JAX's
    collective, for JAX's types and derivative rules. axis_index is JAX's too, a value that varies over the axes (run
    as this rank's index, _collective): a value made of it varies, so an out_spec cannot promise it unvarying."""

    def axis_index(self, axis_name):
        axes = tuple(axes_of(axis_name))
        return jax.lax.axis_index(axes if len(axes) > 1 else axes[0])

    def _run(self, what, x, axis_name, **args):
        x = jnp.asarray(x)
        axes = tuple(axes_of(axis_name))
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


class BodyContext(TracedContext):
    """The collectives of a body JAX traced, run by shardkit (TracedContext), and what _in_body needs to trace more
    code as that body: the abstract mesh and the stack of traced bodies' contexts."""

    def __init__(self, mesh, abstract, stack):
        super().__init__(mesh)
        self.abstract, self.stack = abstract, stack


def traced_by_jax(f, mesh, blocks, in_specs, rebuild_args, stack):
    """f's result on this rank's blocks, f traced by jax.shard_map (check_vma=True) on an abstract mesh like `mesh`
    and its equations run by shardkit (_interpret), and the mesh axes each output varies over, by the output's id (its
    type's vma, as JAX traced the body)."""
    names = tuple(mesh.axis_names)
    sizes = {a: int(mesh.axis_size([a])) for a in names}
    abstract = jc.abstract_mesh([sizes[a] for a in names], names)
    # JAX's global shapes: each block times the sizes of the axes its spec names (each rank traces its own).
    shapes = []
    for b, spec in zip(blocks, in_specs):
        shape = list(b.shape)
        for d, e in enumerate(spec):
            for a in (axes_of(e) if e is not None else ()):
                shape[d] *= sizes[a]
        shapes.append(jax.ShapeDtypeStruct(tuple(shape), b.dtype, weak_type=getattr(b, "weak_type", False)))
    tree, types = [], []

    def body(*bs):
        leaves, treedef = jax.tree.flatten(f(*rebuild_args(list(bs))))
        tree.append(treedef)
        types.append([jc.vma(jax.typeof(x)) for x in leaves])  # before JAX casts them to the shard_map's out_specs
        return leaves

    ctx = BodyContext(mesh, abstract, stack)
    closed = _traced_as_body(ctx, body, shapes, tuple(PartitionSpec(*s) for s in in_specs))
    outs = _run_body(ctx, closed, blocks)
    return tree[0].unflatten(outs), {id(o): t for o, t in zip(outs, types[0])}


def _traced_as_body(ctx, fn, shapes, in_specs):
    """The jaxpr of jax.shard_map(fn) (check_vma=True) on ctx's abstract mesh, for arguments of these global shapes
    cut by in_specs, the body's collectives JAX's own (JaxContext)."""
    def body(*bs):
        # Out: each leaf behind a leading axis cut by every mesh axis, which JAX takes whether it varies or not (the
        # out_specs are shardkit's, applied by run).
        return [jnp.expand_dims(jnp.asarray(x), 0) for x in fn(*bs)]

    jsm = jax.shard_map(body, mesh=ctx.abstract, in_specs=in_specs, out_specs=PartitionSpec(tuple(ctx.mesh.axis_names)),
                        check_vma=True)
    ctx.stack.append(JaxContext(ctx.mesh))
    try:
        with _ops.mesh_key((ctx.mesh, "check_vma")):  # jit-compiled functions in the body are traced for this mesh
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
    names = tuple(ctx.mesh.axis_names)

    def typed(*xs):
        return fn(*[jc.pvary(x, tuple(a for a in names if a in jc.vma(t))) if jc.vma(t) else x
                    for x, t in zip(xs, avals)])

    shapes = [jax.ShapeDtypeStruct(t.shape, t.dtype, weak_type=t.weak_type) for t in avals]
    return _run_body(ctx, _traced_as_body(ctx, typed, shapes, (PartitionSpec(),) * len(avals)), args)


def _differentiable(aval):
    return bool(jnp.issubdtype(aval.dtype, jnp.inexact))


def _float0s(aval):
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
    cotangent of a value it holds alike with others, shardkit.jax._ops): the shares of an output's cotangent are
    psum'ed over the mesh axes the output does not vary over, and the cotangent of an argument that k ranks hold alike
    is shared as 1/k of it on each."""
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
    if kind == "axis_index":  # no operand
        return _collective(ctx, kind, None, params)
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
