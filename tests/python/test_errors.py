"""C++ errors arrive as Python exceptions of the shardkit hierarchy, each triggered here."""

import numpy as np
import pytest


def test_hierarchy(sk):
    assert issubclass(sk.InvalidArgument, sk.Error) and issubclass(sk.InvalidArgument, ValueError)
    assert issubclass(sk.TimeoutError, sk.Error) and issubclass(sk.TimeoutError, TimeoutError)
    assert issubclass(sk.MismatchError, sk.Error) and issubclass(sk.BackendError, sk.Error)
    assert issubclass(sk.Error, RuntimeError)


def test_invalid_argument(sk, size):
    with pytest.raises(sk.InvalidArgument, match=f"root {size} out of range"):
        sk.mpi.bcast(np.zeros(3), size)
    with pytest.raises(sk.InvalidArgument, match="'sum' is not defined for dtype bool"):
        sk.mpi.allreduce(np.array([True]), op="sum")


def test_mismatch_error(sk, rank, size):
    if size == 1:
        pytest.skip("one rank cannot disagree with itself")
    checked = sk._core.make_comm(check=True, name="checked")
    with pytest.raises(sk.MismatchError, match=r"count: 3 on rank 0"):
        checked.allreduce(np.zeros(3 if rank == 0 else 4), sk.ReduceOp.SUM)
    # Nothing was sent: the communicator still works.
    r, _ = checked.allreduce(np.ones(2), sk.ReduceOp.SUM)
    assert r.tolist() == [size, size]


def test_backend_error(sk):
    if sk.device() != "cpu":
        pytest.skip("this rank has a GPU: device memory is available")
    mesh = sk.Mesh((sk.size(),), "x")
    with pytest.raises(sk.BackendError) as info:
        sk.distribute(np.zeros(sk.size()), sk.NamedSharding(mesh, sk.P("x")), device="cuda:0")
    assert info.value.backend == "CUDA"
    assert isinstance(info.value.native_code, int)
