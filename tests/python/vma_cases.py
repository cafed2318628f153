"""Bodies of shard_maps whose gradients test_jax_vma.py compares, written once for shardkit and for JAX: each body
takes the module of axis collectives (``shardkit``, or ``jax.lax`` in jax_shard_map_reference.py, which runs JAX's own
jax.shard_map on virtual CPU devices), so the same code runs under both. Imports neither.

A case: mesh axis names and shape (from the number of ranks n), the arguments' global shapes and specs, the out_spec,
the body, and the same function of the global arrays written without a shard_map (``ref``, on jax.numpy as ``np_``).
"""


# The cases also run with check_vma=False (the same derivatives: JAX's transpose of a shard_map sums and shares at its
# boundary in both modes), and with global arrays for arguments (the whole gradient on every rank).
# (A few, for time: test_jax_shard_map's linear cases run every collective with check_vma=False on global arrays.)
CHECK_VMA_OFF = ("ppermute", "replicated_argument", "two_d")
GLOBAL_ARGUMENTS = ("replicated_argument", "two_d_psum")


def mesh_of(n, two_d):
    """(axis names, shape): one axis "x" of n, or a 2-D mesh ("a", "b") (2 x n/2 where n is even, else n x 1)."""
    if not two_d:
        return ("x",), (n,)
    return ("a", "b"), ((2, n // 2) if n % 2 == 0 else (n, 1))


def cases(n, jnp, jax=None):
    """name -> (two_d, [(global shape, spec entries)], out_spec entries, body(c, *blocks), ref(*global arrays)); with
    `jax`, the cases of functions with custom derivative rules too (custom)."""
    k = 2 * n  # the block length along "x"
    r = lambda c: c.axis_index("x") + 1  # noqa: E731  (a per-rank weight: cotangents differ from rank to rank)
    blocks = lambda x: x.reshape(n, k)  # noqa: E731
    idx = jnp.arange(1, n + 1)[:, None]
    ring = [(i, (i + 1) % n) for i in range(n)]
    sharded = [((n * k,), ("x",))]
    (_, (a, b)) = mesh_of(n, True)
    return {
        "psum": (False, sharded, (), lambda c, x: c.psum(jnp.sin(x) * x, "x"),
                 lambda x: blocks(jnp.sin(x) * x).sum(0)),
        "pmean": (False, sharded, (), lambda c, x: c.pmean(x * x, "x"), lambda x: blocks(x * x).mean(0)),
        "all_gather": (False, sharded, ("x",), lambda c, x: c.all_gather(jnp.sin(x), "x", axis=0, tiled=True) * r(c),
                       lambda x: jnp.concatenate([jnp.sin(x) * (i + 1) for i in range(n)])),
        "psum_scatter": (False, sharded, ("x",),
                         lambda c, x: c.psum_scatter(x * x, "x", scatter_dimension=0, tiled=True),
                         lambda x: blocks(x * x).sum(0)),
        "ppermute": (False, sharded, ("x",), lambda c, x: c.ppermute(x * x, "x", ring) * r(c),
                     lambda x: (jnp.roll(blocks(x * x), 1, axis=0) * idx).reshape(-1)),
        "all_to_all": (False, sharded, ("x",), lambda c, x: c.all_to_all(jnp.sin(x), "x", 0, 0, tiled=True),
                       lambda x: jnp.sin(x).reshape(n, n, 2).transpose(1, 0, 2).reshape(-1)),
        "pbroadcast": (False, sharded, ("x",), lambda c, x: c.pbroadcast(x * x, "x", n - 1) * r(c),
                       lambda x: (blocks(x * x)[n - 1][None, :] * idx).reshape(-1)),
        # A replicated argument read by code that varies over "x": its gradient is the sum over the ranks.
        "replicated_argument": (False, [((k,), ())], ("x",), lambda c, x: jnp.sin(x) * r(c),
                                lambda x: jnp.concatenate([jnp.sin(x) * (i + 1) for i in range(n)])),
        "psum_of_replicated": (False, [((k,), ())], (), lambda c, x: c.psum(x * x, "x"), lambda x: n * x * x),
        # Megatron's layer on a 2-D mesh: x replicated over "b", w over "a", b1 over both.
        "two_d": (True, [((2 * a, 3), ("a",)), ((3, 2 * b), (None, "b")), ((2 * b,), ("b",)), ((), ())],
                  ("a", "b"), lambda c, x, w, b1, s: jnp.sin(x @ w + b1) * s,
                  lambda x, w, b1, s: jnp.sin(x @ w + b1) * s),
        "two_d_psum": (True, [((2 * a, 3), ("a",)), ((3, 2 * b), (None, "b")), ((2 * b, 2), ("b",))], ("a",),
                       lambda c, x, w, v: c.psum(jnp.tanh(x @ w) @ v, "b"),
                       lambda x, w, v: jnp.tanh(x @ w) @ v),
        **(custom(n, jax, jnp) if jax is not None else {}),
    }


def square_sum(jax, c, axis):
    """A custom_vjp: the psum over `axis` of v * v (without one: the sum over the leading dimension), its backward 3
    times the derivative."""
    @jax.custom_vjp
    def f(v):
        return c.psum(v * v, axis) if axis else (v * v).sum(0)

    f.defvjp(lambda v: (f(v), v), lambda v, ct: (6 * v * ct,))
    return f


def custom(n, jax, jnp):
    """Cases whose bodies call functions with custom derivative rules, which hold for the gradient of the shard_map:
    jax.nn.relu (a custom_jvp: derivative 0 at 0, where max's is 1/2), a custom_vjp whose backward is not its
    derivative, and custom_vjps with collectives in their forward and backward (check_vma=True's types: the backward
    of a psum'ed, unvarying output gets the whole cotangent; a cotangent of an unvarying argument is psum'ed), on one
    mesh axis and on two."""
    k = 2 * n
    r = lambda c: c.axis_index("x") + 1  # noqa: E731
    blocks = lambda x: x.reshape(n, k)  # noqa: E731
    idx = jnp.arange(1, n + 1)[:, None]
    sharded = [((n * k,), ("x",))]
    (_, (a, b)) = mesh_of(n, True)

    def relu(x):  # relu at 0 (x - x with a tangent) and elsewhere
        return jax.nn.relu(x) + 3 * jax.nn.relu(x - jax.lax.stop_gradient(x))

    @jax.custom_vjp
    def h(v):
        return jnp.sin(v)

    h.defvjp(lambda v: (jnp.sin(v), v), lambda v, ct: (ct * 10.0,))

    def scaled(c, axis):  # s * sin(v) for an unvarying s: its cotangent psum'ed; v's 5 times the derivative
        @jax.custom_vjp
        def f(s, v):
            return s * jnp.sin(v)

        def bwd(res, ct):
            s, v = res
            ds = jnp.sum(ct * jnp.sin(v))
            return c.psum(ds, axis) if axis else ds, 5 * ct * s

        f.defvjp(lambda s, v: (f(s, v), (s, v)), bwd)
        return f

    return {
        "relu": (False, sharded, ("x",), lambda c, x: relu(jnp.sin(x)) * r(c),
                 lambda x: (blocks(relu(jnp.sin(x))) * idx).reshape(-1)),
        "custom_vjp": (False, sharded, ("x",), lambda c, x: h(x * x) * r(c),
                       lambda x: (blocks(h(x * x)) * idx).reshape(-1)),
        "custom_vjp_psum": (False, sharded, (), lambda c, x: jnp.sin(square_sum(jax, c, "x")(x)),
                            lambda x: jnp.sin(square_sum(jax, None, None)(blocks(x)))),
        "custom_vjp_unvarying": (False, sharded, ("x",),
                                 lambda c, x: scaled(c, "x")(c.psum(jnp.sum(x * x), "x"), x) * r(c),
                                 lambda x: (blocks(scaled(None, None)(jnp.sum(x * x), x)) * idx).reshape(-1)),
        # On the 2-D mesh: a psum over "b" only (unvarying over "b", varying over "a").
        "custom_vjp_two_d": (True, [((2 * a, 3), ("a",)), ((3, 2 * b), (None, "b"))], ("a",),
                             lambda c, x, w: square_sum(jax, c, "b")(jnp.sin(x @ w)),
                             lambda x, w: square_sum(jax, None, None)(
                                 jnp.sin(x @ w).reshape(2 * a, b, 2).transpose(1, 0, 2))),
    }


def inside(n, jax, jnp):
    """Bodies that call jax.grad themselves, of losses that run an axis collective, each on a (n * 2n,) array cut as
    P("x"), out_spec P("x"): name -> body(c, block). JAX's answers depend on check_vma (on: a psum of a varying value
    transposes to a copy, an unvarying value read by varying code to a psum, so that the psum'ed losses give the
    gradient of the global loss; off: pmap's rules, where psum transposes to a psum)."""
    r = lambda c: c.axis_index("x") + 1  # noqa: E731
    ring = [(i, (i + 1) % n) for i in range(n)]

    def grad_of(loss):
        return lambda c, b: jax.grad(lambda v: loss(c, v))(b)

    @jax.custom_vjp
    def h(v):  # its backward: 10 times the cotangent
        return jnp.sin(v)

    h.defvjp(lambda v: (jnp.sin(v), v), lambda v, ct: (ct * 10.0,))

    def unvarying(c, b):  # the gradient with respect to an unvarying value that varying code reads
        s = c.psum(jnp.sum(b), "x")
        return jnp.zeros_like(b) + jax.grad(lambda t: c.psum(jnp.sum(jnp.sin(t * b)), "x"))(s)

    return {
        "psum": grad_of(lambda c, v: c.psum(jnp.sum(jnp.sin(v) * v), "x")),
        "pmean": grad_of(lambda c, v: c.pmean(jnp.sum(v * v * r(c)), "x")),
        "all_gather": grad_of(lambda c, v: c.psum(jnp.sum(jnp.sin(c.all_gather(v, "x", axis=0, tiled=True)) * r(c)),
                                                  "x")),
        "all_gather_unvarying": grad_of(lambda c, v: jnp.sum(jnp.sin(c.all_gather(v, "x", axis=0, tiled=True)))),
        "psum_scatter": grad_of(lambda c, v: c.psum(jnp.sum(jnp.sin(
            c.psum_scatter(v * v, "x", scatter_dimension=0, tiled=True)) * r(c)), "x")),
        "ppermute": grad_of(lambda c, v: c.psum(jnp.sum(jnp.sin(c.ppermute(v, "x", ring)) * r(c)), "x")),
        "all_to_all": grad_of(lambda c, v: c.psum(jnp.sum(jnp.cos(c.all_to_all(v, "x", 0, 0, tiled=True)) * r(c)),
                                                  "x")),
        "pbroadcast": grad_of(lambda c, v: c.psum(jnp.sum(jnp.sin(c.pbroadcast(v, "x", n - 1)) * r(c)), "x")),
        "unvarying": unvarying,
        # Collectives in a loop body and in a jit-compiled function, under jax.grad.
        "fori_loop": grad_of(lambda c, v: c.psum(jnp.sum(jax.lax.fori_loop(
            0, 2, lambda i, y: jnp.sin(c.ppermute(y, "x", ring)) * r(c), v)), "x")),
        "jit": grad_of(lambda c, v: c.psum(jax.jit(lambda u: jnp.sum(jnp.sin(
            c.all_gather(u * u, "x", axis=0, tiled=True))))(v), "x")),
        # Functions with custom derivative rules, in the gradient and beside it (calls of them stay in the body).
        "relu": lambda c, b: jax.nn.relu(b) + grad_of(lambda c, v: c.psum(jnp.sum(jax.nn.relu(jnp.sin(v)) * v * r(c)),
                                                                          "x"))(c, b),
        "custom_vjp": lambda c, b: h(b) + grad_of(lambda c, v: c.psum(jnp.sum(h(v) * v * r(c)), "x"))(c, b),
        "custom_vjp_psum": lambda c, b: jnp.sin(square_sum(jax, c, "x")(b)) + grad_of(
            lambda c, v: c.psum(jnp.sum(jnp.sin(v) * v * r(c)), "x"))(c, b),
    }


def out_spec_cases(n, jnp):
    """name -> (two_d, [(global shape, spec entries)], out_spec entries, body(c, *blocks), the mesh axes the output
    varies over that its out_spec does not name): with check_vma on, jax.shard_map refuses at trace time exactly the
    bodies whose last entry is not empty (the reference records JAX's verdict), and shardkit names those axes."""
    k = 2 * n
    (_, (a, b)) = mesh_of(n, True)
    sharded, replicated = [((n * k,), ("x",))], [((k,), ())]
    two_d = [((2 * a, 3), ("a",)), ((3, 2 * b), (None, "b"))]
    return {
        "identity": (False, sharded, (), lambda c, x: x, ("x",)),
        "identity_named": (False, sharded, ("x",), lambda c, x: x, ()),
        "psum": (False, sharded, (), lambda c, x: c.psum(x, "x"), ()),
        "pmean": (False, sharded, (), lambda c, x: c.pmean(jnp.sin(x), "x"), ()),
        "all_gather": (False, sharded, (), lambda c, x: c.all_gather(x, "x", axis=0, tiled=True), ("x",)),
        "replicated": (False, replicated, (), lambda c, x: jnp.sin(x), ()),
        "axis_index": (False, replicated, (), lambda c, x: x * (c.axis_index("x") + 1), ("x",)),
        "two_d_psum_b": (True, two_d, ("a",), lambda c, x, w: c.psum(x @ w, "b"), ()),
        "two_d_no_psum": (True, two_d, ("a",), lambda c, x, w: x @ w, ("b",)),
        "two_d_replicated_over_b": (True, two_d[:1], ("a",), lambda c, x: jnp.sin(x), ()),
        "two_d_neither": (True, two_d, (), lambda c, x, w: x @ w, ("a", "b")),
        "two_d_pmean_both": (True, two_d, (), lambda c, x, w: c.pmean(x @ w, ("a", "b")), ()),
    }


def arguments(shapes, np_):
    """Deterministic float64 arguments of these global shapes."""
    out = []
    for j, (shape, _) in enumerate(shapes):
        size = 1
        for d in shape:
            size *= d
        out.append((np_.cos(np_.arange(size, dtype=np_.float64) * 0.7 + j) * 1.5).reshape(shape))
    return out


def weights(shape, np_):
    """The loss's weights of an output of this global shape: sum(sin(out) * weights)."""
    size = 1
    for d in shape:
        size *= d
    return (np_.arange(size, dtype=np_.float64) % 5 + 1).reshape(shape) / 3
