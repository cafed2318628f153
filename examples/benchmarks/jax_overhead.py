"""Per-call cost of shardkit's collectives on JAX arrays against mpi4jax, in one run.

For each size (float64 elements), the time per call of
  - sk jit        shardkit.mpi.allreduce inside jax.jit (XLA FFI handler): `iters` calls in one compiled fori_loop
  - mpi4jax jit   mpi4jax.allreduce likewise (0.8+ returns no token)
  - sk eager      shardkit.mpi.allreduce(x, op=MPI.SUM) on a jax.Array
  - mpi4jax eager mpi4jax.allreduce(x, op=MPI.SUM) on a jax.Array
  - sk numpy      shardkit.mpi.allreduce on a NumPy array (the native path, for reference)
  - psum jit      sk.psum in a fori_loop inside jax.jit(sk.shard_map(...)) on the global array
alternating them over repeats, with the min and median over repeats and the ratios to mpi4jax. Results are checked
first (a fast wrong answer is no result). mpi4jax is optional (scripts/setup.sh installs it as the baseline).

    mpirun -np 2 python examples/benchmarks/jax_overhead.py [--sizes 8,4096] [--iters 500] [--repeats 5]
"""

import argparse
import json
import statistics
import sys
import time

import jax
import numpy as np
from mpi4py import MPI

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import shardkit as sk  # noqa: E402
from shardkit import P  # noqa: E402

try:
    import mpi4jax
except ImportError:  # the baseline is optional
    mpi4jax = None


def timed(fn, iters):
    """Seconds per call of fn() (its result waited for), the slowest rank's."""
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
    parser.add_argument("--iters", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None, help="write results to this file ('-': stdout)")
    args = parser.parse_args()
    size = MPI.COMM_WORLD.Get_size()
    mesh = sk.Mesh((size,), ("x",))
    it = args.iters
    # Inside jit: `iters` allreduces in one compiled loop (as mpi4jax's own benchmarks count), v -> sum(v) / size
    # keeps v == x on every rank, so the check holds for the loop as for one call.
    loop = lambda red: jax.jit(lambda x: jax.lax.fori_loop(0, it, lambda i, v: red(v) / size, x))  # noqa: E731
    sk_loop = loop(lambda v: sk.mpi.allreduce(v, op=MPI.SUM)[0])
    psum_loop = jax.jit(sk.shard_map(lambda b: jax.lax.fori_loop(0, it, lambda i, v: sk.psum(v, "x") / size, b),
                                     mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    # name: (call, allreduces per call, expected result)
    cases = {
        "sk jit": (lambda x, g, xn: sk_loop(x), it, lambda xn: xn),
        "sk eager": (lambda x, g, xn: sk.mpi.allreduce(x, op=MPI.SUM)[0], 1, lambda xn: size * xn),
        "sk numpy": (lambda x, g, xn: sk.mpi.allreduce(xn, op=MPI.SUM)[0], 1, lambda xn: size * xn),
        "psum jit": (lambda x, g, xn: psum_loop(g), it, lambda xn: np.tile(xn, size)),
    }
    if mpi4jax is not None:
        def m4j(x):  # mpi4jax 0.8+ returns the result alone (tokens were removed), earlier (result, token)
            r = mpi4jax.allreduce(x, op=MPI.SUM)
            return r[0] if isinstance(r, tuple) else r

        m4j_loop = loop(m4j)
        cases["mpi4jax jit"] = (lambda x, g, xn: m4j_loop(x), it, lambda xn: xn)
        cases["mpi4jax eager"] = (lambda x, g, xn: m4j(x), 1, lambda xn: size * xn)
    results = []
    for n in [int(s) for s in args.sizes.split(",")]:
        xn = np.arange(n, dtype=np.float64)
        x = jnp.asarray(xn)
        g = jnp.tile(x, size)  # the global array whose P("x") blocks are x
        for name, (fn, _, want) in cases.items():
            if not np.array_equal(np.asarray(fn(x, g, xn)), want(xn)):
                raise SystemExit(f"jax_overhead: {name} gives a wrong sum at {n} elements")
        samples = {k: [] for k in cases}
        for _ in range(args.repeats):
            for name, (fn, per_call, _) in cases.items():
                if per_call > 1:  # one compiled loop of `iters` allreduces
                    samples[name].append(timed(lambda: fn(x, g, xn), 1) / per_call)
                else:
                    calls = it if name != "mpi4jax eager" else max(it // 50, 3)  # 10-30 ms a call
                    samples[name].append(timed(lambda: fn(x, g, xn), calls))
        row = {"elements": n, "bytes": 8 * n, "ranks": size}
        for k, v in samples.items():
            row[f"{k}_us_min"] = 1e6 * min(v)
            row[f"{k}_us_median"] = 1e6 * statistics.median(v)
        results.append(row)

    if MPI.COMM_WORLD.Get_rank() == 0:
        print(f"# per-call time in microseconds, {size} ranks, {args.iters} calls x {args.repeats} repeats "
              f"(min / median over repeats)")
        names = list(cases)
        print(f"{'elements':>9} " + " ".join(f"{k:>19}" for k in names))
        for r in results:
            cells = [f"{r[k + '_us_min']:8.2f} / {r[k + '_us_median']:8.2f}" for k in names]
            print(f"{r['elements']:>9} " + " ".join(f"{c:>19}" for c in cells))
        if mpi4jax is not None:
            for r in results:
                print(f"{r['elements']:>9} elements: sk jit / mpi4jax jit = "
                      f"{r['sk jit_us_median'] / r['mpi4jax jit_us_median']:.2f} (median), "
                      f"{r['sk jit_us_min'] / r['mpi4jax jit_us_min']:.2f} (min); sk eager / mpi4jax eager = "
                      f"{r['sk eager_us_median'] / r['mpi4jax eager_us_median']:.3f}")
        if args.json:
            text = json.dumps({"benchmark": "jax_overhead", "results": results}, indent=2)
            if args.json == "-":
                print(text)
            else:
                with open(args.json, "w") as f:
                    f.write(text)


if __name__ == "__main__":
    sys.exit(main())
