"""shardkit.mpi on JAX values, swept: every operation x {eager, jit, vmap, vmap inside jit} x dtypes (float16 and
bfloat16 through ml_dtypes included) x shapes (0,), (1,), (7,), (3, 5) x every reduction the dtype allows, against a
NumPy model of the operation over every rank's input (a function of the rank, so the expectations hold at any world
size); the derivatives mpi4jax defines (allreduce with SUM, sendrecv) in jvp, vjp, grad and linear_transpose against
the analytic answer, eagerly and under jit.

One program per (operation, dtype, mode) computes every reduction on every shape at once (one compilation, its results
kept here); the cases, one per (operation, dtype, reduction, mode, shape), read them, so a failure names its case
without a compilation per case. Every rank runs the same cases in the same order, so the collectives match."""

import functools

import numpy as np
import pytest

from conftest import WIDE_SWEEP, WORLD_SIZE, require_jax

jax = require_jax()
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402

MPI = pytest.importorskip("mpi4py.MPI")


DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float64": np.float64,
          "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64, "uint8": np.uint8,
          "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64, "complex64": np.complex64,
          "complex128": np.complex128, "bool": np.bool_}
FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
COMPLEX = ("complex64", "complex128")
SHAPES = {"0": (0,), "1": (1,), "7": (7,), "3x5": (3, 5)}
MODES = ("eager", "jit", "vmap", "jit_vmap")  # vmap: eager jax.vmap; jit_vmap: jax.jit(jax.vmap(...))
EAGER_VMAP_DTYPES = ("float32", "bfloat16", "int8", "uint64", "complex128", "bool")
# Every dtype at 2 ranks, the smallest exchange (WIDE_SWEEP); at 1 (no peer) and at 3 and 4 (where the rank count, not
# the dtype, is what is new) one of each kind.
SWEPT_DTYPES = tuple(DTYPES) if WIDE_SWEEP else EAGER_VMAP_DTYPES
BATCH = 2  # the vmap modes' batch size

MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "land": MPI.LAND, "lor": MPI.LOR,
           "lxor": MPI.LXOR, "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR}
UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum, "land": np.logical_and,
          "lor": np.logical_or, "lxor": np.logical_xor, "band": np.bitwise_and, "bor": np.bitwise_or,
          "bxor": np.bitwise_xor}


def allowed(red, dt):
    """The reductions shardkit (and MPI) define per dtype."""
    if red in ("sum", "prod"):
        return dt != "bool"
    if red in ("min", "max"):
        return dt != "bool" and dt not in COMPLEX
    return dt in INTS or dt == "bool"


REDUCING = ("allreduce", "reduce", "scan")
MOVING = ("bcast", "allgather", "gather", "scatter", "alltoall", "sendrecv", "send_recv")
REDUCTIONS = {dt: [red for red in MPI_OPS if allowed(red, dt)] for dt in DTYPES}
REFUSED = [(dt, red) for dt in DTYPES for red in MPI_OPS if not allowed(red, dt)]


def root_of(size):
    return size - 1  # not 0, so a root/rank mix-up shows


LOGICAL = ("land", "lor", "lxor", "band", "bor", "bxor")
# Which of ranks 0-3 hold a nonzero at an index: 0 and 15 (none, all) among any 7 consecutive entries.
NONZERO_RANKS = np.array([15, 0, 5, 10, 3, 12, 6, 9, 1, 14, 7, 8, 2, 13, 4, 11])


def kind(red, dt):
    return "logical" if red in LOGICAL or dt == "bool" else "arithmetic"


def rank_input(r, shape, dt, salt=0, red=None):
    """Rank r's data for reduction `red` (None: data movement). Arithmetic: small nonzero integers in [-3, 3] ([1, 6]
    for unsigned types: see test_integer_sum_wraps), a stride that differs per rank, so that sums and products over 4
    ranks are exact in every dtype and differ from every rank's input. Logical and bitwise: zeros where NONZERO_RANKS
    says (so that land, lor and lxor vary along the array), else 8 plus [1, 7] (a bit that band keeps)."""
    i = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    if kind(red, dt) == "logical":
        nonzero = (NONZERO_RANKS[(i - salt) % 16] >> (r % 4)) & 1
        v = (8 | ((i * (r + 1) + 2 * r) % 7 + 1)) * nonzero
        return v.astype(bool) if dt == "bool" else v.astype(DTYPES[dt])
    v = (i * (r + 1) + 2 * r + 3 * salt) % 6
    v = v + 1 if dt.startswith("uint") else np.where(v < 3, v - 3, v - 2)
    if dt in COMPLEX:
        return (v + 1j * ((i + 2 * r + salt) % 5 - 2)).astype(DTYPES[dt])
    return v.astype(np.float64).astype(DTYPES[dt]) if dt in FLOATS else v.astype(DTYPES[dt])


def op_input(op, r, size, shape, dt, salt=0, red=None):
    leading = op == "alltoall" or (op == "scatter" and r == root_of(size))
    return rank_input(r, ((size,) if leading else ()) + shape, dt, salt, red)


def combine(red, arrs):
    """The reduction over ranks, in float64 / complex128 for the floating dtypes (exact for these inputs)."""
    dt = arrs[0].dtype
    wide = np.complex128 if dt.kind == "c" else np.float64 if (dt.kind == "f" or dt == ml_dtypes.bfloat16) else None
    work = [a.astype(wide) for a in arrs] if wide else arrs
    return functools.reduce(UFUNCS[red], work).astype(dt)


def reference(op, r, size, xs, red):
    """What rank r gets from `op` (reduction `red`) given every rank's input xs."""
    root = root_of(size)
    if op == "allreduce":
        return combine(red, xs)
    if op == "reduce":
        return combine(red, xs) if r == root else xs[r]
    if op == "scan":
        return combine(red, xs[: r + 1])
    if op == "bcast":
        return xs[root]
    if op == "allgather":
        return np.stack(xs)
    if op == "gather":
        return np.stack(xs) if r == root else xs[r]
    if op == "scatter":
        return xs[root][r]
    if op == "alltoall":
        return np.stack([x[r] for x in xs])
    if op in ("sendrecv", "send_recv"):
        return xs[(r - 1) % size]
    raise AssertionError(op)


def zeros_like(x):
    """The receive template: batched like x under vmap (jnp.zeros_like's result is not: an unbatched template receives
    one message for the whole batch); eagerly made from NumPy (jnp.zeros_like would compile a program per shape)."""
    if isinstance(x, jax.core.Tracer):
        return jnp.where(False, x, jnp.zeros((), x.dtype))
    return jnp.asarray(np.zeros(x.shape, x.dtype))


def call(mpi, op, x, red, rank, size):
    """Rank `rank`'s call of `op` in the mpi4jax API; returns the value."""
    root = root_of(size)
    if op in ("allreduce", "scan"):
        return getattr(mpi, op)(x, MPI_OPS[red])[0]
    if op == "reduce":
        return mpi.reduce(x, MPI_OPS[red], root)[0]
    if op in ("bcast", "gather", "scatter"):
        return getattr(mpi, op)(x, root)[0]
    if op in ("allgather", "alltoall"):
        return getattr(mpi, op)(x)[0]
    if op == "sendrecv":  # a ring: from rank - 1, to rank + 1
        return mpi.sendrecv(x, zeros_like(x), (rank - 1) % size, (rank + 1) % size)[0]
    if op == "send_recv":  # the same ring by send and recv: rank 0 sends first, the others receive first
        if rank == 0:
            token = mpi.send(x, 1)
            return mpi.recv(zeros_like(x), size - 1, token=token)[0]
        y, token = mpi.recv(zeros_like(x), rank - 1)
        mpi.send(x, (rank + 1) % size, token=token)
        return y
    raise AssertionError(op)


_results = {}


def results(mpi, op, dt, mode, rank, size):
    """{(reduction, shape id): (got, want)} for one program: every reduction of `dt` on every shape. Kept, with the
    exception it raised if it did, for the cases that read it."""
    key = (op, dt, mode)
    if key not in _results:
        try:
            _results[key] = _run(mpi, op, dt, mode, rank, size)
        except Exception as e:  # noqa: BLE001  (each of the group's cases raises it again)
            _results[key] = e
    if isinstance(_results[key], Exception):
        raise _results[key]
    return _results[key]


def _run(mpi, op, dt, mode, rank, size):
    reds = REDUCTIONS[dt] if op in REDUCING else [None]
    cases = [(red, s) for red in reds for s in SHAPES]
    batched = mode in ("vmap", "jit_vmap")
    salts = range(BATCH) if batched else [0]
    # Every rank's input per (kind of reduction, shape): a list over ranks of (batch, *shape) arrays, or *shape ones.
    inputs = {}
    for red, s in cases:
        k = (kind(red, dt), s)
        if k not in inputs:
            v = [np.stack([op_input(op, r, size, SHAPES[s], dt, b, red) for b in salts]) for r in range(size)]
            inputs[k] = v if batched else [x[0] for x in v]
    want = {}
    for red, s in cases:
        xs = inputs[kind(red, dt), s]
        if batched:
            want[red, s] = np.stack([reference(op, rank, size, [x[b] for x in xs], red) for b in salts])
        else:
            want[red, s] = reference(op, rank, size, xs, red)

    keys = list(inputs)
    local = [jnp.asarray(inputs[k][rank]) for k in keys]

    def program(*args):
        return [call(mpi, op, args[keys.index((kind(red, dt), s))], red, rank, size) for red, s in cases]

    if mode == "eager":
        got = program(*local)
    elif mode == "jit":
        got = jax.jit(program)(*local)
    elif mode == "vmap":
        got = jax.vmap(program)(*local)
    else:
        got = jax.jit(jax.vmap(program))(*local)
    return {c: (g, want[c]) for c, g in zip(cases, got)}


def check(got, want):
    assert isinstance(got, jax.Array), type(got)
    got = np.asarray(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    # Exact in every dtype: the inputs are small integers whose sums and products over 4 ranks every
    # dtype represents exactly, so any rounding difference is an error.
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
    else:
        wide = np.complex128 if want.dtype.kind == "c" else np.float64
        np.testing.assert_array_equal(got.astype(wide), want.astype(wide))


def skip_ring_at_one_rank(op, size):
    if op == "send_recv" and size < 2:
        pytest.skip("a blocking send to itself: needs 2 ranks")


def modes(dt):
    # Eager vmap runs each batched primitive as its own compiled program (one compilation per operation, shape and
    # reduction): there, one dtype of each kind (float32 and bfloat16, a narrow signed and a wide unsigned integer,
    # complex, bool); the batching rules are the same inside jit, where every dtype goes.
    # At 3 and 4 ranks the batching rules run inside jit only (jit_vmap: a batch of 2 against 3 or 4 ranks, so an
    # exchange of the two axes shows there).
    return MODES if dt in EAGER_VMAP_DTYPES and WORLD_SIZE <= 2 else tuple(m for m in MODES if m != "vmap")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dt,red,mode",
                         [(dt, red, m) for dt in SWEPT_DTYPES for red in REDUCTIONS[dt] for m in modes(dt)])
@pytest.mark.parametrize("op", REDUCING)
def test_reductions(mpi, rank, size, op, dt, red, mode, shape):
    got, want = results(mpi, op, dt, mode, rank, size)[red, shape]
    check(got, want)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dt,mode", [(dt, m) for dt in SWEPT_DTYPES for m in modes(dt)])
@pytest.mark.parametrize("op", MOVING)
def test_data_movement(mpi, rank, size, op, dt, mode, shape):
    skip_ring_at_one_rank(op, size)
    got, want = results(mpi, op, dt, mode, rank, size)[None, shape]
    check(got, want)


# ---- derivatives: allreduce with SUM and sendrecv, as mpi4jax defines them ------------------------------------------

# Every dtype mpi4jax differentiates at 2 ranks; elsewhere one of each width and kind (the rank count is what is new).
DIFF_DTYPES = (("float16", "bfloat16", "float32", "float64", "complex64") if WIDE_SWEEP
               else ("bfloat16", "float64", "complex64"))
TRANSFORMS = ("jvp", "vjp", "linear_transpose", "grad")
_derivs = {}


def derivative_results(mpi, op, dt, mode, rank, size):
    key = (op, dt, mode)
    if key not in _derivs:
        try:
            _derivs[key] = _run_derivatives(mpi, op, dt, mode, rank, size)
        except Exception as e:  # noqa: BLE001
            _derivs[key] = e
    if isinstance(_derivs[key], Exception):
        raise _derivs[key]
    return _derivs[key]


def _run_derivatives(mpi, op, dt, mode, rank, size):
    src, dst = (rank - 1) % size, (rank + 1) % size
    if op == "allreduce":
        f = lambda x: mpi.allreduce(x, MPI.SUM)[0]  # noqa: E731
        value = lambda vs: combine("sum", vs)  # noqa: E731
        tangent = lambda ts: combine("sum", ts)  # noqa: E731
        adjoint = lambda cs: cs[rank]  # mpi4jax: the transpose of the sum over ranks is the identity  # noqa: E731
    else:
        f = lambda x: mpi.sendrecv(x, zeros_like(x), src, dst)[0]  # noqa: E731
        value = tangent = lambda vs: vs[src]  # noqa: E731
        adjoint = lambda cs: cs[dst]  # the reverse exchange  # noqa: E731
    shapes = list(SHAPES.values())
    xs = [[rank_input(r, s, dt) for r in range(size)] for s in shapes]
    ts = [[rank_input(r, s, dt, salt=1) for r in range(size)] for s in shapes]
    cs = [[rank_input(r, s, dt, salt=2) for r in range(size)] for s in shapes]
    real = dt != "complex64"

    def program(xl, tl, cl):
        out = []
        for x, t, c in zip(xl, tl, cl):
            y, dy = jax.jvp(f, (x,), (t,))
            (vj,) = jax.vjp(f, x)[1](c)
            (tr,) = jax.linear_transpose(f, x)(c)
            # the cotangent c on the received / reduced value: d/dx sum(c * f(x))
            gr = jax.grad(lambda x, c=c: (f(x) * c).sum())(x) if real else vj
            out.append((y, dy, vj, tr, gr))
        return out

    args = ([jnp.asarray(v[rank]) for v in xs], [jnp.asarray(v[rank]) for v in ts], [jnp.asarray(v[rank]) for v in cs])
    got = (jax.jit(program) if mode == "jit" else program)(*args)
    res = {}
    for s, g, x, t, c in zip(SHAPES, got, xs, ts, cs):
        res["jvp", s] = ((g[0], value(x)), (g[1], tangent(t)))
        res["vjp", s] = ((g[2], adjoint(c)),)
        res["linear_transpose", s] = ((g[3], adjoint(c)),)
        res["grad", s] = ((g[4], adjoint(c)),)
    return res


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("dt,mode", [(dt, m) for dt in DIFF_DTYPES for m in ("jit", "eager")])
@pytest.mark.parametrize("op", ["allreduce", "sendrecv"])
def test_derivatives(mpi, rank, size, op, dt, mode, transform, shape):
    if transform == "grad" and dt == "complex64":
        pytest.skip("jax.grad needs a real input (vjp covers complex64)")
    for got, want in derivative_results(mpi, op, dt, mode, rank, size)[transform, shape]:
        check(got, want)


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("dt", ["int8", "uint8", "int16", "uint16", "int32"])
def test_integer_sum_wraps(mpi, rank, size, dt, mode):
    # Sums past the dtype's range wrap around (as NumPy's and C's do), over a length past any SIMD width: Open MPI
    # 4.1's own MPI_SUM saturates 8- and 16-bit integers there (open-mpi/ompi#8045), shardkit's must not.
    top = np.iinfo(dt).max
    x = np.full(67, top - rank, dt)
    want = np.sum([np.full(67, top - r, np.int64) for r in range(size)], axis=0).astype(dt)
    got = (jax.jit if mode == "jit" else lambda f: f)(lambda x: mpi.allreduce(x, MPI.SUM)[0])(jnp.asarray(x))
    check(got, want)


# (a, b) whose exact sum or product lies between two 16-bit values, or halfway between them (ties go to the even one).
HALF_CASES = {
    "float16": {"sum": [(2.0, 3 * 2**-11), (2.0, 2**-10), (2.001953125, 2**-10), (-2.0, -3 * 2**-11), (1000.0, 0.3)],
                "prod": [(0.7, 1.9), (1 + 3 * 2**-10, 1.5), (3.0, 1 + 2**-10)]},
    "bfloat16": {"sum": [(0.1, 0.2), (1.0, 2**-8), (1.0078125, 2**-8), (-1.0, -3 * 2**-9)],
                 "prod": [(0.7, 1.9), (1 + 3 * 2**-7, 1.5), (3.0, 1 + 2**-7)]},
}


def transformed(f, mode):
    """f as `mode` runs it: eager, jit, vmap or jit of vmap (the batched forms over a batch of two equal rows)."""
    if mode == "eager":
        return f
    if mode == "jit":
        return jax.jit(f)
    batched = jax.vmap(f) if mode == "vmap" else jax.jit(jax.vmap(f))
    return lambda x: batched(jnp.stack([x, x]))[1]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("red", ["sum", "prod"])
@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_half_reductions_round_to_nearest_even(mpi, rank, size, dt, red, mode):
    # Two ranks hold a and b (every pair of positions), the others the identity, so the order of reduction cannot
    # matter: the result is the exact a (op) b, computed in float32, rounded once by NumPy / ml_dtypes. Compared bit for
    # bit (the sweep's inputs are exact in 16 bits, which rounding toward zero would pass).
    if size < 2:
        pytest.skip("a reduction over one rank rounds nothing")
    t = DTYPES[dt]
    pairs = [(i, j) for i in range(size) for j in range(i + 1, size)]
    cases = [(t(a), t(b), i, j) for a, b in HALF_CASES[dt][red] for i, j in pairs]
    identity = t(0) if red == "sum" else t(1)
    x = np.array([a if rank == i else b if rank == j else identity for a, b, i, j in cases], t)
    exact = np.array([UFUNCS[red](np.float32(a), np.float32(b)) for a, b, _, _ in cases], np.float32)
    want = exact.astype(t)
    assert not np.array_equal(want.astype(np.float32), exact), "every case must need rounding somewhere"
    f = lambda v: mpi.allreduce(v, MPI_OPS[red])[0]  # noqa: E731
    got = np.asarray(transformed(f, mode)(jnp.asarray(x)))
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dt", FLOATS)
def test_nan_propagates_from_every_rank(mpi, rank, size, dt, mode):
    # Element k < size: a NaN on rank k only; element size: none; element size + 1: NaN on every rank. max, min, sum and
    # prod are NaN wherever a rank holds one, as NumPy's maximum/minimum and JAX's pmax/pmin give.
    t = DTYPES[dt]

    def held(r):
        v = np.full(size + 2, 1 + r, np.float64)
        v[r] = v[size + 1] = np.nan
        return v.astype(t)

    xs = [held(r) for r in range(size)]
    for red in ("max", "min", "sum", "prod"):
        want = functools.reduce(UFUNCS[red], [x.astype(np.float64) for x in xs]).astype(t)
        f = lambda v, red=red: mpi.allreduce(v, MPI_OPS[red])[0]  # noqa: E731
        got = np.asarray(transformed(f, mode)(jnp.asarray(xs[rank])))
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64), err_msg=red)


@pytest.mark.parametrize("mode", ["eager", "jit", "vmap", "jit_vmap"])
def test_barrier(mpi, sk, rank, size, mode):
    # barrier returns only a token; inside a program it runs though nothing uses that token (one more collective
    # on the compiled programs' communicator per call).
    f = lambda x: (mpi.barrier(), x + 1)[1]  # noqa: E731
    x = jnp.arange(3.0)
    if mode == "eager":
        assert isinstance(mpi.barrier(), sk.Token)
        return
    g = {"jit": jax.jit(f), "vmap": jax.vmap(f), "jit_vmap": jax.jit(jax.vmap(f))}[mode]
    xb = x if mode == "jit" else jnp.stack([x, x])
    jax.block_until_ready(g(xb))  # traced (the default communicator is registered)
    h = sk.jax._ops.comm_handle(None)
    seq = sk._core._jax_comm_sequence(h)
    np.testing.assert_array_equal(g(xb), np.asarray(xb) + 1)
    assert sk._core._jax_comm_sequence(h) == seq + 1
