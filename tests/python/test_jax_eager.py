"""shardkit.mpi called eagerly on concrete jax.Arrays: the native path (the buffer protocol in, jaxlib's DLPack importer
out; DLPack both ways for what the buffer protocol does not export), checked for every dtype, empty arrays, every
value rule, memory ownership, deleted (donated) inputs, tokens of both kinds, and for concrete arrays met while JAX
traces, which must still be staged into the program rather than run once at trace time."""

import numpy as np
import pytest

from conftest import require_jax

jax = require_jax()
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402

MPI = pytest.importorskip("mpi4py.MPI")


def value(r, n, dtype):
    """Rank r's input: small integers, exact in every dtype (bool: alternating)."""
    v = np.arange(n) % 5 + r + 1
    return (v % 2 == 0) if dtype == np.bool_ else v.astype(dtype)


def as_f64(a):
    a = np.asarray(a)
    return a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)


DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.uint32,
          np.uint64, np.complex64, np.complex128, np.bool_]


@pytest.mark.parametrize("n", [0, 1, 7])
@pytest.mark.parametrize("dtype", DTYPES)
def test_results_are_new_jax_arrays_with_the_right_values(mpi, sk, rank, size, dtype, n):
    x = jnp.asarray(value(rank, n, dtype))
    want_dtype = np.dtype(dtype)
    got, tok = mpi.allgather(x)
    assert isinstance(got, jax.Array) and isinstance(tok, sk.Token)
    assert got.dtype == want_dtype and got.shape == (size, n)
    assert got.devices() == x.devices()
    np.testing.assert_array_equal(as_f64(got), np.stack([as_f64(value(r, n, dtype)) for r in range(size)]))
    if dtype != np.bool_:
        got, _ = mpi.allreduce(x, op=MPI.SUM)
        assert got.dtype == want_dtype and got.shape == (n,)
        np.testing.assert_array_equal(as_f64(got), sum(as_f64(value(r, n, dtype)) for r in range(size)))
    got, _ = mpi.bcast(x, size - 1)
    np.testing.assert_array_equal(as_f64(got), as_f64(value(size - 1, n, dtype)))
    np.testing.assert_array_equal(as_f64(x), as_f64(value(rank, n, dtype)))  # inputs are never written


def test_every_value_rule_and_the_input_itself_where_the_value_is_the_input(mpi, sk, rank, size):
    root = size - 1
    x = jnp.arange(6.0).reshape(2, 3) + rank
    got, _ = mpi.reduce(x, op=MPI.SUM, root=root)
    if rank == root:
        np.testing.assert_array_equal(got, size * np.arange(6.0).reshape(2, 3) + size * (size - 1) / 2)
    else:
        assert got is x  # as for NumPy: the caller's own (immutable) array
    got, _ = mpi.gather(x, root)
    assert got.shape == ((size, 2, 3) if rank == root else (2, 3))
    blocks = jnp.stack([jnp.full(3, 10.0 * rank + j) for j in range(size)])
    got, _ = mpi.alltoall(blocks)
    np.testing.assert_array_equal(got, np.stack([np.full(3, 10.0 * j + rank) for j in range(size)]))
    got, _ = mpi.scatter(blocks if rank == root else jnp.zeros(3), root)  # elsewhere x gives the shape
    np.testing.assert_array_equal(got, np.full(3, 10.0 * root + rank))
    got, _ = mpi.scan(jnp.ones(4, jnp.int32), op=MPI.SUM)
    np.testing.assert_array_equal(got, np.full(4, rank + 1))
    got, _ = mpi.sendrecv(jnp.full(2, rank), jnp.zeros(2, jnp.int64), (rank - 1) % size, (rank + 1) % size)
    np.testing.assert_array_equal(got, np.full(2, (rank - 1) % size))
    got, _ = sk.world().allgatherv(jnp.arange(rank + 1))  # the concatenating rule (a Communicator method)
    np.testing.assert_array_equal(got, np.concatenate([np.arange(r + 1) for r in range(size)]))


@pytest.mark.parametrize("send_jax,recv_jax", [(True, False), (False, True), (True, True), (False, False)])
def test_sendrecv_returns_a_jax_array_when_either_buffer_is_one(mpi, rank, size, send_jax, recv_jax):
    # mpi4jax returns JAX arrays; NumPy in both gives NumPy (shardkit's mpi4py-like host path).
    send = np.full(3, rank, np.int32)
    recv = np.zeros(3, np.int32)
    got, _ = mpi.sendrecv(jnp.asarray(send) if send_jax else send, jnp.asarray(recv) if recv_jax else recv,
                          (rank - 1) % size, (rank + 1) % size)
    assert isinstance(got, jax.Array if send_jax or recv_jax else np.ndarray), type(got)
    assert got.dtype == np.int32 and got.shape == (3,)
    np.testing.assert_array_equal(np.asarray(got), np.full(3, (rank - 1) % size))


def test_results_own_their_memory(mpi, size):
    x = jnp.arange(64.0)
    a, _ = mpi.allreduce(x, op=MPI.SUM)
    b, _ = mpi.allreduce(x, op=MPI.SUM)
    pa, pb = a.unsafe_buffer_pointer(), b.unsafe_buffer_pointer()
    assert len({pa, pb, x.unsafe_buffer_pointer()}) == 3
    del b  # freeing one result leaves the other intact
    c, _ = mpi.allreduce(jnp.ones(64), op=MPI.SUM)
    np.testing.assert_array_equal(a, size * np.arange(64.0))
    np.testing.assert_array_equal(c, np.full(64, size))
    np.testing.assert_array_equal(a + 1, size * np.arange(64.0) + 1)  # usable by JAX's own operations


def test_views_and_results_of_jitted_programs(mpi, size):
    m = jnp.arange(12.0).reshape(3, 4)
    got, _ = mpi.allreduce(m.T, op=MPI.SUM)  # a transposed array (JAX materialises it row-major)
    np.testing.assert_array_equal(got, size * np.arange(12.0).reshape(3, 4).T)
    y = jax.jit(lambda v: v * 2)(m)  # possibly still being computed when the call starts
    got, _ = mpi.allreduce(y[1:], op=MPI.SUM)
    np.testing.assert_array_equal(got, size * 2 * np.arange(12.0).reshape(3, 4)[1:])


def test_deleted_arrays_raise(mpi):
    x = jnp.ones(3)
    x.delete()
    with pytest.raises(Exception, match="(?i)deleted"):
        mpi.allreduce(x, op=MPI.SUM)
    donated = jnp.ones(3)
    jax.jit(lambda v: v + 1, donate_argnums=0)(donated)
    if donated.is_deleted():  # XLA:CPU honours donation
        with pytest.raises(Exception, match="(?i)deleted"):
            mpi.allreduce(donated, op=MPI.SUM)


def test_tokens_of_both_kinds(mpi, sk, size):
    r, tok = mpi.allreduce(jnp.ones(2), op=MPI.SUM, token=sk.Token())
    assert isinstance(tok, sk.Token)
    r, tok = mpi.allreduce(r, op=MPI.SUM, token=tok)
    np.testing.assert_array_equal(r, np.full(2, size * size))
    # A JAX token eagerly (complete outside a trace): the native path, on the communicator itself; a jax.Array back.
    r, tok = mpi.allreduce(jnp.ones(2), op=MPI.SUM, token=jax.lax.create_token())
    assert isinstance(r, jax.Array) and isinstance(tok, sk.Token)
    np.testing.assert_array_equal(r, np.full(2, size))
    assert isinstance(mpi.barrier(), sk.Token)


def test_eager_calls_match_whatever_token_they_carry(mpi, sk, rank, size):
    """All eager calls of one communicator match each other: a send given a JAX token and a receive given none (before,
    the first ran on the communicator's duplicate for compiled programs and the two never met)."""
    if size < 2:
        pytest.skip("needs 2 ranks")
    comm = sk._core.make_comm(timeout=20, name="eager-tokens")
    y = jnp.arange(3.0)
    if rank == 0:
        mpi.send(y, 1, tag=4, comm=comm, token=jax.lax.create_token())
        got, _ = mpi.recv(y, 1, tag=5, comm=comm)
        np.testing.assert_array_equal(got, 2 * np.arange(3.0))
    elif rank == 1:
        got, _ = mpi.recv(y, 0, tag=4, comm=comm)
        np.testing.assert_array_equal(got, np.arange(3.0))
        mpi.send(got * 2, 0, tag=5, comm=comm, token=jax.lax.create_token())


def test_concrete_arrays_met_while_tracing_are_staged(mpi, sk, size):
    const = jnp.ones(3)
    f = jax.jit(lambda: mpi.allreduce(const, op=MPI.SUM)[0])
    np.testing.assert_array_equal(f(), np.full(3, size))  # traced: the default communicator is registered
    h = sk.jax._ops.comm_handle(None)
    seq = sk._core._jax_comm_sequence(h)
    np.testing.assert_array_equal(f(), np.full(3, size))
    assert sk._core._jax_comm_sequence(h) == seq + 1  # the compiled program ran the allreduce


def test_the_direct_route_is_available(mpi, sk):
    # jaxlib's importer and the trace probe were found: eager results do not fall back to jax.dlpack's Python layers.
    refs = sk._core._jax_hook_refs
    assert refs[5] is not None and refs[6] is not None


def test_eager_nccl_launches_wait_for_the_compiled_programs_dispatched_before(mpi, sk, monkeypatch):
    # The NCCL launch fence (collectives/launch_fence.hpp) is shardkit.jax._ops's, and it waits for the dispatched
    # programs with JAX's own barrier. The C++ side (the fence runs before an eager NCCL launch, never inside a compiled
    # program, and fixes the launch order the simulated NCCL refuses) is tests/sim/jax_cuda_handler_test.cpp's.
    mpi.allreduce(jnp.ones(1), op=MPI.SUM)  # shardkit's JAX layer activated
    assert sk._core._nccl_launch_fence is sk.jax._ops._wait_for_compiled
    waited = []
    monkeypatch.setattr(jax, "effects_barrier", lambda: waited.append(True))
    sk._core._nccl_launch_fence()
    assert waited == [True]
