"""Per-call cost of shardkit's collectives on JAX arrays against mpi4jax, in one run.

For each size (float64 elements), the time per call of
  - sk jit        shardkit.mpi.allreduce inside jax.jit (XLA FFI handler): `loop` calls in one compiled fori_loop
  - mpi4jax jit   mpi4jax.allreduce likewise (0.8+ returns no token)
  - sk jit call   one jax.jit call of a program with one shardkit.mpi.allreduce: what a compiled step pays to start,
                  JAX's dispatch included (a program with an ordered effect, as every collective's is, takes JAX's
                  Python dispatch path and a runtime token per call)
  - mpi4jax jit call  likewise
  - sk eager      shardkit.mpi.allreduce(x, op=MPI.SUM) on a jax.Array
  - mpi4jax eager mpi4jax.allreduce(x, op=MPI.SUM) on a jax.Array
  - sk numpy      shardkit.mpi.allreduce on a NumPy array (the native path, for reference)
  - psum jit      sk.psum in a fori_loop inside jax.jit(sk.shard_map(...)) on the global array
  - jax gloo psum JAX's own multi-process psum likewise (jax.shard_map over every process's CPU device, with
                  jax.distributed and the gloo CPU collectives), but `iters` in one loop (each psum takes tens of
                  microseconds: the call's dispatch is a small part of that loop), run by one helper process per rank:
                  jax.distributed must be set up before JAX computes anything, and it changes what jax.devices()
                  means, so it stays out of the processes measuring shardkit (which use MPI, not jax.distributed)
alternating them over repeats (each repeat starting at the next case, and each sample after untimed warm-up calls of
its own case), with the min and median over repeats and the ratios to mpi4jax. Results are checked first (a fast
wrong answer is no result). mpi4jax is optional (scripts/setup.sh installs it as the baseline); where JAX's gloo
baseline cannot run, the table says why instead of giving a number.

    mpirun -np 2 python examples/benchmarks/jax_overhead.py [--sizes 8,4096] [--iters 500] [--loop 20000] [--repeats 5]
        [--no-gloo]
"""

import argparse
import json
import statistics
import sys
import time

import jax
import numpy as np
from bench_helpers import coordinator_address, run_helpers, write_json

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

GLOO_CHILD = "--jax-gloo-child"


def gloo_child(address, rank, size, sizes, iters, repeats):
    """One process of JAX's own multi-process psum (no MPI here): prints {elements: [seconds per psum, ...]}."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=address, num_processes=size, process_id=rank)
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as JP

    mesh = jax.make_mesh((size,), ("x",), devices=jax.devices())
    # As the shardkit loop: v -> psum(v) / size keeps v == x. check_vma=False: psum's replicated result is carried in
    # the loop as the varying block it equals.
    loop = jax.jit(jax.shard_map(lambda b: jax.lax.fori_loop(0, iters, lambda i, v: jax.lax.psum(v, "x") / size, b),
                                 mesh=mesh, in_specs=JP("x"), out_specs=JP("x"), check_vma=False))
    out = {}
    for n in sizes:
        xn = np.arange(n, dtype=np.float64)
        g = jax.make_array_from_process_local_data(NamedSharding(mesh, JP("x")), xn)
        got = np.asarray(loop(g).addressable_data(0))
        if not np.array_equal(got, xn):
            raise SystemExit(f"JAX's gloo psum gives a wrong sum at {n} elements")
        samples = []
        for _ in range(repeats):
            jax.block_until_ready(loop(g))  # both processes enter the timed loop together
            t0 = time.perf_counter()
            jax.block_until_ready(loop(g))
            samples.append((time.perf_counter() - t0) / iters)
        out[n] = samples
    print(json.dumps(out))


def run_gloo_baseline(comm, sizes, iters, repeats):
    """JAX's gloo psum measured by one helper process per rank: ({elements: [seconds, ...]}, None) or (None, why)."""
    size = comm.Get_size()
    address = coordinator_address(comm)
    got, why = run_helpers(comm, __file__, lambda rank: [GLOO_CHILD, address, str(rank), str(size),
                                                         ",".join(map(str, sizes)), str(iters), str(repeats)], 300)
    if got is None:
        return None, why
    samples = {int(k): v for k, v in got.items()}
    # The slowest rank's time, per sample.
    from mpi4py import MPI

    return {n: [comm.allreduce(t, op=MPI.MAX) for t in v] for n, v in samples.items()}, None


def timed(fn, iters, warm):
    """Seconds per call of fn() (its result waited for), the slowest rank's, after `warm` untimed calls."""
    from mpi4py import MPI

    import shardkit as sk

    for _ in range(warm):  # the caches and branch predictors as this case leaves them, not as the previous case did
        jax.block_until_ready(fn())
    sk.mpi.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        r = fn()
    jax.block_until_ready(r)
    dt = (time.perf_counter() - t0) / iters
    return MPI.COMM_WORLD.allreduce(dt, op=MPI.MAX)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,4096")
    parser.add_argument("--iters", type=int, default=500, help="calls per sample of the per-call cases")
    parser.add_argument("--loop", type=int, default=20000,
                        help="allreduces in one compiled loop (sk jit, mpi4jax jit, psum jit): enough that the jit "
                             "call's own dispatch (sk jit call) is a small part of each")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-gloo", action="store_true", help="skip JAX's own multi-process psum (gloo)")
    parser.add_argument("--json", default=None, help="write results to this file ('-': stdout)")
    args = parser.parse_args()
    from mpi4py import MPI

    import shardkit as sk
    from shardkit import P

    try:
        import mpi4jax
    except ImportError:  # the baseline is optional
        mpi4jax = None
    size = MPI.COMM_WORLD.Get_size()
    mesh = sk.Mesh((size,), ("x",))
    it = args.loop
    # Inside jit: `loop` allreduces in one compiled loop (as mpi4jax's own benchmarks count), v -> sum(v) / size
    # keeps v == x on every rank, so the check holds for the loop as for one call.
    loop = lambda red: jax.jit(lambda x: jax.lax.fori_loop(0, it, lambda i, v: red(v) / size, x))  # noqa: E731
    sk_red = lambda v: sk.mpi.allreduce(v, op=MPI.SUM)[0]  # noqa: E731
    sk_loop, sk_once = loop(sk_red), jax.jit(sk_red)
    # (The result is gathered into the global array in the same program, as JAX's global output is addressable.)
    # check_vma=False, as JAX's own loop in gloo_child: psum's unvarying result is carried as the varying block.
    psum_loop = jax.jit(lambda g: sk.process_allgather(sk.shard_map(
        lambda b: jax.lax.fori_loop(0, it, lambda i, v: sk.psum(v, "x") / size, b), mesh=mesh, in_specs=P("x"),
        out_specs=P("x"), check_vma=False)(g)))
    # name: (call, allreduces per call, expected result)
    cases = {
        "sk jit": (lambda x, g, xn: sk_loop(x), it, lambda xn: xn),
        "sk jit call": (lambda x, g, xn: sk_once(x), 1, lambda xn: size * xn),
        "sk eager": (lambda x, g, xn: sk.mpi.allreduce(x, op=MPI.SUM)[0], 1, lambda xn: size * xn),
        "sk numpy": (lambda x, g, xn: sk.mpi.allreduce(xn, op=MPI.SUM)[0], 1, lambda xn: size * xn),
        "psum jit": (lambda x, g, xn: psum_loop(g), it, lambda xn: np.tile(xn, size)),
    }
    if mpi4jax is not None:
        def m4j(x):  # mpi4jax 0.8+ returns the result alone (tokens were removed), earlier (result, token)
            r = mpi4jax.allreduce(x, op=MPI.SUM)
            return r[0] if isinstance(r, tuple) else r

        m4j_loop, m4j_once = loop(m4j), jax.jit(m4j)
        cases["mpi4jax jit"] = (lambda x, g, xn: m4j_loop(x), it, lambda xn: xn)
        cases["mpi4jax jit call"] = (lambda x, g, xn: m4j_once(x), 1, lambda xn: size * xn)
        cases["mpi4jax eager"] = (lambda x, g, xn: m4j(x), 1, lambda xn: size * xn)
    results = []
    for n in [int(s) for s in args.sizes.split(",")]:
        xn = np.arange(n, dtype=np.float64)
        x = jnp.asarray(xn)
        g = jnp.tile(x, size)  # the global array whose P("x") blocks are x
        for name, (fn, _, want) in cases.items():
            if not np.array_equal(np.asarray(fn(x, g, xn)), want(xn)):
                raise SystemExit(f"jax_overhead: {name} gives a wrong sum at {n} elements")
        samples: dict[str, list[float]] = {k: [] for k in cases}
        order = list(cases)
        for rep in range(args.repeats):
            # Each repeat starts at another case: the case measured right after mpi4jax's eager calls (milliseconds
            # of other work) runs on cold caches, and a fixed order would hand that cost to the same case every time.
            for name in order[rep % len(order):] + order[:rep % len(order)]:
                fn, per_call, _ = cases[name]
                if per_call > 1:  # one compiled loop of `iters` allreduces
                    samples[name].append(timed(lambda: fn(x, g, xn), 1, 1) / per_call)
                else:
                    slow = name == "mpi4jax eager"  # 10-30 ms a call
                    calls = max(args.iters // 50, 3) if slow else args.iters
                    samples[name].append(timed(lambda: fn(x, g, xn), calls, 1 if slow else max(calls // 10, 1)))
        row: dict[str, float] = {"elements": n, "bytes": 8 * n, "ranks": size}
        for k, v in samples.items():
            row[f"{k}_us_min"] = 1e6 * min(v)
            row[f"{k}_us_median"] = 1e6 * statistics.median(v)
        results.append(row)
    gloo, gloo_why = (None, "skipped (--no-gloo)") if args.no_gloo else run_gloo_baseline(
        MPI.COMM_WORLD, [r["elements"] for r in results], args.iters, args.repeats)
    names = list(cases)
    if gloo is not None:
        names.append("jax gloo psum")
        for r in results:
            v = gloo[r["elements"]]
            r["jax gloo psum_us_min"] = 1e6 * min(v)
            r["jax gloo psum_us_median"] = 1e6 * statistics.median(v)

    if MPI.COMM_WORLD.Get_rank() == 0:
        print(f"# per-call time in microseconds, {size} ranks, {args.repeats} repeats of {args.loop} calls in one "
              f"compiled loop (jit) or {args.iters} calls (the others); min / median over repeats")
        print(f"{'elements':>9} " + " ".join(f"{k:>19}" for k in names))
        for r in results:
            cells = [f"{r[k + '_us_min']:8.2f} / {r[k + '_us_median']:8.2f}" for k in names]
            print(f"{r['elements']:>9} " + " ".join(f"{c:>19}" for c in cells))
        if mpi4jax is not None:
            for r in results:
                print(f"{r['elements']:>9} elements: sk jit / mpi4jax jit = "
                      f"{r['sk jit_us_median'] / r['mpi4jax jit_us_median']:.2f} (median), "
                      f"{r['sk jit_us_min'] / r['mpi4jax jit_us_min']:.2f} (min); sk jit call / mpi4jax jit call = "
                      f"{r['sk jit call_us_median'] / r['mpi4jax jit call_us_median']:.2f} (median); "
                      f"sk eager / mpi4jax eager = "
                      f"{r['sk eager_us_median'] / r['mpi4jax eager_us_median']:.3f}")
        for r in results:
            print(f"{r['elements']:>9} elements: sk eager - sk numpy = "
                  f"{r['sk eager_us_min'] - r['sk numpy_us_min']:.2f} us (min), "
                  f"{r['sk eager_us_median'] - r['sk numpy_us_median']:.2f} us (median)")
            if gloo is not None:
                print(f"{r['elements']:>9} elements: psum jit / jax gloo psum = "
                      f"{r['psum jit_us_median'] / r['jax gloo psum_us_median']:.3f} (median), "
                      f"{r['psum jit_us_min'] / r['jax gloo psum_us_min']:.3f} (min)")
        if gloo is None:
            print(f"# jax gloo psum: no result: {gloo_why}")
        write_json(args.json, "jax_overhead", results, jax_gloo_psum="measured" if gloo is not None else gloo_why)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == GLOO_CHILD:
        a = sys.argv[2:]
        sys.exit(gloo_child(a[0], int(a[1]), int(a[2]), [int(n) for n in a[3].split(",")], int(a[4]), int(a[5])))
    sys.exit(main())
