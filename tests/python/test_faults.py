"""Jobs that go wrong, and what the flight recorder and `shardkit-trace analyze` make of them: a rank busy in its own
code, a killed rank, a stopped rank, mismatched shapes without checked mode (at 2, 3 and 4 ranks); SIGUSR1 and the
hang warning, which write the dumps and let the job go on. (A skipped collective, a checked mismatch and a hang inside
a jitted program: test_processes.py.)"""

import re
import sys
import textwrap

import pytest

from conftest import mpirun, python

pytestmark = pytest.mark.processes

FAULTS = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    import shardkit as sk
    from mpi4py import MPI
    fault, last = sys.argv[1], sk.size() - 1
    sk.mpi.allreduce(np.ones(4), op=MPI.SUM)  # line 7
    if sk.rank() == last and fault == "busy":
        t = time.time()
        while time.time() - t < 30:  # line 10: in its own code, holding the GIL
            sum(range(1000))
    if sk.rank() == last and fault in ("SIGKILL", "SIGSTOP"):
        os.kill(os.getpid(), getattr(signal, fault))  # line 13
    if fault == "mismatch":
        sk.mpi.bcast(np.ones(8 - 5 * (sk.rank() == last)), 0)  # line 15: smaller on the last rank: MPI truncates
    else:
        sk.mpi.allreduce(np.ones(8), op=MPI.SUM)  # line 17
    sk.mpi.allreduce(np.ones(4), op=MPI.SUM)  # line 18
""")


def run_fault(tmp_path, np_, fault, wait_s="10", **env):
    script = tmp_path / "faults.py"
    script.write_text(FAULTS)
    dumps = tmp_path / "dumps"
    r = mpirun(np_, [sys.executable, str(script), fault], timeout=120, SHARDKIT_TIMEOUT_S="2",
               SHARDKIT_DUMP_DIR=str(dumps), SHARDKIT_DUMP_WAIT_S=wait_s, **env)
    assert r.returncode != 0, r.stdout + r.stderr
    a = python(f"import sys, shardkit.trace as t; sys.exit(t.main(['analyze', {str(dumps)!r}]))")
    assert a.returncode == 1, a.stdout + a.stderr
    return script, dumps, a.stdout, r


def others(np_):
    return "rank 0" if np_ == 2 else "ranks " + ", ".join(map(str, range(np_ - 1)))


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_a_rank_busy_in_its_own_code_writes_its_dump_too(tmp_path, np_):
    """The rank that never comes is in a Python loop: its watchdog thread writes its dump when the others time out,
    and the analyzer says where it last was and that it was in its own code."""
    script, dumps, out, r = run_fault(tmp_path, np_, "busy")
    assert sorted(p.name for p in dumps.iterdir()) == [f"rank{k}.json" for k in range(np_)], r.stderr
    at = re.escape(str(script))
    assert re.search(rf"the ranks part at collective #2:\n  {others(np_)}: allreduce #2 \(8 x float64\) at {at}:17 "
                     rf"\(failed\)", out), out
    assert re.search(rf"\n  rank {np_ - 1}: never entered it; its last collective here: allreduce #1 \(4 x float64\) "
                     rf"at {at}:7 \(completed\); when it wrote its dump it was in its own code", out), out


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_a_killed_rank_is_named_and_the_others_placed(tmp_path, np_):
    script, _, out, _ = run_fault(tmp_path, np_, "SIGKILL", wait_s="2")
    last = np_ - 1
    assert f"rank {last} wrote no dump (killed, stopped, or busy outside shardkit)" in out, out
    assert re.search(rf"communicator 'world' \([^)]*\): rank {last} wrote no dump; the others' last collectives:\n"
                     rf"  {others(np_)}: allreduce #2 \(8 x float64\) at {re.escape(str(script))}:17 \(failed\)", out), out


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_a_stopped_rank_is_named(tmp_path, np_):
    """SIGSTOP: the whole process stops, its watchdog too. Ending the job continues it (SIGCONT, then SIGTERM), so it
    writes its dump late (before or after entering the collective the others gave up on), or none at all."""
    script, _, out, _ = run_fault(tmp_path, np_, "SIGSTOP", wait_s="2")
    last, at = np_ - 1, re.escape(str(script))
    late = re.search(rf"at collective #2, rank {last} entered allreduce #2 \(8 x float64\) at {at}:17 only "
                     rf"[0-9.]+ s after {others(np_)} had given up on it: rank {last} stopped", out)
    silent = re.search(rf"rank {last} wrote no dump; the others' last collectives:\n  {others(np_)}: allreduce #2 "
                       rf"\(8 x float64\) at {at}:17 \(failed\)", out)
    stopped = re.search(rf"\n  rank {last}: never entered it; its last collective here: allreduce #1 \(4 x float64\) "
                        rf"at {at}:7 \(completed\);(?: when it wrote its dump [^;\n]*;)? its dump came [0-9.]+ s after "
                        rf"the others'", out)
    assert late or silent or stopped, out


@pytest.mark.parametrize("backend", ["mpi", "shm"])
@pytest.mark.parametrize("np_", [2, 3, 4])
def test_mismatched_shapes_without_checked_mode_are_named(tmp_path, np_, backend):
    """MPI reports the truncated bcast; shm compares the sizes the ranks post with their steps."""
    script, _, out, r = run_fault(tmp_path, np_, "mismatch", SHARDKIT_CHECK="0", SHARDKIT_BACKEND=backend)
    assert "Rerun with SHARDKIT_CHECK=1" in r.stderr, r.stderr
    at = re.escape(str(script))
    assert re.search(rf"  rank {np_ - 1}: bcast #2 \(3 x float64\) peer/root 0 at {at}:15 \(failed\)", out), out
    assert "their arguments differ (count)" in out, out


LATE = textwrap.dedent("""
    import os, signal, time
    import numpy as np
    import shardkit as sk
    from mpi4py import MPI
    sk.mpi.allreduce(np.ones(4), op=MPI.SUM)
    if sk.rank() == 0 and os.environ.get("SIGNAL_ME"):
        os.kill(os.getpid(), signal.SIGUSR1)  # line 8
        time.sleep(1.5)
    if sk.rank() == 1:
        time.sleep(float(os.environ.get("LATE_S", "0")))  # line 11: late, in its own code
    sk.mpi.allreduce(np.ones(4), op=MPI.SUM)  # line 12
    print(f"rank {sk.rank()} finished", flush=True)
""")


def test_sigusr1_writes_every_ranks_dump_and_the_job_goes_on(tmp_path):
    script = tmp_path / "late.py"
    script.write_text(LATE)
    dumps = tmp_path / "dumps"
    r = mpirun(2, [sys.executable, str(script)], timeout=120, SIGNAL_ME="1", SHARDKIT_DUMP_DIR=str(dumps))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rank 0 finished" in r.stdout and "rank 1 finished" in r.stdout, r.stdout
    assert sorted(p.name for p in dumps.iterdir()) == ["rank0.json", "rank1.json"], r.stderr
    at = re.escape(str(script))
    # Each says what it is doing: rank 0 is in its own code; rank 1 (almost surely) already waits for it in the second
    # allreduce, or is between the two, or (on a loaded machine) has not yet seen the first one complete, which rank 0
    # may leave first.
    assert re.search(rf"shardkit: rank 0: in none of shardkit's operations; its last, started [0-9.]+ s ago: "
                     rf"allreduce #1 \(4 x float64\) on communicator 'world' at {at}:6", r.stderr), r.stderr
    assert re.search(rf"shardkit: rank 1: (waiting [0-9.]+ s \(since [0-9:]+ UTC\) for allreduce (#2 \(4 x float64\) "
                     rf"on communicator 'world' at {at}:12|#1 \(4 x float64\) on communicator 'world' at {at}:6)"
                     rf"|in none of shardkit's operations)", r.stderr), r.stderr
    assert "SIGUSR1 (1) on rank 0" in (dumps / "rank1.json").read_text()


def test_a_long_wait_without_timeout_warns_once_per_rank_and_goes_on(tmp_path):
    """SHARDKIT_HANG_WARN_S: rank 1 is late; ranks 0 and 2 say what they wait for and since when, rank 1 that it is in
    its own code; every rank writes its dump, and the job completes."""
    script = tmp_path / "late.py"
    script.write_text(LATE)
    dumps = tmp_path / "dumps"
    r = mpirun(3, [sys.executable, str(script)], timeout=120, LATE_S="5", SHARDKIT_HANG_WARN_S="2",
               SHARDKIT_DUMP_DIR=str(dumps))
    assert r.returncode == 0, r.stdout + r.stderr
    at = re.escape(str(script))
    for k in (0, 2):
        lines = re.findall(rf"shardkit: rank {k}: waiting [0-9.]+ s \(since [0-9:]+ UTC\) for allreduce #2 "
                           rf"\(4 x float64\) on communicator 'world' at {at}:12", r.stderr)
        assert len(lines) == 1, r.stderr
    assert len(re.findall(r"shardkit: rank 1: in none of shardkit's operations", r.stderr)) == 1, r.stderr
    assert sorted(p.name for p in dumps.iterdir()) == ["rank0.json", "rank1.json", "rank2.json"], r.stderr
    a = python(f"import sys, shardkit.trace as t; sys.exit(t.main(['analyze', {str(dumps)!r}]))")
    assert re.search(rf"\n  rank 1: never entered it; its last collective here: allreduce #1 \(4 x float64\) at {at}:6 "
                     rf"\(completed\); when it wrote its dump it was in its own code", a.stdout), a.stdout
