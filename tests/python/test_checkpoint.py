"""Checkpoints from Python: trees of NumPy- and JAX-backed ShardedArrays, plain arrays, numbers and optimizer-like
states saved on the world's mesh and loaded onto others (specs as one P, a prefix pytree, a callable, or as saved),
`like=` templates, background saves, what other Zarr readers (TensorStore, zarr-python) see, the command line, and
(in their own mpirun jobs) a rank killed at each stage of a save: the last good step stays and loads.
"""

import collections
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import pytest

from conftest import has_module, mpirun

State = collections.namedtuple("State", ["count", "mu", "nu"])

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
          "float64", "complex64", "complex128"]


def values(shape, dtype, salt=0):
    """A deterministic global array: distinct values that every dtype holds exactly."""
    n = int(np.prod(shape))
    i = np.arange(n, dtype=np.int64) + salt
    if dtype == "bool":
        return (i % 3 == 0).reshape(shape)
    if dtype.startswith("complex"):
        return (i - 2 + 1j * (i % 7)).astype(dtype).reshape(shape)
    if dtype.startswith("uint"):
        return (i % 200).astype(dtype).reshape(shape)
    return ((i % 100) - 50).astype(dtype).reshape(shape)


@pytest.fixture
def shared_dir(sk, rank):
    """A fresh directory every rank names alike; removed by rank 0 once every rank is done."""
    path = tempfile.mkdtemp(prefix="shardkit-ckpt-py-") if rank == 0 else ""
    buf = np.zeros(512, np.uint8)
    buf[:len(path)] = np.frombuffer(path.encode(), np.uint8)
    out, _ = sk.mpi.bcast(buf, 0)
    path = bytes(np.asarray(out)).rstrip(b"\0").decode()
    yield path
    sk.mpi.barrier()
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def meshes(sk, size):
    out = [sk.Mesh((size,), ("x",))]
    if size == 4:
        out.append(sk.Mesh((2, 2), ("x", "y")))
    if size == 2:
        out.append(sk.Mesh((1, 2), ("x", "y")))
    return out


def global_of(sk, x):
    return np.asarray(sk.process_allgather(x))


def test_a_tree_saved_on_one_mesh_loads_onto_every_other(sk, size, shared_dir):
    from shardkit import P

    mesh = sk.Mesh((size,), ("x",))
    s = sk.NamedSharding(mesh, P("x"), uneven=True)
    w = values((7, 5), "float32")
    tree = {
        "params": {"w": sk.distribute(w, s), "b": sk.distribute(values((5,), "int16"), sk.NamedSharding(mesh, P()))},
        "opt": State(count=3, mu=sk.distribute(values((7, 5), "float64", 1), s), nu=np.arange(4.0)),
        "empty": sk.distribute(np.zeros((0, 3), np.float32), sk.NamedSharding(mesh, P(None, "x"), uneven=True)),
        "lr": 0.125, "done": False, "name_with/slash": np.int32(5), "none": None,
    }
    h = sk.save(shared_dir, tree, metadata={"epoch": 2})
    assert h.done() and h.step == 0 and sk.checkpoint.latest_step(shared_dir) == 0
    for target in meshes(sk, size):
        axis = target.axis_names[-1]
        for specs in [P(axis), {"params": P(axis), "opt": P(), "empty": P(), "lr": P(), "done": P(),
                                "name_with/slash": P(), "none": None},
                      lambda key, info: P(axis) if len(info["shape"]) == 2 else P(), None]:
            out = sk.load(shared_dir, target, specs, uneven=True)
            assert sorted(out) == sorted(tree)
            np.testing.assert_array_equal(global_of(sk, out["params"]["w"]), w)
            np.testing.assert_array_equal(global_of(sk, out["params"]["b"]), values((5,), "int16"))
            np.testing.assert_array_equal(global_of(sk, out["opt"]["mu"]), values((7, 5), "float64", 1))
            # Plain values come back whole on every rank; numbers as the Python type they were.
            np.testing.assert_array_equal(out["opt"]["nu"], np.arange(4.0))
            assert out["opt"]["count"] == 3 and type(out["opt"]["count"]) is int
            assert out["lr"] == 0.125 and out["done"] is False and out["none"] is None
            assert int(out["name_with/slash"]) == 5
            assert global_of(sk, out["empty"]).shape == (0, 3)
            if isinstance(specs, type(P())):
                assert out["params"]["w"].spec == P(axis)
            if specs is None:  # as saved, where the target mesh has the axes
                assert out["params"]["w"].spec == (P("x") if "x" in target.axis_names else P())
    info = sk.checkpoint_info(shared_dir)
    assert info["steps"] == [0] and info["committed"] and info["metadata"] == {"epoch": 2}
    assert info["saved_ranks"] == size
    keys = {a["key"]: a for a in info["arrays"]}
    assert keys["params/w"]["spec"] == P("x") and keys["params/w"]["mesh_shape"] == (size,)
    assert keys["params/w"]["shape"] == (7, 5) and keys["params/w"]["dtype"] == "float32"
    assert "name_with%2Fslash" in keys and keys["lr"]["plain"]


def test_like_gives_back_the_classes_and_checks_the_keys(sk, size, shared_dir):
    from shardkit import P

    mesh = sk.Mesh((size,), ("x",))
    s = sk.NamedSharding(mesh, P("x"), uneven=True)
    state = State(count=7, mu=sk.distribute(values((6, 2), "int32"), s), nu=[1.5, np.ones(3, np.float32)])
    sk.save(shared_dir, {"state": state}, step=5)
    out = sk.load(shared_dir, mesh, P("x"), like={"state": state}, uneven=True)
    assert isinstance(out["state"], State) and isinstance(out["state"].nu, list)
    np.testing.assert_array_equal(global_of(sk, out["state"].mu), values((6, 2), "int32"))
    assert out["state"].nu[0] == 1.5
    # Without like=, a namedtuple comes back as a dict of its fields.
    plain = sk.load(shared_dir, mesh, P("x"), uneven=True)
    assert sorted(plain["state"]) == ["count", "mu", "nu"]
    with pytest.raises(sk.InvalidArgument, match="key 'state/extra' of like= is not in step 5"):
        sk.load(shared_dir, mesh, P(), like={"state": {"extra": 1}})
    with pytest.raises(sk.InvalidArgument, match="not a prefix"):
        sk.load(shared_dir, mesh, {"other": P()})
    with pytest.raises(sk.InvalidArgument, match="the leaf at 'text' is a str"):
        sk.save(shared_dir, {"text": "hello"})
    with pytest.raises(sk.InvalidArgument, match="step 9 does not exist"):
        sk.load(shared_dir, mesh, P(), step=9)


def test_jax_backed_arrays_save_and_load_as_jax(sk, size, shared_dir):
    jax = pytest.importorskip("jax")
    from shardkit import P

    mesh = sk.Mesh((size,), ("x",))
    s = sk.NamedSharding(mesh, P("x"), uneven=True)
    g = values((5, 3), "float32")
    x = sk.distribute(jax.numpy.asarray(g), s)
    assert x.framework == "jax"
    plain = jax.numpy.arange(3)  # int32, or int64 where another test of the process turned on jax_enable_x64
    sk.save(shared_dir, {"x": x, "plain": plain})
    out = sk.load(shared_dir, mesh, P("x"), framework="jax", uneven=True)
    assert isinstance(out["x"].local, jax.Array) and isinstance(out["plain"], jax.Array)
    np.testing.assert_array_equal(global_of(sk, out["x"]), g)
    like = sk.load(shared_dir, mesh, P("x"), like={"x": x, "plain": np.zeros(3, plain.dtype)}, uneven=True)
    assert isinstance(like["x"].local, jax.Array) and isinstance(like["plain"], np.ndarray)


def test_a_background_save_copies_the_blocks_and_commits_at_wait(sk, size, shared_dir):
    from shardkit import P

    mesh = sk.Mesh((size,), ("x",))
    s = sk.NamedSharding(mesh, P("x"), uneven=True)
    block = np.array(sk.distribute(values((9, 4), "float64"), s).local)  # a writable block of our own
    x = sk.from_local(block, (9, 4), s)
    h = sk.save(shared_dir, {"x": x}, blocking=False)
    block[...] = -1  # the save staged its own copy
    assert sk.checkpoint.steps(shared_dir) == []
    h.wait()
    assert h.done() and sk.checkpoint.steps(shared_dir) == [0]
    np.testing.assert_array_equal(global_of(sk, sk.load(shared_dir, mesh, P("x"), uneven=True)["x"]),
                                  values((9, 4), "float64"))
    sk.save(shared_dir, {"x": x}, blocking=False)
    sk.checkpoint.wait_for_saves()
    h2 = sk.save(shared_dir, {"x": x}, keep_last=1)
    assert h2.step == 2 and sk.checkpoint.steps(shared_dir) == [2]


def test_per_rank_state_comes_back_to_its_rank(sk, rank, size, shared_dir):
    from shardkit import P

    mesh = sk.Mesh((size,), ("x",))
    x = sk.distribute(values((5, 2), "float32"), sk.NamedSharding(mesh, P("x"), uneven=True))
    rng = np.random.default_rng(rank)
    mine = {"rank": rank, "position": 1000 * rank + 7, "name": "é" * rank, "rng": rng.bit_generator.state}
    sk.save(shared_dir, {"x": x}, step=0, rank_state=mine)
    assert sk.checkpoint.load_rank_state(shared_dir) == mine
    assert np.random.default_rng(rank).bit_generator.state == sk.checkpoint.load_rank_state(shared_dir, 0)["rng"]
    assert list(sk.load(shared_dir, mesh)) == ["x"]  # not a leaf of the tree
    sk.save(shared_dir, {"x": x}, step=1)
    with pytest.raises(sk.InvalidArgument, match="step 1 .* holds no per-rank state"):
        sk.checkpoint.load_rank_state(shared_dir)
    with pytest.raises(sk.InvalidArgument, match="rank_state must be JSON"):
        sk.save(shared_dir, {"x": x}, step=2, rank_state={"f": open})


RANK_STATE = r"""
import sys, shardkit as sk
root, mode = sys.argv[1], sys.argv[2]
if mode == "save":
    sk.save(root, {"n": 1}, rank_state={"seen": 10 * sk.rank() + 1})
elif mode == "merge":
    got = sk.checkpoint.load_rank_state(root, merge=lambda states, r, n: [s["seen"] for s in states])
    print(f"merged {sk.rank()} {got}\n", end="", flush=True)
else:
    try:
        print(f"loaded {sk.rank()} {sk.checkpoint.load_rank_state(root)}\n", end="", flush=True)
    except sk.InvalidArgument as e:
        print(f"refused {e}\n", end="", flush=True)
"""


@pytest.mark.processes
def test_per_rank_state_onto_another_count_needs_a_merge(tmp_path):
    script = tmp_path / "rank_state.py"
    script.write_text(RANK_STATE)
    root = str(tmp_path / "ckpt")
    assert mpirun(3, [sys.executable, str(script), root, "save"]).returncode == 0
    same = mpirun(3, [sys.executable, str(script), root, "plain"])
    assert all(f"loaded {r} {{'seen': {10 * r + 1}}}" in same.stdout for r in range(3)), same.stdout + same.stderr
    fewer = mpirun(2, [sys.executable, str(script), root, "plain"])
    assert fewer.stdout.count("per-rank state of 3 rank(s) and this job has 2") == 2, fewer.stdout + fewer.stderr
    merged = mpirun(2, [sys.executable, str(script), root, "merge"])
    assert all(f"merged {r} [1, 11, 21]" in merged.stdout for r in range(2)), merged.stdout + merged.stderr


def test_a_bare_array_a_cpp_style_step_and_like_checks(sk, rank, size, shared_dir):
    from shardkit import P

    mesh = sk.Mesh((size,), ("x",))
    x = sk.distribute(values((size + 1, 2), "float64"), sk.NamedSharding(mesh, P("x"), uneven=True))
    # A tree that is one leaf.
    sk.save(shared_dir, x, step=0)
    back = sk.load(shared_dir, mesh, P("x"), step=0)
    np.testing.assert_array_equal(global_of(sk, back), values((size + 1, 2), "float64"))
    # A step saved with no Python tree (as a C++ program saves): keys with '/' come back as saved.
    sk._core.checkpoint_save(shared_dir, [("params/w", sk._sharding._unwrap(x))], 1, "null", "null", 0, 1 << 20, True,
                             True, None)
    got = sk.load(shared_dir, mesh, P("x"), step=1)
    assert list(got) == ["params/w"]
    np.testing.assert_array_equal(global_of(sk, got["params/w"]), values((size + 1, 2), "float64"))
    # like= says the shape and dtype it expects: a difference names the key and both values.
    # (the C++ key 'params/w' is the Python tree {"params": {"w": ...}})
    with pytest.raises(sk.InvalidArgument, match=r"'params/w' was saved with shape .*; the caller expects \(7,\)"):
        sk.load(shared_dir, mesh, P("x"), step=1, like={"params": {"w": np.zeros((7,), np.float64)}})
    with pytest.raises(sk.InvalidArgument, match="'params/w' was saved as float64; the caller expects float32"):
        sk.load(shared_dir, mesh, P("x"), step=1, like={"params": {"w": np.zeros((size + 1, 2), np.float32)}})
    back = sk.load(shared_dir, mesh, P("x"), step=1, like={"params": {"w": x}})
    np.testing.assert_array_equal(global_of(sk, back["params"]["w"]), values((size + 1, 2), "float64"))


def test_a_failure_on_one_rank_is_raised_on_every_rank(sk, rank, size, shared_dir):
    from shardkit import P

    mesh = sk.Mesh((size,), ("x",))
    x = sk.distribute(values((4, 2), "float32"), sk.NamedSharding(mesh, P("x"), uneven=True))
    last = size - 1
    # The last rank's tree has a leaf that is no array; the others' do not: every rank raises (none waits).
    with pytest.raises(sk.InvalidArgument, match="not an array" if rank == last else f"on rank {last}"):
        sk.save(shared_dir, {"x": x, "y": "text" if rank == last else 1.0})
    # Its rank state is no JSON.
    with pytest.raises(sk.InvalidArgument, match="rank_state must be JSON"):
        sk.save(shared_dir, {"x": x}, rank_state={"f": open} if rank == last else {"ok": 1})
    # Only some ranks pass a rank state.
    if size > 1:
        with pytest.raises(sk.MismatchError):
            sk.save(shared_dir, {"x": x}, rank_state={"r": rank} if rank == 0 else None)
    sk.mpi.barrier()  # the communicator goes on
    assert sk.checkpoint.steps(shared_dir) == []


def test_other_zarr_readers_open_every_array(sk, rank, size, shared_dir):
    from shardkit import P

    mesh = sk.Mesh((size,), ("x",))
    tree, globals_ = {}, {"scalar": np.asarray(2.5)}
    for i, dt in enumerate(DTYPES + ["bfloat16"]):
        if dt == "bfloat16":
            ml_dtypes = pytest.importorskip("ml_dtypes")
            g = values((6, 5), "float32").astype(ml_dtypes.bfloat16)
        else:
            g = values((6, 5), dt)
        spec = [P("x"), P(None, "x"), P()][i % 3]
        tree[dt], globals_[dt] = sk.distribute(g, sk.NamedSharding(mesh, spec, uneven=True)), g
    tree["scalar"] = 2.5
    sk.save(shared_dir, tree, step=1, chunk_bytes=16)  # several inner chunks per file
    sk.mpi.barrier()
    if rank != 0:
        return
    readers = [m for m in ("tensorstore", "zarr") if has_module(m)]
    if not readers:
        pytest.skip("neither tensorstore nor zarr is installed (scripts/setup.sh installs both)")
    step_dir = os.path.join(shared_dir, "step_1")
    for key in list(tree):
        want = globals_[key]
        path = os.path.join(step_dir, key)
        if "tensorstore" in readers:
            import tensorstore as ts

            got = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": path}}).result().read().result()
            assert got.dtype.name == want.dtype.name or key == "bfloat16", key
            np.testing.assert_array_equal(np.asarray(got).reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8),
                                          err_msg=key)
        if "zarr" in readers and key != "bfloat16":  # zarr-python has no bfloat16
            import zarr

            got = zarr.open_array(path, mode="r")[...]
            np.testing.assert_array_equal(np.asarray(got), want, err_msg=key)
    if "zarr" in readers:
        import warnings

        import zarr

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing in a step that zarr does not know
            group = zarr.open_group(step_dir, mode="r")
            assert group.attrs["shardkit"]["step"] == 1
            assert sorted(group.attrs["shardkit"]["keys"]) == sorted(tree)
            for key in tree:  # listing the members would parse bfloat16's metadata, which zarr-python cannot
                if key != "bfloat16":
                    np.testing.assert_array_equal(np.asarray(group[key][...]), globals_[key], err_msg=key)


def test_the_command_line_lists_what_a_step_holds(sk, rank, size, shared_dir):
    from shardkit import P

    mesh = sk.Mesh((size,), ("x",))
    sk.save(shared_dir, {"w": sk.distribute(values((4, 3), "float32"), sk.NamedSharding(mesh, P("x"), uneven=True)),
                         "n": 3}, metadata={"tag": "t"})
    if rank != 0:
        return
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert sk.checkpoint.main(["inspect", shared_dir, "--verify"]) == 0
    text = out.getvalue()
    assert "step 0: committed, verified" in text and f"saved by {size} rank(s)" in text
    assert "w: float32[4, 3]" in text and "spec P('x')" in text and '"tag": "t"' in text
    assert "n: int64[] plain" in text
    # A damaged file is named.
    chunk = os.path.join(shared_dir, "step_0", "w", "c", "0", "0")
    with open(chunk, "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 1]))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert sk.checkpoint.main(["inspect", shared_dir, "--verify"]) == 2
    assert chunk in out.getvalue() and "crc32c" in out.getvalue()


# ---- a rank killed during a save (its own mpirun jobs) ----------------------------------------------------------

SAVER = r"""
import sys, numpy as np, shardkit as sk
from shardkit import P
root, step = sys.argv[1], int(sys.argv[2])
mesh = sk.Mesh((sk.size(),), ("x",))
s = sk.NamedSharding(mesh, P("x"), uneven=True)
g = (np.arange(40.0) + step).reshape(8, 5)
x = sk.distribute(g, s)
done = sk.checkpoint.steps(root)
if done:  # what is committed loads exactly, whatever the last job did
    last = done[-1]
    got = np.asarray(sk.process_allgather(sk.load(root, mesh, P("x"), uneven=True)["x"]))
    assert np.array_equal(got, (np.arange(40.0) + last).reshape(8, 5)), (last, got)
sk.save(root, {"x": x}, step=step, keep_last=2)
print(f"saved {step} {sk.checkpoint.steps(root)}\n", end="", flush=True)  # one write: ranks' lines never interleave
"""


@pytest.mark.processes
@pytest.mark.parametrize("stage,victim", [("write", 1), ("manifest", 0), ("rename", 0), ("cleanup", 0)])
def test_a_rank_killed_during_a_save_leaves_the_last_step_whole(tmp_path, stage, victim):
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    root = str(tmp_path / "ckpt")
    for step in (0, 1):
        run = mpirun(3, [sys.executable, str(script), root, str(step)])
        assert run.returncode == 0, run.stdout + run.stderr
    # Step 2 dies: one rank SIGKILLed at the stage (the job ends).
    run = mpirun(3, [sys.executable, str(script), root, "2"], SHARDKIT_CHECKPOINT_TEST_KILL=f"{stage}:{victim}")
    assert run.returncode != 0
    listing = sorted(os.listdir(root))
    if stage == "cleanup":
        # Killed after the commit, between keep_last's renames: step 2 is committed; step 0 is on its way out.
        assert "step_2" in listing and "step_0" not in listing, listing
    else:
        assert "step_2" not in listing, listing
        if victim == 0:  # rank 0 died holding the temporary directory (a survivor rank 0 removes it as it fails)
            assert [n for n in listing if n.startswith(".tmp-step_2")], listing
    # The next job finds the last committed step whole (the saver checks it loads exactly), and its save clears what
    # the killed one left.
    run = mpirun(3, [sys.executable, str(script), root, "3"])
    assert run.returncode == 0, run.stdout + run.stderr
    expected = [1, 3] if stage != "cleanup" else [2, 3]
    assert f"saved 3 {expected}" in run.stdout, run.stdout
    assert not [n for n in os.listdir(root) if n.startswith(".tmp-")], os.listdir(root)


def test_checkpoint_info_needs_no_mesh_and_reports_an_empty_root(sk, shared_dir):
    assert sk.checkpoint_info(shared_dir) == {"path": shared_dir, "steps": []}
    assert sk.checkpoint.latest_step(shared_dir) is None
    with pytest.raises(sk.InvalidArgument, match="no committed step"):
        sk.load(shared_dir, sk.Mesh((sk.size(),), ("x",)), None)
    json.dumps(sk.checkpoint_info(shared_dir))
