"""Waiting is interruptible: SIGINT or SIGTERM sent to a rank blocked in a collective that rank 0 never enters ends the
rank within 2 s with KeyboardInterrupt (shardkit.Interrupted) and the job ends (MPI_Abort at exit, as after a
timeout) long before SHARDKIT_TIMEOUT_S; without a timeout (one blocking MPI call) the watchdog ends the rank; and a size mismatch that MPI reports as a truncation says to rerun with
SHARDKIT_CHECK=1 and ends the job. Each case starts its own mpirun job."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import clean_env, has_module

pytestmark = pytest.mark.processes

TIMEOUT_S = 60  # far beyond what a case may take: the timeout cannot be what ends the job

# Rank 0 never enters; every other rank blocks in `sys.argv[1]`'s wait, after writing its pid (and the time it starts
# waiting) for the test. What ends a rank's wait is printed with the time, then raised on: the job ends at exit.
RANK_PROGRAM = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import shardkit as sk
    mode, where = sys.argv[1], sys.argv[2]
    rank = sk.rank()
    if mode == "jit":
        import jax
        recv = jax.jit(lambda x: sk.mpi.recv(x, source=0)[0])
        recv.lower(np.zeros(2)).compile()  # compiled before the wait starts
    comm = sk._core.make_comm(async_=True, name="interrupt-test") if mode == "token" else sk.world()
    sk.mpi.barrier(comm=comm).wait()  # together once: the wait below is the operation's, not the set-up's
    if rank == 0:
        time.sleep(3 * 60)  # never enters
        sys.exit(0)
    with open(os.path.join(where, f"pid.{rank}.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(where, f"pid.{rank}.tmp"), os.path.join(where, f"pid.{rank}"))
    try:
        if mode == "eager":
            sk.mpi.allreduce(np.ones(2), op="sum", comm=comm)
        elif mode == "token":
            _, token = comm.allreduce(np.ones(2), sk.ReduceOp.SUM)
            token.wait()
        elif mode == "jit":
            recv(np.zeros(2)).block_until_ready()
        print(f"rank {rank}: ERROR: the wait completed", flush=True)
    except BaseException as e:
        print(f"rank {rank}: ended at {time.time():.3f} by {type(e).__module__}.{type(e).__name__}"
              f" (KeyboardInterrupt: {isinstance(e, KeyboardInterrupt)}): {e}", flush=True)
        raise
""")


def run_and_signal(np_, mode, sig, tmp_path, victim=1, timeout=True, backend=None):
    """Starts the job, sends `sig` to rank `victim` once it waits, and returns (signal time, job end time, output).
    `backend`: SHARDKIT_BACKEND for the job (None: the default route)."""
    cmd = [os.environ.get("MPIEXEC", "mpirun"), "--oversubscribe", "--bind-to", "none", "-np", str(np_),
           sys.executable, "-c", RANK_PROGRAM, mode, str(tmp_path)]
    env = clean_env(PYTHONUNBUFFERED="1", SHARDKIT_DUMP_DIR=str(tmp_path / "dumps"))
    if timeout:
        env["SHARDKIT_TIMEOUT_S"] = str(TIMEOUT_S)
    else:
        env.pop("SHARDKIT_TIMEOUT_S", None)
    env.pop("SHARDKIT_CHECK", None)
    if backend:
        env["SHARDKIT_BACKEND"] = backend
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        pid_file = tmp_path / f"pid.{victim}"
        start = time.time()
        while not pid_file.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.time() - start < 60, "the rank never started waiting"
            time.sleep(0.05)
        time.sleep(1.0)  # well inside its wait by now
        sent = time.time()
        os.kill(int(pid_file.read_text()), sig)
        out, _ = proc.communicate(timeout=TIMEOUT_S / 2)
        return sent, time.time(), out
    finally:
        if proc.poll() is None:  # a failed case: SIGTERM lets mpirun take its ranks down too
            proc.terminate()
            try:
                proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def check_interrupted(np_, mode, sig, tmp_path):
    sent, ended, out = run_and_signal(np_, mode, sig, tmp_path)
    # The rank's report is one write to its stdout; mpirun forwards its stdout and stderr apart, so the report may
    # land inside a line of the traceback printed on stderr: it is looked for anywhere, to the end of its line.
    found = re.search(r"rank 1: ended at [^\n]*", out)
    assert found is not None, out
    line = found[0]
    assert "(KeyboardInterrupt: True)" in line or ("shardkit.Interrupted" in line and "interrupt" in line), line
    assert float(line.split()[4]) - sent < 2.0, (line, sent)
    assert "ending the job (MPI_Abort)" in out, out
    assert ended - sent < 20, f"the job took {ended - sent:.1f} s to end"
    return line, out


@pytest.mark.parametrize("np_", [2, 3])
def test_sigint_ends_a_blocking_collective_and_the_job(np_, tmp_path):
    line, out = check_interrupted(np_, "eager", signal.SIGINT, tmp_path)
    assert "shardkit.Interrupted" in line and "on communicator 'world' was interrupted by SIGINT" in line, line
    assert "was interrupted by SIGINT while waiting" in line, line


def test_sigterm_ends_a_blocking_collective_and_the_job(tmp_path):
    line, _ = check_interrupted(2, "eager", signal.SIGTERM, tmp_path)
    assert "shardkit.Interrupted" in line and "was interrupted by SIGTERM" in line, line


@pytest.mark.parametrize("np_", [2, 3])
def test_sigint_ends_a_rank_inside_a_blocking_mpi_call_and_the_job(np_, tmp_path):
    """Without a timeout a collective is one blocking MPI call, which Python's KeyboardInterrupt cannot leave: the
    watchdog sees the signal went to Python's handler while the same operation is still in progress, writes every
    rank's dump (rank 0 is in its own code) and ends the rank as the signal would; mpirun then ends the job."""
    sent, ended, out = run_and_signal(np_, "eager", signal.SIGINT, tmp_path, timeout=False, backend="mpi")
    assert re.search(r"shardkit: rank 1: SIGINT on rank 1 while it was waiting [0-9.]+ s \(since [0-9:]+ UTC\) for "
                     r"allreduce #\d+ \(2 x float64\) on communicator 'world' at <string>:\d+, a blocking MPI call "
                     r"that nothing interrupts; ending the rank", out), out
    assert "ERROR" not in out, out
    assert ended - sent < 10, f"the job took {ended - sent:.1f} s to end"
    assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == [f"rank{k}.json" for k in range(np_)], out


@pytest.mark.parametrize("np_", [2, 3])
def test_sigint_interrupts_a_wait_on_shared_memory_without_a_timeout(np_, tmp_path):
    """On the shm route (the default for a small allreduce on one node) the wait is shardkit's own: SIGINT raises
    Interrupted in the rank, naming who did not arrive, and the job ends."""
    sent, ended, out = run_and_signal(np_, "eager", signal.SIGINT, tmp_path, timeout=False, backend="shm")
    assert re.search(r"allreduce #\d+ on communicator 'world' was interrupted by SIGINT while waiting; rank\(s\) 0 "
                     r"did not arrive \(shared memory\)", out), out
    assert ended - sent < 10, f"the job took {ended - sent:.1f} s to end"


def test_sigint_ends_a_pending_token_wait(tmp_path):
    line, _ = check_interrupted(2, "token", signal.SIGINT, tmp_path)
    assert "allreduce #1 on communicator 'interrupt-test' was interrupted by SIGINT" in line, line


@pytest.mark.skipif(not has_module("jax"), reason="needs jax")
def test_sigint_ends_a_recv_in_a_compiled_jax_program(tmp_path):
    check_interrupted(2, "jit", signal.SIGINT, tmp_path)


# On shm, bcasts of up to 144 B go through the root's ring (48 B a line), larger ones through the buffer sets, and from
# 16 KiB the readers read the root's buffer itself (single copy, where the kernel lets them): the sizes are compared
# whichever way each side went (32/16 B: both the ring, a line each; 128/16 and 16/128: three lines against one;
# 256/16: the root a set, the reader the ring; 16/256: the other way round; 32 KiB/8 KiB and back: single copy against
# the set; 16 B/16 KiB and back: the ring against the shared bcast, where each rank has a CPU, whose reader once waited
# for the root's set line only and timed out naming the root). MPI reports only a truncation (the root sending more
# than a reader takes).
@pytest.mark.parametrize("backend,root_n,other_n", [("mpi", 4, 2), ("shm", 4, 2), ("shm", 16, 2), ("shm", 2, 16),
                                                    ("shm", 32, 2), ("shm", 2, 32), ("shm", 4096, 1024),
                                                    ("shm", 1024, 4096), ("shm", 2, 2048), ("shm", 2048, 2)])
def test_a_truncation_outside_checked_mode_says_to_rerun_checked_and_ends_the_job(backend, root_n, other_n):
    """Rank 1 catches the error and would finish normally while rank 0 may wait in a later operation: the job ends
    at exit. MPI reports the truncation; shm compares the sizes the ranks post."""
    code = textwrap.dedent("""
        import numpy as np, shardkit as sk
        n = ROOT_N if sk.rank() == 0 else OTHER_N  # float64 elements the root sends, the others expect
        try:
            sk.mpi.bcast(np.arange(n, dtype=np.float64), root=0)
            print(f"rank {sk.rank()}: bcast returned", flush=True)
        except sk.Error as e:
            print(f"rank {sk.rank()}: {type(e).__name__}: {e}", flush=True)
    """).replace("ROOT_N", str(root_n)).replace("OTHER_N", str(other_n))
    launcher = os.environ.get("MPIEXEC", "mpirun")
    start = time.time()
    r = subprocess.run([launcher, "--oversubscribe", "--bind-to", "none", "-np", "2", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=120,
                       env=dict(clean_env(SHARDKIT_TIMEOUT_S=str(TIMEOUT_S)), SHARDKIT_CHECK="0",
                                SHARDKIT_BACKEND=backend))
    out = r.stdout + r.stderr
    if backend == "mpi":
        assert "rank 1: BackendError: MPI error" in out and "MPI_ERR_TRUNCATE" in out, out
    else:
        want = (f"rank 1: MismatchError: bcast #1 on communicator 'world': rank 0 posted {8 * root_n} bytes, rank 1 "
                f"has {8 * other_n}")
        assert want in out, out
    assert "Rerun with SHARDKIT_CHECK=1 to have every rank name the mismatch" in out, out
    assert "ending the job (MPI_Abort)" in out, out
    assert r.returncode != 0
    assert time.time() - start < TIMEOUT_S / 2


@pytest.mark.parametrize("late", ["root", "reader"])
def test_a_root_that_ran_one_more_small_bcast_is_a_mismatch_outside_checked_mode(late):
    """Rank 0 (the root) sends a small bcast (its ring) and then a large one (a buffer set); rank 1 calls only the
    large one. Rank 1 sees either the root's ring post where it waits for its set line (its sizes differ), or, coming
    late, the large bcast's post carrying another count of small bcasts than its own: a MismatchError either way,
    never the root's data of another bcast."""
    code = textwrap.dedent("""
        import time, numpy as np, shardkit as sk
        if sk.rank() == (0 if LATE == "root" else 1):
            time.sleep(0.5)
        try:
            if sk.rank() == 0:
                sk.mpi.bcast(np.arange(2, dtype=np.float64), root=0)
            sk.mpi.bcast(np.arange(512, dtype=np.float64), root=0)
            print(f"rank {sk.rank()}: bcast returned", flush=True)
        except sk.Error as e:
            print(f"rank {sk.rank()}: {type(e).__name__}: {e}", flush=True)
    """).replace("LATE", repr(late))
    launcher = os.environ.get("MPIEXEC", "mpirun")
    r = subprocess.run([launcher, "--oversubscribe", "--bind-to", "none", "-np", "2", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=120,
                       env=dict(clean_env(SHARDKIT_TIMEOUT_S=str(TIMEOUT_S)), SHARDKIT_CHECK="0", SHARDKIT_BACKEND="shm"))
    out = r.stdout + r.stderr
    assert re.search(r"rank 1: MismatchError: bcast #\d+ on communicator 'world': rank 0 (posted 16 bytes, rank 1 has "
                     r"4096|ran another number of operations before it than rank 1)", out), out
    assert "rank 1: bcast returned" not in out, out
    assert r.returncode != 0
