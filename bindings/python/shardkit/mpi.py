"""shardkit.mpi: the mpi4jax API (https://mpi4jax.readthedocs.io) over shardkit's communicators.

Every function takes arrays from any DLPack producer (NumPy, JAX, PyTorch, CuPy, Warp) or scalars, and returns
results in the caller's framework, with a token: ``result, token = allreduce(x, op=MPI.SUM)``. Passing
``token=`` orders an operation after the one that produced the token. ``comm`` is an mpi4py communicator (used as
given) or a shardkit Communicator; by default a clone of COMM_WORLD. ``op`` is an mpi4py operation (``MPI.SUM``,
...), a name ({reduction_names}) or a shardkit ReduceOp.

Per-rank shape rules, as mpi4jax's:
  - gather: on ``root`` the result has shape (nproc, *x.shape); elsewhere it is x, unchanged;
  - scatter: on ``root`` x has shape (nproc, *s) and the result shape s; elsewhere x gives s (its data is not read);
  - reduce: the reduction on ``root``; x, unchanged, elsewhere;
  - alltoall: x's first axis must have size nproc;
  - bcast, recv, sendrecv return new arrays (unlike mpi4py's) and never write into their inputs.
Blocking calls release the GIL. The functions are implemented in C++ (shardkit._core): a call costs about what
mpi4py's buffer interface does.
"""

from __future__ import annotations

from . import _core
from ._core import ReduceOp, Token

# The reduction names come from shardkit's one table of them (ReduceOp's members are the names in upper case).
if __doc__:  # None under python -OO
    __doc__ = __doc__.replace("{reduction_names}", ", ".join(f'"{name.lower()}"' for name in ReduceOp.__members__))

__all__ = [
    "allgather", "allreduce", "alltoall", "barrier", "bcast", "gather", "recv", "reduce", "scan", "scatter",
    "send", "sendrecv", "has_cuda_support", "Token", "ReduceOp", "ANY_SOURCE", "ANY_TAG",
]

ANY_SOURCE = _core.ANY_SOURCE
ANY_TAG = _core.ANY_TAG

allgather = _core.mpi_allgather
allreduce = _core.mpi_allreduce
alltoall = _core.mpi_alltoall
barrier = _core.mpi_barrier
bcast = _core.mpi_bcast
gather = _core.mpi_gather
recv = _core.mpi_recv
reduce = _core.mpi_reduce
scan = _core.mpi_scan
scatter = _core.mpi_scatter
send = _core.mpi_send
sendrecv = _core.mpi_sendrecv


def has_cuda_support() -> bool:
    """True when shardkit was built with CUDA and NCCL, so GPU arrays (CuPy, PyTorch, JAX on GPU) can be used."""
    return _core.cuda_built() and _core.nccl_built()
