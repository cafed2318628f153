"""Calls the stubs and annotations must refuse: tests/python/test_typing.py runs mypy over this file and expects
exactly the error on each line that ends with `# E: <error code>`, and none elsewhere. Never run (every call is
wrong); not a test module (pytest does not collect it)."""

from __future__ import annotations

import numpy as np

import shardkit as sk
from shardkit import P


def misuse(mesh: sk.Mesh, x: sk.ShardedArray) -> None:
    sk.Mesh("x")  # E: call-arg
    sk.Mesh(2.5, "x")  # E: arg-type
    sk.Mesh((2,), ("x",), comm=3)  # E: arg-type
    P("x", 1)  # E: arg-type
    sk.NamedSharding(mesh, "x")  # E: arg-type
    mesh.axis_size(0)  # E: arg-type
    mesh.axis_index("x", rank="0")  # E: arg-type
    sk.NamedSharding(mesh, P("x")).shard_shape([4]) + [1]  # E: operator
    sk.shard_map(lambda b: b, out_specs=1.5)  # E: call-overload
    sk.shard_map(lambda b: b, mesh=mesh, in_specs=None, out_specs=P())  # E: call-overload
    sk.shard_map(lambda b: b, mesh=mesh, out_specs=P(), check_vma="yes")  # E: call-overload
    sk.shard_map(mesh=mesh, out_specs=P(), axis_names=3)  # E: call-overload
    n: int = sk.distribute(np.zeros(4), sk.NamedSharding(mesh, P("x")))  # E: assignment
    sk.distribute(np.zeros(4), mesh)  # E: arg-type
    sk.psum_scatter(x, "x", scatter_dimension="0")  # E: arg-type
    sk.all_gather(x, "x", axis_index_groups=[[0, 1]])  # E: arg-type
    sk.ppermute(x, "x", perm=3)  # E: arg-type
    sk.visualize_sharding(x, print_on_rank="0")  # E: arg-type
    x.shape.append(1)  # E: attr-defined
    sk.tree_global_norm([x], True)  # E: call-arg
    sk.optax.lamb(b1=0.9)  # E: call-arg
    del n
