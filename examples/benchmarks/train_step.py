"""Per-step time of one compiled training step in shardkit, in JAX's own multi-process runtime, and in one process.

The step is the Megatron-style MLP of examples/jax/train_mlp.py (examples/jax/mlp_model.py: W1 P(None, "model"),
W2 P("model", None), b1 P("model"), b2 replicated, batch P("data", None), mean squared error, SGD), on a
(data, model) mesh of every rank, run three ways:
  - shardkit  jax.jit(step) around sk.shard_map with sk.psum / sk.pmean, parameters ShardedArrays, donate_argnums=0,
              in the ranks of this mpirun job
  - jax       the same step with jax.shard_map and jax.lax.psum / pmean over the global mesh of JAX's own multi-process
              runtime (jax.distributed.initialize, gloo CPU collectives), one helper process per rank: jax.distributed
              must be set up before JAX computes anything and changes what jax.devices() means, so it stays out of
              the ranks measuring shardkit
  - single    the global step (no shard_map, no communication) jitted in one helper process that may use every core
              of the machine, which the parallel efficiency T1 / (ranks x Tn) compares against
Each rank (and its helper) computes on its share of the cores (cores / ranks, pinned), so the ranks do not take each
other's cores. Each runtime warms up (compilation and `--warmup` steps), then takes `--repeats` samples of `--steps`
donated steps each (the slowest rank's time per step); the table and the JSON give the min and median over samples.
The first losses of the three are checked against each other first (a fast wrong step is no result). After the timed
steps, the shardkit ranks run `--rss-steps` more and report the growth of their resident memory (the largest rank's,
KiB; donation that leaked a buffer per step would show here). Where JAX's runtime cannot run, the output says why
instead of giving a number. The three run one after another (one process, shardkit, JAX), not alternating: each is
its own set of processes, so timings on a shared machine vary between them as much as between runs.

    mpirun -np 2 python examples/benchmarks/train_step.py [--models small,large] [--mesh 1x2] [--json -]
    mpirun -np 2 python examples/benchmarks/train_step.py --models 8x16x4x8 --steps 3   # d_in x hidden x d_out x batch
"""

import argparse
import functools
import json
import os
import statistics
import sys
import time

from bench_helpers import coordinator_address, run_helpers, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "jax"))  # mlp_model.py, shared with examples/jax/train_mlp.py

# name: (d_in, hidden, d_out, batch). small: a few KiB per layer, the step is overhead; large: the one-process step
# takes about 75 ms on an idle 2-core machine (issue 20 asks for at least 20), and the model axis moves only the
# (batch, d_out) output.
MODELS = {"small": (16, 32, 8, 32), "large": (512, 4096, 64, 1024)}
JAX_CHILD, SINGLE_CHILD = "--jax-child", "--single-child"


def parse_model(name):
    """(name, (d_in, hidden, d_out, batch)) for a name of MODELS or a spec 'DxHxOxB'."""
    if name in MODELS:
        return name, MODELS[name]
    dims = tuple(int(v) for v in name.split("x"))
    if len(dims) != 4:
        raise SystemExit(f"train_step: a model is one of {sorted(MODELS)} or d_in x hidden x d_out x batch, not {name}")
    return name, dims


def check_first_loss(runtime, model, loss, ref):
    if abs(loss - ref) > 1e-4 * abs(ref):
        raise SystemExit(f"train_step: {model}: the first loss in {runtime} is {loss}, in one process {ref}")


def pin_to_share(index, count):
    """Keep this process to its share of the cores (index of count), so count processes do not compete for them."""
    cpus = sorted(os.sched_getaffinity(0) if count > 1 else range(os.cpu_count() or 1))
    per = max(len(cpus) // count, 1)
    os.sched_setaffinity(0, cpus[(index * per) % len(cpus):][:per])


def resident_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def time_steps(step, state, steps, repeats, warmup, sync):
    """Seconds per step, one sample per repeat, after `warmup` untimed steps; state = step(*state)[1:] each step."""
    for _ in range(warmup):
        out = step(*state)
        state = out[1:]
    import jax

    jax.block_until_ready(out)
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            out = step(*state)
            state = out[1:]
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t0) / steps)
    return samples, state


def single_child(models, steps, repeats, warmup):
    """The global step in one process (every core): prints {model: {"loss0", "samples"}}."""
    import jax

    from mlp_model import global_loss, problem, sgd

    @functools.partial(jax.jit, donate_argnums=0)
    def step(p, x, t):
        value, grads = jax.value_and_grad(global_loss)(p, x, t)
        return value, sgd(p, grads), x, t

    out = {}
    for name in models:
        value, *state = step(*jax.tree.map(jax.numpy.array, problem(*parse_model(name)[1])))
        samples, _ = time_steps(step, tuple(state), steps, repeats, warmup, lambda: None)
        out[name] = {"loss0": float(value), "samples": samples}
    print(json.dumps(out))


def jax_child(address, rank, size, data, models, steps, repeats, warmup):
    """One process of JAX's own multi-process runtime (no MPI here): prints {model: {"loss0", "samples"}}."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=address, num_processes=size, process_id=rank)
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as JP

    from mlp_model import block_loss, problem, sgd, specs

    mesh = jax.make_mesh((data, size // data), ("data", "model"), devices=jax.devices())
    spec = specs(JP)
    loss = jax.shard_map(functools.partial(block_loss, psum=jax.lax.psum, pmean=jax.lax.pmean), mesh=mesh,
                         in_specs=(spec, JP("data"), JP("data")), out_specs=JP())

    @functools.partial(jax.jit, donate_argnums=0)
    def step(p, x, t):
        value, grads = jax.value_and_grad(loss)(p, x, t)
        return value, sgd(p, grads), x, t

    def place(a, s):  # every process holds the whole array (a fixed seed); each device takes its block
        return jax.make_array_from_callback(a.shape, NamedSharding(mesh, s), lambda idx: a[idx])

    out = {}
    for name in models:
        params, x, t = problem(*parse_model(name)[1])
        state = ({k: place(v, spec[k]) for k, v in params.items()}, place(x, JP("data")), place(t, JP("data")))
        value, *state = step(*state)
        samples, _ = time_steps(step, tuple(state), steps, repeats, warmup,
                                lambda: multihost_utils.sync_global_devices("sample"))
        out[name] = {"loss0": float(value), "samples": samples}
    print(json.dumps(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="small,large", help=f"names ({', '.join(MODELS)}) or DxHxOxB specs")
    parser.add_argument("--mesh", default="", help="data x model mesh, e.g. 2x1 (default: 1 x ranks, model-parallel)")
    parser.add_argument("--steps", type=int, default=20, help="steps per sample")
    parser.add_argument("--repeats", type=int, default=5, help="samples per runtime")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps after compilation")
    parser.add_argument("--rss-steps", type=int, default=200, help="steps over which resident memory growth is read")
    parser.add_argument("--no-jax", action="store_true", help="skip JAX's own multi-process runtime")
    parser.add_argument("--json", default=None, help="write results to this file ('-': stdout)")
    args = parser.parse_args()
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)), int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", 1))
    pin_to_share(*local)  # before JAX sizes its thread pool

    import jax
    import numpy as np
    from mpi4py import MPI

    import shardkit as sk
    from mlp_model import block_loss, problem, sgd, specs
    from shardkit import P

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    data, model = (int(v) for v in args.mesh.split("x")) if args.mesh else (1, size)
    if data * model != size:
        raise SystemExit(f"train_step: a {data}x{model} mesh does not fit {size} ranks")
    models = [parse_model(m) for m in args.models.split(",")]
    names = [m for m, _ in models]
    common = [",".join(names), str(args.steps), str(args.repeats), str(args.warmup)]

    # One process, every core (rank 0's helper; the others wait without spinning).
    single, single_why = run_helpers(comm, __file__, lambda r: [SINGLE_CHILD] + common if r == 0 else None)
    single = comm.bcast(single, root=0)
    if single is None:
        raise SystemExit(f"train_step: the one-process step did not run: {single_why}")

    mesh = sk.Mesh(np.arange(size).reshape(data, model), ("data", "model"))
    spec = specs(P)
    loss = sk.shard_map(functools.partial(block_loss, psum=sk.psum, pmean=sk.pmean), mesh=mesh,
                        in_specs=(spec, P("data"), P("data")), out_specs=P())

    @functools.partial(jax.jit, donate_argnums=0)
    def step(p, x, t):
        value, grads = jax.value_and_grad(lambda q: loss(q, x, t).local)(p)
        return value, sgd(p, grads), x, t

    results = []
    for name, dims in models:
        params, x, t = problem(*dims)
        params = {k: sk.distribute(v, sk.NamedSharding(mesh, spec[k])) for k, v in params.items()}
        x, t = (sk.distribute(a, sk.NamedSharding(mesh, P("data"))) for a in (x, t))
        params = jax.tree.map(jax.numpy.array, params)  # JAX-owned blocks, which the step can donate
        value, *state = step(params, x, t)
        check_first_loss("shardkit", name, float(value), single[name]["loss0"])
        samples, state = time_steps(step, tuple(state), args.steps, args.repeats, args.warmup, sk.mpi.barrier)
        rss = resident_kib()
        for _ in range(args.rss_steps):
            value, *state = step(*state)
        jax.block_until_ready(value)
        d_in, hidden, d_out, batch = dims
        results.append({"ranks": size, "model": name, "mesh": [data, model], "d_in": d_in, "hidden": hidden,
                        "d_out": d_out, "batch": batch,
                        "param_bytes": 4 * (d_in * hidden + hidden + hidden * d_out + d_out),
                        "shardkit_s": [comm.allreduce(s, op=MPI.MAX) for s in samples],
                        "single_s": single[name]["samples"], "rss_steps": args.rss_steps,
                        "rss_growth_kib": comm.allreduce(resident_kib() - rss, op=MPI.MAX)})
    del state

    jax_why = "skipped (--no-jax)"
    if not args.no_jax:
        address = coordinator_address(comm)
        got, jax_why = run_helpers(comm, __file__, lambda r: [JAX_CHILD, address, str(r), str(size), str(data)]
                                   + common)
        for row in results if got is not None else []:
            mine = got[row["model"]]
            check_first_loss("JAX's runtime", row["model"], mine["loss0"], single[row["model"]]["loss0"])
            row["jax_s"] = [comm.allreduce(s, op=MPI.MAX) for s in mine["samples"]]

    for row in results:
        for k in ("shardkit", "jax", "single"):
            v = row.pop(f"{k}_s", None)
            if v is not None:
                row[f"{k}_ms_min"], row[f"{k}_ms_median"] = 1e3 * min(v), 1e3 * statistics.median(v)
        row["efficiency_median"] = row["single_ms_median"] / (size * row["shardkit_ms_median"])
        if "jax_ms_median" in row:
            row["shardkit_over_jax_median"] = row["shardkit_ms_median"] / row["jax_ms_median"]

    if rank == 0:
        print(f"# ms per training step, {size} ranks (mesh {data}x{model}), {args.steps} steps x {args.repeats} "
              f"samples (min / median); efficiency = single / (ranks x shardkit), medians")
        print(f"{'model':>12} {'params':>10} {'shardkit':>17} {'jax':>17} {'single':>17} {'sk/jax':>7} {'eff':>5} "
              f"{'rss KiB':>8}")
        for r in results:
            def cell(k):
                return f"{r[k + '_ms_min']:7.3f} / {r[k + '_ms_median']:7.3f}" if k + "_ms_min" in r else "-"
            ratio = f"{r['shardkit_over_jax_median']:.3f}" if "shardkit_over_jax_median" in r else "-"
            print(f"{r['model']:>12} {r['param_bytes']:>10} {cell('shardkit'):>17} {cell('jax'):>17} "
                  f"{cell('single'):>17} {ratio:>7} {r['efficiency_median']:5.2f} {r['rss_growth_kib']:>8}")
        if jax_why:
            print(f"# jax: no result: {jax_why}")
        write_json(args.json, "train_step", results, jax="measured" if not jax_why else jax_why)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in (JAX_CHILD, SINGLE_CHILD):
        a = sys.argv[2:]
        if sys.argv[1] == SINGLE_CHILD:
            pin_to_share(0, 1)  # every core, whatever the launcher bound the rank to
            sys.exit(single_child(a[0].split(","), int(a[1]), int(a[2]), int(a[3])))
        sys.exit(jax_child(a[0], int(a[1]), int(a[2]), int(a[3]), a[4].split(","), int(a[5]), int(a[6]), int(a[7])))
    sys.exit(main())
