"""sk.optax on sharded state: optax.chain(sk.optax.clip_by_global_norm, optax.adamw), sk.optax.lamb and sk.optax.lars
training the Megatron MLP of examples/jax/mlp_model.py with jitted steps on (data, model) meshes (1, 2), (2, 1) and
(2, 2) (those that fit the world size; (1, 1) at one rank; smaller meshes than the world on groups of ranks), against
the same optax chains in one process to 1e-5, the clip clipping at every step. And the rule the docs state: optax's own
reducing transforms (clip_by_global_norm, global_norm) see this rank's blocks only, a different value on each rank."""

import functools
import os
import sys

import numpy as np
import pytest

from conftest import REPO, require_jax

jax = require_jax()
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "examples", "jax"))
from mlp_model import block_loss, global_loss, problem, specs  # noqa: E402

D_IN, HIDDEN, D_OUT, BATCH, STEPS, LR = 8, 16, 4, 8, 4, 1e-2
CLIP = 0.25  # below the gradient's norm at every step (checked): the clip changes every update


def optimizers(sk):
    """name -> (shardkit's transform, optax's for the one-process reference)."""
    return {
        "clip+adamw": (optax.chain(sk.optax.clip_by_global_norm(CLIP), optax.adamw(LR, weight_decay=0.1)),
                       optax.chain(optax.clip_by_global_norm(CLIP), optax.adamw(LR, weight_decay=0.1))),
        "lamb": (sk.optax.lamb(LR, weight_decay=0.1), optax.lamb(LR, weight_decay=0.1)),
        "lars": (sk.optax.lars(LR, weight_decay=0.1, trust_coefficient=0.5),
                 optax.lars(LR, weight_decay=0.1, trust_coefficient=0.5)),
    }


@functools.lru_cache(maxsize=None)
def reference(name):
    """(losses, final parameters, gradient norms) of one-process optax on the global arrays: run on rank 0 and sent to
    the others (each program compiled once in the job, not once per rank)."""
    import shardkit as sk

    params, _, _ = problem(D_IN, HIDDEN, D_OUT, BATCH)
    keys = sorted(params)
    packed = np.zeros(2 * STEPS + sum(params[k].size for k in keys))
    if sk.rank() == 0:
        losses, params, norms = one_process(optimizers(sk)[name][1])
        packed = np.concatenate([losses, norms] + [np.asarray(params[k], np.float64).ravel() for k in keys])
    packed, _ = sk.mpi.bcast(packed, 0)
    parts = np.split(packed, np.cumsum([STEPS, STEPS] + [params[k].size for k in keys]))
    return parts[0], {k: v.reshape(params[k].shape) for k, v in zip(keys, parts[2:])}, parts[1]


def one_process(opt):
    params, x, t = problem(D_IN, HIDDEN, D_OUT, BATCH)
    state = opt.init(params)

    @jax.jit
    def step(p, s):
        loss, g = jax.value_and_grad(lambda q: global_loss(q, x, t))(p)
        updates, s = opt.update(g, s, p)
        return loss, optax.apply_updates(p, updates), s, optax.tree.norm(g)

    losses, norms = [], []
    for _ in range(STEPS):
        loss, params, state, norm = step(params, state)
        losses.append(float(loss))
        norms.append(float(norm))
    return np.array(losses), params, np.array(norms)


@functools.lru_cache(maxsize=None)
def mesh_cases():
    """[(data, model), mesh or None]: each mesh that fits the world, on groups of data*model ranks (None on a rank
    left out of every group). Splitting is collective: every rank makes every case."""
    import shardkit as sk

    n, rank = sk.size(), sk.rank()
    shapes = [s for s in [(1, 2), (2, 1), (2, 2)] if s[0] * s[1] <= n] or [(1, 1)]
    out = []
    for data, model in shapes:
        k = data * model
        group = rank // k if rank < n - n % k else n  # the ranks past the last full group: a group of their own
        comm = sk.world().split(group, rank)
        mesh = sk.Mesh(np.arange(k).reshape(data, model), ("data", "model"), comm=comm) if group < n else None
        out.append(((data, model), mesh))
    return out


def most_cut():
    """The case of mesh_cases whose mesh cuts the parameters most (the largest model axis, then data): (1, 2) at 2 and 3
    ranks, (2, 2) at 4; none on a rank left out of every group."""
    cases = [(shape, mesh) for shape, mesh in mesh_cases() if mesh is not None]
    return [max(cases, key=lambda c: (c[0][1], c[0][0]))] if cases else []


def train(sk, opt, mesh, steps=STEPS):
    """The sharded training (examples/jax/train_mlp.py's step; the loss's shard_map unchecked, which leaves its
    derivative the global loss's and traces faster): the losses and the parameters, ShardedArrays."""
    spec = specs(sk.P)
    params, x, t = problem(D_IN, HIDDEN, D_OUT, BATCH)
    params = {k: sk.distribute(v, sk.NamedSharding(mesh, spec[k])) for k, v in params.items()}
    x, t = (sk.distribute(a, sk.NamedSharding(mesh, sk.P("data"))) for a in (x, t))
    loss = sk.shard_map(functools.partial(block_loss, psum=sk.psum, pmean=sk.pmean), mesh=mesh,
                        in_specs=(spec, sk.P("data"), sk.P("data")), out_specs=sk.P(), check_vma=False)
    params = jax.tree.map(jnp.asarray, params)
    state = opt.init(params)

    @jax.jit
    def step(p, s, xb, tb):
        value, grads = jax.value_and_grad(lambda q: loss(q, xb, tb).local)(p)
        updates, s = opt.update(grads, s, p)
        return value, optax.apply_updates(p, updates), s

    losses = []
    for _ in range(steps):
        value, params, state = step(params, state, x, t)
        losses.append(float(value))
    return np.array(losses), params


@pytest.mark.parametrize("name", ["clip+adamw", "lamb", "lars"])
def test_sharded_training_matches_one_process_optax(sk, name):
    ref_losses, ref_params, norms = reference(name)
    if name == "clip+adamw":
        assert np.all(norms > CLIP), norms  # the clip acts at every step
    # LAMB's runs test the trust ratio on every mesh; LARS's chain runs on the one that cuts most
    cases = most_cut() if name == "lars" else [(shape, mesh) for shape, mesh in mesh_cases() if mesh is not None]
    for shape, mesh in cases:
        losses, params = train(sk, optimizers(sk)[name][0], mesh)
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, err_msg=f"{name} on mesh {shape}")
        for k, v in params.items():
            # This rank's block (a replicated parameter's too: each rank's copy, not one rank's gathered)
            assert isinstance(v, sk.ShardedArray) and v.sharding.spec == specs(sk.P)[k]
            index = v.sharding.index(list(v.shape), mesh.rank)
            want = np.asarray(ref_params[k])[tuple(slice(a, b) for a, b in index)]
            np.testing.assert_allclose(v.local, want, rtol=1e-5, atol=1e-6, err_msg=f"{name}: {k} on mesh {shape}")


def test_optax_own_reductions_see_this_ranks_blocks_only(sk):
    # The rule: reductions over sharded state are global through sk.tree_* and sk.optax; optax's own reducing
    # transforms reduce over the leaves, which are this rank's blocks: a value of its own on each rank, not the global
    # one, wherever a parameter is cut (model > 1).
    spec = specs(sk.P)
    for (_, model), mesh in most_cut():
        if model == 1:  # at one rank: each block is the whole array, nothing to show
            continue
        params, _, _ = problem(D_IN, HIDDEN, D_OUT, BATCH)
        tree = {k: sk.distribute(v, sk.NamedSharding(mesh, spec[k])) for k, v in params.items()}
        tree = jax.tree.map(jnp.asarray, tree)
        whole = np.sqrt(sum((np.asarray(v, np.float64) ** 2).sum() for v in params.values()))
        mine = np.sqrt(sum((np.asarray(b, np.float64) ** 2).sum() for b in jax.tree.leaves(tree)))
        np.testing.assert_allclose(float(optax.tree.norm(tree)), mine, rtol=1e-5)  # this rank's blocks
        np.testing.assert_allclose(float(sk.optax.global_norm(tree)), whole, rtol=1e-5)
        assert abs(mine - whole) > 1e-3 * whole
        # So optax's clip scales each rank's blocks by its own factor: not the global update.
        limit = float(0.5 * whole)
        ours, _ = jax.jit(sk.optax.clip_by_global_norm(limit).update)(tree, optax.EmptyState())
        theirs, _ = jax.jit(optax.clip_by_global_norm(limit).update)(tree, optax.EmptyState())
        want = {k: v * (limit / whole) for k, v in params.items()}
        for k in params:
            np.testing.assert_allclose(sk.process_allgather(ours[k]), want[k], rtol=1e-5, atol=1e-7)
        assert not all(np.allclose(sk.process_allgather(theirs[k]), want[k], rtol=1e-3) for k in params)
