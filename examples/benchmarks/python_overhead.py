"""Per-call cost of shardkit's Python collectives against mpi4py, on small NumPy arrays, in one run.

Measures, for each size, the time per call of
  - mpi4py      comm.Allreduce(x, out, op=MPI.SUM)          (buffer interface, output preallocated)
  - mpi4py+new  comm.Allreduce(x, np.empty_like(x), ...)     (a new output each call, as the mpi4jax API returns)
  - shardkit    shardkit.mpi.allreduce(x, op=MPI.SUM)        (mpi4jax API: a new output each call)
  - psum        shardkit.psum(x, "x") inside one shard_map body
in the same process, alternating them over repeats so machine noise hits all alike, and prints the min and median
over repeats and the ratios to mpi4py. The goal is shardkit no slower than mpi4py.

    mpirun -np 2 python examples/benchmarks/python_overhead.py [--sizes 1,8,64,512] [--iters 2000] [--repeats 7]
"""

import argparse
import statistics
import sys
import time

import numpy as np
from bench_helpers import write_json
from mpi4py import MPI

import shardkit as sk
from shardkit import P


def timed(fn, iters):
    """Seconds per call of fn(), the slowest rank's (as MPI benchmarks report)."""
    sk.mpi.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = (time.perf_counter() - t0) / iters
    return MPI.COMM_WORLD.allreduce(dt, op=MPI.MAX)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8,64,512", help="element counts (float64)")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default=None, help="write results to this file ('-': stdout)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD.Dup()  # mpi4py's traffic on its own communicator, as a user would
    size = comm.Get_size()
    mesh = sk.Mesh((size,), ("x",))
    results = []
    for n in [int(s) for s in args.sizes.split(",")]:
        x = np.arange(n, dtype=np.float64)
        out = np.empty_like(x)
        held = sk.distribute(np.tile(x, size), sk.NamedSharding(mesh, P("x")))
        # The three compute the same sum (checked once per size: a fast wrong answer is no result).
        comm.Allreduce(x, out, op=MPI.SUM)
        mine, _ = sk.mpi.allreduce(x, op=MPI.SUM)
        psummed = sk.shard_map(lambda b: sk.psum(b, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())(held)
        if not (np.array_equal(mine, out) and np.array_equal(sk.process_allgather(psummed), out)
                and np.array_equal(out, size * x)):
            raise SystemExit(f"python_overhead: results differ at {n} elements")
        samples: dict[str, list[float]] = {"mpi4py": [], "mpi4py+new": [], "shardkit.mpi": [], "psum": []}

        def run_mpi4py():
            return timed(lambda: comm.Allreduce(x, out, op=MPI.SUM), args.iters)

        def run_mpi4py_new():
            return timed(lambda: comm.Allreduce(x, np.empty_like(x), op=MPI.SUM), args.iters)

        def run_shardkit():
            return timed(lambda: sk.mpi.allreduce(x, op=MPI.SUM), args.iters)

        def run_psum():
            # One shard_map call; inside, `iters` psums on the block (the per-psum time is what is reported).
            measured = []

            def body(b):
                measured.append(timed(lambda: sk.psum(b, "x"), args.iters))
                return b

            sk.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_rep=False)(held)
            return measured[0]

        for fn in (run_mpi4py, run_mpi4py_new, run_shardkit, run_psum):  # warm-up
            fn()
        for _ in range(args.repeats):
            samples["mpi4py"].append(run_mpi4py())
            samples["mpi4py+new"].append(run_mpi4py_new())
            samples["shardkit.mpi"].append(run_shardkit())
            samples["psum"].append(run_psum())
        row: dict[str, float] = {"elements": n, "bytes": 8 * n, "ranks": size}
        for k, v in samples.items():
            row[f"{k}_us_min"] = 1e6 * min(v)
            row[f"{k}_us_median"] = 1e6 * statistics.median(v)
        row["shardkit_vs_mpi4py_median"] = row["shardkit.mpi_us_median"] / row["mpi4py_us_median"]
        row["psum_vs_mpi4py_median"] = row["psum_us_median"] / row["mpi4py_us_median"]
        row["shardkit_vs_mpi4py_min"] = row["shardkit.mpi_us_min"] / row["mpi4py_us_min"]
        row["psum_vs_mpi4py_min"] = row["psum_us_min"] / row["mpi4py_us_min"]
        row["shardkit_vs_mpi4py_new_median"] = row["shardkit.mpi_us_median"] / row["mpi4py+new_us_median"]
        results.append(row)

    if comm.Get_rank() == 0:
        print(f"# per-call time in microseconds, {size} ranks, {args.iters} calls x {args.repeats} repeats "
              f"(min / median over repeats)")
        print(f"{'elements':>9} {'mpi4py':>17} {'mpi4py+new':>17} {'shardkit.mpi':>17} {'psum':>17} "
              f"{'sk/mpi4py':>10} {'psum/mpi4py':>12} {'sk/mpi4py+new':>14}")
        for r in results:
            def cell(k):
                return f"{r[k + '_us_min']:7.3f} / {r[k + '_us_median']:7.3f}"
            print(f"{r['elements']:>9} {cell('mpi4py'):>17} {cell('mpi4py+new'):>17} {cell('shardkit.mpi'):>17} "
                  f"{cell('psum'):>17} {r['shardkit_vs_mpi4py_median']:>10.2f} {r['psum_vs_mpi4py_median']:>12.2f} "
                  f"{r['shardkit_vs_mpi4py_new_median']:>14.2f}")
        write_json(args.json, "python_overhead", results)
    comm.Free()


if __name__ == "__main__":
    sys.exit(main())
