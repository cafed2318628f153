"""sk.shard_map traced by JAX: jax.jit(sk.shard_map(...)) and jit-compiled bodies give what the eager shard_map gives
(the C++ implementation, on NumPy arrays), for every axis collective, on 1-d meshes and a 2-d mesh at 4 ranks; the two
seed programs under jax.jit."""

import os
import sys

import numpy as np
import pytest

from conftest import REPO, mpirun, require_jax

jax = require_jax()
import jax.numpy as jnp  # noqa: E402


def meshes(sk):
    n = sk.size()
    out = [("x", sk.Mesh(np.arange(n), ("x",)))]
    if n == 4:
        out.append((("x", "y"), sk.Mesh(np.arange(4).reshape(2, 2), ("x", "y"))))
    return out


BODIES = {
    "psum": lambda sk, ax: lambda b: sk.psum(b, ax),
    "pmean": lambda sk, ax: lambda b: sk.pmean(b, ax),
    "pmax": lambda sk, ax: lambda b: sk.pmax(b * (sk.axis_index(ax) + 1), ax),
    "pmin": lambda sk, ax: lambda b: sk.pmin(b - sk.axis_index(ax), ax),
    "all_gather": lambda sk, ax: lambda b: sk.all_gather(b, ax, axis=1, tiled=True),
    "all_gather_untiled": lambda sk, ax: lambda b: sk.all_gather(b, ax, axis=0).sum(axis=0),
    "psum_scatter": lambda sk, ax: lambda b: sk.psum_scatter(
        jnp.concatenate([b] * sk.axis_size(ax), axis=1) if isinstance(b, jax.Array) or hasattr(b, "aval")
        else np.concatenate([b] * sk.axis_size(ax), axis=1), ax, scatter_dimension=1, tiled=True),
    "ppermute": lambda sk, ax: lambda b: sk.ppermute(
        b, ax, [(i, (i + 1) % sk.axis_size(ax)) for i in range(sk.axis_size(ax))]),
    "ppermute_chain": lambda sk, ax: lambda b: sk.ppermute(b, ax, [(i, i + 1) for i in range(sk.axis_size(ax) - 1)]),
    "all_to_all": lambda sk, ax: lambda b: sk.all_to_all(
        jnp.tile(b, (1, sk.axis_size(ax))) if hasattr(b, "aval") or isinstance(b, jax.Array)
        else np.tile(b, (1, sk.axis_size(ax))), ax, 1, 0, tiled=True),
    "pbroadcast": lambda sk, ax: lambda b: sk.pbroadcast(b, ax, sk.axis_size(ax) - 1),
}


@pytest.mark.parametrize("cols", [1, 3])
@pytest.mark.parametrize("name", sorted(BODIES))
def test_jit_shard_map_matches_eager(sk, name, cols):
    for ax, mesh in meshes(sk):
        rows = 2 * sk.size()
        x = (np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) % 5) + 1
        spec = sk.P(ax)
        body = BODIES[name](sk, ax)
        out_spec = sk.P(ax)
        eager = sk.process_allgather(sk.shard_map(body, mesh=mesh, in_specs=(spec,), out_specs=out_spec,
                                                  check_rep=False)(x))
        got = jax.jit(lambda a: sk.process_allgather(sk.shard_map(body, mesh=mesh, in_specs=(spec,),
                                                                  out_specs=out_spec, check_rep=False)(a)))(
            jnp.asarray(x))
        assert isinstance(got, jax.Array)
        np.testing.assert_allclose(np.asarray(got), np.asarray(eager), rtol=1e-6)


def test_jit_compiled_body_inside_eager_shard_map(sk):
    mesh = sk.Mesh(np.arange(sk.size()), ("x",))
    x = np.arange(2.0 * sk.size()).reshape(sk.size(), 2)
    body = jax.jit(lambda b: sk.psum(b * 2, "x") + sk.all_gather(b, "x", tiled=True).sum(axis=0))
    got = sk.process_allgather(sk.shard_map(body, mesh=mesh, in_specs=(sk.P("x"),), out_specs=sk.P("x"),
                                            check_rep=False)(x))
    want = np.tile(2 * x.sum(axis=0) + x.sum(axis=0), (sk.size(), 1))
    np.testing.assert_allclose(np.asarray(got), want)


@pytest.mark.parametrize("traced", [False, True])
def test_bool_reductions_follow_jax(sk, traced):
    """JAX's rules, one for the eager and the traced body: psum of bool counts (int32), pmax/pmin are or/and (bool)."""
    mesh = sk.Mesh(np.arange(sk.size()), ("x",))
    n = sk.size()
    x = np.stack([np.arange(n), np.ones(n)], axis=1).reshape(-1)  # rank r holds [r, 1]
    body = lambda b: (sk.psum(b > 0, "x"), sk.pmax(b > 0, "x"), sk.pmin(b > 0, "x"))  # noqa: E731
    f = sk.shard_map(body, mesh=mesh, in_specs=(sk.P("x"),), out_specs=(sk.P(), sk.P(), sk.P()))
    if traced:
        got = [np.asarray(v.local) for v in jax.jit(f)(jnp.asarray(x))]
    else:
        got = [np.asarray(v.local) for v in f(x)]
    assert got[0].dtype == np.int32 and got[0].tolist() == [n - 1, n]
    assert got[1].dtype == np.bool_ and got[1].tolist() == [n > 1, True]
    assert got[2].dtype == np.bool_ and got[2].tolist() == [False, True]


def test_traced_reduction_refuses_an_undefined_dtype_while_tracing(sk):
    mesh = sk.Mesh(np.arange(sk.size()), ("x",))
    f = jax.jit(sk.shard_map(lambda b: sk.pmax(b, "x"), mesh=mesh, in_specs=(sk.P("x"),), out_specs=sk.P()))
    with pytest.raises(sk.InvalidArgument, match="pmax: not defined for dtype complex64"):
        jax.jit(f).lower(jnp.zeros(2 * sk.size(), jnp.complex64))  # lowering traces; nothing runs


def test_traced_psum_of_a_python_scalar_stays_weakly_typed(sk):
    mesh = sk.Mesh(np.arange(sk.size()), ("x",))
    f = jax.jit(sk.shard_map(lambda b: b * sk.psum(1.0, "x"), mesh=mesh, in_specs=(sk.P("x"),), out_specs=sk.P("x")))
    y = sk.process_allgather(f(jnp.arange(2.0 * sk.size(), dtype=jnp.bfloat16)))
    assert y.dtype == jnp.bfloat16  # as jax.lax.psum(1.0) in JAX's shard_map: 1.0 is weak
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.arange(2.0 * sk.size()) * sk.size())


@pytest.mark.parametrize("name", ["pmax", "pmin"])
@pytest.mark.parametrize("transform", ["grad", "jvp", "linear_transpose"])
def test_pmax_pmin_have_no_derivative_and_say_so(sk, name, transform):
    """The error names what the body called (as JAX's primitives do), not the allreduce it is made of."""
    mesh = sk.Mesh(np.arange(sk.size()), ("x",))
    sm = sk.shard_map(lambda b: getattr(sk, name)(b, "x"), mesh=mesh, in_specs=(sk.P("x"),), out_specs=sk.P("x"))
    f = lambda a: sk.process_allgather(sm(a))  # noqa: E731
    x = jnp.arange(2.0 * sk.size())
    g = {"grad": jax.grad(lambda a: f(a).sum()), "jvp": lambda a: jax.jvp(f, (a,), (a,))[1],
         "linear_transpose": lambda a: jax.linear_transpose(f, a)(a)[0]}[transform]
    with pytest.raises(NotImplementedError, match=rf"Differentiation rule for '{name}' not implemented") as info:
        jax.jit(g)(x)
    assert "allreduce" not in str(info.value)


def test_traced_shard_map_under_grad(sk):
    mesh = sk.Mesh(np.arange(sk.size()), ("x",))
    f = sk.shard_map(lambda b: sk.psum((b * b).sum(), "x"), mesh=mesh, in_specs=(sk.P("x"),), out_specs=sk.P())
    x = jnp.arange(2.0 * sk.size())
    g = np.asarray(jax.jit(jax.grad(lambda a: f(a).local))(x))  # a P() output: its block is the whole value
    # As jax.shard_map's: the gradient of the global function, whole on every rank (x is a global array every rank
    # holds).
    np.testing.assert_allclose(g, 2 * np.asarray(x))


# Linear bodies of a traced shard_map over mesh axis "x" (n ranks, blocks of k = 2n), with the same function of the
# global array written in plain JAX: (body, in_spec, out_spec, reference).
def linear_cases(sk, n, k):
    P = sk.P
    blocks = lambda x: x.reshape(n, k)  # noqa: E731
    return {
        "identity": (lambda b: b * 3, P("x"), P("x"), lambda x: x * 3),
        "psum": (lambda b: sk.psum(b, "x"), P("x"), P(), lambda x: blocks(x).sum(0)),
        "all_gather": (lambda b: sk.all_gather(b, "x", tiled=True), P("x"), P(), lambda x: x),
        "all_gather_untiled": (lambda b: sk.all_gather(b, "x"), P("x"), P(), blocks),
        "psum_scatter": (lambda b: sk.psum_scatter(b, "x", tiled=True), P("x"), P("x"), lambda x: blocks(x).sum(0)),
        "all_to_all": (lambda b: sk.all_to_all(b, "x", 0, 0, tiled=True), P("x"), P("x"),
                       lambda x: x.reshape(n, n, k // n).transpose(1, 0, 2).reshape(-1)),
        "ppermute": (lambda b: sk.ppermute(b, "x", [(i, (i + 1) % n) for i in range(n)]) * (sk.axis_index("x") + 1),
                     P("x"), P("x"), lambda x: (jnp.roll(blocks(x), 1, axis=0) * jnp.arange(1, n + 1)[:, None])
                     .reshape(-1)),
        "ppermute_chain": (lambda b: sk.ppermute(b, "x", [(i, i + 1) for i in range(n - 1)]), P("x"), P("x"),
                           lambda x: jnp.concatenate([jnp.zeros(k), x[:-k]])),
        "pbroadcast": (lambda b: sk.pbroadcast(b, "x", n - 1), P("x"), P(), lambda x: blocks(x)[n - 1]),
        # Gathered or broadcast values used differently on each rank: their cotangents differ per rank and add up.
        "all_gather_to_sharded": (lambda b: sk.all_gather(b, "x", tiled=True), P("x"), P("x"),
                                  lambda x: jnp.tile(x, n)),
        "all_gather_weighted": (lambda b: sk.all_gather(b, "x", tiled=True) * (sk.axis_index("x") + 1), P("x"), P("x"),
                                lambda x: jnp.concatenate([x * (r + 1) for r in range(n)])),
        "pbroadcast_to_sharded": (lambda b: sk.pbroadcast(b, "x", n - 1), P("x"), P("x"),
                                  lambda x: jnp.tile(blocks(x)[n - 1], n)),
        "psum_weighted": (lambda b: sk.psum(b, "x") * (sk.axis_index("x") + 1), P("x"), P("x"),
                          lambda x: jnp.concatenate([blocks(x).sum(0) * (r + 1) for r in range(n)])),
        "replicated_input": (lambda b: b * 3, P(), P(), lambda x: x * 3),
    }


@pytest.mark.parametrize("mode", ["jit", "eager"])
@pytest.mark.parametrize("case", ["identity", "psum", "all_gather", "all_gather_untiled", "psum_scatter", "all_to_all",
                                  "ppermute", "ppermute_chain", "pbroadcast", "all_gather_to_sharded",
                                  "all_gather_weighted", "pbroadcast_to_sharded", "psum_weighted", "replicated_input"])
def test_traced_shard_map_derivatives_of_every_linear_collective(sk, case, mode):
    # Exact transposes in the body (psum's is psum, all_gather's psum_scatter, pbroadcast's a psum kept at the source,
    # all_to_all's all_to_all, ppermute's the inverse permutation; check_vma=False: pmap's rules), shares summed and
    # split at the boundary: every rank's gradient is the gradient of the global function, computed here by JAX on
    # the plain function. The "weighted" and "to_sharded" cases use a gathered or broadcast value differently on each
    # rank (a rule that assumed equal cotangents everywhere got them wrong).
    n = sk.size()
    k = 2 * n
    body, in_spec, out_spec, ref = linear_cases(sk, n, k)[case]
    mesh = sk.Mesh(np.arange(n), ("x",))
    sm = sk.shard_map(body, mesh=mesh, in_specs=(in_spec,), out_specs=out_spec, check_vma=False)
    f = lambda a: sk.process_allgather(sm(a))  # noqa: E731
    f = jax.jit(f) if mode == "jit" else f
    x = jnp.arange(n * k, dtype=jnp.float64) + 1
    t = jnp.cos(x)  # a tangent
    w = jnp.arange(ref(x).size, dtype=jnp.float64).reshape(ref(x).shape) % 5 + 1  # the cotangent's weights
    y, dy = jax.jvp(f, (x,), (t,))
    np.testing.assert_allclose(y, ref(x))
    np.testing.assert_allclose(dy, ref(t))  # linear: the tangent is the function of the tangent
    g = np.asarray(jax.grad(lambda a: (f(a) * w).sum())(x))
    np.testing.assert_allclose(g, jax.grad(lambda a: (ref(a) * w).sum())(x))
    (ct,) = jax.linear_transpose(f, x)(w)  # the same as the gradient (linear)
    np.testing.assert_allclose(ct, g)


def test_errors_in_traced_bodies(sk):
    mesh = sk.Mesh(np.arange(sk.size()), ("x",))
    if sk.size() > 1:  # every length divides over one rank
        with pytest.raises(sk.InvalidArgument):
            jax.jit(sk.shard_map(lambda b: b, mesh=mesh, in_specs=(sk.P("x"),), out_specs=sk.P("x")))(
                jnp.ones(2 * sk.size() + 1))
    with pytest.raises(sk.InvalidArgument, match="not a permutation"):
        jax.jit(sk.shard_map(lambda b: sk.ppermute(b, "x", [(0, 0), (0, 0)]), mesh=mesh, in_specs=(sk.P("x"),),
                             out_specs=sk.P("x")))(jnp.ones(sk.size()))
    with pytest.raises(sk.InvalidArgument):
        jax.jit(lambda a: sk.shard_map(lambda b: sk.psum(b, "nope"), mesh=mesh, in_specs=(sk.P("x"),),
                                       out_specs=sk.P("x"))(a))(jnp.ones(sk.size()))


# Each check of an axis collective, given one block shape: the eager body (ShardContext) and the traced one
# (TracedContext) execute the same plan (shardkit::plan_axis), so they refuse with one message.
REFUSALS = {
    "all_gather": (lambda sk, b: sk.all_gather(b, "x", axis=3), "all_gather: dimension 3 out of range"),
    "psum_scatter_tiled": (lambda sk, b: sk.psum_scatter(b, "x", tiled=True), "is not divisible by"),
    "psum_scatter": (lambda sk, b: sk.psum_scatter(b, "x"), r"psum_scatter \(tiled=False\): dimension 0 of size"),
    "all_to_all": (lambda sk, b: sk.all_to_all(b, "x", 0, 1, tiled=True), "all_to_all: dimension 0 of size"),
    "all_to_all_concat": (lambda sk, b: sk.all_to_all(b, "x", 0, 2), "all_to_all: dimension 2 out of range"),
    "ppermute": (lambda sk, b: sk.ppermute(b, "x", [(0, 0), (0, 0)]), r"not a permutation .* source 0 appears twice"),
    "ppermute_range": (lambda sk, b: sk.ppermute(b, "x", [(0, 9)]), r"pair \(0, 9\) is out of range"),
    "pbroadcast": (lambda sk, b: sk.pbroadcast(b, "x", 9), "pbroadcast: source 9 out of range"),
    "pmax_complex": (lambda sk, b: sk.pmax(b.astype(np.complex64), "x"), "pmax: not defined for dtype complex64"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_eager_and_traced_bodies_refuse_alike(sk, case):
    body, pattern = REFUSALS[case]
    n = sk.size()
    mesh = sk.Mesh(np.arange(n), ("x",))
    # (n + 1) rows per rank: dimension 0 neither equals nor divides by the axis size (at 1 rank, the tiled cases divide)
    g = np.ones((n * (n + 1), 2), np.float32)
    messages = []
    for traced in (False, True):
        f = sk.shard_map(lambda b: body(sk, b), mesh=mesh, in_specs=sk.P("x"), out_specs=sk.P("x"), check_vma=False)
        if n == 1 and case in ("psum_scatter_tiled", "all_to_all"):
            (jax.jit(f) if traced else f)(jnp.asarray(g) if traced else g)
            continue
        with pytest.raises(sk.InvalidArgument, match=pattern) as e:
            (jax.jit(f) if traced else f)(jnp.asarray(g) if traced else g)
        messages.append(str(e.value))
    assert len(set(messages)) <= 1, messages


def test_every_axis_collective_is_in_both_bodies_and_the_module(sk):
    from shardkit.jax._collectives import TracedContext

    names = sk._core._axis_ops()
    assert "psum" in names and "ppermute" in names
    for name in names:
        assert callable(getattr(sk, name)), name
        assert callable(getattr(TracedContext, name)), name
        assert callable(getattr(sk._core.ShardContext, name)), name


@pytest.mark.processes
@pytest.mark.parametrize("np_", [1, 2, 3])
@pytest.mark.parametrize("example,last", [("multiply_by_two.py", "allclose: True"),
                                          ("distributed_matmul.py", "Allclose: True")])
def test_seed_examples_under_jit(np_, example, last):
    pytest.importorskip("warp")
    r = mpirun(np_, [sys.executable, os.path.join(REPO, "examples/jax", example)], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"Running on {np_} process(es)" in r.stdout
    assert r.stdout.strip().endswith(last), r.stdout
