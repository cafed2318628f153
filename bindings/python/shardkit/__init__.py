"""shardkit: sharded compute across many GPUs and many machines, over MPI and NCCL.

Run one process per device (``mpirun -np 4 python prog.py``, or ``shardkit-run -n 4 python prog.py``). Importing
shardkit initialises MPI (or adopts mpi4py's), binds this rank's GPU if there is one, and frees everything at exit.

    import numpy as np
    import shardkit as sk
    from shardkit import P

    mesh = sk.Mesh((sk.size(),), ("x",))
    x = sk.distribute(np.arange(4.0 * sk.size()), sk.NamedSharding(mesh, P("x")))
    y = sk.shard_map(lambda b: b * 2, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(x)
    print(sk.process_allgather(y))

Modules: ``shardkit.mpi`` (the mpi4jax API), ``shardkit.checkpoint`` (sharded checkpoints: ``save``, ``load`` and
``checkpoint_info`` are here too), ``shardkit.optax`` (optax's reducing transforms, global on sharded state), the
sharding API here (Mesh, P, NamedSharding, shard_map, psum, ...) and reductions over trees of sharded arrays
(tree_sum, tree_global_norm: the global value on every rank).
"""

from . import _core
from . import _mpi_setup
from ._core import (
    Array, BackendError, Communicator, Error, InternalError, Interrupted, InvalidArgument, MismatchError, ReduceOp,
    TimeoutError, Token,
)

__version__ = _core.__version__

_mpi_setup.initialize()

from . import _arrays  # noqa: E402  (after initialisation, as everything below)

_arrays.register()

from ._arrays import asarray, framework_of  # noqa: E402
from ._sharding import (  # noqa: E402
    Mesh, NamedSharding, P, PartitionSpec, ShardedArray, all_gather, all_to_all, axis_index, axis_size,
    choose_matmul_algorithm, distribute, from_local, gather, matmul, pbroadcast, pmax, pmean, pmin, ppermute,
    process_allgather, psum, psum_scatter, reshard, shard_map, visualize_sharding,
)
from ._reductions import tree_global_norm, tree_sum  # noqa: E402
from . import mpi  # noqa: E402
from . import checkpoint  # noqa: E402
from . import optax  # noqa: E402  (imports optax only when a transform is made)
from .checkpoint import checkpoint_info, load, save  # noqa: E402
from . import _after_jax  # noqa: E402

_after_jax.install()  # the JAX layer (shardkit.jax) loads once JAX is imported


def rank() -> int:
    """This process's rank in the job."""
    return _core.rank()


def size() -> int:
    """Number of processes in the job."""
    return _core.size()


def describe() -> str:
    """One line: rank, host, device, backend and library versions."""
    return _core.describe()


def device() -> str:
    """The device this rank computes on: "cuda:N" (its bound GPU) or "cpu"."""
    return _core.device()


def world() -> Communicator:
    """The default communicator (a clone of COMM_WORLD)."""
    return _core.world()


make_comm = _core.make_comm  # a communicator with settings of its own (C++ CommOptions): backend=, timeout=, ...


__all__ = [
    "Array", "BackendError", "Communicator", "Error", "InternalError", "Interrupted", "InvalidArgument", "MismatchError",
    "ReduceOp", "TimeoutError", "Token", "Mesh", "NamedSharding", "P", "PartitionSpec", "ShardedArray", "all_gather", "all_to_all",
    "axis_index", "axis_size", "distribute", "from_local", "gather", "pbroadcast", "pmax", "pmean", "pmin", "ppermute",
    "process_allgather", "psum", "psum_scatter", "reshard", "shard_map", "visualize_sharding", "mpi", "asarray",
    "matmul", "choose_matmul_algorithm", "tree_sum", "tree_global_norm", "checkpoint", "save", "load",
    "checkpoint_info", "framework_of", "rank", "size", "describe", "device", "world", "make_comm", "__version__",
]  # not "optax": `from shardkit import *` would shadow the optax a program imported (use sk.optax)
