"""Arrays from any DLPack producer, without copies on the host path; results in the caller's framework."""

import numpy as np
import pytest

from conftest import has_module


def test_numpy_import_shares_memory(sk):
    x = np.arange(12.0).reshape(3, 4)
    a = sk.asarray(x)
    assert a.data_ptr == x.ctypes.data
    assert a.shape == (3, 4) and a.dtype == "float64" and a.read_only
    v = x[:, 1]  # a strided view: shared, not copied
    assert sk.asarray(v).data_ptr == v.ctypes.data


def test_every_numpy_dtype_round_trips(sk):
    for dt in ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
               "float32", "float64", "complex64", "complex128"]:
        x = (np.arange(6) % 2).astype(dt) if dt == "bool" else np.arange(6).astype(dt)
        y, _ = sk.mpi.bcast(x, 0)
        assert y.dtype == np.dtype(dt)
        np.testing.assert_array_equal(y, x)


def test_bfloat16_through_ml_dtypes(sk):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.arange(5, dtype=ml_dtypes.bfloat16)
    y, _ = sk.mpi.bcast(x, 0)
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y.astype(np.float32), x.astype(np.float32))


def test_results_come_back_in_the_callers_framework(sk, size):
    r, _ = sk.mpi.allreduce(np.ones(3, np.float32), op="sum")
    assert isinstance(r, np.ndarray) and r.tolist() == [size] * 3
    if has_module("jax"):
        import jax
        import jax.numpy as jnp

        j, _ = sk.mpi.allreduce(jnp.ones(3, jnp.float32), op="sum")
        assert isinstance(j, jax.Array)
        assert j.tolist() == [size] * 3
    if has_module("warp"):
        import warp as wp

        wp.config.log_level = getattr(wp, "LOG_WARNING", 30)  # no start-up banner
        w, _ = sk.mpi.allreduce(wp.array(np.ones(3, np.float32), device="cpu"), op="sum")
        assert isinstance(w, wp.array)
        assert w.numpy().tolist() == [size] * 3
    if has_module("torch"):
        import torch

        t, _ = sk.mpi.allreduce(torch.ones(3), op="sum")
        assert isinstance(t, torch.Tensor) and t.tolist() == [size] * 3


def test_jax_import_shares_memory(sk):
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.arange(16.0)
    assert sk.asarray(x).data_ptr == x.unsafe_buffer_pointer()


def test_warp_import_shares_memory(sk):
    wp = pytest.importorskip("warp")
    wp.config.log_level = getattr(wp, "LOG_WARNING", 30)  # no start-up banner
    x = wp.array(np.arange(8, dtype=np.float32), device="cpu")
    assert sk.asarray(x).data_ptr == x.ptr


def test_torch_import_shares_memory(sk):
    torch = pytest.importorskip("torch")
    x = torch.arange(8.0)
    assert sk.asarray(x).data_ptr == x.data_ptr()


class LegacyOnly:
    """A producer from before the DLPack 1.0 Python protocol: __dlpack__ rejects max_version."""

    def __init__(self, arr):
        self.arr = arr
        self.calls = []

    def __dlpack__(self, stream=None):
        self.calls.append("legacy")
        return self.arr.__dlpack__()

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


class VersionedOnly:
    def __init__(self, arr):
        self.arr = arr
        self.max_versions = []

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        self.max_versions.append(max_version)
        if max_version is None:
            raise BufferError("this producer only exports versioned tensors")
        return self.arr.__dlpack__(max_version=max_version)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_versioned_first_then_legacy_fallback(sk):
    x = np.arange(4.0)
    legacy = LegacyOnly(x)
    assert sk.asarray(legacy).data_ptr == x.ctypes.data
    assert legacy.calls == ["legacy"]
    versioned = VersionedOnly(x)
    assert sk.asarray(versioned).data_ptr == x.ctypes.data
    assert versioned.max_versions[0][0] == 1  # asked for DLPack 1.x first


def test_capsules_are_consumed_once(sk):
    x = np.arange(3.0)
    cap = x.__dlpack__(max_version=(1, 0))
    a = sk.asarray(cap)
    assert a.data_ptr == x.ctypes.data
    with pytest.raises(sk.InvalidArgument, match="already consumed"):
        sk.asarray(cap)
    legacy = x.__dlpack__()
    assert sk.asarray(legacy).shape == (3,)


def test_read_only_inputs_are_accepted_and_never_written(sk, size):
    x = np.arange(5.0)
    x.flags.writeable = False
    a = sk.asarray(x)
    assert a.read_only
    r, _ = sk.mpi.allreduce(x, op="sum")
    np.testing.assert_array_equal(x, np.arange(5.0))
    np.testing.assert_array_equal(r, np.arange(5.0) * size)


def test_our_array_exports_to_any_consumer(sk):
    a = sk.asarray(np.arange(6.0).reshape(2, 3))
    n = np.from_dlpack(a)
    assert n.shape == (2, 3) and n[1, 2] == 5.0
    assert a.__dlpack_device__() == (1, 0)
    legacy_capsule = a.__dlpack__()
    versioned_capsule = a.__dlpack__(max_version=(1, 0))
    assert "dltensor" in repr(legacy_capsule) and "dltensor_versioned" in repr(versioned_capsule)
    if has_module("jax"):
        import jax.dlpack

        assert jax.dlpack.from_dlpack(a).shape == (2, 3)


def test_scalars_and_sequences(sk, size):
    r, _ = sk.mpi.allreduce(3, op="sum")
    assert r.shape == () and int(r) == 3 * size
    r, _ = sk.mpi.allreduce(2.5, op="max")
    assert float(r) == 2.5
    r, _ = sk.mpi.allreduce([1, 2], op="sum")
    assert r.tolist() == [size, 2 * size]
    with pytest.raises(sk.InvalidArgument):
        sk.asarray(object())


def test_cuda_producers_get_our_stream(sk):
    """A CUDA producer is handed shardkit's stream (DLPack stream rule); needs a GPU."""
    if sk.device() == "cpu":
        pytest.skip("no GPU on this rank")
    cupy = pytest.importorskip("cupy")
    x = cupy.arange(10, dtype=cupy.float32)
    r, _ = sk.mpi.allreduce(x, op="sum")
    assert isinstance(r, cupy.ndarray)
    assert r.tolist() == (np.arange(10) * sk.size()).tolist()
