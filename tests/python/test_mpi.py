"""shardkit.mpi: every function of the mpi4jax API with its documented arguments, defaults, per-rank shape rules
and token behaviour."""

import os
import re
import threading
import time

import numpy as np
import pytest

from conftest import has_module

MPI = pytest.importorskip("mpi4py.MPI")


def test_has_cuda_support_reports_the_build(sk, mpi):
    assert mpi.has_cuda_support() == (sk._core.cuda_built() and sk._core.nccl_built())


def test_allreduce_every_op_spelling(sk, mpi, rank, size):
    x = np.array([rank + 1, 2 * rank + 1], dtype=np.int64)
    want_sum = np.array([size * (size + 1) // 2, size * size])
    for op in (MPI.SUM, "sum", mpi.ReduceOp.SUM):
        r, tok = mpi.allreduce(x, op=op)
        np.testing.assert_array_equal(r, want_sum)
        assert isinstance(tok, mpi.Token)
    r, _ = mpi.allreduce(x, op=MPI.MAX)
    np.testing.assert_array_equal(r, [size, 2 * size - 1])
    r, _ = mpi.allreduce(x, op=MPI.MIN)
    np.testing.assert_array_equal(r, [1, 1])
    r, _ = mpi.allreduce(x, op=MPI.PROD)
    assert r[0] == np.prod(np.arange(1, size + 1))
    r, _ = mpi.allreduce(np.array([rank % 2 == 0]), op=MPI.LAND)
    assert bool(r[0]) == (size == 1)
    r, _ = mpi.allreduce(np.array([1 << rank], np.int32), op=MPI.BOR)
    assert r[0] == (1 << size) - 1
    with pytest.raises(sk.InvalidArgument, match="mpi4py operation .* has no shardkit equivalent"):
        mpi.allreduce(x, op=MPI.MAXLOC)
    with pytest.raises(sk.InvalidArgument, match="unknown reduction 'median'"):
        mpi.allreduce(x, op="median")


# The reductions' names, in ReduceOp order, as the API documents them.
REDUCTIONS = ["sum", "prod", "min", "max", "land", "lor", "lxor", "band", "bor", "bxor"]


def test_every_reduction_has_one_name_in_every_spelling(sk, mpi, rank, size):
    """One table of names: ReduceOp's members, mpi4py's operations, the names taken in any case, the module docstring
    and the error's list of valid names all come from it."""
    assert list(mpi.ReduceOp.__members__) == [n.upper() for n in REDUCTIONS]
    assert ", ".join(f'"{n}"' for n in REDUCTIONS) in mpi.__doc__
    x = np.array([rank + 1, 3, rank % 2], dtype=np.int32)  # every reduction is defined for int32
    for code, name in enumerate(REDUCTIONS):
        assert int(mpi.ReduceOp[name.upper()]) == code
        want, _ = mpi.allreduce(x, op=mpi.ReduceOp(code))
        for op in (name, name.upper(), name.capitalize(), getattr(MPI, name.upper()), code):
            r, _ = mpi.allreduce(x, op=op)
            np.testing.assert_array_equal(r, want, err_msg=f"{name} spelt {op!r}")
    with pytest.raises(sk.InvalidArgument, match=re.escape(f"unknown reduction 'avg' ({', '.join(REDUCTIONS)})")):
        mpi.allreduce(x, op="AVG")
    names = ", ".join(REDUCTIONS).upper()
    with pytest.raises(sk.InvalidArgument, match=re.escape(f"no shardkit equivalent ({names})")):
        mpi.allreduce(x, op=MPI.MAXLOC)


def test_allgather_stacks(mpi, rank, size):
    r, _ = mpi.allgather(np.full((2, 3), rank, np.float32))
    assert r.shape == (size, 2, 3)
    for q in range(size):
        assert (r[q] == q).all()


def test_alltoall_first_axis_is_nproc(mpi, rank, size):
    x = np.array([[rank * 100 + j] for j in range(size)])
    r, _ = mpi.alltoall(x)
    assert r.shape == (size, 1)
    assert r[:, 0].tolist() == [q * 100 + rank for q in range(size)]
    if size > 1:
        with pytest.raises(ValueError):
            mpi.alltoall(np.zeros((size + 1, 2)))


def test_barrier_returns_a_token(mpi):
    tok = mpi.barrier()
    assert isinstance(tok, mpi.Token) and tok.is_complete()
    tok = mpi.barrier(token=tok)
    assert tok.is_complete()


def test_barrier_holds_every_rank_until_the_last_arrives(sk, mpi, rank, size):
    """Rank 0 arrives 0.8 s late: no other rank may leave the barrier before then (blocking, timeout and async
    communicators alike)."""
    import time

    if size < 2:
        pytest.skip("needs two ranks")
    comms = [None, sk._core.make_comm(timeout=30, name="barrier-timeout"),
             sk._core.make_comm(async_=True, name="barrier-async")]
    for comm in comms:
        mpi.barrier(comm=comm).wait()  # everyone starts together
        start = time.monotonic()
        if rank == 0:
            time.sleep(0.8)
        mpi.barrier(comm=comm).wait()
        waited = time.monotonic() - start
        if rank != 0:
            assert waited >= 0.4, f"rank {rank} left the barrier after {waited:.3f} s, before rank 0 arrived"


def test_bcast_returns_a_new_array(mpi, rank, size):
    root = size - 1
    x = np.full(4, float(rank))
    r, _ = mpi.bcast(x, root)
    assert (r == root).all()
    assert (x == rank).all()  # unlike mpi4py's bcast, the input is not overwritten
    assert r is not x


def test_gather_shapes_differ_between_ranks(mpi, rank, size):
    x = np.array([rank, rank + 10])
    r, _ = mpi.gather(x, 0)
    if rank == 0:
        assert r.shape == (size, 2)
        assert r[:, 0].tolist() == list(range(size))
    else:
        assert r.shape == x.shape and (r == x).all()


def test_scatter_input_shape_differs_between_ranks(mpi, rank, size):
    root = 0
    x = np.arange(size * 3).reshape(size, 3) if rank == root else np.zeros(3, np.int64)
    r, _ = mpi.scatter(x, root)
    assert r.shape == (3,)
    assert r.tolist() == [rank * 3, rank * 3 + 1, rank * 3 + 2]
    if rank == root:
        with pytest.raises(ValueError):  # refused on the root before anything is sent
            mpi.scatter(np.zeros((size + 1, 3)), root)
    mpi.barrier()


def test_reduce_on_root_only(mpi, rank, size):
    x = np.array([rank + 1.0])
    r, _ = mpi.reduce(x, MPI.SUM, size - 1)
    if rank == size - 1:
        assert r[0] == size * (size + 1) / 2
    else:
        assert r[0] == rank + 1.0


def test_scan_is_inclusive(mpi, rank):
    r, _ = mpi.scan(np.array([rank + 1]), MPI.SUM)
    assert r[0] == (rank + 1) * (rank + 2) // 2


def test_send_recv_with_status_and_tags(mpi, rank, size):
    if size < 2:
        pytest.skip("needs two ranks")
    if rank == 0:
        tok = mpi.send(np.arange(4.0), 1, tag=7)
        assert isinstance(tok, mpi.Token)
    elif rank == 1:
        status = MPI.Status()
        like = np.full(4, -1.0)
        r, tok = mpi.recv(like, 0, tag=7, status=status)
        assert r.tolist() == [0, 1, 2, 3]
        assert (like == -1).all()  # "can contain arbitrary data and will not be overwritten"
        assert status.Get_source() == 0 and status.Get_tag() == 7
        assert status.Get_count(MPI.DOUBLE) == 4
    mpi.barrier()
    # Defaults: source=ANY_SOURCE, tag=ANY_TAG.
    if rank == 1:
        mpi.send(np.array([42], np.int32), 0, tag=3)
    elif rank == 0:
        status = MPI.Status()
        r, _ = mpi.recv(np.zeros(1, np.int32), status=status)
        assert r[0] == 42 and status.Get_source() == 1 and status.Get_tag() == 3
    mpi.barrier()


def test_small_sends_return_before_their_receives_as_mpis_eager_sends_do(mpi, rank, size):
    # More small messages than shm's ring from one rank to another holds, then a barrier that the receiver joins before
    # it takes any (and it sends none): each send returns at once, as an eager MPI_Send does, and the rest go out while
    # the sender waits in the barrier and after. One rank: to itself.
    dest, count = min(1, size - 1), 40
    if rank == 0:
        for i in range(count):
            mpi.send(np.full(3, i, np.int64), dest, tag=i)
    mpi.barrier()
    if rank == dest:
        for i in range(count):
            r, _ = mpi.recv(np.zeros(3, np.int64), 0, tag=i)
            assert r.tolist() == [i] * 3
    mpi.barrier()


def test_sendrecv_ring(mpi, rank, size):
    right, left = (rank + 1) % size, (rank - 1) % size
    status = MPI.Status()
    r, tok = mpi.sendrecv(np.array([rank] * 3), np.zeros(3, np.int64), left, right, sendtag=5, recvtag=5,
                          status=status)
    assert r.tolist() == [left] * 3
    assert status.Get_source() == left


def test_tokens_order_operations(mpi, rank, size):
    tok = None
    acc = np.array([1.0])
    for _ in range(3):
        acc, tok = mpi.allreduce(acc, op=MPI.SUM, token=tok)
    assert acc[0] == size ** 3
    joined = mpi.Token.join(tok, mpi.barrier(token=tok))
    joined.wait()
    assert joined.is_complete()


def test_comm_accepts_mpi4py_communicators(sk, mpi, rank, size):
    # Defaults to a clone of COMM_WORLD: a separate message space from mpi4py's own COMM_WORLD.
    default = sk._core.comm(None)
    assert default.handle != MPI._handleof(MPI.COMM_WORLD)
    assert default.size == size
    # An mpi4py communicator is used as given.
    halves = MPI.COMM_WORLD.Split(rank % 2, rank)
    r, _ = mpi.allreduce(np.array([1]), op=MPI.SUM, comm=halves)
    assert r[0] == halves.Get_size()
    assert sk._core.comm(halves).handle == MPI._handleof(halves)
    assert sk._core.comm(halves) is sk._core.comm(halves)  # cached on the communicator
    # Point to point on a fresh mpi4py communicator needs no collective set-up (no hang with two ranks).
    if size >= 2:
        fresh = MPI.COMM_WORLD.Dup()
        if rank == 0:
            mpi.send(np.array([5]), 1, comm=fresh)
        elif rank == 1:
            assert mpi.recv(np.zeros(1, np.int64), 0, comm=fresh)[0][0] == 5
        MPI.COMM_WORLD.Barrier()
        fresh.Free()
    halves.Free()
    with pytest.raises(ValueError):
        mpi.allreduce(np.ones(1), op=MPI.SUM, comm="world")
    # Other mpi4py objects are not communicators (a group's handle must never be taken for one).
    group = MPI.COMM_WORLD.Get_group()
    with pytest.raises(sk.InvalidArgument, match="comm must be None, a shardkit Communicator or an mpi4py communicator"):
        mpi.allreduce(np.ones(1), op=MPI.SUM, comm=group)
    group.Free()
    # Subclasses of Comm are communicators.
    cart = MPI.COMM_WORLD.Create_cart([size])
    r, _ = mpi.allreduce(np.array([2]), op=MPI.SUM, comm=cart)
    assert r[0] == 2 * size
    cart.Free()
    # A freed communicator (its handle is now MPI_COMM_NULL) is refused, not used.
    with pytest.raises(sk.InvalidArgument, match="COMM_NULL"):
        mpi.allreduce(np.array([2]), op=MPI.SUM, comm=cart)


def test_mpi4py_traffic_and_ours_coexist(mpi, rank, size):
    # mpi4py's own collectives on COMM_WORLD interleave with ours on the default clone.
    total = MPI.COMM_WORLD.allreduce(rank)
    r, _ = mpi.allreduce(np.array([rank]), op=MPI.SUM)
    assert r[0] == total


def test_blocking_calls_release_the_gil(mpi, rank, size):
    """While rank 1 waits in a barrier for a late rank 0, another Python thread on rank 1 keeps running."""
    if size < 2:
        pytest.skip("needs a rank to wait for")
    counter = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            counter[0] += 1

    if rank == 0:
        time.sleep(0.5)
        mpi.barrier()
    else:
        t = threading.Thread(target=spin)
        t.start()
        time.sleep(0.05)
        before = counter[0]
        mpi.barrier()
        during = counter[0] - before
        stop.set()
        t.join()
        assert during > 1000, f"the spinning thread advanced only {during} times while we waited"


@pytest.mark.parametrize("options", [{}, {"timeout": 60.0}, {"async_": True}], ids=["blocking", "timeout", "async"])
def test_numpy_fast_path_on_every_kind_of_communicator(sk, mpi, rank, size, options):
    """NumPy arrays go in without a copy: borrowed for the call on a blocking communicator, held by a reference when
    the communicator may keep them past the call (timeout, async). Either way the results are right, stay valid after
    the input is gone, and no reference is left behind (the input's count is unchanged)."""
    import gc
    import sys

    comm = sk._core.make_comm(timeout=options.get("timeout"), async_=options.get("async_", False),
                              name="fast-path")
    for n in (0, 1, 7):  # empty, one element, and a size no rank count divides
        x = np.arange(n, dtype=np.float64) + rank
        strided = (np.arange(2 * n, dtype=np.float64) + rank)[::2]  # a view: not contiguous
        base = strided.base
        before, before_base = sys.getrefcount(x), sys.getrefcount(base)
        r, tok = mpi.allreduce(x, op=MPI.SUM, comm=comm)
        s, _ = mpi.allreduce(strided, op=MPI.SUM, comm=comm, token=tok)
        g, _ = mpi.allgather(x, comm=comm)
        c, _ = mpi.scan(x, op=MPI.SUM, comm=comm)
        # The Communicator's own methods take the same path.
        r2, _ = comm.allreduce(strided, sk.ReduceOp.SUM)
        g2, _ = comm.allgather(x)
        c2, _ = comm.scan(x, sk.ReduceOp.SUM)
        after, after_base = sys.getrefcount(x), sys.getrefcount(base)
        assert (after, after_base) == (before, before_base)
        want = size * np.arange(n) + size * (size - 1) / 2
        del x, strided, base
        gc.collect()
        np.testing.assert_array_equal(r, want)
        np.testing.assert_array_equal(s, 2 * size * np.arange(n) + size * (size - 1) / 2)
        assert g.shape == (size, n) and all((g[q] == np.arange(n) + q).all() for q in range(size))
        np.testing.assert_array_equal(c, (rank + 1) * np.arange(n) + rank * (rank + 1) / 2)
        np.testing.assert_array_equal(r2, s)
        np.testing.assert_array_equal(g2, g)
        np.testing.assert_array_equal(c2, c)
        assert r.flags.writeable and r.flags.c_contiguous and r.base is None  # a NumPy array of its own
    if size >= 2:  # receives fill a new array; the template is never written
        like = np.full(3, -1.0)
        if rank == 0:
            mpi.send(np.array([1.0, 2.0, 3.0]), 1, comm=comm)
        elif rank == 1:
            got, _ = mpi.recv(like, 0, comm=comm)
            assert got.tolist() == [1.0, 2.0, 3.0] and like.tolist() == [-1.0] * 3
    mpi.barrier(comm=comm)


def test_arguments_are_checked_as_python_checks_them(sk, mpi, rank, size):
    """The functions parse their arguments themselves (no general dispatcher on the hot path): positional and keyword
    forms, keyword-only parameters, defaults and every kind of bad call behave as for a Python function."""
    import inspect

    x = np.arange(3.0)
    want = size * x
    np.testing.assert_array_equal(mpi.allreduce(x, MPI.SUM)[0], want)
    np.testing.assert_array_equal(mpi.allreduce(x=x, op=MPI.SUM)[0], want)
    np.testing.assert_array_equal(mpi.allreduce(x, **{"o" + "p": "sum"})[0], want)  # a keyword made at run time
    assert str(inspect.signature(mpi.allreduce)) == "(x, op, *, comm=None, token=None)"
    assert list(inspect.signature(mpi.sendrecv).parameters)[:4] == ["sendbuf", "recvbuf", "source", "dest"]
    assert inspect.signature(mpi.recv).parameters["source"].default == mpi.ANY_SOURCE
    assert "(result, token)" in mpi.allreduce.__doc__ and mpi.allreduce.__name__ == "allreduce"
    with pytest.raises(TypeError, match=r"allreduce\(\) missing required argument 'op'"):
        mpi.allreduce(x)
    with pytest.raises(TypeError, match=r"takes at most 2 positional arguments \(3 given\)"):
        mpi.allreduce(x, MPI.SUM, None)  # comm is keyword-only
    with pytest.raises(TypeError, match="unexpected keyword argument 'root'"):
        mpi.allreduce(x, MPI.SUM, root=0)
    with pytest.raises(TypeError, match="multiple values for argument 'op'"):
        mpi.allreduce(x, MPI.SUM, op=MPI.SUM)
    with pytest.raises(TypeError, match="token must be a shardkit Token, a JAX token or None, not int"):
        mpi.allreduce(x, MPI.SUM, token=3)
    with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
        mpi.bcast(x, 0.0)
    with pytest.raises(OverflowError):
        mpi.bcast(x, 2 ** 40)
    with pytest.raises(sk.InvalidArgument, match="root -1 out of range"):
        mpi.bcast(x, -1)
    with pytest.raises(TypeError, match="missing required argument 'x'"):
        sk.psum(axis_name="x")
    with pytest.raises(sk.InvalidArgument, match="only be called inside a shard_map body"):
        sk.psum(x, "x")
    r, tok = mpi.bcast(x + rank, root=size - 1)  # an int-like root by keyword
    np.testing.assert_array_equal(r, x + size - 1)
    assert isinstance(mpi.barrier(token=tok), mpi.Token)


def test_communicator_methods_are_the_mpi_functions_bound_to_the_communicator(sk, mpi, rank, size):
    """Communicator methods and shardkit.mpi are two views of one binding: the same parameters (less comm), the same
    op spellings, the same per-rank shape rules and results, and the same errors."""
    import inspect

    comm = sk.world()
    x = np.arange(4.0) + rank
    for name in ("allreduce", "reduce", "bcast", "allgather", "gather", "scatter", "alltoall", "send", "recv",
                 "sendrecv", "barrier", "scan"):
        params = [p for p in inspect.signature(getattr(mpi, name)).parameters if p != "comm"]
        assert list(inspect.signature(getattr(comm, name)).parameters) == params, name
    assert str(inspect.signature(comm.allreduce)) == "(x, op, *, token=None)"
    for op in (MPI.SUM, "sum", "SUM", sk.ReduceOp.SUM, int(sk.ReduceOp.SUM)):
        np.testing.assert_array_equal(comm.allreduce(x, op)[0], mpi.allreduce(x, op)[0])
    np.testing.assert_array_equal(comm.scan(x, MPI.MAX)[0], mpi.scan(x, "max")[0])
    np.testing.assert_array_equal(comm.allgather(x)[0], mpi.allgather(x, comm=comm)[0])
    got, _ = comm.gather(x, size - 1)
    assert got.shape == ((size, 4) if rank == size - 1 else (4,))
    # Operations mpi4jax lacks are Communicator methods only.
    blocks = np.stack([np.full(3, float(rank * size + q)) for q in range(size)])
    rs, _ = comm.reduce_scatter(blocks, "sum")
    np.testing.assert_array_equal(rs, np.full(3, float(sum(q * size + rank for q in range(size)))))
    v, _ = comm.allgatherv(np.full(rank + 1, rank, np.int32))
    np.testing.assert_array_equal(v, np.concatenate([np.full(q + 1, q, np.int32) for q in range(size)]))
    assert not hasattr(mpi, "reduce_scatter")
    with pytest.raises(sk.InvalidArgument, match="unknown reduction 'average'"):
        comm.allreduce(x, "average")
    with pytest.raises(sk.InvalidArgument, match=f"root {size} out of range"):
        comm.bcast(x, size)
    with pytest.raises(TypeError, match=r"allreduce\(\) missing required argument 'op'"):
        comm.allreduce(x)


def test_every_operation_has_its_facts(sk):
    """The operation table's facts as the Python and JAX layers read them (_core._op_facts, one row per OpKind): each
    has a value rule, batch axes and transposes, and its Python entry's parameters are the Communicator method's and
    (where mpi4jax has the function) shardkit.mpi's."""
    import inspect

    facts = sk._core._op_facts()
    rules = {"none", "same_shape", "stacked", "root_stacked", "root_same", "drop_leading", "scatter", "root_copy",
             "like", "concat"}
    keys = {"value", "collective", "reduces", "rooted", "has_dest", "has_source", "batch", "python", "mpi4jax",
            "params", "transpose", "sm_transpose"}
    assert {"allreduce", "sendrecv", "alltoallv"} <= set(facts)
    for name, f in facts.items():
        assert set(f) == keys, name
        assert f["value"] in rules, name
        assert all(len(b) == 2 and all(a in (0, 1) for a in b) for b in f["batch"]), name
        for partner in (f["transpose"], f["sm_transpose"]):
            assert partner is None or partner in facts, name
        assert hasattr(sk.Communicator, name) == f["python"], name
        assert hasattr(sk.mpi, name) == f["mpi4jax"], name
        if not f["python"]:
            continue
        method = list(inspect.signature(getattr(sk.Communicator, name)).parameters)
        assert method == ["self"] + f["params"], name
        if f["mpi4jax"]:
            function = [p for p in inspect.signature(getattr(sk.mpi, name)).parameters if p != "comm"]
            assert function == f["params"], name
        wanted = {"op"} if f["reduces"] else set()
        wanted |= {"root"} if f["rooted"] else set()
        wanted |= {"dest"} if f["has_dest"] else set()
        wanted |= {"source"} if f["has_source"] else set()
        assert wanted <= set(f["params"]), name


def test_make_comm_gives_each_communicator_its_own_settings(sk, mpi, rank, size):
    """make_comm(backend=, timeout=, check=): the collectives layer's settings per communicator (SHARDKIT_BACKEND and
    friends only fill the defaults); what is not given is the base communicator's; a setting it cannot take raises."""
    assert sk.make_comm is sk._core.make_comm
    forced = sk.make_comm(backend="mpi", timeout=7.5, check=True, name="forced mpi")
    assert (forced.backend, forced.timeout, forced.check) == ("mpi", 7.5, True)
    assert forced.transport_for("allreduce") == "mpi"
    on_shm = sk._core.make_comm(backend="shm", name="forced shm")
    assert on_shm.backend == "shm"
    assert on_shm.transport_for("allreduce") == "shm"  # one node, host buffers: made with the communicator
    assert on_shm.transport_for("scan") == "mpi"  # shm has no scan: the fallback takes it
    inherited = sk._core.make_comm(forced, name="from forced")
    assert (inherited.backend, inherited.timeout, inherited.check) == ("mpi", 7.5, True)
    x = np.arange(5, dtype=np.float64) + rank
    want = size * np.arange(5) + size * (size - 1) / 2
    for c in (forced, on_shm, inherited):
        r, _ = mpi.allreduce(x, op="sum", comm=c)
        np.testing.assert_array_equal(r, want)
    with pytest.raises(sk.InvalidArgument, match="backend='tcp': expected auto, mpi, nccl or shm"):
        sk._core.make_comm(backend="tcp")
    with pytest.raises(sk.InvalidArgument, match="timeout=-1"):
        sk._core.make_comm(timeout=-1)
    # The rest of CommOptions: given, read back, inherited; a count below zero raises.
    tuned = sk.make_comm(trace_buffer=0, shm_single_copy=False, shm_pending_bytes=4096, verbose=False, name="tuned")
    assert (tuned.trace_buffer, tuned.shm_single_copy, tuned.shm_pending_bytes) == (0, False, 4096)
    again = sk.make_comm(tuned, name="from tuned")
    assert (again.trace_buffer, again.shm_single_copy, again.shm_pending_bytes) == (0, False, 4096)
    assert sk.world().trace_buffer != 0 or os.environ.get("SHARDKIT_TRACE_BUFFER") == "0"
    r, _ = mpi.allreduce(x, op="sum", comm=tuned)
    np.testing.assert_array_equal(r, want)
    for what in ("trace_buffer", "shm_pending_bytes"):
        with pytest.raises(sk.InvalidArgument, match=what + "=-1"):
            sk.make_comm(**{what: -1})
