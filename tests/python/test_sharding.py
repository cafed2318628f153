"""The sharding API (JAX's names) and shard_map with the axis collectives, over NumPy, JAX and Warp arrays."""

import numpy as np
import pytest

from conftest import has_module


@pytest.fixture
def line(sk, size):
    return sk.Mesh(np.arange(size), "x")  # JAX's spelling: an array of devices and a name


@pytest.fixture
def grid(sk, size):
    ny = 2 if size % 2 == 0 else 1
    return sk.Mesh((size // ny, ny), ("x", "y"))


def test_mesh_and_specs(sk, size, line):
    assert line.shape == [size] and line.axis_names == ["x"]
    P = sk.P
    assert repr(P("x", None)) == "P('x', None)"
    assert P("x") == P("x", None)
    assert list(P(("x", "y"), None)) == [("x", "y"), None]
    assert len(P()) == 0
    with pytest.raises(ValueError, match="mesh size must equal"):
        sk.Mesh((size + 1,), ("x",))
    with pytest.raises(ValueError, match="used twice"):
        sk.Mesh((1, size), ("x", "x"))
    abstract = sk._core.Mesh.abstract([4, 2], ["x", "y"])
    s = sk.NamedSharding(abstract, P("x", "y"))
    assert s.shard_shape([8, 4]) == [2, 2]
    assert sk.NamedSharding(abstract, P(("x", "y"))).shard_shape([8, 4]) == [1, 4]


def test_distribute_gather_allgather(sk, rank, size, grid):
    P = sk.P
    g = np.arange(4 * size * 6, dtype=np.float64).reshape(4 * size, 6)
    s = sk.NamedSharding(grid, P("x", "y"))
    x = sk.distribute(g, s)
    assert x.shape == g.shape and x.dtype == "float64"
    idx = s.index(list(g.shape), rank)
    np.testing.assert_array_equal(x.local, g[idx[0][0]:idx[0][1], idx[1][0]:idx[1][1]])
    with pytest.raises(ValueError):
        x.local[0, 0] = 1  # local blocks are read-only views
    np.testing.assert_array_equal(sk.process_allgather(x), g)
    gathered = sk.gather(x, root=0)
    if rank == 0:
        np.testing.assert_array_equal(gathered, g)
    else:
        assert gathered is None


def test_uneven_opt_in(sk, size, line):
    g = np.arange(2 * size + 1, dtype=np.int32)
    with pytest.raises(ValueError, match="not divisible"):
        if size > 1:
            sk.distribute(g, sk.NamedSharding(line, sk.P("x")))
        else:
            raise ValueError("not divisible (trivially true on one rank)")
    x = sk.distribute(g, sk.NamedSharding(line, sk.P("x"), uneven=True))
    np.testing.assert_array_equal(sk.process_allgather(x), g)


def test_from_local_and_reshard(sk, rank, size, grid):
    P = sk.P
    g = np.arange(2 * size * 2 * size, dtype=np.float32).reshape(2 * size, 2 * size)
    rows = sk.NamedSharding(grid, P(("x", "y")))
    block = g[2 * rank:2 * rank + 2]
    x = sk.from_local(block, g.shape, rows)
    np.testing.assert_array_equal(sk.process_allgather(x), g)
    for spec in (P(), P(None, ("x", "y")), P("y", "x"), P("x")):
        y = sk.reshard(x, sk.NamedSharding(grid, spec))
        assert y.spec == spec
        np.testing.assert_array_equal(sk.process_allgather(y), g)


def test_visualize(sk, size, grid):
    x = sk.distribute(np.zeros((2 * size, 4)), sk.NamedSharding(grid, sk.P("x")))
    text = sk.visualize_sharding(x, print_on_rank=None)
    assert "ranks" in text or "rank 0" in text
    assert "NamedSharding" in text


def test_shard_map_call_and_decorator(sk, rank, size, line):
    P = sk.P
    g = np.arange(5 * size, dtype=np.float32)
    x = sk.distribute(g, sk.NamedSharding(line, P("x")))
    y = sk.shard_map(lambda b: b * 2, mesh=line, in_specs=P("x"), out_specs=P("x"), check_rep=False)(x)
    np.testing.assert_array_equal(sk.process_allgather(y), g * 2)

    @sk.shard_map(mesh=line, in_specs=(P("x"), P()), out_specs=(P("x"), P()))
    def step(block, bias):
        return block + bias, sk.psum(block.sum(keepdims=True), "x")

    out, total = step(x, np.float32(1.0) * np.ones(1, np.float32))
    np.testing.assert_array_equal(sk.process_allgather(out), g + 1)
    np.testing.assert_array_equal(total.local, [g.sum()])


def test_axis_collectives_match_references(sk, rank, size, grid):
    P = sk.P
    nx, ny = grid.shape
    g = np.arange(nx * 2 * ny * 3, dtype=np.float64).reshape(nx * 2, ny * 3)
    x = sk.distribute(g, sk.NamedSharding(grid, P("x", "y")))

    @sk.shard_map(mesh=grid, in_specs=P("x", "y"),
                  out_specs=(P(None, "y"), P("x"), P("x", "y"), P(), P("x", "y"), P("x", "y")))
    def body(b):
        col = sk.psum(b, "x")
        row = sk.all_gather(b, "y", axis=1, tiled=True)
        ring = [(i, (i + 1) % nx) for i in range(nx)]
        shifted = sk.ppermute(b, "x", ring)
        idx = np.array([[sk.axis_index(("x", "y")), sk.axis_size(("x", "y"))]], dtype=np.float64)
        everything = sk.all_gather(idx, ("x", "y"), axis=0, tiled=True)
        mx = sk.pmax(b, ("x", "y"))
        first = sk.pbroadcast(b, "x", 0)
        return col, row, shifted, everything, mx, first

    col, row, shifted, everything, mx, first = body(x)
    blocks = g.reshape(nx, 2, ny, 3)
    np.testing.assert_array_equal(sk.process_allgather(col), blocks.sum(axis=0).reshape(2, ny * 3))
    np.testing.assert_array_equal(sk.process_allgather(row), g)
    np.testing.assert_array_equal(sk.process_allgather(shifted), np.roll(g, 2, axis=0))
    np.testing.assert_array_equal(everything.local, [[i, nx * ny] for i in range(nx * ny)])
    max_block = blocks.max(axis=(0, 2))
    np.testing.assert_array_equal(sk.process_allgather(mx), np.tile(max_block, (nx, ny)))
    np.testing.assert_array_equal(sk.process_allgather(first), np.tile(g[0:2], (nx, 1)))


def test_psum_scatter_and_all_to_all(sk, rank, size, line):
    P = sk.P
    g = np.arange(size * size * 2, dtype=np.float32).reshape(size * size, 2)
    x = sk.distribute(g, sk.NamedSharding(line, P("x")))

    @sk.shard_map(mesh=line, in_specs=P("x"), out_specs=(P("x"), P("x")))
    def body(b):
        return sk.psum_scatter(b, "x", scatter_dimension=0, tiled=True), sk.all_to_all(b, "x", 0, 0, tiled=True)

    scattered, exchanged = body(x)
    blocks = g.reshape(size, size, 2)
    np.testing.assert_array_equal(sk.process_allgather(scattered), blocks.sum(axis=0))
    np.testing.assert_array_equal(sk.process_allgather(exchanged), blocks.transpose(1, 0, 2).reshape(size * size, 2))


def test_check_rep(sk, rank, size, line):
    P = sk.P
    if size == 1:
        pytest.skip("one rank is always replicated")
    x = sk.distribute(np.arange(size, dtype=np.float32), sk.NamedSharding(line, P("x")))
    body = lambda b: b + 0  # noqa: E731
    with pytest.raises(ValueError, match="promises that output 0 is replicated"):
        sk.shard_map(body, mesh=line, in_specs=P("x"), out_specs=P())(x)
    sk.shard_map(body, mesh=line, in_specs=P("x"), out_specs=P(), check_rep=False)(x)  # no error


def test_collectives_outside_shard_map_are_refused(sk):
    with pytest.raises(ValueError, match="inside a shard_map"):
        sk.psum(np.ones(2), "x")


def test_shard_map_with_jax_and_warp_blocks(sk, size, line):
    P = sk.P
    if has_module("jax"):
        import jax
        import jax.numpy as jnp

        x = sk.distribute(jnp.arange(3.0 * size), sk.NamedSharding(line, P("x")))
        y = sk.shard_map(lambda b: b * 3, mesh=line, in_specs=P("x"), out_specs=P("x"))(x)
        full = sk.process_allgather(y)
        assert isinstance(full, jax.Array)
        np.testing.assert_array_equal(np.asarray(full), np.arange(3.0 * size) * 3)
    if has_module("warp"):
        import warp as wp

        wp.config.log_level = getattr(wp, "LOG_WARNING", 30)  # no start-up banner

        @wp.kernel
        def triple(a: wp.array(dtype=wp.float32), out: wp.array(dtype=wp.float32)):
            i = wp.tid()
            out[i] = a[i] * 3.0

        def body(b):
            out = wp.empty_like(b)
            wp.launch(triple, dim=b.shape[0], inputs=[b], outputs=[out], device="cpu")
            return out

        w = wp.array(np.arange(2.0 * size, dtype=np.float32), device="cpu")
        x = sk.distribute(w, sk.NamedSharding(line, P("x")))
        y = sk.shard_map(body, mesh=line, in_specs=P("x"), out_specs=P("x"))(x)
        full = sk.process_allgather(y)
        assert isinstance(full, wp.array)
        np.testing.assert_array_equal(full.numpy(), np.arange(2.0 * size) * 3)


def test_bad_input(sk, line):
    P = sk.P
    x = sk.distribute(np.zeros(4 * sk.size()), sk.NamedSharding(line, P("x")))
    ident = lambda b: b  # noqa: E731
    with pytest.raises(ValueError, match="unknown mesh axis 'q'"):
        sk.shard_map(ident, mesh=line, in_specs=P("q"), out_specs=P("x"))(x)
    with pytest.raises(ValueError, match="used twice|uses mesh axis 'x' twice"):
        sk.NamedSharding(line, P("x", "x"))
    with pytest.raises(ValueError, match="one in_spec per argument"):
        sk.shard_map(ident, mesh=line, in_specs=(P("x"), P()), out_specs=P("x"))(x)
    with pytest.raises(ValueError, match="has 2 entries but the array has rank 1"):
        sk.shard_map(ident, mesh=line, in_specs=P(None, "x"), out_specs=P("x"))(x)


def test_matmul_every_algorithm(sk, size, line, grid):
    P = sk.P
    m, k, n = 4 * size, 6 * size, 4 * size
    rng = np.random.default_rng(0)
    a = rng.integers(-5, 5, size=(m, k)).astype(np.float64)
    b = rng.integers(-5, 5, size=(k, n)).astype(np.float64)
    want = a @ b
    cases = [
        ("local", line, P("x", None), P()),
        ("allgather", line, P("x", None), P("x", None)),
        ("reduce_scatter", line, P(None, "x"), P("x", None)),
        ("summa", grid, P("x", "y"), P("x", "y")),
    ]
    for algorithm, mesh, sa, sb in cases:
        xa = sk.distribute(a, sk.NamedSharding(mesh, sa))
        xb = sk.distribute(b, sk.NamedSharding(mesh, sb))
        assert sk.choose_matmul_algorithm(xa, xb) == algorithm
        c = sk.matmul(xa, xb)
        np.testing.assert_array_equal(sk.process_allgather(c), want)
        # Read-only imports are never written, whatever the algorithm (a second product gives the same).
        np.testing.assert_array_equal(sk.process_allgather(sk.matmul(xa, xb, algorithm=algorithm)), want)
        for overlap in (True, False, None):
            np.testing.assert_array_equal(sk.process_allgather(sk.matmul(xa, xb, overlap=overlap)), want)
    assert sk._core.matmul_overlap_default(gpu=True) is True
    assert isinstance(sk._core.matmul_overlap_default(), bool)
    with pytest.raises(TypeError):
        sk.matmul(xa, xb, overlap="yes")
    with pytest.raises(ValueError, match="unknown matmul algorithm"):
        sk.matmul(xa, xb, algorithm="strassen")
