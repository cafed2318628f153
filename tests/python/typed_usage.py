"""Typed use of shardkit's public API, as a user's program would write it.

mypy checks this file with the examples (tests/python/test_typing.py; configuration in pyproject.toml): every
assert_type states a type the stubs (_core.pyi) or the annotated modules give. test_typing.py also runs it at every
world size, where the matching runtime checks hold, so a stub that lies about a type fails one way or the other.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional, Union

import numpy as np
import numpy.typing as npt

import shardkit as sk
from shardkit import P

if sys.version_info >= (3, 11):
    from typing import assert_type
else:  # pragma: no cover - the check runs on a newer Python

    def assert_type(value: Any, typ: Any) -> Any:
        return value


def run() -> None:
    """The API's typed surface; each assert_type is checked statically, each assert at runtime."""
    n = sk.size()
    assert_type(sk.rank(), int)

    # Meshes: a shape and names, or JAX's spelling (an array of devices, one name for a 1-d mesh).
    mesh = sk.Mesh((n,), ("x",))
    assert sk.Mesh(np.arange(n), "x") == mesh and sk.Mesh(n, "x") == mesh
    assert mesh != "x"  # another type is unequal (typed as object.__eq__)
    assert_type(mesh.shape, list[int])
    assert_type(mesh.axis_names, list[str])
    devices = mesh.devices
    assert_type(devices, npt.NDArray[np.int64])
    assert devices.dtype == np.int64 and devices.shape == (n,)
    assert_type(mesh.axis_size("x"), int)
    assert_type(mesh.axis_index(("x",), rank=0), int)
    assert_type(mesh.axis_comm(axes="x"), sk.Communicator)
    assert mesh.axis_size(axes=["x"]) == n

    # Partition specs: entries are None, a name, or a tuple of names.
    spec = P(("x",), None)
    entry = spec[0]
    assert_type(entry, Union[str, tuple[str, ...], None])
    assert entry == ("x",) or entry == "x"
    assert [e for e in P("x", None)] == ["x", None]
    assert_type(P.parse(text="x, None"), sk.PartitionSpec)
    assert P.parse("x, None") == P("x")

    sharding = sk.NamedSharding(mesh, P("x", None))
    assert_type(sharding.shard_shape((4 * n, 3)), tuple[int, ...])
    assert sharding.shard_shape((4 * n, 3)) == (4, 3)
    indices = sharding.devices_indices_map((4 * n, 3))
    assert_type(indices, dict[int, tuple[slice, ...]])
    assert all(isinstance(s, slice) for s in indices[sk.rank()])
    assert_type(sharding.local_shape(global_shape=[4 * n, 3], rank=sk.rank()), list[int])
    assert_type(sharding.index([4 * n, 3], rank=0), list[tuple[int, int]])
    assert sharding.num_shards(dim=0) == n
    sharding.validate(global_shape=[4 * n, 3])

    # Sharded arrays and shard_map: the call form and the decorator form.
    x = sk.distribute(np.arange(4.0 * n), sk.NamedSharding(mesh, P("x")))
    assert_type(x, sk.ShardedArray)
    assert_type(x.shape, tuple[int, ...])
    assert x.shape == (4 * n,)
    double = sk.shard_map(lambda b: b * 2, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    assert_type(double, Callable[..., Any])
    y = double(x)
    assert isinstance(y, sk.ShardedArray)

    @sk.shard_map(mesh=mesh, in_specs=(P("x"),), out_specs=P(), check_vma=True)
    def total(block: npt.NDArray[np.float64]) -> Any:
        return sk.psum(block.sum(keepdims=True), "x")

    assert_type(total, Callable[..., Any])
    want = 4.0 * n * (4 * n - 1) / 2
    assert float(sk.process_allgather(total(x))[0]) == want

    # Reductions over trees of sharded arrays: the global value, on every rank.
    assert float(sk.tree_sum({"x": x, "held": np.ones(2)})) == want + 2
    assert_type(sk.tree_global_norm([x, y], squared=True), Any)
    assert float(sk.tree_global_norm([x], squared=True)) == float((np.arange(4.0 * n) ** 2).sum())

    gathered: Optional[Any] = sk.gather(y, root=0)
    assert (gathered is None) == (sk.rank() != 0)

    # The mpi4jax API: untyped in the stub (its parameters are checked at run time), but present.
    total_1, token = sk.mpi.allreduce(np.ones(3), op="sum")
    token.wait()
    assert total_1.tolist() == [n] * 3

    # Errors are the shardkit hierarchy, with the same bases statically as at runtime.
    try:
        sk.NamedSharding(mesh, P("not_an_axis"))
    except sk.InvalidArgument as e:
        assert_type(e, sk.InvalidArgument)
        assert_type(e.where, Optional[str])
        as_base: sk.Error = e
        as_value_error: ValueError = e
        assert isinstance(as_base, sk.Error) and isinstance(as_value_error, ValueError)
    else:
        raise AssertionError("NamedSharding accepted an axis the mesh lacks")
    error: RuntimeError = sk.Error("")
    timeout: TimeoutError = sk.TimeoutError("")
    mismatch: sk.Error = sk.MismatchError("")
    backend: sk.Error = sk.BackendError("")
    assert isinstance(error, RuntimeError) and isinstance(timeout, TimeoutError)
    assert isinstance(mismatch, sk.Error) and isinstance(backend, sk.Error)


if __name__ == "__main__":
    run()
    print("typed_usage done")
