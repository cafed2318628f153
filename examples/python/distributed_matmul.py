"""Distributed matrix multiplication: the second shard_map program of NVIDIA Warp's interoperability guide.

A (M, K) is sharded by rows over every rank, B (K, N) is replicated; inside shard_map each rank multiplies its rows
of A by B with a Warp kernel (or NumPy with --numpy, or shardkit's BLAS-backed matmul with --sk-matmul); the
gathered result is compared with a one-process NumPy reference. With --checkpoint DIR, A, B and the product are saved
as a checkpoint step and loaded back cut another way (the product by columns), as a job on another mesh would.

    mpirun -np 4 python examples/python/distributed_matmul.py [--numpy | --sk-matmul] [--m M --k K --n N]
        [--checkpoint DIR]
"""

import argparse

import numpy as np

import shardkit as sk
from shardkit import P


def print_on_process_0(*args, **kwargs):
    if sk.rank() == 0:
        print(*args, **kwargs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--numpy", action="store_true", help="local products with NumPy instead of Warp")
    mode.add_argument("--sk-matmul", action="store_true", help="use shardkit.matmul on the ShardedArrays")
    parser.add_argument("--m", type=int, default=None, help="rows of A (default 8 per process)")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--n", type=int, default=6)
    parser.add_argument("--checkpoint", default=None, help="save A, B and the product here and load them back")
    args = parser.parse_args()
    num_procs = sk.size()
    print_on_process_0(f"Running on {num_procs} process(es) (local shards on {sk.device()})")

    M = args.m if args.m is not None else 8 * num_procs  # scale M with the number of processes
    K, N = args.k, args.n
    use_warp = not args.numpy and not args.sk_matmul
    label = "Warp" if use_warp else ("NumPy" if args.numpy else "shardkit.matmul")
    print_on_process_0(f"Test distributed matrix multiplication using shardkit + {label}")

    a = np.arange(M * K, dtype=np.float32).reshape(M, K)  # Shape: (M, K)
    b = np.arange(K * N, dtype=np.float32).reshape(K, N)  # Shape: (K, N)

    mesh = sk.Mesh(np.arange(num_procs), "x")
    sharding_spec_a = sk.NamedSharding(mesh, P("x", None))
    sharding_spec_b = sk.NamedSharding(mesh, P(None, None))

    if use_warp:
        import warp as wp

        wp.config.log_level = getattr(wp, "LOG_WARNING", 30)  # no start-up banner
        device = "cpu" if sk.device() == "cpu" else sk.device()

        @wp.kernel
        def matmul_kernel(a: wp.array2d(dtype=wp.float32), b: wp.array2d(dtype=wp.float32),
                          c: wp.array2d(dtype=wp.float32)):
            # a: (M/num_procs, K), b: (K, N), c: (M/num_procs, N)
            i, j = wp.tid()
            s = wp.float32(0.0)
            for k in range(a.shape[1]):
                s += a[i, k] * b[k, j]
            c[i, j] = s

        def local_matmul(a_shard, b_full):
            c = wp.empty((a_shard.shape[0], b_full.shape[1]), dtype=wp.float32, device=device)
            wp.launch(matmul_kernel, dim=(a_shard.shape[0], b_full.shape[1]), inputs=[a_shard, b_full], outputs=[c],
                      device=device)
            return c

        a_in, b_in = wp.array(a, device="cpu"), wp.array(b, device="cpu")
    else:
        def local_matmul(a_shard, b_full):
            return a_shard @ b_full

        a_in, b_in = a, b

    sharded_a = sk.distribute(a_in, sharding_spec_a)  # (M/num_procs, K) per process
    replicated_b = sk.distribute(b_in, sharding_spec_b)  # (K, N) on every process

    def host(x):
        x = sk.process_allgather(x)
        return x.numpy() if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else np.asarray(x)

    print_on_process_0(f"Input matrix A:\n{host(sharded_a)}")
    print_on_process_0(f"Input matrix B:\n{host(replicated_b)}")

    if args.sk_matmul:
        result = sk.matmul(sharded_a, replicated_b)
    else:
        result = sk.shard_map(local_matmul, mesh=mesh, in_specs=(P("x", None), P(None, None)),
                              out_specs=P("x", None), check_rep=False)(sharded_a, replicated_b)
    print_on_process_0(f"{label} Output:")
    output = host(result)
    print_on_process_0(output)

    reference = np.matmul(a, b)  # one process, NumPy
    print_on_process_0("NumPy Output:")
    print_on_process_0(reference)
    print_on_process_0(f"Expected shape: {(M, N)}")
    print_on_process_0(f"{label} output shape: {tuple(result.local.shape)} on each process")
    print_on_process_0(f"NumPy output shape: {reference.shape}")
    allclose = np.allclose(output, reference, atol=1e-5)
    if args.checkpoint is not None:
        saved = sk.save(args.checkpoint, {"a": sharded_a, "b": replicated_b, "c": result})
        back = sk.load(args.checkpoint, mesh, {"a": P("x", None), "b": P(), "c": P(None, "x")}, step=saved.step,
                       uneven=True)  # columns need not divide by the ranks
        same = all(np.array_equal(host(back[k]), host(v))
                   for k, v in (("a", sharded_a), ("b", replicated_b), ("c", result)))
        print_on_process_0(f"Checkpoint step {saved.step} saved and loaded back (C cut by columns): "
                           f"{'bit-equal' if same else 'DIFFERENT'}")
        allclose = allclose and same
    print_on_process_0(f"Allclose: {allclose}")


if __name__ == "__main__":
    main()
