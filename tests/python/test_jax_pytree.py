"""Sharded state through jax.jit: ShardedArray is a JAX pytree (its leaf this rank's block, the global shape and the
sharding static), a jitted sk.shard_map takes ShardedArrays and returns each output's block only, and in_specs /
out_specs are pytree prefixes, eagerly and traced. Sizes that divide, that do not (uneven opt-in) and zero, at every
world size; a 2-d mesh where the world size allows one."""

import functools
import os
import shutil
import sys

import numpy as np
import pytest

from conftest import REPO, mpirun, python, require_jax

jax = require_jax()
import jax.numpy as jnp  # noqa: E402


def meshes(sk):
    n = sk.size()
    out = [(sk.Mesh(np.arange(n), ("x",)), "x")]
    if n % 2 == 0:
        out.append((sk.Mesh(np.arange(n).reshape(n // 2, 2), ("x", "y")), ("x", "y")))
    return out


def lengths(n):
    """(global length, uneven): divisible, not divisible (uneven opt-in; at 3 and 4 ranks a trailing block is smaller
    or empty), and zero."""
    return [(3 * n, False), (2 * n + 1, True), (0, False)]


def sharded(sk, mesh, axes, length, uneven, dtype=np.float32):
    g = np.arange(length * 2, dtype=dtype).reshape(length, 2) + 1
    return g, sk.distribute(g, sk.NamedSharding(mesh, sk.P(axes), uneven))


def block_of(sk, g, sharding):
    index = sharding.index(list(g.shape), sharding.mesh.rank)
    return g[tuple(slice(a, b) for a, b in index)]


def test_the_leaf_is_the_block_and_the_metadata_is_static(sk):
    for mesh, axes in meshes(sk):
        for length, uneven in lengths(sk.size()):
            g, x = sharded(sk, mesh, axes, length, uneven)
            (leaf,) = jax.tree.leaves(x)
            np.testing.assert_array_equal(leaf, block_of(sk, g, x.sharding))
            leaves, treedef = jax.tree.flatten(x)
            assert treedef == jax.tree.structure(jax.tree.map(lambda b: b * 2, x))  # same shape and sharding
            y = jax.tree.map(lambda b: b * 2, x)  # a NumPy leaf stays NumPy, and eager operations take it
            assert isinstance(y, sk.ShardedArray) and y.shape == x.shape and y.sharding == x.sharding
            np.testing.assert_array_equal(sk.process_allgather(y), 2 * g)
            # JAX rebuilds pytrees from placeholders too: nothing is checked or sent
            z = jax.tree.unflatten(treedef, [object()])
            assert z.shape == g.shape and z.sharding == x.sharding


def test_jit_grad_and_loop_carries_keep_the_sharding(sk):
    for mesh, axes in meshes(sk):
        for length, uneven in lengths(sk.size()):
            g, x = sharded(sk, mesh, axes, length, uneven)
            block = block_of(sk, g, x.sharding)
            y = jax.jit(lambda a: jax.tree.map(lambda b: b * 2, a))(x)
            assert isinstance(y, sk.ShardedArray) and y.sharding == x.sharding and y.shape == g.shape
            assert isinstance(y.local, jax.Array) and y.framework == "jax"
            np.testing.assert_array_equal(y.local, 2 * block)  # this rank's block only
            np.testing.assert_array_equal(sk.process_allgather(y), 2 * g)  # eager operations take a JAX leaf
            c = jax.lax.fori_loop(0, 3, lambda i, a: jax.tree.map(lambda b: b + 1, a), x)
            assert c.sharding == x.sharding
            np.testing.assert_array_equal(c.local, block + 3)
            s, ys = jax.lax.scan(lambda a, _: (jax.tree.map(lambda b: b * 2, a), a.local.sum()), x, None, length=2)
            assert s.sharding == x.sharding
            np.testing.assert_array_equal(s.local, 4 * block)
            np.testing.assert_array_equal(ys, [block.sum(), 2 * block.sum()])
            v, dx = jax.value_and_grad(lambda a: (a.local ** 2).sum() / 2)(x)
            assert isinstance(dx, sk.ShardedArray) and dx.sharding == x.sharding
            np.testing.assert_allclose(dx.local, block)
            np.testing.assert_allclose(v, (block ** 2).sum() / 2)


def test_optax_updates_keep_the_sharding(sk):
    optax = pytest.importorskip("optax")
    mesh, axes = meshes(sk)[-1]
    g, x = sharded(sk, mesh, axes, 2 * sk.size(), False)
    opt = optax.adam(0.1)
    state = opt.init(x)
    updates, state = jax.jit(opt.update)(jax.tree.map(jnp.ones_like, x), state, x)
    new = optax.apply_updates(x, updates)
    assert isinstance(new, sk.ShardedArray) and new.sharding == x.sharding
    assert new.local.shape == block_of(sk, g, x.sharding).shape


def collectives_in(lowered):
    return lowered.as_text().count("shardkit_collective")


@pytest.mark.parametrize("out_axes", ["same", "none"])
def test_jitted_shard_map_hands_blocks_over_and_keeps_outputs_sharded(sk, out_axes):
    """The block of a ShardedArray held as its in_spec goes to the body as it is, and each output comes back as a
    ShardedArray holding this rank's block: the lowered program has no collective at all (none to cut the inputs, none
    to gather the outputs); where the out_spec names no axis, the block is the whole value, as eagerly."""
    n = sk.size()
    for mesh, axes in meshes(sk):
        for length, uneven in lengths(n):
            g, x = sharded(sk, mesh, axes, length, uneven)
            block = block_of(sk, g, x.sharding)
            if out_axes == "same":
                f = sk.shard_map(lambda b: b * 3, mesh=mesh, in_specs=sk.P(axes), out_specs=sk.P(axes))
            else:  # every rank returns the same value: a replicated ShardedArray whose block is the whole value
                f = sk.shard_map(lambda b: jnp.full((1,) * b.ndim, 7, b.dtype), mesh=mesh, in_specs=sk.P(axes),
                                 out_specs=sk.P())
            y = jax.jit(f)(x)
            eager = f(x)
            assert isinstance(y, sk.ShardedArray) and isinstance(eager, sk.ShardedArray)
            assert y.sharding == eager.sharding and y.shape == eager.shape, (y, eager)
            np.testing.assert_array_equal(y.local, eager.local)
            if out_axes == "same":
                assert y.shape == g.shape and y.sharding == sk.NamedSharding(mesh, sk.P(axes), uneven)
                np.testing.assert_array_equal(y.local, 3 * block)  # the block, not the gathered value
            else:
                assert y.shape == (1, 1) and y.spec == sk.P()
                np.testing.assert_array_equal(y.local, [[7]])
            assert collectives_in(jax.jit(f).lower(x)) == 0
    # What gathering looks like in the program, so that the count above can see one.
    mesh, axes = meshes(sk)[0]
    _, x = sharded(sk, mesh, axes, 2 * n, False)
    gathered = jax.jit(lambda a: sk.process_allgather(sk.shard_map(lambda b: b, mesh=mesh, in_specs=sk.P(axes),
                                                                   out_specs=sk.P(axes))(a)))
    assert collectives_in(gathered.lower(x)) == (1 if n > 1 else 0)  # (one block: nothing to gather)
    np.testing.assert_array_equal(gathered(x), sk.process_allgather(x))


def test_arguments_held_otherwise_are_resharded_as_reshard_plans(sk):
    """reshard's plan, compiled: a replicated argument is sliced (no collective), a sharded one gathered by one
    all_gather where its in_spec replicates more, and moved by one all_to_all where its axes move to another
    dimension; any other plan (axes swapped between dimensions, uneven blocks) by an all_gather per sharded dimension
    and a slice. The same values as the eager shard_map."""
    n = sk.size()
    mesh, axes = meshes(sk)[0]
    g = np.arange(4 * n * 2 * n, dtype=np.float32).reshape(4 * n, 2 * n)
    cases = [(sk.P(), sk.P(axes), 0), (sk.P(axes), sk.P(), 1), (sk.P(axes), sk.P(None, axes), 1)]
    if n % 2 == 0:
        grid = sk.Mesh(np.arange(n).reshape(n // 2, 2), ("x", "y"))
        cases += [(sk.P("x", "y"), sk.P("x"), 1), (sk.P("x", "y"), sk.P(None, "y"), 1),
                  (sk.P("x", "y"), sk.P("y", "x"), (n // 2 > 1) + 1)]  # swapped: gathered, then sliced
    for held, spec, collectives in cases:
        m = grid if "y" in str(held) + str(spec) else mesh
        x = sk.distribute(g, sk.NamedSharding(m, held))
        f = sk.shard_map(lambda b: b + 1, mesh=m, in_specs=spec, out_specs=spec)
        y = jax.jit(f)(x)
        np.testing.assert_array_equal(y.local, block_of(sk, g, sk.NamedSharding(m, spec)) + 1)
        np.testing.assert_array_equal(y.local, f(x).local)
        kept = all(sk.NamedSharding(m, held).index(list(g.shape), r) == sk.NamedSharding(m, spec).index(
            list(g.shape), r) for r in range(n))  # every rank holds its block already (axes of size 1): nothing to do
        assert collectives_in(jax.jit(f).lower(x)) == (0 if kept else collectives), (held, spec)
    if n > 1:
        for length in (2 * n + 1, 1, 0):  # uneven blocks (at 1 and 0 elements some are empty)
            gu, u = sharded(sk, mesh, axes, length, True)
            for spec in (sk.P(None), sk.P(axes)):
                f = sk.shard_map(lambda b: b * 2, mesh=mesh, in_specs=spec, out_specs=spec)
                y = jax.jit(f)(u)
                np.testing.assert_array_equal(y.local, 2 * block_of(sk, gu, sk.NamedSharding(mesh, spec, True)))
                np.testing.assert_array_equal(y.local, f(u).local)
        _, u = sharded(sk, mesh, axes, 2 * n + 1, True)  # (2n+1, 2): at 3-4 ranks the columns are uneven too
        cols = sk.shard_map(lambda b: b, mesh=mesh, in_specs=sk.P(None, axes), out_specs=sk.P(None, axes))
        np.testing.assert_array_equal(jax.jit(cols)(u).local, cols(u).local)  # uneven: gathered, then sliced
        other = sk.Mesh(np.arange(n)[::-1].copy(), ("x",))
        with pytest.raises(sk.InvalidArgument, match="lives on"):
            jax.jit(sk.shard_map(lambda b: b, mesh=other, in_specs=sk.P("x"), out_specs=sk.P("x")))(
                sk.distribute(g, sk.NamedSharding(mesh, sk.P(axes))))
    # A plain argument stays a global value every rank holds
    f = sk.shard_map(lambda b: b + 1, mesh=mesh, in_specs=sk.P(axes), out_specs=sk.P(axes))
    z = jax.jit(f)(jnp.asarray(g))
    np.testing.assert_array_equal(sk.process_allgather(z), g + 1)


def test_grad_of_a_replicated_loss_through_a_jitted_shard_map(sk):
    """loss = sum over the global w of w**2 * c: each rank's gradient is its own block's 2 w c (one rule for the P()
    output eagerly and traced: a ShardedArray whose .local is the loss)."""
    n = sk.size()
    for mesh, axes in meshes(sk):
        for length, uneven in lengths(n):
            g, w = sharded(sk, mesh, axes, length, uneven, np.float64)
            c = 3.0
            loss = sk.shard_map(lambda b: sk.psum((b * b * c).sum(), axes), mesh=mesh, in_specs=sk.P(axes),
                                out_specs=sk.P())
            value, grad = jax.jit(jax.value_and_grad(lambda p: loss(p).local))(w)
            np.testing.assert_allclose(value, (g * g * c).sum())
            np.testing.assert_allclose(loss(w).local, value)  # the eager shard_map's P() output: the same value
            assert grad.sharding == w.sharding
            np.testing.assert_allclose(grad.local, 2 * c * block_of(sk, g, w.sharding))


def test_pytree_specs_eager_and_traced(sk):
    n = sk.size()
    mesh, axes = meshes(sk)[0]
    g, x = sharded(sk, mesh, axes, 2 * n, False)
    P = sk.P

    def body(params, scale):
        return {"sum": sk.psum(params["w"].sum() * scale, axes), "w": (params["w"] * scale, params["v"])}

    in_specs = ({"w": P(axes), "v": P()}, P())
    out_specs = {"sum": P(), "w": P(axes)}  # one P for the tuple under "w"
    v = np.arange(3.0)
    f = sk.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    for run in (lambda: f({"w": x, "v": v}, 2.0),  # eager: NumPy blocks
                lambda: jax.jit(f)({"w": x, "v": jnp.asarray(v)}, 2.0)):  # traced
        out = run()
        assert set(out) == {"sum", "w"} and isinstance(out["w"], tuple)
        np.testing.assert_allclose(out["sum"].local, 2 * g.sum())
        np.testing.assert_allclose(sk.process_allgather(out["w"][0]), 2 * g)
        assert out["w"][1].spec == P(axes) and out["w"][1].shape == (3 * n,)  # v's replicated block, cut as P(axes)
    for bad_in, bad_out in (((P(axes), P(), P()), out_specs), (in_specs, {"sum": P()}), (in_specs, [P(), P(), P()])):
        for traced in (False, True):
            g_ = sk.shard_map(body, mesh=mesh, in_specs=bad_in, out_specs=bad_out, check_vma=False)
            with pytest.raises(sk.InvalidArgument, match="is not a prefix of the structure"):
                (jax.jit(g_) if traced else g_)({"w": x, "v": v}, 2.0)


def test_traced_process_allgather_and_reshard_of_uneven_blocks(sk):
    """Under jax.jit, process_allgather and reshard of unevenly sharded arrays (blocks padded to the largest, gathered,
    trimmed): the eager values, and the gradient of the global function."""
    n = sk.size()
    mesh, axes = meshes(sk)[0]
    for length in (2 * n + 1, 1, 0):
        g, x = sharded(sk, mesh, axes, length, True, np.float64)
        np.testing.assert_array_equal(jax.jit(sk.process_allgather)(x), g)
        replicated = sk.NamedSharding(mesh, sk.P(), True)
        y = jax.jit(lambda a: sk.reshard(a, replicated))(x)  # noqa: B023
        assert y.sharding == replicated and y.shape == g.shape
        np.testing.assert_array_equal(y.local, g)
        np.testing.assert_array_equal(y.local, sk.reshard(x, replicated).local)
        w = np.arange(length, dtype=np.float64)[:, None]  # a weight per row: each block's cotangent differs
        grad = jax.jit(jax.grad(lambda a: (jnp.sin(sk.process_allgather(a)) * w).sum()))(x)  # noqa: B023
        assert grad.sharding == x.sharding
        np.testing.assert_allclose(grad.local, block_of(sk, np.cos(g) * w, x.sharding), rtol=1e-12)


@pytest.mark.processes
def test_registered_once_jax_is_imported_after_shardkit():
    r = python("import sys, numpy as np, shardkit as sk\n"
               "assert 'jax' not in sys.modules\n"
               "x = sk.distribute(np.ones(3), sk.NamedSharding(sk.Mesh((1,), ('x',)), sk.P('x')))\n"
               "import jax\n"
               "print(type(jax.jit(lambda a: a)(x)).__name__, len(jax.tree.leaves(x)))\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ShardedArray", "1"]


def test_donated_sharded_state_reuses_its_buffers(sk):
    """donate_argnums on a step that takes and returns ShardedArrays: the output blocks take the donated blocks' buffers
    (the inputs are deleted, the pointer is the same), and 200 steps do not grow resident memory."""
    n = sk.size()
    mesh, axes = meshes(sk)[-1]
    w = sk.distribute(np.ones((256 * n, 256), np.float32), sk.NamedSharding(mesh, sk.P(axes)))  # 256 KiB per rank
    loss = sk.shard_map(lambda b: sk.psum((b * b).sum(), axes), mesh=mesh, in_specs=sk.P(axes), out_specs=sk.P())

    @functools.partial(jax.jit, donate_argnums=0)
    def step(p):
        lv, g = jax.value_and_grad(lambda q: loss(q).local)(p)
        return lv, jax.tree.map(lambda a, d: a - 1e-4 * d, p, g)

    p = jax.tree.map(jnp.array, w)  # JAX-owned blocks (a NumPy block cannot be donated)
    before = p.local.unsafe_buffer_pointer()
    lv, q = step(p)
    assert p.local.is_deleted() and q.local.unsafe_buffer_pointer() == before
    assert q.sharding == w.sharding
    for _ in range(20):
        lv, q = step(q)
    lv.block_until_ready()
    rss = resident_bytes()
    for _ in range(200):
        lv, q = step(q)
    lv.block_until_ready()
    assert resident_bytes() - rss < 4 << 20  # a leak of one block per step would be 50 MiB
    np.testing.assert_allclose(q.local, np.full(q.local.shape, (1 - 2e-4) ** 221, np.float32), rtol=1e-4)


def resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.processes
@pytest.mark.parametrize("np_,meshes_", [(1, "1x1"), (2, "2x1,1x2"), (4, "2x2")])
def test_train_mlp_example(np_, meshes_):
    """examples/jax/train_mlp.py: its loss trajectory equals single-process JAX's on every mesh, and a model-parallel
    rank holds a part of the parameters only."""
    r = mpirun(np_, [sys.executable, os.path.join(REPO, "examples/jax/train_mlp.py"), "--meshes", meshes_],
               timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("max relative difference") == len(meshes_.split(","))
    if "x2" in meshes_:
        assert "parameter bytes on rank 0: 1632 of 3232" in r.stdout  # W1, b1, W2 halved; b2 whole
    assert r.stdout.strip().endswith("losses match single-process JAX to 1e-5: True"), r.stdout


@pytest.mark.processes
def test_train_mlp_resumes_from_a_checkpoint_on_the_same_and_other_meshes(tmp_path):
    """examples/jax/train_mlp.py --checkpoint-dir: stopped after step 3 on a 1x2 mesh, resumed on the same mesh the
    trajectory (optimiser state included) is bit-equal to an uninterrupted run's; resumed on 2x1 and on one rank it
    matches to 1e-5."""
    script = os.path.join(REPO, "examples/jax/train_mlp.py")

    def run(np_, meshes_, *extra):
        r = mpirun(np_, [sys.executable, script, "--meshes", meshes_, "--steps", "6", *extra], timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    def trajectory(out):
        line = [ln for ln in out.splitlines() if ln.startswith("trajectory: ")][-1]
        return [float.fromhex(v) for v in line.split()[1:]]

    whole = trajectory(run(2, "1x2"))
    assert len(whole) == 6
    ckpt = str(tmp_path / "ckpt")
    stopped = run(2, "1x2", "--checkpoint-dir", ckpt, "--stop-after", "3")
    assert "stopped after step 3" in stopped and trajectory(stopped) == whole[:3]
    for np_, mesh in ((2, "2x1"), (1, "1x1")):
        copy = str(tmp_path / f"ckpt-{mesh}")
        shutil.copytree(ckpt, copy)
        out = run(np_, mesh, "--checkpoint-dir", copy, "--resume")
        assert "resumed from step 3" in out and out.strip().endswith("to 1e-5: True"), out
        np.testing.assert_allclose(trajectory(out), whole, rtol=1e-5)
    out = run(2, "1x2", "--checkpoint-dir", ckpt, "--resume")
    assert "resumed from step 3" in out and trajectory(out) == whole, out  # bit for bit
