"""shardkit.optax's transforms: optax's, with their norms taken over the global arrays of sharded state.

optax reduces over a tree's leaves, and a ShardedArray's leaf is this rank's block: optax.clip_by_global_norm and the
trust ratio of scale_by_trust_ratio (lamb, lars) would each see this rank's blocks only. These are the same transforms,
written as optax 0.2's are, with the norms of shardkit._reductions (global; one psum per mesh and set of sharding axes
for the whole tree): clip_by_global_norm's norm over the whole tree, the trust ratio's per parameter (the norm of the
whole parameter, reduced over the mesh axes its spec shards). The elementwise transforms they are chained with are
optax's own, exact on sharded state as they are. optax is imported when a transform is made: it stays optional.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._reductions import leaf_sums, tree_global_norm
from .._sharded_array import is_sharded


def _optax():
    import optax  # optional: needed once a transform is made

    return optax


def clip_by_global_norm(max_norm):
    """optax.clip_by_global_norm, the norm that of the global arrays."""
    optax = _optax()

    def update_fn(updates, state, params=None):
        del params
        g_norm = jnp.asarray(tree_global_norm(updates))
        trigger = jnp.squeeze(g_norm < max_norm)

        def clip_fn(t):
            return jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm)

        return jax.tree.map(clip_fn, updates), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def _safe_norm(sum_of_squares, min_norm):
    """optax's numerics.safe_norm from a (global) sum of squares: the norm, min_norm where it is at most min_norm, and
    a derivative that is 0 there rather than NaN (the square root is taken of 1 instead)."""
    small = jnp.sqrt(sum_of_squares) <= min_norm
    return jnp.where(small, min_norm, jnp.sqrt(jnp.where(small, jnp.ones_like(sum_of_squares), sum_of_squares)))


def scale_by_trust_ratio(min_norm=0.0, trust_coefficient=1.0, eps=0.0):
    """optax.scale_by_trust_ratio, each parameter's norm and its update's those of the global arrays."""
    optax = _optax()

    def update_fn(updates, state, params):
        if params is None:
            raise ValueError("scale_by_trust_ratio needs the parameters: pass `params` to `update`")
        leaves, treedef = jax.tree.flatten(updates, is_leaf=is_sharded)
        held = treedef.flatten_up_to(params)
        sums = leaf_sums(leaves + held, square=True)  # the updates' and the parameters' together: one psum per group

        def scaled(update, param, update_sq, param_sq):
            param_norm = _safe_norm(param_sq, min_norm)
            update_norm = _safe_norm(update_sq, min_norm)
            trust_ratio = trust_coefficient * param_norm / (update_norm + eps)
            zero_norm = jnp.logical_or(param_norm == 0.0, update_norm == 0.0)
            ratio = jnp.where(zero_norm, jnp.array(1.0, dtype=param.dtype), trust_ratio)
            return jax.tree.map(lambda u: u * ratio, update)  # a ShardedArray's block, or a whole array

        n = len(leaves)
        out = [scaled(u, p, su, sp) for u, p, su, sp in zip(leaves, held, sums[:n], sums[n:])]
        return treedef.unflatten(out), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def lamb(learning_rate, b1=0.9, b2=0.999, eps=1e-6, eps_root=0.0, weight_decay=0.0, mask=None):
    """optax.lamb (optax 0.2's chain) with the global trust ratio."""
    optax = _optax()
    return optax.chain(
        optax.scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root),
        optax.add_decayed_weights(weight_decay=weight_decay, mask=mask),
        scale_by_trust_ratio(),
        optax.scale_by_learning_rate(learning_rate),
    )


def lars(learning_rate, weight_decay=0.0, weight_decay_mask=True, trust_coefficient=0.001, eps=0.0,
         trust_ratio_mask=True, momentum=0.9, nesterov=False):
    """optax.lars (optax 0.2's chain) with the global trust ratio."""
    optax = _optax()
    return optax.chain(
        optax.add_decayed_weights(weight_decay, mask=weight_decay_mask),
        optax.masked(inner=scale_by_trust_ratio(trust_coefficient=trust_coefficient, eps=eps), mask=trust_ratio_mask),
        optax.scale_by_learning_rate(learning_rate),
        optax.trace(decay=momentum, nesterov=nesterov),
    )
