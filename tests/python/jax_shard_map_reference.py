"""JAX's own answers for test_jax_vma.py: the loss and gradients of vma_cases' bodies under jax.shard_map (check_vma on,
and off for vma_cases.CHECK_VMA_OFF) on n of 4 virtual CPU devices, in one process without MPI, and whether it accepts
the out_specs of vma_cases.out_spec_cases. Where JAX raises (its
transpose of pbroadcast, seen on jax 0.8.3 and 0.10.2: "full must be called with scalar fill_value"), the case's error
is recorded instead. jax.grad inside a body (vma_cases.inside): the shard_map's value under each check_vma; where JAX
raises (its pbroadcast), the same body with pbroadcast written as a psum that JAX transposes (PbroadcastByPsum).

    python jax_shard_map_reference.py N OUT.npz
"""

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vma_cases  # noqa: E402


class PbroadcastByPsum:
    """jax.lax with pbroadcast written as the psum of the source's value (zeros elsewhere), varying: the form JAX can
    transpose, as shardkit traces pbroadcast in a body with check_vma on."""

    def __getattr__(self, name):
        return getattr(jax.lax, name)

    @staticmethod
    def pbroadcast(x, axis_name, source):
        mine = jax.lax.axis_index(axis_name) == source
        y = jax.lax.psum(jnp.where(mine, x, jnp.zeros_like(x)), axis_name)
        return jax.lax.pcast(y, axis_name, to="varying") if hasattr(jax.lax, "pcast") else jax.lax.pvary(y, axis_name)


PbroadcastByPsum = PbroadcastByPsum()


def main():
    n, out = int(sys.argv[1]), sys.argv[2]
    jax.config.update("jax_enable_x64", True)
    results = {}
    for name, (two_d, shapes, out_spec, body, ref) in vma_cases.cases(n, jnp, jax).items():
        names, shape = vma_cases.mesh_of(n, two_d)
        mesh = Mesh(np.array(jax.devices()[:n]).reshape(shape), names)
        args = [jnp.asarray(a) for a in vma_cases.arguments(shapes, np)]
        w = vma_cases.weights(ref(*args).shape, jnp)
        for check in (True, False) if name in vma_cases.CHECK_VMA_OFF else (True,):
            f = jax.shard_map(lambda *b: body(jax.lax, *b), mesh=mesh, out_specs=PartitionSpec(*out_spec),
                              in_specs=tuple(PartitionSpec(*s) for _, s in shapes), check_vma=check)
            loss = lambda *a: jnp.sum(jnp.sin(f(*a)) * w)  # noqa: E731, B023
            try:
                value, grads = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(args)))))(*args)
            except Exception as e:  # noqa: BLE001  (JAX has no answer for this one: the test says which and why)
                results[f"{name}/{check}/error"] = np.array(f"{type(e).__name__}: {e}".splitlines()[0])
                continue
            results[f"{name}/{check}/value"] = np.asarray(value)
            for j, g in enumerate(grads):
                results[f"{name}/{check}/{j}"] = np.asarray(g)
    # out_specs against the outputs' types (check_vma on): JAX's verdict at trace time, "" where it accepts.
    for name, (two_d, shapes, out_spec, body, _) in vma_cases.out_spec_cases(n, jnp).items():
        names, shape = vma_cases.mesh_of(n, two_d)
        mesh = Mesh(np.array(jax.devices()[:n]).reshape(shape), names)
        f = jax.shard_map(lambda *b: body(jax.lax, *b), mesh=mesh, out_specs=PartitionSpec(*out_spec),  # noqa: B023
                          in_specs=tuple(PartitionSpec(*s) for _, s in shapes), check_vma=True)
        try:
            jax.jit(f).trace(*[jnp.asarray(x) for x in vma_cases.arguments(shapes, np)])
            results[f"out_spec/{name}"] = np.array("")
        except Exception as e:  # noqa: BLE001  (the verdict itself)
            results[f"out_spec/{name}"] = np.array(f"{type(e).__name__}: {e}".splitlines()[0])
    # jax.grad inside the body: the forward value of the shard_map, under each check_vma.
    mesh = Mesh(np.array(jax.devices()[:n]), ("x",))
    x = jnp.cos(jnp.arange(2.0 * n * n))
    for name, body in vma_cases.inside(n, jax, jnp).items():
        for check in (True, False):
            f = jax.shard_map(lambda b: body(jax.lax, b), mesh=mesh, in_specs=PartitionSpec("x"),  # noqa: B023
                              out_specs=PartitionSpec("x"), check_vma=check)
            try:
                results[f"inside/{name}/{check}"] = np.asarray(jax.jit(f)(x))
            except Exception:  # noqa: BLE001  (JAX's transpose of pbroadcast: the same body with pbroadcast as a psum)
                f = jax.shard_map(lambda b: body(PbroadcastByPsum, b), mesh=mesh, in_specs=PartitionSpec("x"),  # noqa: B023
                                  out_specs=PartitionSpec("x"), check_vma=check)
                try:
                    results[f"inside/{name}/{check}"] = np.asarray(jax.jit(f)(x))
                except Exception as e:  # noqa: BLE001  (no answer from this JAX: jax 0.8.3 refuses that psum's transpose)
                    results[f"inside/{name}/{check}/error"] = np.array(f"{type(e).__name__}: {e}".splitlines()[0])
    np.savez(out, **results)


if __name__ == "__main__":
    main()
