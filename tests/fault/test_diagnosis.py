"""`shardkit-trace analyze` on the dumps of real failing jobs (tests/fault/diagnosis_main.cpp, at 2-4 ranks): the cases
that once misled it. Two communicators with one name (two dup()s, two meshes' axis communicators), collectives whose
per-rank counts differ by design (scatter, gather, allgatherv, alltoallv), rings that hold only point-to-point
operations, an asynchronous send whose token was dropped (the flight recorder once deadlocked there), dumps written on
another rank's request (SIGUSR1) with asynchronous operations in them, and a directory an earlier job left.

Each case runs the job, then the analyzer, and checks the verdict: the communicator, the collective and the rank at
fault, nothing that did not happen. Run by ctest (fault_diagnosis), which names the program in DIAGNOSIS_MAIN."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

PROGRAM = os.environ.get("DIAGNOSIS_MAIN", "")
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def job(np_, scenario, dumps, **env):
    """Runs the scenario under mpirun; (its output, seconds it took)."""
    assert PROGRAM and os.path.exists(PROGRAM), "DIAGNOSIS_MAIN must name diagnosis_main (ctest sets it)"
    launcher = shutil.which("mpirun") or shutil.which("mpiexec")
    full = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_", "PMIX_", "PMI_", "OMPI_MCA_orte"))}
    full.update(ROOT_ENV, SHARDKIT_DUMP_DIR=str(dumps), SHARDKIT_DUMP_WAIT_S="5")
    full.update(env)
    start = time.time()
    r = subprocess.run([launcher, "--oversubscribe", "--bind-to", "none", "-np", str(np_), PROGRAM, scenario],
                       capture_output=True, text=True, timeout=120, env=full)
    return r, time.time() - start


def analyze(dumps, *extra):
    r = subprocess.run([sys.executable, "-m", "shardkit.trace", "analyze", str(dumps), *extra], capture_output=True,
                       text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def failed_verdict(np_, scenario, tmp_path, **env):
    """Runs a scenario that fails, then the analyzer, which must find the problem: (its verdict, the dump folder)."""
    dumps = tmp_path / "dumps"
    r, _ = job(np_, scenario, dumps, **env)
    assert r.returncode != 0, r.stdout + r.stderr
    rc, out = analyze(dumps)
    assert rc == 1, out
    return out, dumps


def ranks(rs):
    rs = list(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def dumped(dumps):
    return {int(p.name[4:-5]): json.loads(p.read_text()) for p in dumps.glob("rank*.json")}


@pytest.mark.parametrize("np_", [2, 3])
def test_two_communicators_with_one_name_stay_apart(tmp_path, np_):
    """The first 'twin' failed; the second, with more collectives, completed them all: keyed by name and ranks, the
    second hid the first ("no rank behind", exit 0)."""
    out, dumps = failed_verdict(np_, "twins", tmp_path)
    last = np_ - 1
    m = re.search(rf"communicator 'twin' \({ranks(range(np_))}\) \[identity (\d+)\]: the ranks part at collective "
                  rf"#(\d+):\n  {ranks(range(last))}: barrier #\2 \(failed\)\n  rank {last}: never entered it; its "
                  rf"last collective here: allreduce #\d+ \(4 x float32\) \(completed\)", out)
    assert m, out
    # The identities every rank agreed on, in every dump: the two twins differ.
    ids = {tuple(sorted(c["id"] for c in d["communicators"] if c["name"] == "twin")) for d in dumped(dumps).values()}
    assert len(ids) == 1 and len(next(iter(ids))) == 2 and len(set(next(iter(ids)))) == 2, ids


@pytest.mark.parametrize("np_", [3, 4])
def test_counts_that_differ_by_design_are_no_divergence(tmp_path, np_):
    """scatter's root holds every block, allgatherv's and alltoallv's ranks give their own counts: what the ranks agree
    on is compared (checked mode's signature), so the verdict is the allreduce the last rank never entered."""
    out, dumps = failed_verdict(np_, "vops", tmp_path)
    last = np_ - 1
    assert re.search(rf"communicator 'world' \({ranks(range(np_))}\): the ranks part at collective #(\d+):\n  "
                     rf"{ranks(range(last))}: allreduce #\1 \(8 x float32\) \(failed\)\n  rank {last}: never entered "
                     rf"it; its last collective here: alltoallv", out), out
    assert "arguments differ" not in out, out


@pytest.mark.parametrize("np_", [2, 3])
def test_a_ring_of_point_to_point_operations_only_is_not_a_missing_rank(tmp_path, np_):
    """Ranks 0 and 1 keep only their 8 last operations, all sends and receives: they entered the allreduce, which
    their rings no longer reach. The verdict is rank 0's receive, and rank 1, which never sent it."""
    out, dumps = failed_verdict(np_, "p2ponly", tmp_path, SHARDKIT_TRACE_BUFFER="8")
    assert "never entered" not in out, out
    assert "the ranks part" not in out, out
    assert re.search(r"communicator 'world': rank 0 failed in recv \(2 x float32\) peer/root 1\n    rank 1, its peer, "
                     r"never sent it; when it wrote its dump it was in none of shardkit's operations", out), out
    for k in (0, 1):
        c = next(c for c in dumped(dumps)[k]["communicators"] if c["name"] == "world")
        assert c["collectives"] >= 1 and all(op["seq"] < 0 for op in c["ops"]), c


def test_a_dropped_pending_send_does_not_deadlock_the_recorder(tmp_path):
    """SHARDKIT_TRACE_BUFFER=2 and an asynchronous world: the ring's slot of rank 0's send (its token and buffer
    dropped) is reused by the second barrier. The recorder once dropped the send's last reference there, under the
    ring's lock: its completion timed out and dumped the same recorder, which spun forever. Now the send's wait times
    out within the timeout, every rank writes its dump, and the analyzer names rank 1."""
    dumps = tmp_path / "dumps"
    r, took = job(2, "dropped", dumps, SHARDKIT_TRACE_BUFFER="2")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert took < 30, f"{took:.1f} s\n{out}"
    assert re.search(r"pending send failed: send on communicator 'world' did not complete within 2 s", out), out
    assert "TimeoutError" in out, out
    assert sorted(dumped(dumps)) == [0, 1], out
    rc, verdict = analyze(dumps)
    assert rc == 1, verdict
    assert re.search(r"communicator 'world': rank 0 failed in send \(262144 x float32\) peer/root 1\n    rank 1, its "
                     r"peer, never received it", verdict), verdict


@pytest.mark.parametrize("np_", [2, 4])
def test_dumps_asked_for_by_another_rank_show_completed_async_operations(tmp_path, np_):
    """SIGUSR1 on rank 0: every other rank's watchdog writes its dump. Their asynchronous allreduce completed (its
    token was waited for): every dump says so, without any thread asking a token; the job goes on, and the analyzer
    sees nothing wrong (rank 0's send, whose token nobody waited for, was received)."""
    dumps = tmp_path / "dumps"
    r, _ = job(np_, "usr1", dumps)
    assert r.returncode == 0, r.stdout + r.stderr
    got = dumped(dumps)
    assert sorted(got) == list(range(np_)), r.stdout + r.stderr
    for k, d in got.items():
        assert d["reason"].startswith("SIGUSR1" if k == 0 else "asked by rank 0"), d["reason"]
        world = next(c for c in d["communicators"] if c["name"] == "world")
        states = {op["op"]: op["state"] for op in world["ops"]}  # the last of each: the job was idle then
        assert states["allreduce"] == "completed" and states["barrier"] == "completed", (d["time_us"], world)
        if k == 1:
            assert states["recv"] == "completed", world
        if k == 0:
            assert states["send"] == "pending", world  # nobody waited for its token
    rc, out = analyze(dumps)
    assert rc == 0, out
    assert "the dumps show no rank behind the others and no operation left waiting" in out, out


def test_an_earlier_jobs_dumps_are_never_this_jobs(tmp_path):
    """A directory with every rank's dump of an earlier 4-rank job: a 2-rank job whose rank 1 stops (SIGSTOP: it
    writes no dump) must not take the old rank1.json for its own (rank 0 waits SHARDKIT_DUMP_WAIT_S for this job's),
    and the analyzer reads this job's dumps only, naming the others as ignored."""
    dumps = tmp_path / "dumps"
    r, _ = job(4, "twins", dumps)
    assert sorted(dumped(dumps)) == [0, 1, 2, 3], r.stdout + r.stderr
    old = {k: d["job"] for k, d in dumped(dumps).items()}
    r, took = job(2, "stop", dumps, SHARDKIT_DUMP_WAIT_S="3")
    assert r.returncode != 0, r.stdout + r.stderr
    new = dumped(dumps)
    assert new[0]["job"] != old[0], (old, new)
    # Rank 0 timed out (2 s), then waited the whole SHARDKIT_DUMP_WAIT_S for rank 1's dump of this job.
    assert took >= 2 + 3, f"{took:.1f} s: rank 0 took the old rank1.json for this job's\n{r.stdout}{r.stderr}"
    rc, out = analyze(dumps)
    assert rc == 1, out
    assert f"job {new[0]['job']}:" in out, out
    for k in (2, 3):
        assert f"ignored rank{k}.json: a dump of another job ({old[k]}" in out, out
    if new[1]["job"] == old[1]:  # rank 1 never wrote one (the end of the job may continue it: then it writes late)
        assert f"ignored rank1.json: a dump of another job ({old[1]}" in out, out
        assert "rank 1 wrote no dump (killed, stopped, or busy outside shardkit)" in out, out
    assert re.search(r"rank 0: allreduce #\d+ \(8 x float32\) \(failed\)", out), out
    rc, out = analyze(dumps, "--job", old[2])
    assert rc == 1 and f"job {old[2]}:" in out and "'twin'" in out, out


@pytest.mark.parametrize("np_", [3, 4])
def test_two_meshes_axis_communicators_stay_apart(tmp_path, np_):
    """Two meshes of one shape over the world: their axis communicators have one name and the same ranks. The second
    one's allreduce failed (the last rank never came); the first's completed."""
    out, dumps = failed_verdict(np_, "mesh", tmp_path)
    last = np_ - 1
    group = [1, 3] if np_ == 4 else list(range(np_))
    waiting = [k for k in group if k != last]
    m = re.search(rf"communicator '(.+?)' \({ranks(group)}\) \[identity (\d+)\]: the ranks part at collective "
                  rf"#(\d+):\n  {ranks(waiting)}: allreduce #\3 \(4 x float32\) \(failed\)\n  rank {last}: never "
                  rf"entered it", out)
    assert m, out
    # Two communicators of that name over those ranks in every dump, and the verdict names the second (made later).
    ids = sorted(c["id"] for c in dumped(dumps)[last]["communicators"] if c["name"] == m.group(1))
    assert len(ids) == 2 and int(m.group(2)) == ids[1], (ids, out)
