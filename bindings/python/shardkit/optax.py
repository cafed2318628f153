"""optax's transforms that reduce over parameters, exact on sharded state: ``sk.optax.clip_by_global_norm``,
``scale_by_trust_ratio``, ``lamb``, ``lars`` and ``global_norm``, drop-in for optax's (same arguments, same values on
one process), for trees of ShardedArrays (any mesh and spec) and arrays every rank holds.

A ShardedArray's pytree leaf is this rank's block, so an optax transform that acts element by element (sgd, adam,
adamw, ...) is exact on sharded state, while one that reduces over a parameter or the tree (optax's clip_by_global_norm,
the trust ratio of lamb and lars, ...) sees this rank's blocks only, and gives each rank its own wrong value: use these
instead. Their norms are those of the global arrays (shardkit._reductions: replicated blocks count once), the same on
every rank, eagerly and under jax.jit; the rest of each chain is optax's.

optax is optional: it is imported (and with it JAX, which loads shardkit's JAX layer, where the transforms are written)
when a transform is made, not when shardkit is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _core, _hooks
from ._reductions import tree_global_norm

if TYPE_CHECKING:
    import optax

__all__ = ["clip_by_global_norm", "scale_by_trust_ratio", "lamb", "lars", "global_norm"]

global_norm = tree_global_norm  # optax.global_norm of the global arrays


def _transforms() -> Any:
    """The JAX layer's transforms (shardkit.jax._optax), once optax (and so JAX) is imported."""
    try:
        import optax  # noqa: F401  (imports jax, which loads shardkit's JAX layer)
    except ImportError as e:
        raise ImportError(f"shardkit.optax needs optax (pip install optax): {e}") from e
    layer = _hooks.jax_layer()
    if layer is None:
        raise _core.InvalidArgument("shardkit.optax: shardkit's JAX layer is not loaded (see the warning that "
                                    "`import jax` gave)")
    return layer.optax


def clip_by_global_norm(max_norm: Any) -> optax.GradientTransformation:
    """optax.clip_by_global_norm: updates scaled by ``max_norm / norm`` where their norm exceeds ``max_norm``, the
    norm that of the whole tree's global arrays (the same on every rank)."""
    return _transforms().clip_by_global_norm(max_norm)


def scale_by_trust_ratio(min_norm: Any = 0.0, trust_coefficient: Any = 1.0,
                         eps: Any = 0.0) -> optax.GradientTransformation:
    """optax.scale_by_trust_ratio: each update scaled by ``trust_coefficient * |param| / (|update| + eps)`` (1 where a
    norm is 0), the norms those of each whole parameter and update (reduced over the mesh axes its spec shards; one
    collective for the tree)."""
    return _transforms().scale_by_trust_ratio(min_norm, trust_coefficient, eps)


def lamb(learning_rate: Any, b1: Any = 0.9, b2: Any = 0.999, eps: Any = 1e-6, eps_root: Any = 0.0,
         weight_decay: Any = 0.0, mask: Any = None) -> optax.GradientTransformationExtraArgs:
    """optax.lamb with the trust ratio of the global parameters (scale_by_trust_ratio here)."""
    return _transforms().lamb(learning_rate, b1, b2, eps, eps_root, weight_decay, mask)


def lars(learning_rate: Any, weight_decay: Any = 0.0, weight_decay_mask: Any = True, trust_coefficient: Any = 0.001,
         eps: Any = 0.0, trust_ratio_mask: Any = True, momentum: Any = 0.9,
         nesterov: bool = False) -> optax.GradientTransformationExtraArgs:
    """optax.lars with the trust ratio of the global parameters (scale_by_trust_ratio here)."""
    return _transforms().lars(learning_rate, weight_decay, weight_decay_mask, trust_coefficient, eps, trust_ratio_mask,
                              momentum, nesterov)
