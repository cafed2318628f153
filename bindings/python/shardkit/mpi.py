"""shardkit.mpi: the mpi4jax API (https://mpi4jax.readthedocs.io) over shardkit's communicators.

Every function takes arrays from any DLPack producer (NumPy, JAX, PyTorch, CuPy, Warp) or scalars, and returns
results in the caller's framework, with a token: ``result, token = allreduce(x, op=MPI.SUM)``. Passing
``token=`` orders an operation after the one that produced the token. ``comm`` is an mpi4py communicator or a
shardkit Communicator; by default a clone of COMM_WORLD. ``op`` is an mpi4py operation (``MPI.SUM``, ...), a
name ("sum", "prod", "min", "max", "land", "lor", "lxor", "band", "bor", "bxor") or a shardkit ReduceOp.

Per-rank shape rules, as mpi4jax's:
  - gather: on ``root`` the result has shape (nproc, *x.shape); elsewhere it is x, unchanged;
  - scatter: on ``root`` x has shape (nproc, *s) and the result shape s; elsewhere x gives s (its data is not read);
  - reduce: the reduction on ``root``; x, unchanged, elsewhere;
  - alltoall: x's first axis must have size nproc;
  - bcast, recv, sendrecv return new arrays (unlike mpi4py's) and never write into their inputs.
Blocking calls release the GIL.
"""

from __future__ import annotations

from . import _core
from ._core import ReduceOp, Token

__all__ = [
    "allgather", "allreduce", "alltoall", "barrier", "bcast", "gather", "recv", "reduce", "scan", "scatter",
    "send", "sendrecv", "has_cuda_support", "Token", "ReduceOp", "ANY_SOURCE", "ANY_TAG",
]

ANY_SOURCE = _core.ANY_SOURCE
ANY_TAG = _core.ANY_TAG

_NAMES = {
    "sum": ReduceOp.SUM, "prod": ReduceOp.PROD, "min": ReduceOp.MIN, "max": ReduceOp.MAX,
    "land": ReduceOp.LAND, "lor": ReduceOp.LOR, "lxor": ReduceOp.LXOR,
    "band": ReduceOp.BAND, "bor": ReduceOp.BOR, "bxor": ReduceOp.BXOR,
}
_mpi4py_ops: dict | None = None


def _mpi4py_op_table():
    global _mpi4py_ops
    if _mpi4py_ops is None:
        _mpi4py_ops = {}
        try:
            from mpi4py import MPI
        except ImportError:
            return _mpi4py_ops
        for name, op in (("SUM", MPI.SUM), ("PROD", MPI.PROD), ("MIN", MPI.MIN), ("MAX", MPI.MAX),
                         ("LAND", MPI.LAND), ("LOR", MPI.LOR), ("LXOR", MPI.LXOR), ("BAND", MPI.BAND),
                         ("BOR", MPI.BOR), ("BXOR", MPI.BXOR)):
            _mpi4py_ops[MPI._handleof(op)] = getattr(ReduceOp, name)
    return _mpi4py_ops


def _op(op) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        try:
            return _NAMES[op.lower()]
        except KeyError:
            raise _core.InvalidArgument(f"unknown reduction {op!r} (one of {', '.join(_NAMES)})") from None
    if type(op).__module__ == "mpi4py.MPI":
        from mpi4py import MPI

        found = _mpi4py_op_table().get(MPI._handleof(op))
        if found is None:
            raise _core.InvalidArgument(f"mpi4py operation {op!r} has no shardkit equivalent "
                                        "(SUM, PROD, MIN, MAX, LAND, LOR, LXOR, BAND, BOR, BXOR)")
        return found
    raise _core.InvalidArgument(f"op must be an mpi4py operation, a name or a shardkit ReduceOp, not {type(op).__name__}")


def _source(source: int) -> int:
    """mpi4py's ANY_SOURCE (-2 in MPICH, -1 in Open MPI) or ours."""
    if source == ANY_SOURCE:
        return ANY_SOURCE
    try:
        from mpi4py import MPI

        if source == MPI.ANY_SOURCE:
            return ANY_SOURCE
    except ImportError:
        pass
    return source


def _tag(tag: int) -> int:
    if tag == ANY_TAG:
        return ANY_TAG
    try:
        from mpi4py import MPI

        if tag == MPI.ANY_TAG:
            return ANY_TAG
    except ImportError:
        pass
    return tag


def _fill_status(status, info, like) -> None:
    """Writes what a receive matched into an mpi4py Status."""
    source, tag, count = info
    status.Set_source(source)
    status.Set_tag(tag)
    try:
        from mpi4py.util import dtlib
        import numpy as np

        status.Set_elements(dtlib.from_numpy_dtype(np.dtype(_core.asarray(like).dtype)), count)
    except (ImportError, TypeError, ValueError, KeyError):
        pass  # dtypes without an MPI equivalent (bfloat16): source and tag are still set


def allreduce(x, op, *, comm=None, token=None):
    """Reduces x over all ranks with op; every rank gets the result. Returns (result, token)."""
    return _core.comm(comm).allreduce(x, _op(op), token)


def allgather(x, *, comm=None, token=None):
    """Every rank's x, stacked: shape (nproc, *x.shape). x must have the same shape and dtype on all ranks."""
    return _core.comm(comm).allgather(x, token)


def alltoall(x, *, comm=None, token=None):
    """Block i of x (first axis, of size nproc) goes to rank i; block j of the result came from rank j."""
    return _core.comm(comm).alltoall(x, token)


def barrier(*, comm=None, token=None):
    """Waits for every rank. Returns the token."""
    return _core.comm(comm).barrier(token)


def bcast(x, root, *, comm=None, token=None):
    """Root's x on every rank (x gives shape and dtype elsewhere; its data is only read on root)."""
    return _core.comm(comm).bcast(x, root, token)


def gather(x, root, *, comm=None, token=None):
    """On root, every rank's x stacked (nproc, *x.shape); elsewhere x unchanged."""
    return _core.comm(comm).gather(x, root, token)


def recv(x, source=ANY_SOURCE, *, tag=ANY_TAG, comm=None, status=None, token=None):
    """Receives an array shaped like x (which is not written) from source. Returns (result, token)."""
    result, tok, info = _core.comm(comm).recv(x, _source(source), _tag(tag), token)
    if status is not None:
        _fill_status(status, info, x)
    return result, tok


def reduce(x, op, root, *, comm=None, token=None):
    """On root, x reduced over all ranks with op; elsewhere x unchanged."""
    return _core.comm(comm).reduce(x, _op(op), root, token)


def scan(x, op, *, comm=None, token=None):
    """Inclusive prefix reduction: rank r gets op over ranks 0..r."""
    return _core.comm(comm).scan(x, _op(op), token)


def scatter(x, root, *, comm=None, token=None):
    """Block r of root's x (shape (nproc, *s)) to rank r; elsewhere x gives the shape s."""
    return _core.comm(comm).scatter(x, root, token)


def send(x, dest, *, tag=0, comm=None, token=None):
    """Sends x to dest. Returns the token."""
    return _core.comm(comm).send(x, dest, tag, token)


def sendrecv(sendbuf, recvbuf, source, dest, *, sendtag=0, recvtag=ANY_TAG, comm=None, status=None, token=None):
    """Sends sendbuf to dest while receiving an array shaped like recvbuf (not written) from source."""
    result, tok, info = _core.comm(comm).sendrecv(sendbuf, recvbuf, _source(source), dest, sendtag, _tag(recvtag),
                                                  token)
    if status is not None:
        _fill_status(status, info, recvbuf)
    return result, tok


def has_cuda_support() -> bool:
    """True when shardkit was built with CUDA and NCCL, so GPU arrays (CuPy, PyTorch, JAX on GPU) can be used."""
    return _core.cuda_built() and _core.nccl_built()
