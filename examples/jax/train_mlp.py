"""A data-parallel x model-parallel MLP trained with sharded state across jax.jit steps (Megatron-style).

W1 is cut by columns and W2 by rows over mesh axis "model" (P(None, "model"), P("model", None)), b1 with W1's columns,
b2 replicated; the batch is cut over "data". Each jitted step takes and returns ShardedArrays (parameters and, with
optax installed, Adam's state; plain SGD otherwise), so every rank keeps only its blocks between steps; donated, the
step reuses their buffers. The loss trajectory is compared with the same training in one process with plain JAX.

Gradients: jax.grad of the jitted shard_map gives each rank its block of the gradient of the global loss, as
jax.shard_map does (a parameter replicated over a mesh axis gets its gradient summed over that axis by the shard_map's
derivative), so the step hands them to the optimiser as they come.

The model (parameters, losses, SGD) is mlp_model.py's, which examples/benchmarks/train_step.py times.

With --checkpoint-dir, the training (on the first mesh) saves its state after every step (parameters and optimiser
state as ShardedArrays, the step and the losses so far; the newest two steps kept) and --stop-after K stops it after
step K, as a job that ends; --resume loads the newest step onto this run's mesh, which may have another number of
ranks or shape, and goes on: the trajectory equals an uninterrupted run's (bit for bit on the same mesh).

    mpirun -np 4 python examples/jax/train_mlp.py                 # every mesh of 4 ranks: (1, 4), (2, 2), (4, 1)
    mpirun -np 2 python examples/jax/train_mlp.py --meshes 2x1,1x2
    mpirun -np 4 python examples/jax/train_mlp.py --meshes 2x2 --checkpoint-dir ckpt --stop-after 8
    mpirun -np 2 python examples/jax/train_mlp.py --meshes 1x2 --checkpoint-dir ckpt --resume
"""

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

import shardkit as sk
from mlp_model import block_loss, global_loss, problem, sgd, specs
from shardkit import P

try:
    import optax
except ImportError:  # optax is optional: plain SGD then
    optax = None

D_IN, HIDDEN, D_OUT, BATCH = 16, 32, 8, 32  # HIDDEN and BATCH divide over 1, 2 and 4 ranks
SPECS = specs(P)


def print_on_process_0(*args):
    if sk.rank() == 0:
        print(*args, flush=True)


def optimizer():
    return optax.adam(1e-2) if optax is not None else None


def sgd_or_optax(opt, grads, state, params):
    if opt is None:
        return sgd(params, grads), state
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state


def reference(steps):
    """The loss trajectory of the same training in one process, plain JAX on the global arrays."""
    params, x, t = problem(D_IN, HIDDEN, D_OUT, BATCH)
    opt = optimizer()
    state = opt.init(params) if opt is not None else None

    @jax.jit
    def step(p, s):
        loss, g = jax.value_and_grad(lambda q: global_loss(q, x, t))(p)
        p, s = sgd_or_optax(opt, g, s, p)
        return loss, p, s

    out = []
    for _ in range(steps):
        loss, params, state = step(params, state)
        out.append(float(loss))
    return np.array(out)


def param_spec(key, info):
    """The spec of a saved array on the new mesh (sk.load's callable form): a parameter's, or Adam's moment of one
    (their key paths end in the parameter's name), by its name."""
    return SPECS.get(key.rsplit("/", 1)[-1], P())


def train(data, model, steps, checkpoint_dir=None, stop_after=None, resume=False):
    """The sharded training on a (data, model) mesh: the loss trajectory and this rank's parameter bytes."""
    mesh = sk.Mesh(np.arange(data * model).reshape(data, model), ("data", "model"))
    params, x, t = problem(D_IN, HIDDEN, D_OUT, BATCH)
    params = {k: sk.distribute(v, sk.NamedSharding(mesh, SPECS[k])) for k, v in params.items()}
    x = sk.distribute(x, sk.NamedSharding(mesh, P("data")))
    t = sk.distribute(t, sk.NamedSharding(mesh, P("data")))

    body = functools.partial(block_loss, psum=sk.psum, pmean=sk.pmean)
    loss = sk.shard_map(body, mesh=mesh, in_specs=(SPECS, P("data"), P("data")), out_specs=P())

    opt = optimizer()
    state = opt.init(jax.tree.map(jnp.asarray, params)) if opt is not None else None

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(p, s, xb, tb):
        value, grads = jax.value_and_grad(lambda q: loss(q, xb, tb).local)(p)
        p, s = sgd_or_optax(opt, grads, s, p)
        return value, p, s

    params = jax.tree.map(jnp.array, params)  # JAX-owned blocks, which the step can donate
    out, first = [], 0
    if resume:
        # like= gives the loaded tree the classes of the state one starts from (optax's namedtuples) and JAX leaves.
        like = {"params": params, "opt": state, "step": 0, "losses": np.zeros(0)}
        saved = sk.checkpoint.latest_step(checkpoint_dir)
        info = {a["key"]: a for a in sk.checkpoint_info(checkpoint_dir)["arrays"]}
        like["losses"] = np.zeros(info["losses"]["shape"], np.float64)
        back = sk.load(checkpoint_dir, mesh, param_spec, like=like)
        params, state, first, out = back["params"], back["opt"], back["step"], list(back["losses"])
        print_on_process_0(f"resumed from step {saved} of {checkpoint_dir} on mesh ({data}, {model})")
    for i in range(first, steps):
        value, params, state = step(params, state, x, t)
        out.append(float(value))
        if checkpoint_dir is not None:
            sk.save(checkpoint_dir, {"params": params, "opt": state, "step": i + 1, "losses": np.array(out)},
                    step=i + 1, keep_last=2)
        if stop_after is not None and i + 1 == stop_after:
            break
    assert all(isinstance(v, sk.ShardedArray) for v in params.values())
    return np.array(out), sum(v.local.nbytes for v in params.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meshes", default="", help="data x model meshes, e.g. 2x1,1x2 (default: every one that "
                                                      "fits the number of processes)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--checkpoint-dir", default=None, help="save the state after every step here")
    parser.add_argument("--stop-after", type=int, default=None, help="stop after this step (with --checkpoint-dir)")
    parser.add_argument("--resume", action="store_true", help="go on from the newest step of --checkpoint-dir")
    args = parser.parse_args()
    if (args.resume or args.stop_after is not None) and args.checkpoint_dir is None:
        parser.error("--resume and --stop-after need --checkpoint-dir")
    n = sk.size()
    print_on_process_0(f"Running on {n} process(es) ({'optax adam' if optax is not None else 'plain SGD'})")
    meshes = [tuple(int(v) for v in m.split("x")) for m in args.meshes.split(",")] if args.meshes else \
        [(d, n // d) for d in range(1, n + 1) if n % d == 0]
    ref = reference(args.steps)
    whole = 4 * (D_IN * HIDDEN + HIDDEN + HIDDEN * D_OUT + D_OUT)
    ok = True
    if args.checkpoint_dir is not None:
        meshes = meshes[:1]  # one training, checkpointed
    for data, model in meshes:
        losses, mine = train(data, model, args.steps, args.checkpoint_dir, args.stop_after, args.resume)
        print_on_process_0("trajectory: " + " ".join(float(v).hex() for v in losses))
        if len(losses) < args.steps:
            print_on_process_0(f"stopped after step {len(losses)} (resume with --resume)")
            return
        rel = float(np.max(np.abs(losses - ref) / np.abs(ref)))
        ok = ok and rel <= 1e-5
        print_on_process_0(f"mesh ({data}, {model}): loss {losses[0]:.6f} -> {losses[-1]:.6f}, max relative "
                           f"difference from one process {rel:.1e}; parameter bytes on rank 0: {mine} of {whole}")
    print_on_process_0(f"losses match single-process JAX to 1e-5: {ok}")


if __name__ == "__main__":
    main()
