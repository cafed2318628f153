"""Derivatives of a traced sk.shard_map are those of the global function, as jax.shard_map's: ``jax.grad`` of a jitted
shard_map with respect to ShardedArrays gives, on every rank, its block of the gradient (with respect to a global array,
the whole gradient), with check_vma on (and off: vma_cases.CHECK_VMA_OFF), for psum, pmean, all_gather, psum_scatter,
ppermute, all_to_all and pbroadcast, replicated arguments and a 2-d mesh. Compared with JAX's own jax.shard_map on n of
4 virtual CPU devices (jax_shard_map_reference.py, run once per job by rank 0 in a process without MPI) and with the
plain global function (vma_cases' ``ref``, differentiated by JAX)."""

import io
import os
import subprocess
import sys

import numpy as np
import pytest

import vma_cases
from conftest import WORLD_SIZE, clean_env, require_jax

jax = require_jax()
import jax.numpy as jnp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = list(vma_cases.cases(1, np, jax))


@pytest.fixture(scope="module")
def jax_answers(sk, tmp_path_factory):
    """JAX's jax.shard_map answers at this world size ({key: array}), computed by rank 0 and broadcast."""
    data = b""
    if sk.rank() == 0:
        out = tmp_path_factory.mktemp("vma") / "reference.npz"
        run = subprocess.run([sys.executable, os.path.join(HERE, "jax_shard_map_reference.py"), str(sk.size()),
                              str(out)], capture_output=True, text=True, timeout=300, env=clean_env())
        data = out.read_bytes() if run.returncode == 0 else b""
        if not data:
            sys.stderr.write(run.stdout + run.stderr)
    (length,), _ = sk.mpi.bcast(np.array([len(data)], np.int64), 0)
    assert length > 0, "jax_shard_map_reference.py failed on rank 0"
    buf, _ = sk.mpi.bcast(np.frombuffer(data, np.uint8) if data else np.zeros(int(length), np.uint8), 0)
    with np.load(io.BytesIO(np.asarray(buf).tobytes())) as z:
        return {k: z[k] for k in z.files}


def block_of(g, sharding):
    index = sharding.index(list(g.shape), sharding.mesh.rank)
    return np.asarray(g)[tuple(slice(a, b) for a, b in index)]


# Which cases each mode runs; every mode's cases are differentiated in one compiled program (one compilation per mode
# keeps the suite's time down at 3 and 4 ranks on two cores).
MODES = {"check_vma": (NAMES, True, True), "no_check_vma": (vma_cases.CHECK_VMA_OFF, False, True),
         "global_arguments": (vma_cases.GLOBAL_ARGUMENTS, True, False)}


@pytest.mark.parametrize("mode", list(MODES))
def test_grad_of_a_jitted_shard_map_is_the_global_gradient(sk, jax_answers, mode):
    """For every case of the mode: the loss sum(sin(out) * w) of the shard_map's global output, and its gradient with
    respect to each argument (a ShardedArray: this rank's block of the gradient, with the argument's sharding; a global
    array: the whole gradient), against the plain global function and JAX's jax.shard_map."""
    names, check, sharded = MODES[mode]
    n = sk.size()
    cases = vma_cases.cases(n, jnp, jax)
    fs, ws, args, xs = {}, {}, {}, {}
    for name in names:
        two_d, shapes, out_spec, body, ref = cases[name]
        axis_names, shape = vma_cases.mesh_of(n, two_d)
        mesh = sk.Mesh(np.arange(n).reshape(shape), axis_names)
        specs = tuple(sk.P(*s) for _, s in shapes)
        args[name] = vma_cases.arguments(shapes, np)
        ws[name] = vma_cases.weights(ref(*args[name]).shape, np)
        fs[name] = sk.shard_map(lambda *b, body=body: body(sk, *b), mesh=mesh, in_specs=specs,
                                out_specs=sk.P(*out_spec), check_vma=check)
        xs[name] = [sk.distribute(a, sk.NamedSharding(mesh, s)) if sharded else jnp.asarray(a)
                    for a, s in zip(args[name], specs)]

    def losses(f_of, values):
        out = {name: jnp.sum(jnp.sin(f_of(name, *values[name])) * ws[name]) for name in names}
        return sum(out.values()), out

    sk_value = lambda name, *a: sk.process_allgather(fs[name](*a))  # noqa: E731
    ref_value = lambda name, *a: cases[name][4](*a)  # noqa: E731
    (_, values), grads = jax.jit(jax.value_and_grad(lambda v: losses(sk_value, v), has_aux=True))(xs)
    (_, ref_values), ref_grads = jax.jit(jax.value_and_grad(lambda v: losses(ref_value, v), has_aux=True))(args)
    for name in names:
        key = f"{name}/{check}"
        jax_ok = f"{key}/error" not in jax_answers  # (JAX's transpose of pbroadcast raises: the global function only)
        np.testing.assert_allclose(values[name], ref_values[name], rtol=1e-12, err_msg=name)
        if jax_ok:
            np.testing.assert_allclose(values[name], jax_answers[f"{key}/value"], rtol=1e-12, err_msg=name)
        for j, (g, x) in enumerate(zip(grads[name], xs[name])):
            where = f"{name}, argument {j}, check_vma={check}"
            if sharded:
                assert isinstance(g, sk.ShardedArray) and g.sharding == x.sharding, where
                g, cut = g.local, lambda v, x=x: block_of(v, x.sharding)
            else:
                cut = np.asarray
            np.testing.assert_allclose(g, cut(ref_grads[name][j]), rtol=1e-12, atol=1e-12,
                                       err_msg=f"{where}: against the global function")
            if jax_ok:
                np.testing.assert_allclose(g, cut(jax_answers[f"{key}/{j}"]), rtol=1e-12, atol=1e-12,
                                           err_msg=f"{where}: against JAX")


def test_a_replicated_output_fed_to_another_shard_map(sk):
    """The P() output of one shard_map, an argument of a second: its cotangent is shared once, not once per
    shard_map."""
    n = sk.size()
    mesh = sk.Mesh(np.arange(n), ("x",))
    P = sk.P
    first = sk.shard_map(lambda b: sk.psum(jnp.sum(b * b), "x"), mesh=mesh, in_specs=P("x"), out_specs=P())
    second = sk.shard_map(lambda s, b: sk.psum(s * jnp.sum(jnp.sin(b)), "x"), mesh=mesh, in_specs=(P(), P("x")),
                          out_specs=P())
    x = np.cos(np.arange(2.0 * n))
    xs = sk.distribute(x, sk.NamedSharding(mesh, P("x")))
    value, g = jax.jit(jax.value_and_grad(lambda a: second(first(a), a).local))(xs)
    expected_value, expected = jax.value_and_grad(lambda a: jnp.sum(a * a) * jnp.sum(jnp.sin(a)))(x)
    np.testing.assert_allclose(value, expected_value, rtol=1e-12)
    np.testing.assert_allclose(g.local, block_of(expected, xs.sharding), rtol=1e-12)


@pytest.mark.parametrize("check", [True, False])
def test_grad_inside_a_body_follows_jax(sk, jax_answers, check):
    """jax.grad called in the body, of losses that run each axis collective (vma_cases.inside), all in one compiled
    program: with check_vma=True JAX's rules (psum of a varying value transposes to a copy, an unvarying value read by
    varying code to a psum: psum'ed losses give the gradient of the global loss), with check_vma=False pmap's (psum's
    transpose a psum: n times it), against JAX's jax.shard_map (its pbroadcast written as a psum, whose transpose JAX
    has)."""
    n = sk.size()
    mesh = sk.Mesh(np.arange(n), ("x",))
    # Where this JAX has no answer (jax 0.8.3 refuses the transpose of pbroadcast written as a psum), nothing to compare.
    fs = {name: sk.shard_map(lambda b, body=body: body(sk, b), mesh=mesh, in_specs=sk.P("x"), out_specs=sk.P("x"),
                             check_vma=check)
          for name, body in vma_cases.inside(n, jax, jnp).items() if f"inside/{name}/{check}/error" not in jax_answers}
    assert len(fs) >= len(vma_cases.inside(n, jax, jnp)) - 1
    x = sk.distribute(np.cos(np.arange(2.0 * n * n)), sk.NamedSharding(mesh, sk.P("x")))
    ys = jax.jit(lambda a: {name: sk.process_allgather(f(a)) for name, f in fs.items()})(x)
    for name, y in ys.items():
        np.testing.assert_allclose(y, jax_answers[f"inside/{name}/{check}"], rtol=1e-12, atol=1e-14,
                                   err_msg=f"{name}, check_vma={check}")


def test_resharded_arguments(sk):
    """ShardedArrays held otherwise than their in_spec (replicated -> sliced, sharded -> all-gathered, compiled): the
    gradient is still each rank's block of the global one."""
    n = sk.size()
    P = sk.P
    mesh = sk.Mesh(np.arange(n), ("x",))
    x = np.cos(np.arange(4.0 * n))
    c = jnp.arange(4.0 * n)
    f = {want: sk.shard_map(lambda b, c: jnp.sin(b * c), mesh=mesh, in_specs=(want, want), out_specs=want)
         for want in (P("x"), P())}
    xs = (sk.distribute(x, sk.NamedSharding(mesh, P())), sk.distribute(x, sk.NamedSharding(mesh, P("x"))))
    loss = lambda a, b: jnp.sum(sk.process_allgather(f[P("x")](a, c))) + 2 * jnp.sum(f[P()](b, c).local)  # noqa: E731
    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(*xs)
    expected = jax.grad(lambda a: jnp.sum(jnp.sin(a * c)))(x)
    for scale, g, held in zip((1, 2), grads, xs):
        assert g.sharding == held.sharding
        np.testing.assert_allclose(g.local, scale * block_of(expected, held.sharding), rtol=1e-12)


def test_custom_derivative_rules_in_a_body(sk):
    """Functions with custom derivative rules in a body, check_vma on: their rules hold for jax.grad of the jitted
    shard_map (jax.nn.relu's derivative 0 at 0, a custom_vjp's backward), and a jax.grad inside the body through a
    custom_vjp follows JAX's rules (the gradient of the global loss). (vma_cases.custom and vma_cases.inside compare
    more such bodies with JAX.)"""
    n = sk.size()
    mesh = sk.Mesh(np.arange(n), ("x",))
    P = sk.P

    @jax.custom_vjp
    def h(v):
        return jnp.sin(v)

    h.defvjp(lambda v: (jnp.sin(v), v), lambda v, ct: (ct * 10.0,))
    loss = lambda v: jnp.sum(jax.nn.relu(v) + h(v))  # noqa: E731
    x0 = np.tile([0.0, 1.0, -1.0, 0.0], n)
    x = sk.distribute(x0, sk.NamedSharding(mesh, P("x")))
    outside = sk.shard_map(lambda b: sk.psum(loss(b), "x"), mesh=mesh, in_specs=P("x"), out_specs=P())
    inside = sk.shard_map(lambda b: jax.grad(lambda v: sk.psum(jnp.sum(h(v)), "x"))(b), mesh=mesh, in_specs=P("x"),
                          out_specs=P("x"))
    g, y = jax.jit(lambda a: (jax.grad(lambda a: outside(a).local)(a), sk.process_allgather(inside(a))))(x)
    np.testing.assert_allclose(g.local, block_of(jax.grad(loss)(x0), x.sharding), rtol=1e-12)
    np.testing.assert_allclose(y, np.full(x0.shape, 10.0), rtol=1e-12)


def test_a_custom_call_shardkit_cannot_read_is_refused(sk, monkeypatch):
    """Where shardkit cannot read the equation of a call with custom derivative rules (a JAX release whose parameters
    differ), the traced body is refused with the function's name and what to do, not run with other rules."""
    from shardkit.jax import _compat as jc  # noqa: PLC0415

    monkeypatch.setattr(jc, "custom_call_jaxpr", lambda params: None)
    mesh = sk.Mesh(np.arange(sk.size()), ("x",))
    f = sk.shard_map(jax.nn.relu, mesh=mesh, in_specs=sk.P("x"), out_specs=sk.P("x"), check_vma=True)
    x = sk.distribute(np.arange(2.0 * sk.size()), sk.NamedSharding(mesh, sk.P("x")))
    with pytest.raises(NotImplementedError, match=r"'relu' has custom derivative rules.*check_vma=False"):
        jax.jit(lambda a: f(a).local)(x)


@pytest.mark.parametrize("name", list(vma_cases.out_spec_cases(1, np)))
def test_out_specs_are_checked_against_the_outputs_types(sk, jax_answers, name):
    """With check_vma on (the default), a jitted shard_map whose output varies over a mesh axis its out_spec does not
    name is refused at trace time, naming the output and the axes, exactly where JAX's jax.shard_map refuses it; with
    check_vma off it runs, each rank returning its own block unchecked."""
    n = sk.size()
    two_d, shapes, out_spec, body, broken = vma_cases.out_spec_cases(n, jnp)[name]
    axis_names, shape = vma_cases.mesh_of(n, two_d)
    mesh = sk.Mesh(np.arange(n).reshape(shape), axis_names)
    specs = tuple(sk.P(*s) for _, s in shapes)
    xs = [sk.distribute(a, sk.NamedSharding(mesh, s)) for a, s in zip(vma_cases.arguments(shapes, np), specs)]
    jax_verdict = str(jax_answers[f"out_spec/{name}"])
    assert bool(jax_verdict) == bool(broken), f"JAX's verdict on {name}: {jax_verdict!r}"

    def shard_map(check):
        return jax.jit(sk.shard_map(lambda *b: body(sk, *b), mesh=mesh, in_specs=specs, out_specs=sk.P(*out_spec),
                                    check_vma=check))

    if broken:
        with pytest.raises(sk.InvalidArgument, match=r"out_specs\[0\] = P\(.*\) does not name mesh ax") as e:
            shard_map(True)(*xs)
        for a in broken:
            assert f"'{a}'" in str(e.value), (a, str(e.value))
    else:
        shard_map(True)(*xs)
    out = shard_map(False)(*xs)
    assert isinstance(out, sk.ShardedArray) and out.sharding.spec == sk.P(*out_spec)
