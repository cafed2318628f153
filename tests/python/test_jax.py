"""shardkit.mpi on JAX values beyond the sweeps (test_jax_ops.py: every operation, mode, dtype and derivative;
test_jax_errors.py: each error): vmap on a non-leading axis, inside lax loops, cond, custom_vjp and cg; ordering under
jit and vmap (programs whose ranks issue operations in different orders, with messages past the eager limit, so that a
reordered or dropped operation deadlocks and checked mode's timeout turns that into a failure); tokens.

Expected values are functions of the rank, so they hold at any world size."""

import numpy as np
import pytest

from conftest import require_jax

jax = require_jax()
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402

MPI = pytest.importorskip("mpi4py.MPI")


ROOT_OF = lambda size: size - 1  # noqa: E731  (not 0, so a root/rank mix-up shows)


def rank_input(op, r, size, n, dtype, shift=0):
    """Rank r's x for `op`: small integers (exact in float16 / bfloat16 sums over 4 ranks)."""
    leading = op in ("alltoall",) or (op == "scatter" and r == ROOT_OF(size))
    shape = (size, n) if leading else (n,)
    v = np.arange(int(np.prod(shape))).reshape(shape) % 7 + 3 * r + 1 + shift
    return v.astype(dtype)


def check(got, want):
    got = np.asarray(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got.astype(np.float64) if want.dtype == ml_dtypes.bfloat16 else got,
                                  want.astype(np.float64) if want.dtype == ml_dtypes.bfloat16 else want)


def test_vmap_batch_axis_not_leading(mpi, rank, size):
    xb = [np.stack([rank_input("allgather", r, size, 4, np.float32, b) for b in range(2)], axis=1) for r in range(size)]
    got = jax.vmap(lambda x: mpi.allgather(x)[0], in_axes=1, out_axes=1)(jnp.asarray(xb[rank]))
    want = np.stack([np.stack([x[:, b] for x in xb]) for b in range(2)], axis=1)
    check(got, want)


@pytest.mark.parametrize("mode", ["eager", "jit", "vmap"])
def test_sendrecv_ring(mpi, rank, size, mode):
    src, dst = (rank - 1) % size, (rank + 1) % size
    f = lambda x: mpi.sendrecv(x, x, src, dst)[0]  # noqa: E731
    x = jnp.arange(5.0) + 10 * rank
    if mode == "vmap":
        got = jax.vmap(f)(jnp.stack([x, x + 1]))
        want = np.stack([np.arange(5.0) + 10 * src, np.arange(5.0) + 10 * src + 1])
    else:
        got = (jax.jit(f) if mode == "jit" else f)(x)
        want = np.arange(5.0) + 10 * src
    np.testing.assert_array_equal(got, want)


def test_hot_potato_ring_under_jit_without_tokens(mpi, rank, size):
    # Rank 0 sends then receives; the others receive then send. Reordered, the ring would deadlock.
    if size < 2:
        pytest.skip("needs 2 ranks")

    @jax.jit
    def ring(x):
        if rank == 0:
            mpi.send(x, 1)
            y, _ = mpi.recv(x, size - 1)
        else:
            y, _ = mpi.recv(x, rank - 1)
            mpi.send(y + 1, (rank + 1) % size)
        return y

    got = ring(jnp.zeros(3))
    np.testing.assert_array_equal(got, np.full(3, size - 1 if rank == 0 else rank - 1))


def test_tokens_chain_send_recv_and_accept_both_kinds(mpi, sk, rank, size):
    if size < 2:
        pytest.skip("needs 2 ranks")

    @jax.jit
    def chain(x):
        tok = jax.lax.create_token()
        if rank == 0:
            tok = mpi.send(x, 1, token=tok)
            y, tok = mpi.recv(x, 1, token=tok)
        elif rank == 1:
            y, tok = mpi.recv(x, 0, token=tok)
            tok = mpi.send(y * 2, 0, token=tok)
        else:
            y = x
        return y

    got = chain(jnp.ones(2))
    np.testing.assert_array_equal(got, np.full(2, 2.0 if rank == 0 else 1.0))
    r, tok = mpi.allreduce(jnp.ones(2), op=MPI.SUM, token=sk.Token())  # a shardkit token, eagerly
    r2, _ = mpi.allreduce(r, op=MPI.SUM, token=tok)
    np.testing.assert_array_equal(r2, np.full(2, size * size))


LARGE = 1 << 18  # float32 elements: 1 MiB, past MPI's eager limits, so that a send waits for its receive


@pytest.mark.parametrize("mode", ["eager", "jit", "vmap"])
def test_ring_of_large_messages_keeps_program_order(mpi, rank, size, mode):
    # Rank 0 sends, then receives; the others receive, then send. What a rank sends does not depend on what it
    # received, so only program order keeps the ring from deadlocking (every rank sending first).
    if size < 2:
        pytest.skip("needs 2 ranks")

    def ring(x):
        like = jnp.where(False, x, 0.0)  # the receive template, batched like x under vmap
        if rank == 0:
            mpi.send(x, 1)
            return mpi.recv(like, size - 1)[0]
        y, _ = mpi.recv(like, rank - 1)
        mpi.send(x, (rank + 1) % size)
        return y

    x = jnp.full(LARGE, float(rank), jnp.float32)
    want = np.full(LARGE, float((rank - 1) % size), np.float32)
    if mode == "vmap":
        got = jax.vmap(ring)(jnp.stack([x, x + 10]))
        want = np.stack([want, want + 10])
    else:
        got = (jax.jit(ring) if mode == "jit" else ring)(x)
    np.testing.assert_array_equal(got, want)


def test_order_chosen_inside_cond(mpi, rank, size):
    # Pairs (0, 1), (2, 3): the even rank sends first, the odd one receives first; lax.switch picks the order from a
    # traced value, so both orders are in every rank's program. An unpaired last rank takes the third branch.
    partner = rank ^ 1 if (rank ^ 1) < size else 0

    def send_first(x):
        mpi.send(x, partner)
        return mpi.recv(x, partner)[0]

    def recv_first(x):
        y, _ = mpi.recv(x, partner)
        mpi.send(x, partner)
        return y

    f = jax.jit(lambda i, x: jax.lax.switch(i, [send_first, recv_first, lambda x: x], x))
    branch = rank % 2 if (rank ^ 1) < size else 2
    got = f(branch, jnp.full(LARGE, float(rank), jnp.float32))
    np.testing.assert_array_equal(got, np.full(LARGE, float(partner if branch < 2 else rank), np.float32))


def test_unused_results_still_communicate(mpi, rank, size):
    # Programs that drop a send's token or a received value still run them. A dropped send would leave its receiver
    # waiting (a timeout); a dropped receive would leave the 5s pending, to be read by the second exchange instead of
    # the 7s (or leave the large send waiting).
    if size < 2:
        pytest.skip("needs 2 ranks")
    like = jnp.zeros(LARGE, jnp.float32)
    if rank == 0:
        jax.jit(lambda x: (mpi.send(x, 1), x * 2)[1])(jnp.full(LARGE, 5.0, jnp.float32))
        got = jax.jit(lambda x: mpi.recv(x, 1)[0])(like)
        np.testing.assert_array_equal(got, np.full(LARGE, 7.0, np.float32))
    elif rank == 1:
        jax.block_until_ready(jax.jit(lambda x: (mpi.recv(x, 0), x * 2)[1])(like))
        jax.block_until_ready(jax.jit(lambda x: (mpi.send(x, 0), x * 2)[1])(jnp.full(LARGE, 7.0, jnp.float32)))


def test_compiled_and_eager_calls_interleave(mpi, size):
    # A compiled call is dispatched asynchronously; eager calls on the same communicator meanwhile do not match it.
    f = jax.jit(lambda x: mpi.allreduce(x, MPI.SUM)[0])
    x = jnp.ones(1000, jnp.float32)
    a = f(x)
    b, _ = mpi.allreduce(x * 2, MPI.SUM)
    c = f(x * 3)
    d, _ = mpi.bcast(x * 4, size - 1)
    for got, k in ((a, 1), (b, 2), (c, 3)):
        np.testing.assert_array_equal(got, np.full(1000, k * size, np.float32))
    np.testing.assert_array_equal(d, np.full(1000, 4.0, np.float32))


def test_unused_result_still_runs(mpi, sk, size):
    f = jax.jit(lambda x: (mpi.allreduce(x, op=MPI.SUM), x * 2)[1])
    jax.block_until_ready(f(jnp.ones(3)))  # traced: the default communicator is registered
    h = sk.jax._ops.comm_handle(None)
    seq = sk._core._jax_comm_sequence(h)
    jax.block_until_ready(f(jnp.ones(3)))
    assert sk._core._jax_comm_sequence(h) == seq + 1


def test_allreduce_jvp_grad_vjp_transpose(mpi, rank, size):
    x = jnp.arange(4.0) + rank
    f = lambda x: mpi.allreduce(x, op=MPI.SUM)[0]  # noqa: E731
    y, t = jax.jvp(f, (x,), (jnp.ones(4) * (rank + 1),))
    np.testing.assert_array_equal(y, np.arange(4.0) * size + size * (size - 1) / 2)
    np.testing.assert_array_equal(t, np.full(4, size * (size + 1) / 2))
    # mpi4jax's convention: the transpose of the sum over ranks is the identity on each rank.
    g = jax.jit(jax.grad(lambda x: (f(x * x)).sum()))(x)
    np.testing.assert_array_equal(g, 2 * np.asarray(x))
    _, vjp = jax.vjp(f, x)
    np.testing.assert_array_equal(vjp(jnp.full(4, 3.0))[0], np.full(4, 3.0))
    (ct,) = jax.linear_transpose(f, x)(jnp.full(4, 5.0))
    np.testing.assert_array_equal(ct, np.full(4, 5.0))


def test_sendrecv_grad_is_the_reverse_exchange(mpi, rank, size):
    src, dst = (rank - 1) % size, (rank + 1) % size
    x = jnp.arange(3.0) + rank
    w = jnp.arange(3.0) + 100 * rank  # the cotangent each rank applies to what it received
    g = jax.grad(lambda x: (mpi.sendrecv(x, x, src, dst)[0] * w).sum())(x)
    # d/dx_r sum_s w_s * x_{s-1} = w_{r+1}
    np.testing.assert_array_equal(g, np.arange(3.0) + 100 * dst)


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_sendrecv_grad_with_a_send_tag_received_with_any_tag(mpi, rank, size, mode):
    # The reverse exchange sends the cotangent back with the tag the value came with; received with ANY_TAG, that is
    # the sender's send tag (the same on every rank). It went back with tag 0, and the peer waited for tag 5 forever.
    src, dst = (rank - 1) % size, (rank + 1) % size
    x = jnp.arange(3.0) + rank
    w = jnp.arange(3.0) + 100 * rank
    f = lambda x: (mpi.sendrecv(x, x, src, dst, sendtag=5)[0] * w).sum()  # noqa: E731
    g = (jax.jit if mode == "jit" else lambda h: h)(jax.grad(f))(x)
    np.testing.assert_array_equal(g, np.arange(3.0) + 100 * dst)


def test_numpy_calls_inside_a_trace_take_the_host_path_and_traced_buffers_are_staged(mpi, sk, rank, size):
    # NumPy arrays are the mpi4py-like host path also while JAX traces: the call runs when traced, returns NumPy, and
    # can size the program (static shapes).
    f = jax.jit(lambda v: v + jnp.zeros(int(mpi.allreduce(np.ones(1, np.int64), op=MPI.SUM)[0][0])))
    np.testing.assert_array_equal(f(jnp.ones(size)), np.ones(size))
    # A call with a traced buffer is staged, a NumPy buffer beside it a constant of the program: sendrecv with a NumPy
    # send buffer and a traced receive template runs at every call (it was sent down the host path on the tracer).
    src, dst = (rank - 1) % size, (rank + 1) % size
    fn = lambda t: mpi.sendrecv(np.full(2, float(rank)), t, src, dst)[0]  # noqa: E731
    assert "op=sendrecv" in str(jax.make_jaxpr(fn)(jnp.zeros(2)))  # one operation of the program
    np.testing.assert_array_equal(jax.jit(fn)(jnp.zeros(2)), np.full(2, float(src)))


@pytest.mark.parametrize("mode", ["jit", "vmap"])
@pytest.mark.parametrize("op", ["recv", "sendrecv"])
def test_status_is_filled_when_the_compiled_program_runs(mpi, rank, size, op, mode):
    """As mpi4jax: a Status given inside jax.jit (or vmap) is filled by the receive each time the program runs."""
    src, dst = (rank - 1) % size, (rank + 1) % size
    status = MPI.Status()

    def f(x):
        if op == "sendrecv":
            return mpi.sendrecv(x + rank, x, src, dst, sendtag=3 + rank, status=status)[0]
        tok = mpi.send(x + rank, dst, tag=3 + rank)
        return mpi.recv(x, src, status=status, token=tok)[0]

    g = jax.jit(f) if mode == "jit" else jax.vmap(f)
    x = jnp.zeros(3, jnp.float32) if mode == "jit" else jnp.zeros((2, 3), jnp.float32)
    for _ in range(2):  # filled at every run, not once when traced
        status.Set_source(-5)
        status.Set_tag(-5)
        got = g(x)
        np.testing.assert_array_equal(got, np.full(x.shape, float(src)))
        assert (status.Get_source(), status.Get_tag()) == (src, 3 + src)
        assert status.Get_count(MPI.FLOAT) == x.size  # under vmap the batch travels as one message


def test_eager_call_with_a_jax_token_and_a_status(mpi, rank, size):
    src, dst = (rank - 1) % size, (rank + 1) % size
    status = MPI.Status()
    got, _ = mpi.sendrecv(jnp.full(2, float(rank)), jnp.zeros(2), src, dst, sendtag=3, recvtag=3, status=status,
                          token=jax.lax.create_token())
    np.testing.assert_array_equal(got, np.full(2, float(src)))
    assert (status.Get_source(), status.Get_tag()) == (src, 3)


def test_a_jitted_function_reused_under_another_mesh_is_traced_again(sk, rank, size):
    # A jit-compiled body resolves its axis names to the mesh's communicators when traced: the mesh is part of
    # jax.jit's cache key, so under another mesh the same function is traced again (it kept the first mesh's).
    body = jax.jit(lambda b: sk.psum(b, "x"))
    wide = sk.Mesh((size,), ("x",))  # "x" spans every rank
    narrow = sk.Mesh((1, size), ("x", "y"))  # "x" has one rank
    xs = np.arange(size, dtype=np.float64).reshape(size, 1) + 1

    def run(mesh, spec, fn, outer_jit):
        sm = sk.shard_map(fn, mesh=mesh, in_specs=(spec,), out_specs=spec, check_vma=False)
        out = jax.jit(sm)(jnp.asarray(xs)) if outer_jit else sm(xs)
        return np.asarray(sk.process_allgather(out)).ravel()

    for outer_jit in (False, True):  # an eager shard_map's body, and a body inlined into a jitted shard_map
        np.testing.assert_array_equal(run(wide, sk.P("x"), body, outer_jit), np.full(size, size * (size + 1) / 2))
        np.testing.assert_array_equal(run(narrow, sk.P("y"), body, outer_jit), xs.ravel())
        np.testing.assert_array_equal(run(wide, sk.P("x"), body, outer_jit), np.full(size, size * (size + 1) / 2))


def test_inside_loops_custom_vjp_and_cg(mpi, rank, size):
    f = lambda x: mpi.allreduce(x, op=MPI.SUM)[0]  # noqa: E731
    x = jnp.ones(3) * (rank + 1)
    got = jax.jit(lambda x: jax.lax.fori_loop(0, 3, lambda i, v: f(v) / size, x))(x)
    np.testing.assert_allclose(got, np.full(3, (size + 1) / 2))
    got, _ = jax.lax.scan(lambda c, _: (f(c), None), x, None, length=2)
    np.testing.assert_allclose(got, np.full(3, size * size * (size + 1) / 2))
    got = jax.lax.while_loop(lambda v: v[0] < 100, lambda v: f(v) + 1, x)
    assert float(got[0]) >= 100

    @jax.custom_vjp
    def g(x):
        return f(x)

    g.defvjp(lambda x: (f(x), None), lambda _, ct: (f(ct),))
    np.testing.assert_allclose(jax.grad(lambda x: g(x).sum())(x), np.full(3, size))

    # A replicated SPD system A = sum_r D_r (diagonal, D_r owned by rank r): local inner products are global ones.
    n = 6
    d = lambda r: np.arange(n) + r + 1.0  # noqa: E731
    b = jnp.arange(n) + 1.0
    sol, _ = jax.jit(lambda b: jax.scipy.sparse.linalg.cg(lambda v: f(jnp.asarray(d(rank)) * v), b, tol=1e-12))(b)
    np.testing.assert_allclose(sol, np.asarray(b) / sum(d(r) for r in range(size)), rtol=1e-10)


def test_numpy_inputs_stay_on_the_native_path(mpi, size):
    r, tok = mpi.allreduce(np.ones(3), op=MPI.SUM)
    assert type(r) is np.ndarray and isinstance(tok, mpi.Token)
    np.testing.assert_array_equal(r, np.full(3, size))


def test_compiled_operations_of_mixed_shapes_and_dtypes(mpi, rank, size):
    # The handler re-points its per-thread views when an operand's layout repeats (a few per operand position): five
    # layouts in one program and in a loop, more than it keeps, so every view is rebuilt, re-used and replaced, and
    # check every value.
    src, dst = (rank - 1) % size, (rank + 1) % size

    @jax.jit
    def f(a, b, c, d, e):
        def body(i, carry):
            a, b, c, d, e = carry
            a = mpi.allreduce(a, op=MPI.SUM)[0] / size
            b = mpi.allgather(b)[0][rank] + 1
            c = mpi.sendrecv(c, c, src, dst)[0]
            d = mpi.allreduce(d, op=MPI.MAX)[0]
            e = mpi.allreduce(e, op=MPI.PROD)[0] - factorial + rank + 1  # back to rank + 1
            a = mpi.allreduce(a, op=MPI.SUM)[0] / size
            return a, b, c, d, e

        return jax.lax.fori_loop(0, size, body, (a, b, c, d, e))

    a = jnp.arange(3.0, dtype=jnp.float32) + rank
    b = jnp.arange(5, dtype=jnp.int64).reshape(5, 1) + rank
    c = jnp.full((2, 2), rank, dtype=jnp.float64)
    d = jnp.arange(7.0, dtype=jnp.float32) * (rank + 1)
    e = jnp.full((3,), rank + 1, dtype=jnp.int32)  # the dims of a, another dtype
    factorial = int(np.prod(np.arange(1, size + 1)))
    for _ in range(2):
        ga, gb, gc, gd, ge = f(a, b, c, d, e)
        np.testing.assert_allclose(ga, np.arange(3.0) + (size - 1) / 2, rtol=1e-6)
        np.testing.assert_array_equal(gb, np.arange(5).reshape(5, 1) + rank + size)
        np.testing.assert_array_equal(gc, np.full((2, 2), rank))  # size hops around the ring
        np.testing.assert_array_equal(gd, np.arange(7.0) * size)
        np.testing.assert_array_equal(ge, np.full((3,), rank + 1))


def test_jax_internals_are_used_in_one_module_only():
    """Every use of JAX's private modules sits in shardkit/jax/_compat.py, where the supported versions differ."""
    import pathlib

    import shardkit

    package = pathlib.Path(shardkit.__file__).parent
    compat = package / "jax" / "_compat.py"
    users = sorted(str(f.relative_to(package)) for f in package.rglob("*.py")
                   if "jax._src" in f.read_text() and f != compat)
    assert users == []
    assert "jax._src" in compat.read_text()
