"""Fault suite, Python side: a rank raising ends the whole job promptly; malformed DLPack input raises
InvalidArgument (never a crash); ranks that disagree on a collective all raise MismatchError. Each case prints how
long it took to end (pytest -s shows it)."""

import ctypes
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def mpirun(np_, code, timeout=90, **env):
    launcher = shutil.which("mpirun") or shutil.which("mpiexec")
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_", "PMIX_", "PMI_"))}
    full_env.update(ROOT_ENV, **env)
    start = time.time()
    r = subprocess.run([launcher, "--oversubscribe", "--bind-to", "none", "-np", str(np_), sys.executable, "-c",
                        textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, env=full_env)
    return r, time.time() - start


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_a_raising_rank_ends_the_job_promptly(np_):
    r, took = mpirun(np_, """
        import time, numpy as np, shardkit as sk
        if sk.rank() == 1:
            time.sleep(0.5)
            raise RuntimeError("boom on rank 1")
        sk.mpi.allreduce(np.ones(3), op="sum")   # the others wait here for rank 1, which never comes
        print("ERROR: completed")
    """)
    out = r.stdout + r.stderr
    print(f"\n[fault] python exception at {np_} ranks: job ended after {took:.1f} s (exit {r.returncode})")
    assert r.returncode != 0
    assert "RuntimeError: boom on rank 1" in out
    assert "uncaught RuntimeError on rank 1" in out
    assert "ERROR: completed" not in out
    assert took < 30


@pytest.mark.parametrize("np_", [2, 3, 4])
@pytest.mark.parametrize("checked", ["0", "1"])
def test_first_collective_times_out_when_a_rank_never_arrives(np_, checked):
    """The default communicator is made at `import shardkit` (every rank imports it): with SHARDKIT_TIMEOUT_S set, a
    rank that never comes to the first collective ends in TimeoutError on every waiting rank within the timeout plus
    5 s, naming the collective (and, in checked mode, the rank), not in a hang."""
    r, took = mpirun(np_, """
        import time, numpy as np, shardkit as sk
        if sk.rank() == 1:
            time.sleep(12)
        else:
            start = time.time()
            try:
                sk.mpi.allreduce(np.ones(16, np.float32), op="sum")
                print(f"rank {sk.rank()}: ERROR completed", flush=True)
            except sk.TimeoutError as e:
                print(f"rank {sk.rank()}: TimeoutError after {time.time() - start:.1f} s: {e}", flush=True)
            time.sleep(2)  # the other waiting ranks report before this one's exit ends the job
    """, timeout=60, SHARDKIT_TIMEOUT_S="3", SHARDKIT_CHECK=checked)
    out = r.stdout + r.stderr
    print(f"\n[fault] first collective at {np_} ranks, checked={checked}: job ended after {took:.1f} s")
    assert "ERROR completed" not in out
    for rank in [0] + list(range(2, np_)):
        m = re.search(rf"rank {rank}: TimeoutError after ([0-9.]+) s: (.*)", out)
        assert m, out
        assert float(m.group(1)) <= 3 + 5, m.group(0)
        assert re.match(r"allreduce #\d+ on communicator 'world'", m.group(2)), m.group(0)
        if checked == "1":
            assert "rank(s) 1 did not arrive" in m.group(2), m.group(0)
    assert took < 30


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_mismatched_collectives_raise_on_every_rank(np_):
    r, took = mpirun(np_, """
        import numpy as np, shardkit as sk
        comm = sk._core.make_comm(check=True, timeout=20, name="checked")
        try:
            comm.allreduce(np.zeros(3 if sk.rank() == 0 else 4), sk.ReduceOp.SUM)
            print(f"rank {sk.rank()}: ERROR no error", flush=True)
        except sk.MismatchError as e:
            print(f"rank {sk.rank()}: MismatchError: {e}", flush=True)
    """)
    out = r.stdout + r.stderr
    print(f"\n[fault] mismatch at {np_} ranks: every rank raised; job ended after {took:.1f} s (exit {r.returncode})")
    assert r.returncode == 0, out
    for q in range(np_):
        assert re.search(rf"rank {q}: MismatchError: ranks disagree on allreduce #0 .*count: 3 on rank 0",
                         out), out


# ---- malformed DLPack: built with ctypes, as a buggy producer would hand it over -------------------------------------

class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


ctypes.pythonapi.PyCapsule_New.restype = ctypes.py_object
ctypes.pythonapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

BUFFER = np.arange(64, dtype=np.float32)


def capsule(versioned=False, data=None, shape=(4,), strides=(1,), code=2, bits=32, lanes=1, device=1,
            byte_offset=0):
    """A capsule holding a tensor described by the arguments (kept alive in the returned tuple)."""
    shape_arr = (ctypes.c_int64 * len(shape))(*shape)
    strides_arr = (ctypes.c_int64 * len(strides))(*strides) if strides is not None else None
    t = DLTensor(ctypes.c_void_p(BUFFER.ctypes.data if data is None else data), DLDevice(device, 0), len(shape),
                 DLDataType(code, bits, lanes), shape_arr,
                 ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64)) if strides_arr is not None else None,
                 byte_offset)
    if versioned:
        m = DLManagedTensorVersioned(DLPackVersion(1, 0), None, None, 0, t)
        name = b"dltensor_versioned"
    else:
        m = DLManagedTensor(t, None, None)
        name = b"dltensor"
    cap = ctypes.pythonapi.PyCapsule_New(ctypes.addressof(m), name, None)
    return cap, (m, shape_arr, strides_arr)


@pytest.mark.parametrize("versioned", [False, True])
def test_malformed_dlpack_raises_invalid_argument(versioned):
    import shardkit as sk

    good, keep = capsule(versioned)
    assert sk.asarray(good).shape == (4,)
    cases = {
        "null data with elements": dict(data=0),
        "negative stride": dict(shape=(4,), strides=(-1,)),
        "overflowing strides": dict(shape=(4,), strides=(1 << 62,)),
        "unsupported dtype (float8)": dict(code=7, bits=8),
        "vector lanes": dict(lanes=4),
        "unsupported device (Vulkan)": dict(device=7),
        "misaligned byte offset": dict(byte_offset=2),
        "negative shape": dict(shape=(-3,), strides=(1,)),
    }
    start = time.time()
    for what, kwargs in cases.items():
        cap, keep = capsule(versioned, **kwargs)
        with pytest.raises(sk.InvalidArgument):
            sk.asarray(cap)
        # Also through a producer object, as collectives receive inputs.
        producer = type("Producer", (), {"__dlpack__": lambda self, **kw: cap, "__dlpack_device__": lambda self: (1, 0)})
        with pytest.raises(sk.InvalidArgument):
            sk.mpi.allreduce(producer(), op="sum")
    print(f"\n[fault] {len(cases)} malformed DLPack inputs ({'versioned' if versioned else 'legacy'}) refused in "
          f"{time.time() - start:.3f} s")
