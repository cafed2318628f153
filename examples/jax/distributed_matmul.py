"""Distributed matrix multiplication under jax.jit: the seed's JAX + Warp program with shardkit in place of
jax.distributed.

A (M, K) is row-sharded P('x', None) across the MPI processes, B (K, N) replicated; inside the jitted sk.shard_map each
process multiplies its block of rows with the seed's Warp kernel (warp.jax_kernel, launch_dims = the block's (rows, N));
the result comes back P('x', None), assembled on every process.

    mpirun -np 4 python examples/jax/distributed_matmul.py
"""

import jax
import jax.numpy as jnp
import numpy as np
import warp as wp
from warp import jax_kernel

import shardkit as sk
from shardkit import P

wp.config.log_level = getattr(wp, "LOG_WARNING", 30)  # no start-up banner


def print_on_process_0(*args, **kwargs):
    if sk.rank() == 0:
        print(*args, **kwargs)


@wp.kernel
def matmul_kernel(a: wp.array2d(dtype=float), b: wp.array2d(dtype=float), c: wp.array2d(dtype=float)):
    # a: (M / num_procs, K), b: (K, N), c: (M / num_procs, N)
    i, j = wp.tid()
    M = a.shape[0]
    K = a.shape[1]
    N = b.shape[1]
    if i < M and j < N:
        s = wp.float32(0.0)
        for k in range(K):
            s += a[i, k] * b[k, j]
        c[i, j] = s


jax_matmul = jax_kernel(matmul_kernel)


def main():
    num_procs = sk.size()
    print_on_process_0(f"Running on {num_procs} process(es)")
    M, K, N = 4 * num_procs, 3, 5  # M divisible by the number of processes
    mesh = sk.Mesh(np.arange(num_procs), "x")

    def local_matmul(a_block, b_full):
        block_size_m, block_size_n = a_block.shape[0], b_full.shape[1]
        return jax_matmul(a_block, b_full, launch_dims=(block_size_m, block_size_n))[0]

    @jax.jit
    def distributed_matmul(a, b):
        # The shard_map gives each process its block of C (a ShardedArray); process_allgather, compiled into the same
        # program, assembles the global C on every process for the check below.
        c = sk.shard_map(local_matmul, mesh=mesh, in_specs=(P("x", None), P(None, None)), out_specs=P("x", None),
                         check_rep=False)(a, b)
        return sk.process_allgather(c)

    print_on_process_0("Test distributed matrix multiplication using JAX + Warp (shardkit, jax.jit)")
    a = jnp.arange(M * K, dtype=jnp.float32).reshape(M, K)
    b = jnp.arange(K * N, dtype=jnp.float32).reshape(K, N)
    result = np.asarray(distributed_matmul(a, b))
    print_on_process_0(f"Warp Output:\n{result}")
    reference = np.matmul(np.asarray(a), np.asarray(b))  # one process, NumPy
    print_on_process_0(f"Expected shape: {(M, N)}, output shape: {result.shape}")
    print_on_process_0(f"Allclose: {np.allclose(result, reference)}")


if __name__ == "__main__":
    main()
