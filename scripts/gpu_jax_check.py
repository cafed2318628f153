"""shardkit inside jax.jit on JAX's GPU backend: the XLA FFI handlers for CUDA buffers (NCCL under the compiled
program), a traced shard_map with axis collectives, and jax.grad through a collective. Run by scripts/gpu_check.sh
under mpirun (any number of ranks, one GPU each); prints one line per check: "jax <check> ok|FAIL|skipped <detail>".
Exit status: non-zero if any check failed."""

import os
import sys
import traceback

import numpy as np


def main():
    import jax
    import jax.numpy as jnp

    import shardkit as sk
    from shardkit import P

    # SHARDKIT_GPU_CHECK_PLATFORM=cpu runs the same checks on JAX's CPU backend (to check the checks).
    platform = os.environ.get("SHARDKIT_GPU_CHECK_PLATFORM", "gpu")
    gpus = [d for d in jax.devices() if d.platform == platform]
    if not gpus:
        print("jax gpu skipped JAX has no GPU backend here")
        return 0
    n, r = sk.size(), sk.rank()
    base = np.arange(1000, dtype=np.float32)

    def on_gpu(a):
        return list(a.devices())[0].platform == platform

    def allreduce_in_jit():
        x = jax.device_put(jnp.asarray(base) + r, gpus[0])
        f = jax.jit(lambda v: sk.mpi.allreduce(v * 2, op="sum")[0] + 1)
        got = f(x)
        assert on_gpu(got), got.devices()
        want = 2 * (base * n + sum(range(n))) + 1
        np.testing.assert_allclose(np.asarray(got), want)
        return f"jit(allreduce) over {n} rank(s) on {platform} buffers correct"

    def bcast_allgather_in_jit():
        x = jax.device_put(jnp.full((3, 5), float(r), jnp.float32), gpus[0])
        b = jax.jit(lambda v: sk.mpi.bcast(v, 0)[0])(x)
        g = jax.jit(lambda v: sk.mpi.allgather(v)[0])(x)
        np.testing.assert_array_equal(np.asarray(b), np.zeros((3, 5)))
        np.testing.assert_array_equal(np.asarray(g), np.stack([np.full((3, 5), k) for k in range(n)]))
        return "jit(bcast), jit(allgather) correct"

    def shard_map_in_jit():
        mesh = sk.Mesh(np.arange(n), "x")
        x = jax.device_put(jnp.arange(n * 7, dtype=jnp.float32), gpus[0])
        body = lambda b: b * 2 + sk.psum(b.sum(), "x")  # noqa: E731
        f = jax.jit(lambda v: sk.process_allgather(sk.shard_map(body, mesh=mesh, in_specs=(P("x"),),
                                                                out_specs=P("x"))(v)))
        got = np.asarray(f(x))
        want = np.arange(n * 7, dtype=np.float32) * 2 + np.arange(n * 7).sum()
        np.testing.assert_allclose(got, want)
        return f"jit(shard_map) with psum on {platform} blocks correct"

    def grad_through_allreduce():
        x = jax.device_put(jnp.asarray(base[:16]), gpus[0])
        g = jax.jit(jax.grad(lambda v: (sk.mpi.allreduce(v, op="sum")[0] ** 2).sum()))(x)
        # mpi4jax's rule: the transpose of a sum-allreduce is the identity, so each rank gets 2 * (sum_k v_k).
        want = 2 * (base[:16] * n)
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5)
        return f"jax.grad through allreduce on {platform}"

    failed = False
    for name, check in [("allreduce", allreduce_in_jit), ("bcast_allgather", bcast_allgather_in_jit),
                        ("shard_map", shard_map_in_jit), ("grad", grad_through_allreduce)]:
        try:
            detail = check()
            if r == 0:
                print(f"jax {name} ok {detail}", flush=True)
        except Exception as e:  # report each check, go on to the next
            failed = True
            print(f"jax {name} FAIL {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            traceback.print_exc()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
