"""The Megatron-style MLP that examples/jax/train_mlp.py trains and examples/benchmarks/train_step.py times.

W1 is cut by columns and W2 by rows over mesh axis "model", b1 with W1's columns, b2 replicated; the batch is cut over
"data". The per-block loss takes the collectives as arguments (shardkit's sk.psum / sk.pmean, or jax.lax's inside
jax.shard_map), so the same body runs under either runtime; nothing here imports shardkit.
"""

import jax
import jax.numpy as jnp
import numpy as np

# Partition specs as axis-name tuples: SPECS(P) builds them with either shardkit's P or JAX's PartitionSpec.
SPEC_AXES = {"w1": (None, "model"), "b1": ("model",), "w2": ("model", None), "b2": ()}


def specs(P):
    """The parameters' partition specs built with the given PartitionSpec type."""
    return {k: P(*v) for k, v in SPEC_AXES.items()}


def problem(d_in, hidden, d_out, batch, seed=0):
    """Parameters, inputs and targets (float32), the same on every process (a fixed seed)."""
    rng = np.random.default_rng(seed)
    params = {"w1": rng.normal(size=(d_in, hidden)) / np.sqrt(d_in), "b1": np.zeros(hidden),
              "w2": rng.normal(size=(hidden, d_out)) / np.sqrt(hidden), "b2": np.zeros(d_out)}
    x = rng.normal(size=(batch, d_in))
    t = np.sin(x @ rng.normal(size=(d_in, d_out)))
    as32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    return {k: as32(v) for k, v in params.items()}, as32(x), as32(t)


def forward(p, x):
    """The MLP on global arrays (the one-process reference)."""
    return jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def global_loss(p, x, t):
    """Mean squared error on global arrays."""
    return jnp.mean((forward(p, x) - t) ** 2)


def block_loss(p, xb, tb, psum, pmean):
    """The loss from one rank's blocks inside a shard_map over ("data", "model"): psum and pmean are the runtime's."""
    h = jax.nn.relu(xb @ p["w1"] + p["b1"])
    y = psum(h @ p["w2"], "model") + p["b2"]
    return pmean(jnp.mean((y - tb) ** 2), "data")  # equal batch blocks: the mean of the means


def sgd(params, grads, lr=0.1):
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)
