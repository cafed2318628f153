"""sk.tree_sum and sk.tree_global_norm: the value of the global arrays, the same on every rank, for trees that mix
ShardedArrays (sharded, partly replicated, uneven, empty blocks, on 1-d and 2-d meshes) with arrays every rank holds
and numbers; against NumPy on the gathered global arrays, eagerly (NumPy and JAX blocks) and under jax.jit, with
jax.grad of the norm that of the global norm and one collective per set of sharding axes."""

import numpy as np
import pytest

from conftest import has_module, require_jax


def cases(sk):
    """(mesh, [(global shape, spec, uneven, dtype)]) at this world size: a line of every rank, and a grid of two
    columns where the size is even. Among them sharded, replicated (P()), partly replicated (sharded over x only on the
    grid), sharded on a later dimension, uneven (a trailing block smaller, or empty at 3 and 4 ranks), and empty."""
    n, P = sk.size(), sk.P
    line = sk.Mesh(np.arange(n), ("x",))
    out = [(line, [((3 * n, 2), P("x"), False, np.float32), ((3, 2), P(), False, np.float64),
                   ((2, 3 * n), P(None, "x"), False, np.complex64), ((2 * n + 1, 2), P("x"), True, np.float32),
                   ((0, 2), P("x"), False, np.float32), ((5 * n,), P("x"), False, np.int32)])]
    if n % 2 == 0:
        grid = sk.Mesh(np.arange(n).reshape(n // 2, 2), ("x", "y"))
        out.append((grid, [((n, 4), P("x"), False, np.float32), ((2 * n, 3), P(("x", "y")), False, np.float32),
                           ((4, n), P("y", "x"), False, np.float64), ((3, 4), P(None, "y"), False, np.float32),
                           ((n + 1,), P(("x", "y")), True, np.float32), ((2, 2), P(), False, np.float32)]))
    return out


def tree_of(sk, mesh, arrays, seed=0):
    """A dict of ShardedArrays (the global arrays distributed), an array every rank holds and a number."""
    rng = np.random.default_rng(seed)
    tree = {}
    for i, (shape, spec, uneven, dtype) in enumerate(arrays):
        g = rng.normal(size=shape) + (1j * rng.normal(size=shape) if np.dtype(dtype).kind == "c" else 0)
        g = (g * 3).astype(dtype)
        tree[f"a{i}"] = sk.distribute(g, sk.NamedSharding(mesh, spec, uneven))
    tree["plain"] = {"held": rng.normal(size=(3,)).astype(np.float32), "number": 2.0}
    return tree


def expected(sk, tree):
    """(sum, norm) by NumPy over the gathered global arrays, each element once."""
    whole = [np.asarray(sk.process_allgather(v), np.complex128).ravel() for v in
             (tree[k] for k in sorted(tree) if k != "plain")]
    whole += [np.asarray(tree["plain"]["held"], np.complex128), np.array([tree["plain"]["number"]], np.complex128)]
    flat = np.concatenate(whole)
    return flat.sum(), np.sqrt((np.abs(flat) ** 2).sum())


def assert_same_on_every_rank(sk, value):
    every, _ = sk.mpi.allgather(np.asarray(value).reshape(1))
    assert np.all(every == every[0]), every.ravel()


def check(sk, tree, total, norm):
    want_total, want_norm = expected(sk, tree)
    np.testing.assert_allclose(complex(sk.tree_sum(tree)), want_total, rtol=1e-5)
    np.testing.assert_allclose(float(sk.tree_global_norm(tree)), want_norm, rtol=1e-5)
    np.testing.assert_allclose(float(sk.tree_global_norm(tree, squared=True)), want_norm ** 2, rtol=1e-5)
    np.testing.assert_allclose(complex(total), want_total, rtol=1e-5)
    np.testing.assert_allclose(float(norm), want_norm, rtol=1e-5)
    assert_same_on_every_rank(sk, norm)
    assert_same_on_every_rank(sk, total)


def test_numpy_trees_give_the_global_values(sk):
    trees = []
    for mesh, arrays in cases(sk):
        tree = tree_of(sk, mesh, arrays)
        trees.append(tree)
        check(sk, tree, sk.tree_sum(tree), sk.tree_global_norm(tree))
        # Each array alone: the per-array values LAMB's trust ratio takes.
        for key, x in tree.items():
            if key != "plain":
                want = np.sqrt((np.abs(np.asarray(sk.process_allgather(x), np.complex128)) ** 2).sum())
                np.testing.assert_allclose(float(sk.tree_global_norm(x)), want, rtol=1e-5, err_msg=key)
    if len(trees) == 2:  # arrays on two meshes in one tree
        both = {**{f"line_{k}": v for k, v in trees[0].items() if k != "plain"}, **trees[1]}
        check(sk, both, sk.tree_sum(both), sk.tree_global_norm(both))


def test_empty_trees_and_plain_values(sk):
    assert sk.tree_sum({}) == 0 and float(sk.tree_global_norm([])) == 0.0
    held = [np.full(4, 2.0, np.float32), 3.0]  # every rank holds them: counted once, not size() times
    assert float(sk.tree_sum(held)) == 11.0 and float(sk.tree_global_norm(held)) == 5.0


@pytest.mark.skipif(not has_module("jax"), reason="JAX is not installed")
def test_jax_trees_eagerly_and_under_jit(sk):
    jax = require_jax()
    import jax.numpy as jnp

    reduce = jax.jit(lambda t: (sk.tree_sum(t), sk.tree_global_norm(t)))
    for i, (mesh, arrays) in enumerate(cases(sk)):
        tree = tree_of(sk, mesh, arrays)
        blocks = jax.tree.map(jnp.asarray, tree)  # ShardedArrays holding JAX blocks
        assert isinstance(blocks["a0"], sk.ShardedArray) and blocks["a0"].framework == "jax"
        total, norm = reduce(blocks)
        assert isinstance(norm, jax.Array)
        check(sk, tree, total, norm)
        if i == 0:  # eagerly on JAX blocks too (a sharded and a replicated array: eager JAX compiles each operation
            # for each new shape, and the other cases take the same path as NumPy blocks do, eagerly)
            tree = {k: tree[k] for k in ("a0", "a1", "plain")}
            blocks = jax.tree.map(jnp.asarray, tree)
            norm = sk.tree_global_norm(blocks)
            assert isinstance(norm, jax.Array)
            check(sk, tree, sk.tree_sum(blocks), norm)


@pytest.mark.skipif(not has_module("jax"), reason="JAX is not installed")
def test_the_gradient_of_the_norm_is_the_global_one(sk):
    jax = require_jax()
    import jax.numpy as jnp

    for mesh, arrays in cases(sk):
        tree = tree_of(sk, mesh, [a for a in arrays if np.dtype(a[3]).kind == "f"])
        blocks = jax.tree.map(jnp.asarray, tree)
        grads = jax.jit(jax.grad(sk.tree_global_norm))(blocks)
        _, norm = expected(sk, tree)
        for key, x in tree.items():
            if key == "plain":
                np.testing.assert_allclose(grads[key]["held"], x["held"] / norm, rtol=1e-5)
                continue
            assert isinstance(grads[key], sk.ShardedArray) and grads[key].sharding == x.sharding
            np.testing.assert_allclose(sk.process_allgather(grads[key]), sk.process_allgather(x) / norm, rtol=1e-5,
                                       atol=1e-7, err_msg=key)


@pytest.mark.skipif(not has_module("jax"), reason="JAX is not installed")
def test_one_collective_per_set_of_sharding_axes(sk):
    jax = require_jax()
    import jax.numpy as jnp

    for mesh, arrays in cases(sk):
        tree = jax.tree.map(jnp.asarray, tree_of(sk, mesh, arrays))
        # The mesh axes of more than one rank that each array's blocks differ along; replicated arrays need none.
        groups = {tuple(a for a in mesh.axis_names if a not in x.sharding.replicated_axes and mesh.axis_size([a]) > 1)
                  for k, x in tree.items() if k != "plain"} - {()}
        text = jax.jit(sk.tree_global_norm).lower(tree).as_text()
        assert text.count("shardkit_collective") == len(groups), (groups, text.count("shardkit_collective"))
