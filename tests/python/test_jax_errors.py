"""shardkit.mpi's errors on JAX values, each triggered eagerly and while tracing (jit, vmap): the class and the message
name the offending value. Every rank makes the same mistake, so every rank raises before anything is sent (the shape
errors that only a root checks run on MPI.COMM_SELF, where every rank is the root); mismatches between ranks are
caught by checked mode. The derivatives mpi4jax does not define raise NotImplementedError, as its do."""

import numpy as np
import pytest

from conftest import WIDE_SWEEP, require_jax

jax = require_jax()
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402

MPI = pytest.importorskip("mpi4py.MPI")


MODES = ("eager", "jit", "vmap")


def run(mode, f, x):
    """f(x) eagerly, under jax.jit, or under jax.vmap over a batch of two."""
    if mode == "jit":
        return jax.block_until_ready(jax.jit(f)(x))
    if mode == "vmap":
        return jax.vmap(f)(jnp.stack([x, x]))
    return f(x)


DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float64": np.float64,
          "complex64": np.complex64, "bool": np.bool_}
# The pairs no reduction is defined for (test_jax_ops.allowed is the complement).
REFUSED = ([(dt, red) for dt in ("float16", "bfloat16", "float32", "float64")
            for red in ("land", "lor", "lxor", "band", "bor", "bxor")]
           + [("complex64", red) for red in ("min", "max", "land", "lor", "lxor", "band", "bor", "bxor")]
           + [("bool", red) for red in ("sum", "prod", "min", "max")])
# Every refused pair at 2 ranks (WIDE_SWEEP); elsewhere (a refusal happens before anything is sent) one of each dtype.
SWEPT_REFUSED = REFUSED if WIDE_SWEEP else [next(p for p in REFUSED if p[0] == dt) for dt in DTYPES]
MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "land": MPI.LAND, "lor": MPI.LOR,
           "lxor": MPI.LXOR, "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dt,red", SWEPT_REFUSED)
@pytest.mark.parametrize("op", ["allreduce", "reduce", "scan"])
def test_refused_reduction(mpi, sk, size, op, dt, red, mode):
    x = jnp.asarray(np.ones(3, DTYPES[dt]))
    args = (MPI_OPS[red], size - 1) if op == "reduce" else (MPI_OPS[red],)
    with pytest.raises(sk.InvalidArgument, match=rf"{op}: reduction '{red}' is not defined for dtype {dt}"):
        run(mode, lambda x: getattr(mpi, op)(x, *args)[0], x)


@pytest.mark.parametrize("mode", MODES)
def test_unknown_reduction(mpi, sk, mode):
    with pytest.raises(sk.InvalidArgument, match="unknown reduction 'foo'"):
        run(mode, lambda x: mpi.allreduce(x, "foo")[0], jnp.ones(3))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bad", ["size", "-1"])
@pytest.mark.parametrize("op", ["bcast", "reduce", "gather", "scatter"])
def test_root_out_of_range(mpi, sk, size, op, bad, mode):
    root = size if bad == "size" else -1
    args = (MPI.SUM, root) if op == "reduce" else (root,)
    with pytest.raises(sk.InvalidArgument, match=rf"{op}: root {root} out of range"):
        run(mode, lambda x: getattr(mpi, op)(x, *args)[0], jnp.ones(3))


PEER_CASES = {
    "send-dest": (lambda mpi, n: lambda x: (mpi.send(x, n), x)[1], "send: destination"),
    "recv-source": (lambda mpi, n: lambda x: mpi.recv(x, n)[0], "recv: source"),
    "sendrecv-dest": (lambda mpi, n: lambda x: mpi.sendrecv(x, x, 0, n)[0], "sendrecv: destination"),
    "sendrecv-source": (lambda mpi, n: lambda x: mpi.sendrecv(x, x, n, 0)[0], "sendrecv: source"),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bad", ["size", "-2"])
@pytest.mark.parametrize("case", PEER_CASES)
def test_peer_out_of_range(mpi, sk, size, case, bad, mode):
    peer = size if bad == "size" else -2  # -1 is ANY_SOURCE
    make, what = PEER_CASES[case]
    with pytest.raises(sk.InvalidArgument, match=rf"{what} {peer} out of range"):
        run(mode, make(mpi, peer), jnp.ones(3))


TAG_CASES = {
    "send": lambda mpi: lambda x: (mpi.send(x, 0, tag=-5), x)[1],
    "recv": lambda mpi: lambda x: mpi.recv(x, 0, tag=-5)[0],
    "sendrecv-sendtag": lambda mpi: lambda x: mpi.sendrecv(x, x, 0, 0, sendtag=-5)[0],
    "sendrecv-recvtag": lambda mpi: lambda x: mpi.sendrecv(x, x, 0, 0, recvtag=-5)[0],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", TAG_CASES)
def test_tag_out_of_range(mpi, sk, case, mode):
    with pytest.raises(sk.InvalidArgument, match=r"tag -5 out of range"):
        run(mode, TAG_CASES[case](mpi), jnp.ones(3))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", ["alltoall", "scatter"])
def test_leading_axis_not_nproc(mpi, sk, op, mode):
    # On COMM_SELF every rank is the root of a one-rank communicator: every rank checks (and raises).
    args = (0,) if op == "scatter" else ()
    with pytest.raises(sk.InvalidArgument, match=rf"{op}: the input must have shape \(1, \.\.\.\), got \(2, 3\)"):
        run(mode, lambda x: getattr(mpi, op)(x, *args, comm=MPI.COMM_SELF)[0], jnp.ones((2, 3)))


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_scalar(mpi, sk, size, mode):
    with pytest.raises(sk.InvalidArgument, match=rf"alltoall: the input must have shape \({size}, \.\.\.\), got \(\)"):
        run(mode, lambda x: mpi.alltoall(x)[0], jnp.ones(()))


SAME_MESSAGE = {
    "reduction": lambda mpi, r, n: lambda x: mpi.allreduce(x.astype(jnp.complex64), MPI.MAX)[0],
    "root": lambda mpi, r, n: lambda x: mpi.bcast(x, n)[0],
    "dest": lambda mpi, r, n: lambda x: (mpi.send(x, n), x)[1],
    "source": lambda mpi, r, n: lambda x: mpi.recv(x, -2)[0],
    "tag": lambda mpi, r, n: lambda x: mpi.sendrecv(x, x, r, r, recvtag=-5)[0],
    "dtypes": lambda mpi, r, n: lambda x: mpi.sendrecv(x, x.astype(jnp.float32), r, r)[0],
    "leading": lambda mpi, r, n: lambda x: mpi.alltoall(x, comm=MPI.COMM_SELF)[0],
}


@pytest.mark.parametrize("case", sorted(SAME_MESSAGE))
def test_a_refusal_reads_the_same_in_every_mode(mpi, sk, rank, size, case):
    # The traced call is checked by the eager call's table (Communicator::check_value), bound by the same step.
    messages = set()
    for mode in MODES:
        with pytest.raises(sk.InvalidArgument) as e:
            run(mode, SAME_MESSAGE[case](mpi, rank, size), jnp.ones((2, 3)))
        messages.add(str(e.value))
    assert len(messages) == 1, messages


@pytest.mark.parametrize("mode", MODES)
def test_sendrecv_dtypes_differ(mpi, sk, rank, mode):
    with pytest.raises(sk.InvalidArgument, match="sendrecv: send dtype float64 differs from receive dtype float32"):
        run(mode, lambda x: mpi.sendrecv(x, x.astype(jnp.float32), rank, rank)[0], jnp.ones(3))


@pytest.mark.parametrize("mode", MODES)
def test_token_of_another_kind(mpi, mode):
    with pytest.raises(TypeError, match="token must be a shardkit Token(, a JAX token)? or None, not int"):
        run(mode, lambda x: mpi.allreduce(x, MPI.SUM, token=3)[0], jnp.ones(3))


def test_status_inside_a_transformation_must_be_an_mpi4py_status(mpi, rank):
    with pytest.raises(TypeError, match="status must be an mpi4py MPI.Status, not dict"):
        jax.jit(lambda x: mpi.recv(x, rank, status={})[0])(jnp.ones(3))


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_ranks_disagree_in_checked_mode(mpi, sk, rank, size, mode):
    if size == 1:
        pytest.skip("one rank cannot disagree with itself")
    checked = sk._core.make_comm(check=True, name="checked")
    f = lambda x: mpi.allreduce(x, MPI.SUM, comm=checked)[0]  # noqa: E731
    # Inside a compiled program the handler's MismatchError reaches the caller as a JaxRuntimeError naming it.
    error = sk.MismatchError if mode == "eager" else jax.errors.JaxRuntimeError
    with pytest.raises(error, match=r"ranks disagree on allreduce .* count: 3 on rank 0, 4 on ranks? 1"):
        run(mode, f, jnp.ones(3 if rank == 0 else 4))
    # Nothing was sent: the communicator still works.
    np.testing.assert_array_equal(run(mode, f, jnp.ones(2)), np.full(2, size))


@pytest.mark.parametrize("after", ["program", "barrier"])
def test_programs_after_a_failed_program_run(mpi, sk, rank, size, after):
    """A compiled program that fails after it was dispatched (every program on a GPU; on a CPU, one that XLA runs
    asynchronously, as it does this one) reports its error through its results: the next program (which takes the
    failed program's token), or a barrier first (which warns of the error, as nothing else may ever report it), then
    programs and eager calls go on. JAX alone keeps the failed token of the ordered effect and fails every later
    program, barrier and its exit handler with the same error."""
    if size == 1:
        pytest.skip("one rank cannot disagree with itself")
    checked = sk._core.make_comm(check=True, name="checked")

    def f(x, y):
        # A 16x16 product before the collective: above XLA:CPU's cost threshold (1000 flops) for running a program
        # inline, so the call returns before the program runs (JAX_CPU_ENABLE_ASYNC_DISPATCH=0 would run it inline).
        return mpi.allreduce(x + (y @ y).sum() * 0, MPI.SUM, comm=checked)[0]

    y = jnp.ones((16, 16))
    try:
        out = jax.jit(f)(jnp.ones(3 if rank == 0 else 4), y)
    except jax.errors.JaxRuntimeError:
        pytest.fail("the program failed in the call: XLA ran it synchronously (this test needs it to fail after), or an "
                    "earlier failure came back")
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"ranks disagree on allreduce .* count: 3 on rank 0"):
        jax.block_until_ready(out)
    if after == "barrier":
        with pytest.warns(RuntimeWarning, match=r"a compiled program failed: .*ranks disagree on allreduce"):
            jax.effects_barrier()
    np.testing.assert_array_equal(jax.jit(f)(jnp.ones(2), y), np.full(2, size))
    np.testing.assert_array_equal(mpi.allreduce(jnp.ones(2), MPI.SUM, comm=checked)[0], np.full(2, size))
    jax.effects_barrier()


# ---- derivatives mpi4jax does not define -----------------------------------------------------------------------------

def refused(mpi, case, rank, size):
    """(function of x, the message's pattern)."""
    root = size - 1
    if case.startswith("allreduce-"):
        red = MPI_OPS[case.split("-")[1]]
        return (lambda x: mpi.allreduce(x, red)[0]), "only defined for op=MPI.SUM"
    f = {"reduce": lambda x: mpi.reduce(x, MPI.SUM, root)[0],
         "scan": lambda x: mpi.scan(x, MPI.SUM)[0],
         "bcast": lambda x: mpi.bcast(x, root)[0],
         "allgather": lambda x: mpi.allgather(x)[0],
         "gather": lambda x: mpi.gather(x, root)[0],
         "scatter": lambda x: mpi.scatter(jnp.stack([x] * size) if rank == root else x, root)[0],
         "alltoall": lambda x: mpi.alltoall(jnp.stack([x] * size))[0],
         "recv": lambda x: mpi.recv(x, rank)[0],
         "send": lambda x: (mpi.send(x, rank), x * 2)[1]}[case]
    return f, rf"rule for '{case}' \(shardkit\) not implemented"


REFUSED_DERIVATIVES = ["allreduce-prod", "allreduce-min", "allreduce-max", "reduce", "scan", "bcast", "allgather",
                       "gather", "scatter", "alltoall", "recv", "send"]


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("transform", ["jvp", "grad", "linear_transpose"])
@pytest.mark.parametrize("case", REFUSED_DERIVATIVES)
def test_refused_derivative(mpi, rank, size, case, transform, mode):
    if case == "send" and transform == "linear_transpose":
        pytest.skip("send has no result: JAX drops it from the transposed function without asking for a rule")
    f, message = refused(mpi, case, rank, size)
    x = jnp.arange(3.0)
    g = {"jvp": lambda x: jax.jvp(f, (x,), (x,))[1],
         "grad": jax.grad(lambda x: f(x).sum()),
         "linear_transpose": lambda x: jax.linear_transpose(f, x)(jnp.zeros(jax.eval_shape(f, x).shape))[0]}[transform]
    with pytest.raises(NotImplementedError, match=message):
        run(mode, g, x)


def test_transpose_of_sendrecv_from_any_source(mpi, rank):
    with pytest.raises(NotImplementedError, match="needs a definite source"):
        jax.grad(lambda x: mpi.sendrecv(x, x, mpi.ANY_SOURCE, rank)[0].sum())(jnp.ones(3))


@pytest.mark.parametrize("fields", [0, 10, 12])
def test_handler_refuses_a_malformed_call_attribute(mpi, fields):
    """The XLA handler reads its arguments from one int64 array; a program built by hand with another length is
    refused by name (not read past its end). Local to each rank: nothing is sent."""
    from shardkit.jax import _ops

    _ops.activate()  # registers the handlers with XLA

    x = jax.device_put(jnp.arange(3.0), jax.devices("cpu")[0])  # the CPU handler also where JAX defaults to a GPU
    call = jax.ffi.ffi_call("shardkit_collective_cpu", jax.ShapeDtypeStruct(x.shape, x.dtype), has_side_effect=True)
    message = rf"shardkit\.InvalidArgument: .*attribute 'call' has {fields} values, expected 11"
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        jax.block_until_ready(jax.jit(lambda x: call(x, x, call=np.zeros(fields, np.int64)))(x))
