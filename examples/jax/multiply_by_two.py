"""Distributed multiply-by-two under jax.jit: the seed's JAX + Warp shard_map program with shardkit in place of
jax.distributed.

The Warp kernel becomes a JAX primitive through warp.jax_kernel (Warp runs it on XLA:CPU, or the
rank's GPU); sk.shard_map cuts the global array P('x') across the MPI processes inside the jitted function, and
sk.process_allgather brings the result back as the global array on every process (shardkit's all-gather, compiled
into the same program).

    mpirun -np 4 python examples/jax/multiply_by_two.py
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
def multiply_by_two_kernel(a_in: wp.array(dtype=float), a_out: wp.array(dtype=float)):
    index = wp.tid()
    a_out[index] = a_in[index] * 2.0


jax_warp_multiply = jax_kernel(multiply_by_two_kernel)


def warp_multiply(x):
    return jax_warp_multiply(x)


def main():
    num_procs = sk.size()
    print_on_process_0(f"Running on {num_procs} process(es)")
    mesh = sk.Mesh(np.arange(num_procs), "x")

    @jax.jit
    def warp_distributed_operator(a_in):
        def _sharded_operator(a_in):
            # a_in is this process's shard, shape (M / num_procs,)
            return warp_multiply(a_in)[0]

        # Each process's block of the result (a ShardedArray), assembled into the global array in the same program.
        return sk.process_allgather(sk.shard_map(_sharded_operator, mesh=mesh, in_specs=(P("x"),), out_specs=P("x"),
                                                 check_rep=False)(a_in))

    print_on_process_0("Test distributed multiplication using JAX + Warp (shardkit, jax.jit)")
    input_size = num_procs * 5  # 5 elements per process
    single_device_arrays = jnp.arange(input_size, dtype=jnp.float32)
    print_on_process_0(f"Input array: {np.asarray(single_device_arrays)}")
    warp_result = warp_distributed_operator(single_device_arrays)
    print_on_process_0("Warp Output:", np.asarray(warp_result))
    reference = np.arange(input_size, dtype=np.float32) * 2.0
    print_on_process_0(f"allclose: {np.allclose(np.asarray(warp_result), reference)}")


if __name__ == "__main__":
    main()
