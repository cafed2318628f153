"""GPU arrays of CuPy, JAX and PyTorch through shardkit by DLPack: zero-copy import on the GPU (same device pointer),
an allreduce over NCCL, and the result back in the same framework on the same GPU. Run by scripts/gpu_check.sh
(under mpirun, any number of ranks); prints one line per framework: "dlpack <framework> ok|FAIL|skipped <detail>".
Exit status: non-zero if any framework that is installed failed."""

import importlib.util
import sys
import traceback

import numpy as np

import shardkit as sk


def check_cupy():
    import cupy

    x = cupy.arange(1000, dtype=cupy.float32) + sk.rank()
    a = sk.asarray(x)
    assert a.device.startswith("cuda"), a.device
    assert a.data_ptr == x.data.ptr, "import copied the data"
    r, _ = sk.mpi.allreduce(x, op="sum")
    assert isinstance(r, cupy.ndarray) and r.device.id == x.device.id
    want = np.arange(1000, dtype=np.float32) * sk.size() + sum(range(sk.size()))
    assert np.allclose(cupy.asnumpy(r), want)
    return f"device pointer shared, allreduce over {sk.size()} rank(s) correct"


def check_torch():
    import torch

    x = torch.arange(1000, dtype=torch.float32, device="cuda") + sk.rank()
    a = sk.asarray(x)
    assert a.device.startswith("cuda"), a.device
    assert a.data_ptr == x.data_ptr(), "import copied the data"
    r, _ = sk.mpi.allreduce(x, op="sum")
    assert isinstance(r, torch.Tensor) and r.is_cuda
    want = torch.arange(1000, dtype=torch.float32) * sk.size() + sum(range(sk.size()))
    assert torch.allclose(r.cpu(), want)
    return f"device pointer shared, allreduce over {sk.size()} rank(s) correct"


def check_jax():
    import jax
    import jax.numpy as jnp

    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        return None
    x = jax.device_put(jnp.arange(1000, dtype=jnp.float32) + sk.rank(), gpus[0])
    a = sk.asarray(x)
    assert a.device.startswith("cuda"), a.device
    assert a.data_ptr == x.unsafe_buffer_pointer(), "import copied the data"
    r, _ = sk.mpi.allreduce(x, op="sum")
    assert isinstance(r, jax.Array) and list(r.devices())[0].platform == "gpu"
    want = np.arange(1000, dtype=np.float32) * sk.size() + sum(range(sk.size()))
    assert np.allclose(np.asarray(r), want)
    return f"device pointer shared, allreduce over {sk.size()} rank(s) correct"


def main():
    failed = False
    for name, fn in (("cupy", check_cupy), ("torch", check_torch), ("jax", check_jax)):
        if importlib.util.find_spec(name) is None:
            result = ("skipped", "not installed")
        else:
            try:
                detail = fn()
                result = ("skipped", "no GPU device in this framework") if detail is None else ("ok", detail)
            except Exception as e:  # report and go on with the other frameworks
                failed = True
                result = ("FAIL", f"{type(e).__name__}: {e}")
                traceback.print_exc()
        if sk.rank() == 0:
            print(f"dlpack {name} {result[0]} {result[1]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
