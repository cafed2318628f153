"""C++ errors arrive as Python exceptions of the shardkit hierarchy, each triggered here."""

import numpy as np
import pytest


def test_hierarchy(sk):
    assert issubclass(sk.InvalidArgument, sk.Error) and issubclass(sk.InvalidArgument, ValueError)
    assert issubclass(sk.TimeoutError, sk.Error) and issubclass(sk.TimeoutError, TimeoutError)
    assert issubclass(sk.MismatchError, sk.Error) and issubclass(sk.BackendError, sk.Error)
    assert issubclass(sk.Interrupted, sk.Error) and issubclass(sk.Interrupted, KeyboardInterrupt)
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


def test_messages_hold_no_internals(sk, size):
    """What users read names the problem, not shardkit's source: no file paths, no check expressions. The check
    and its location are kept in .where, for bug reports."""
    mesh = sk.Mesh((size,), "x")
    raised = []
    for call in (lambda: sk.mpi.bcast(np.zeros(3), size),                                   # a table rule
                 lambda: sk.matmul(sk.distribute(np.ones((size, 2)), sk.NamedSharding(mesh, sk.P("x"))),
                                   sk.distribute(np.ones((3, 2)), sk.NamedSharding(mesh, sk.P()))),   # a CHECK_EQ
                 lambda: sk.NamedSharding(mesh, sk.P("x", "x"))):                             # a CHECK
        with pytest.raises(sk.InvalidArgument) as info:
            call()
        raised.append(info.value)
    for e in raised:
        text = str(e)
        assert not any(s in text for s in ("[check", ".cpp", ".hpp", "failed at", "/src/")), text
        assert not text.startswith(("InvalidArgument", "TimeoutError", "MismatchError")), text
    assert "matmul: inner dimensions differ" in str(raised[1]) and "(2 == 3 is false)" in str(raised[1])
    assert raised[0].where is None                          # raised by the table's rule, not by a check macro
    assert raised[1].where.startswith("a.shape()[1] == b.shape()[0] at sharding/src/matmul.cpp:"), raised[1].where
    assert "uses mesh axis 'x' twice" in str(raised[2]) and "named_sharding.cpp:" in raised[2].where


# core's error table (core/src/error.cpp), in ErrorCode order: every code is raised as a class of its own.
ERROR_CLASSES = ["InvalidArgument", "MismatchError", "BackendError", "TimeoutError", "InternalError", "Interrupted"]


def test_every_error_code_has_a_class(sk):
    classes = sk._core._error_classes()
    assert list(classes) == ERROR_CLASSES
    for code, name in enumerate(ERROR_CLASSES):
        cls = getattr(sk, name)
        assert classes[name] is cls and cls.__name__ == name and cls.__module__ == "shardkit"
        assert issubclass(cls, sk.Error) and cls is not sk.Error and cls.__doc__
        with pytest.raises(sk.Error, match=f"^message {code}$") as info:
            sk._core._raise_error(code, f"message {code}")
        assert type(info.value) is cls, (code, type(info.value))
    with pytest.raises(sk.InvalidArgument, match=f"no error code {len(ERROR_CLASSES)}"):
        sk._core._raise_error(len(ERROR_CLASSES), "")
