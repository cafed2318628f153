"""Distributed multiply-by-two: the shard_map program of NVIDIA Warp's interoperability guide, on shardkit.

A global arange of 5 elements per process is sharded P('x') over a 1-d mesh of every rank; inside shard_map each
rank doubles its local shard with a Warp kernel (Warp runs on the CPU, or the rank's GPU), or with NumPy
(--numpy); process_allgather collects the result, which rank 0 prints next to the input.

    mpirun -np 4 python examples/python/multiply_by_two.py [--numpy]
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
    parser.add_argument("--numpy", action="store_true", help="double the shards with NumPy instead of Warp")
    args = parser.parse_args()
    num_procs = sk.size()
    print_on_process_0(f"Running on {num_procs} process(es) (local shards on {sk.device()})")

    if args.numpy:
        def multiply(x):
            return x * 2.0
        kernel_name = "NumPy"
    else:
        import warp as wp

        wp.config.log_level = getattr(wp, "LOG_WARNING", 30)  # no start-up banner
        device = "cpu" if sk.device() == "cpu" else sk.device()

        @wp.kernel
        def multiply_by_two_kernel(a_in: wp.array(dtype=wp.float32), a_out: wp.array(dtype=wp.float32)):
            index = wp.tid()
            a_out[index] = a_in[index] * 2.0

        def multiply(x):
            out = wp.empty_like(x)
            wp.launch(multiply_by_two_kernel, dim=x.shape[0], inputs=[x], outputs=[out], device=device)
            return out
        kernel_name = "Warp"

    print_on_process_0(f"Test distributed multiplication using shardkit + {kernel_name}")

    mesh = sk.Mesh(np.arange(num_procs), "x")
    sharding = sk.NamedSharding(mesh, P("x"))
    input_size = num_procs * 5  # 5 elements per process
    single_device_array = np.arange(input_size, dtype=np.float32)
    if not args.numpy:
        single_device_array = wp.array(single_device_array, device="cpu")

    def host(x):  # the gathered global array, as NumPy for printing
        full = sk.process_allgather(x)
        return full if args.numpy else full.numpy()

    sharded_array = sk.distribute(single_device_array, sharding)
    print_on_process_0(f"Input array: {host(sharded_array)}")

    distributed_multiply = sk.shard_map(multiply, mesh=mesh, in_specs=(P("x"),), out_specs=P("x"), check_rep=False)
    result = distributed_multiply(sharded_array)

    output = host(result)
    print_on_process_0(f"{kernel_name} Output: {output}")
    reference = np.arange(input_size, dtype=np.float32) * 2.0
    print_on_process_0(f"allclose: {np.allclose(output, reference)}")


if __name__ == "__main__":
    main()
