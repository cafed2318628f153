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
    with pytest.raises(sk.InvalidArgument, match="mesh size must equal"):
        sk.Mesh((size + 1,), ("x",))
    with pytest.raises(sk.InvalidArgument, match="used twice"):
        sk.Mesh((1, size), ("x", "x"))
    abstract = sk._core.Mesh.abstract([4, 2], ["x", "y"])
    s = sk.NamedSharding(abstract, P("x", "y"))
    assert s.shard_shape([8, 4]) == (2, 2)  # a tuple, as JAX's
    assert sk.NamedSharding(abstract, P(("x", "y"))).shard_shape([8, 4]) == (1, 4)


def test_distribute_gather_allgather(sk, rank, size, grid):
    P = sk.P
    g = np.arange(4 * size * 6, dtype=np.float64).reshape(4 * size, 6)
    s = sk.NamedSharding(grid, P("x", "y"))
    x = sk.distribute(g, s)
    assert x.shape == g.shape and x.dtype == "float64"
    idx = s.index(list(g.shape), rank)
    np.testing.assert_array_equal(x.local, g[idx[0][0]:idx[0][1], idx[1][0]:idx[1][1]])
    with pytest.raises(ValueError, match="read-only"):
        x.local[0, 0] = 1  # local blocks are read-only views
    np.testing.assert_array_equal(sk.process_allgather(x), g)
    gathered = sk.gather(x, root=0)
    if rank == 0:
        np.testing.assert_array_equal(gathered, g)
    else:
        assert gathered is None


def test_uneven_opt_in(sk, size, line):
    g = np.arange(2 * size + 1, dtype=np.int32)
    if size > 1:  # everything divides by 1
        with pytest.raises(sk.InvalidArgument, match=f"dimension 0 of size {2 * size + 1} is not divisible by {size}"):
            sk.distribute(g, sk.NamedSharding(line, sk.P("x")))
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


def test_visualize(sk, rank, size, line):
    # One row of blocks of 2 columns over the line mesh: the grid, worked out by hand from the format (a row of column
    # ranges, a rule, one cell per block naming the rank that holds it, a rule).
    x = sk.distribute(np.zeros(2 * size), sk.NamedSharding(line, sk.P("x")))
    text = sk.visualize_sharding(x, print_on_rank=None)
    width = max(len("rank 0"), len(f"{2 * (size - 1)}:{2 * size}"))
    cols = "".join(f" {f'{2 * i}:{2 * i + 2}':<{width}}  " for i in range(size))
    rule = "+" + "+".join("-" * (width + 2) for _ in range(size)) + "+"
    cells = "|" + "|".join(f" {f'rank {i}':<{width}} " for i in range(size)) + "|"
    assert text == (f"NamedSharding(mesh=Mesh(x={size}), spec=P('x')) of shape ({2 * size},)\n"
                    f" {cols}\n{rule}\n{cells}\n{rule}\n")


def test_visualize_permuted_mesh():
    import shardkit as sk

    # (2,2) as [[3, 1], [2, 0]] (abstract: no processes needed): each block shows the rank the device array puts there.
    mesh = sk._core.Mesh.abstract([2, 2], ["x", "y"], [3, 1, 2, 0])
    text = sk.visualize_sharding((4, 4), sk.NamedSharding(mesh, sk.P("x", "y")), print_on_rank=None)
    assert text == ("NamedSharding(mesh=Mesh(x=2, y=2, devices=[3, 1, 2, 0]), spec=P('x', 'y')) of shape (4, 4)\n"
                    "           cols 0:2   cols 2:4  \n"
                    "         +----------+----------+\n"
                    "rows 0:2 | rank 3   | rank 1   |\n"
                    "         +----------+----------+\n"
                    "rows 2:4 | rank 2   | rank 0   |\n"
                    "         +----------+----------+\n")
    rows = sk.visualize_sharding((4, 4), sk.NamedSharding(mesh, sk.P("x")), print_on_rank=None)
    assert "rows 0:2 | ranks 1,3 |" in rows and "rows 2:4 | ranks 0,2 |" in rows


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
    with pytest.raises(sk.InvalidArgument, match="promises that output 0 is replicated over mesh axes 'x'"):
        sk.shard_map(body, mesh=line, in_specs=P("x"), out_specs=P())(x)
    sk.shard_map(body, mesh=line, in_specs=P("x"), out_specs=P(), check_rep=False)(x)  # no error
    sk.shard_map(body, mesh=line, in_specs=P("x"), out_specs=P(), check_vma=False)(x)  # JAX's current name
    with pytest.raises(sk.InvalidArgument, match="promises that output 0"):
        sk.shard_map(body, mesh=line, in_specs=P("x"), out_specs=P(), check_vma=True, check_rep=True)(x)
    with pytest.raises(sk.InvalidArgument, match="check_vma=False and check_rep=True disagree"):
        sk.shard_map(body, mesh=line, in_specs=P("x"), out_specs=P(), check_vma=False, check_rep=True)


def test_check_vma_compares_values_not_bytes(sk, rank, size, line):
    P = sk.P
    if size == 1:
        pytest.skip("one rank is always replicated")
    odd = rank % 2 == 1
    # -0.0 and 0.0, and NaNs of different bit patterns, are equal values: the promise of P() holds.
    same = np.array([-0.0 if odd else 0.0, -np.nan if odd else np.nan, 1.5], np.float32)
    out = sk.shard_map(lambda: same, mesh=line, in_specs=(), out_specs=P())()
    assert out.shape == (3,)
    differ = np.array([1.0 if odd else 2.0])
    with pytest.raises(sk.InvalidArgument, match="promises that output 0 is replicated"):
        sk.shard_map(lambda: differ, mesh=line, in_specs=(), out_specs=P())()


def test_collectives_outside_shard_map_are_refused(sk):
    with pytest.raises(sk.InvalidArgument, match="can only be called inside a shard_map body"):
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
    with pytest.raises(sk.InvalidArgument, match="unknown mesh axis 'q'"):
        sk.shard_map(ident, mesh=line, in_specs=P("q"), out_specs=P("x"))(x)
    with pytest.raises(sk.InvalidArgument, match="uses mesh axis 'x' twice"):
        sk.NamedSharding(line, P("x", "x"))
    with pytest.raises(sk.InvalidArgument, match="in_specs = .* is not a prefix"):
        sk.shard_map(ident, mesh=line, in_specs=(P("x"), P()), out_specs=P("x"))(x)
    with pytest.raises(sk.InvalidArgument, match="has 2 entries but the array has rank 1"):
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
    with pytest.raises(sk.InvalidArgument, match="unknown matmul algorithm"):
        sk.matmul(xa, xb, algorithm="strassen")


# ---- device order (rank devices.flat[p] at position p, as JAX places devices) -----------------------------------------

# Per world size, meshes as device arrays: the array, the mesh axes, and for axis sets `axes` by rank the hand-worked
# axis_index over `axes` and the ranks an all_gather along `axes` delivers (in coordinate order).
PERMUTED = {
    1: [([0], ("x",), [(("x",), [0], [[0]])])],
    2: [([1, 0], ("x",), [(("x",), [1, 0], [[1, 0], [1, 0]])])],
    3: [([2, 0, 1], ("x",), [(("x",), [1, 2, 0], [[2, 0, 1]] * 3)])],
    4: [
        ([[3, 1], [2, 0]], ("x", "y"), [
            (("x",), [1, 0, 1, 0], [[1, 0], [1, 0], [3, 2], [3, 2]]),
            (("y",), [1, 1, 0, 0], [[2, 0], [3, 1], [2, 0], [3, 1]]),
            (("x", "y"), [3, 1, 2, 0], [[3, 1, 2, 0]] * 4),
            (("y", "x"), [3, 2, 1, 0], [[3, 2, 1, 0]] * 4),
        ]),
        # (2,1,2): rank 1 at (0,0,0), 3 at (0,0,1), 0 at (1,0,0), 2 at (1,0,1).
        ([[[1, 3]], [[0, 2]]], ("x", "y", "z"), [
            (("x",), [1, 0, 1, 0], [[1, 0], [1, 0], [3, 2], [3, 2]]),
            (("z",), [0, 0, 1, 1], [[0, 2], [1, 3], [0, 2], [1, 3]]),
            (("z", "y", "x"), [1, 0, 3, 2], [[1, 0, 3, 2]] * 4),
        ]),
        ([2, 0, 3, 1], ("x",), [(("x",), [1, 3, 0, 2], [[2, 0, 3, 1]] * 4)]),
    ],
}


@pytest.mark.parametrize("which", range(3))
def test_mesh_honours_the_device_order(sk, rank, size, which):
    P = sk.P
    if which >= len(PERMUTED[size]):
        pytest.skip(f"{len(PERMUTED[size])} permuted mesh(es) at {size} ranks")
    devices, names, cases = PERMUTED[size][which]
    mesh = sk.Mesh(np.array(devices), names)
    np.testing.assert_array_equal(mesh.devices, np.array(devices))
    assert mesh.rank_at(mesh.coords(rank)) == rank
    for axes, index, gathered in cases:
        @sk.shard_map(mesh=mesh, in_specs=(), out_specs=(P(names), P(names), P(names)))
        def body():
            me = np.array([rank])
            return (np.array([sk.axis_index(axes)]), sk.all_gather(me, axes, tiled=True)[None],
                    sk.all_gather(me, axes)[None, :, 0])  # untiled: stacked, shape (k, 1)

        idx, tiled, stacked = body()
        assert idx.local.tolist() == [index[rank]], axes
        assert tiled.local.tolist() == [gathered[rank]], axes
        assert stacked.local.tolist() == [gathered[rank]], axes


def test_blocks_follow_the_device_order(sk, rank, size):
    P = sk.P
    devices, names, _ = PERMUTED[size][0]
    mesh = sk.Mesh(np.array(devices), names)
    # Rank devices.flat[p] holds block p of arange (row-major over the mesh), worked out by hand.
    g = np.arange(4.0 * size).reshape(2 * size, 2) if size < 4 else np.arange(16.0).reshape(4, 4)
    want = {
        1: {0: [[0, 1], [2, 3]]},
        2: {1: [[0, 1], [2, 3]], 0: [[4, 5], [6, 7]]},
        3: {2: [[0, 1], [2, 3]], 0: [[4, 5], [6, 7]], 1: [[8, 9], [10, 11]]},
        4: {3: [[0, 1], [4, 5]], 1: [[2, 3], [6, 7]], 2: [[8, 9], [12, 13]], 0: [[10, 11], [14, 15]]},
    }[size]
    s = sk.NamedSharding(mesh, P(*names))
    x = sk.distribute(g, s)
    assert x.local.tolist() == want[rank]
    np.testing.assert_array_equal(sk.process_allgather(x), g)
    back = sk.from_local(np.array(want[rank], np.float64), g.shape, s)
    np.testing.assert_array_equal(sk.process_allgather(back), g)


def test_mesh_device_array_errors(sk, size):
    with pytest.raises(sk.InvalidArgument, match=r"device array holds rank 0 twice \(it must be a permutation"):
        sk.Mesh(np.zeros(size + 1, dtype=int), "x")
    with pytest.raises(sk.InvalidArgument, match=f"device array holds rank {size}, outside 0..{size - 1}"):
        sk.Mesh(np.arange(1, size + 1), "x")
    with pytest.raises(sk.InvalidArgument, match="a device is a rank .an int. or an object with an integer .id"):
        sk.Mesh(np.arange(size, dtype=float), "x")

    class Device:  # as JAX's devices: an object with an integer id
        def __init__(self, i):
            self.id = i

    mesh = sk.Mesh(np.array([Device(i) for i in reversed(range(size))], dtype=object), "x")
    assert mesh.devices.tolist() == list(reversed(range(size)))
    assert sk.Mesh([Device(i) for i in range(size)], "x").devices.tolist() == list(range(size))


def test_named_sharding_jax_methods(sk, rank, size, line):
    P = sk.P
    mesh = sk._core.Mesh.abstract([2, 2], ["x", "y"], [3, 1, 2, 0])
    s = sk.NamedSharding(mesh, P("x", "y"))
    # As jax.sharding.NamedSharding(Mesh(devices[[3, 1, 2, 0]].reshape(2, 2)), P('x', 'y')).devices_indices_map((4, 6)).
    assert s.devices_indices_map((4, 6)) == {
        3: (slice(0, 2), slice(0, 3)), 1: (slice(0, 2), slice(3, 6)),
        2: (slice(2, 4), slice(0, 3)), 0: (slice(2, 4), slice(3, 6))}
    assert list(s.devices_indices_map((4, 6))) == [3, 1, 2, 0]  # in the device array's order
    # 3-d, (2,2,2) as [5, 2, 7, 0, 4, 1, 6, 3], rows over (z, y) and columns over x (checked against JAX's too).
    cube = sk._core.Mesh.abstract([2, 2, 2], ["x", "y", "z"], [5, 2, 7, 0, 4, 1, 6, 3])
    assert sk.NamedSharding(cube, P(("z", "y"), "x")).devices_indices_map((4, 6)) == {
        5: (slice(0, 1), slice(0, 3)), 2: (slice(2, 3), slice(0, 3)), 7: (slice(1, 2), slice(0, 3)),
        0: (slice(3, 4), slice(0, 3)), 4: (slice(0, 1), slice(3, 6)), 1: (slice(2, 3), slice(3, 6)),
        6: (slice(1, 2), slice(3, 6)), 3: (slice(3, 4), slice(3, 6))}
    # A dimension that is not cut is slice(None), as in JAX.
    assert sk.NamedSharding(mesh, P("y")).devices_indices_map((4, 6))[1] == (slice(2, 4), slice(None))
    assert s.shard_shape((4, 6)) == (2, 3)
    assert s.num_devices == 4
    assert not s.is_fully_replicated
    assert sk.NamedSharding(mesh, P()).is_fully_replicated
    assert sk.NamedSharding(sk._core.Mesh.abstract([1, 4], ["x", "y"]), P("x")).is_fully_replicated  # axis of size 1
    with pytest.raises(sk.InvalidArgument, match="an abstract mesh has no rank of its own"):
        s.addressable_devices_indices_map((4, 6))
    mine = sk.NamedSharding(line, P("x")).addressable_devices_indices_map((2 * size,))
    assert mine == {rank: ((slice(2 * rank, 2 * rank + 2) if size > 1 else slice(None)),)}


# ---- JAX's behaviour where shardkit departed: pmean of integers, weak psum of scalars, shard_map spellings ------------

def test_pmean_of_integers_is_the_floating_mean(sk, rank, size, line):
    P = sk.P
    mean = (size - 1) / 2  # of the ranks 0..size-1

    @sk.shard_map(mesh=line, in_specs=(), out_specs=(P(), P(), P(), P()))
    def body():
        i32 = sk.pmean(np.array([rank], np.int32), "x")
        i64 = sk.pmean(np.array([rank], np.int64), "x")
        b = sk.pmean(np.array([True]), "x")
        return i32, i64, b, np.array([sk.pmean(rank, "x")])

    i32, i64, b, scalar = body()
    assert i32.local.dtype == np.float32 and i32.local.tolist() == [mean]  # JAX: int32 / n is float32
    assert i64.local.dtype == np.float64 and i64.local.tolist() == [mean]  # int64 / n is float64
    assert b.local.dtype == np.float32 and b.local.tolist() == [1.0]
    assert scalar.local.tolist() == [mean]


def test_psum_of_a_python_scalar_is_weakly_typed(sk, size, line):
    P = sk.P

    @sk.shard_map(mesh=line, in_specs=(), out_specs=(P(), P()))
    def body():
        x = np.ones(3, np.float32)
        n, f, t = sk.psum(1, "x"), sk.psum(2.5, "x"), sk.psum(True, "x")
        assert type(n) is int and n == size
        assert type(f) is float and f == 2.5 * size
        assert type(t) is int and t == size  # bools are summed as ints, as in JAX
        assert type(sk.pmax(3, "x")) is int
        return x * 0 + n, x * 0 + f

    ints, floats = body()
    assert ints.local.dtype == np.float32 and ints.local.tolist() == [size] * 3
    assert floats.local.dtype == np.float32 and floats.local.tolist() == [2.5 * size] * 3


def test_shard_map_infers_mesh_and_in_specs(sk, rank, size, grid):
    P = sk.P
    g = np.arange(4.0 * size).reshape(2 * size, 2)
    x = sk.distribute(g, sk.NamedSharding(grid, P(("x", "y"))))
    # in_specs left out (JAX's Infer): each ShardedArray keeps its spec, a plain array is replicated; mesh left out:
    # the arguments' mesh.
    y = sk.shard_map(lambda b, c: b + c, out_specs=P(("x", "y")))(x, np.float64(10.0) * np.ones(2))
    assert y.mesh == grid
    np.testing.assert_array_equal(y.local, g[2 * rank:2 * rank + 2] + 10)
    z = sk.shard_map(lambda b: b * 2, out_specs=P(("x", "y")), axis_names={"x", "y"})(x)  # every axis: manual
    np.testing.assert_array_equal(sk.process_allgather(z), g * 2)
    with pytest.raises(sk.InvalidArgument, match=r"no mesh given and no ShardedArray argument .* pass mesh="):
        sk.shard_map(lambda b: b, out_specs=P())(np.ones(2))
    with pytest.raises(sk.InvalidArgument, match=r"axis_names=\['x'\] leaves mesh axes \['y'\] automatic"):
        sk.shard_map(lambda b: b, out_specs=P(("x", "y")), axis_names={"x"})(x)
    with pytest.raises(sk.InvalidArgument, match=r"axis_names names \['q'\], not axes of"):
        sk.shard_map(lambda b: b, out_specs=P(("x", "y")), axis_names={"q"})(x)
    with pytest.raises(sk.InvalidArgument, match="in_specs=None .JAX's static inputs. is not supported"):
        sk.shard_map(lambda b: b, mesh=grid, in_specs=None, out_specs=P())


def test_all_gather_to_and_axis_index_groups(sk, rank, size, line):
    P = sk.P
    groups = [list(range(size))]

    @sk.shard_map(mesh=line, in_specs=(), out_specs=(P(), P()))
    def body():
        me = np.array([rank])
        return sk.all_gather(me, "x", tiled=True, to="invarying"), sk.all_gather(me, "x", tiled=True, to="varying")

    inv, var = body()
    assert inv.local.tolist() == var.local.tolist() == list(range(size))

    refused = {
        "psum": lambda b: sk.psum(b, "x", axis_index_groups=groups),
        "pmax": lambda b: sk.pmax(b, "x", axis_index_groups=groups),
        "pmean": lambda b: sk.pmean(b, "x", axis_index_groups=groups),
        "all_gather": lambda b: sk.all_gather(b, "x", axis_index_groups=groups),
        "psum_scatter": lambda b: sk.psum_scatter(b, "x", axis_index_groups=groups),
        "all_to_all": lambda b: sk.all_to_all(b, "x", 0, 0, axis_index_groups=groups),
    }
    for op, f in refused.items():
        with pytest.raises(sk.InvalidArgument, match=f"{op}: axis_index_groups is not supported. Give the groups a "
                                                     "mesh axis of their own"):
            sk.shard_map(f, mesh=line, in_specs=P("x"), out_specs=P("x"))(np.ones(size))
    with pytest.raises(sk.InvalidArgument, match="to='reduced' is not supported.*use to='varying'"):
        sk.shard_map(lambda b: sk.all_gather(b, "x", to="reduced"), mesh=line, in_specs=P("x"),
                     out_specs=P("x"))(np.ones(size))


def test_equal_meshes_and_shardings_hash_alike_and_other_types_are_unequal(sk):
    # jax.jit keys its caches on the mesh of a shard_map body: equal meshes must hash alike.
    a, b = sk.Mesh((sk.size(),), ("x",)), sk.Mesh((sk.size(),), ("x",))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != sk.Mesh((sk.size(),), ("y",))
    assert a != sk.Mesh((1, sk.size()), ("x", "y"))
    assert not (a == None) and a != 3  # noqa: E711  (False, not a TypeError)
    s, t = sk.NamedSharding(a, sk.P("x")), sk.NamedSharding(b, sk.P("x", None))  # the same spec, normalised
    assert s == t and hash(s) == hash(t)
    assert s != sk.NamedSharding(a, sk.P()) and s != None  # noqa: E711
    assert sk.P("x") != "x" and hash(sk.P("x")) == hash(sk.P("x", None))
