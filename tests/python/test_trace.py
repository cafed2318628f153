"""SHARDKIT_TRACE=DIR: every rank's DIR/rank<R>.trace.json (one span per operation, with its bytes, backend, call
site and the rank's clock offset to rank 0), written at exit and when a timeout ends the job; and `shardkit-trace
merge`, which puts the ranks' spans on rank 0's clock (checked on files with known offsets) and draws them.

Run once, outside mpirun (marker ``processes``): the jobs are started here, and merging needs no MPI job."""

import json
import sys
import textwrap

import pytest

from conftest import mpirun
from test_processes import SKIPPER

pytestmark = pytest.mark.processes

JOB = textwrap.dedent("""
    import time
    import numpy as np
    import shardkit as sk
    from mpi4py import MPI
    n = sk.size()
    sk.mpi.allreduce(np.arange(4.0), op=MPI.SUM)  # line 7
    sk.mpi.bcast(np.arange(3, dtype=np.int32), root=n - 1)
    sk.mpi.allreduce(np.zeros(0, dtype=np.float32), op=MPI.SUM)
    comm = sk._core.make_comm(async_=True, name="async")
    if sk.rank() == 0:
        time.sleep(0.2)  # the others' allgather cannot complete before rank 0 comes
    _, token = comm.allgather(np.ones(5, dtype=np.int16))  # line 13: returns a pending token
    token.wait()  # there the span ends (on the other ranks, when rank 0 came)
    sk.mpi.barrier()
""")


def spans(trace):
    return [ev for ev in trace["traceEvents"] if ev.get("ph") == "X"]


SITES = textwrap.dedent("""
    import numpy as np
    import shardkit as sk
    from mpi4py import MPI
    x = np.ones(2)
    f = lambda: sk.mpi.allreduce(x, op=MPI.SUM)  # line 6
    def nested():
        def inner():
            return sk.mpi.allreduce(x, op=MPI.SUM)  # line 9
        return inner()
    def gen():
        yield sk.mpi.allreduce(x, op=MPI.SUM)  # line 12
    for _ in range(3):  # the same sites again (cached): lines 6, 9, 12, 15, 16
        f(); nested(); next(gen())
        [sk.mpi.allreduce(x, op=MPI.SUM) for _ in range(1)]
        sk.shard_map(lambda b: sk.psum(b, "x"), mesh=sk.Mesh((sk.size(),), ("x",)), in_specs=sk.P("x"), out_specs=sk.P())(
            np.ones(sk.size()))
""")


def test_the_call_site_is_the_callers_line_from_any_kind_of_frame(tmp_path):
    """Lambdas, nested functions, generators and comprehensions each get a new frame per call (read without making
    frame objects on CPython 3.11); the shardkit package's own frames (shard_map's) are skipped."""
    script = tmp_path / "sites.py"
    script.write_text(SITES)
    out = tmp_path / "traces"
    r = mpirun(1, [sys.executable, str(script)], SHARDKIT_TRACE=str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out / "rank0.trace.json") as f:
        sites = [ev["args"].get("site") for ev in spans(json.load(f))]
    assert sites == [f"{script}:{line}" for line in (6, 9, 12, 15, 16)] * 3, sites


def merge(*args):
    from shardkit import trace

    return trace.main(["merge", *map(str, args)])


# The backend each span names, with the backend forced (on the default route it follows shm_transport.cpp's measured table):
# on shm every operation but the async communicator's allgather (async communicators stay on MPI).
SPAN_BACKENDS = {"mpi": ["mpi"] * 5, "shm": ["shm", "shm", "shm", "mpi", "shm"]}


@pytest.mark.parametrize("np_,backend", [(1, "mpi"), (2, "mpi"), (3, "mpi"), (4, "mpi"), (2, "shm"), (3, "shm")])
def test_every_rank_writes_one_span_per_operation(tmp_path, np_, backend):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    out = tmp_path / "traces"
    r = mpirun(np_, [sys.executable, str(script)], SHARDKIT_TRACE=str(out), SHARDKIT_BACKEND=backend)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in out.iterdir()) == [f"rank{k}.trace.json" for k in range(np_)]
    for rank in range(np_):
        with open(out / f"rank{rank}.trace.json") as f:
            trace = json.load(f)
        other = trace["otherData"]
        assert (other["rank"], other["size"], other["clock_rounds"]) == (rank, np_, 8), other
        # One host here: the measured offset is zero, give or take half the round trip (and the rounding).
        assert rank > 0 or other["clock_offset_us"] == 0
        assert abs(other["clock_offset_us"]) <= other["clock_rtt_us"] / 2 + 1, other
        names = {ev["tid"]: ev["args"]["name"] for ev in trace["traceEvents"] if ev["name"] == "thread_name"}
        assert [ev["args"]["name"] for ev in trace["traceEvents"] if ev["name"] == "process_name"] == \
            [f"rank {rank} ({other['host']})"]
        got = [(ev["name"], ev["args"]["bytes"], ev["args"].get("dtype"), ev["args"]["backend"], ev["args"]["state"],
                names[ev["tid"]] == ev["args"]["communicator"]) for ev in spans(trace)]
        b = SPAN_BACKENDS[backend]
        assert got == [("allreduce", 32, "float64", b[0], "completed", True),
                       ("bcast", 12, "int32", b[1], "completed", True),
                       ("allreduce", 0, "float32", b[2], "completed", True),
                       ("allgather", 10, "int16", b[3], "completed", True),
                       ("barrier", 0, None, b[4], "completed", True)], got
        ops = spans(trace)
        assert [ev["ts"] for ev in ops] == sorted(ev["ts"] for ev in ops)
        assert ops[0]["args"]["site"] == f"{script}:7" and ops[3]["args"]["site"] == f"{script}:13"
        assert ops[1]["args"]["root"] == np_ - 1 and "peer" not in ops[1]["args"]
        world = ops[0]["args"]["communicator"]
        seqs = [ev["args"]["seq"] for ev in ops if ev["args"]["communicator"] == world]
        assert seqs == list(range(seqs[0], seqs[0] + 4)), seqs  # the collectives of one communicator, in order
        # The pending allgather ends when its completion was seen (its token's wait), not when the call returned.
        assert ops[3]["args"]["communicator"] == "async" and ops[3]["args"]["end"] == "completed"
        assert rank == 0 or ops[3]["dur"] >= 150_000, ops[3]
        assert "end" not in ops[0]["args"]  # a blocking operation's span ends when the call returns
    assert merge(out, "-o", tmp_path / "job.json") == 0
    with open(tmp_path / "job.json") as f:
        assert len(spans(json.load(f))) == 5 * np_


def test_a_timeout_ending_the_job_still_writes_every_trace(tmp_path):
    """Every rank times out (the flight recorder's dump writes the trace too) and the job ends with MPI_Abort."""
    script = tmp_path / "skipper.py"
    script.write_text(SKIPPER)
    out = tmp_path / "traces"
    r = mpirun(2, [sys.executable, str(script)], SHARDKIT_TRACE=str(out), SHARDKIT_TIMEOUT_S="0.5",
               SHARDKIT_DUMP_DIR=str(tmp_path / "dumps"), SHARDKIT_DUMP_WAIT_S="10")
    assert r.returncode != 0, r.stdout + r.stderr
    for rank, last in ((0, "allreduce"), (1, "recv")):
        with open(out / f"rank{rank}.trace.json") as f:
            ops = spans(json.load(f))
        assert [ev["name"] for ev in ops] == ["allreduce", "bcast", last], ops
        assert [ev["args"]["state"] for ev in ops] == ["completed", "completed", "failed"]
        assert ops[-1]["dur"] >= 450_000  # it waited for the timeout (less than the writer's 1 s between writes)


def synthetic(directory, rank, size, origin_us, offset_us, ts, host="h"):
    """A rank's trace whose allreduce started at local time origin_us + ts (its clock: rank 0's + offset_us)."""
    directory.mkdir(exist_ok=True)
    trace = {"otherData": {"shardkit_trace": 1, "rank": rank, "size": size, "host": host, "pid": 100 + rank,
                           "clock_origin_us": origin_us, "clock_offset_us": offset_us, "clock_rtt_us": 4,
                           "clock_rounds": 8},
             "traceEvents": [
                 {"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank} ({host})"}},
                 {"name": "thread_name", "ph": "M", "pid": rank, "tid": 1, "args": {"name": "world"}},
                 {"name": "allreduce", "cat": "mpi", "ph": "X", "pid": rank, "tid": 1, "ts": ts, "dur": 10.5,
                  "args": {"bytes": 8, "backend": "mpi", "communicator": "world", "seq": 0}}]}
    path = directory / f"rank{rank}.trace.json"
    path.write_text(json.dumps(trace))
    return path


# One allreduce, started at 1_000_100 us on rank 0's clock, as three ranks whose clocks differ recorded it.
CLOCKS = [(1_000_000, 0, 100.0), (1_000_500, 400, 0.0), (999_000, -250, 850.0)]


def test_merge_puts_matching_spans_at_aligned_times(tmp_path, capsys):
    for rank, (origin, offset, ts) in enumerate(CLOCKS):
        synthetic(tmp_path / "t", rank, 3, origin, offset, ts)
    assert merge(tmp_path / "t", "-o", tmp_path / "job.json") == 0
    with open(tmp_path / "job.json") as f:
        merged = json.load(f)
    ops = spans(merged)
    assert sorted(ev["pid"] for ev in ops) == [0, 1, 2]
    # The earliest origin on rank 0's clock is rank 2's (999_000 + 250): the allreduce at 1_000_100 is 850 us after it.
    assert [ev["ts"] for ev in ops] == [850.0, 850.0, 850.0]
    assert merged["otherData"]["clock_origin_us"] == 999_250
    names = sorted(ev["args"]["name"] for ev in merged["traceEvents"] if ev["name"] == "process_name")
    assert names == ["rank 0 (h)", "rank 1 (h)", "rank 2 (h)"]
    out = capsys.readouterr().out
    assert "merged 3 spans of 3 rank(s)" in out and "rank 1 (h): clock +400 us from rank 0's (+/- 2 us)" in out


def test_merge_says_what_is_missing_or_cut_short(tmp_path, capsys):
    assert merge(tmp_path / "empty") == 2
    assert "no rank*.trace.json in" in capsys.readouterr().err
    synthetic(tmp_path / "t", 0, 3, *CLOCKS[0])
    cut = synthetic(tmp_path / "t", 1, 3, *CLOCKS[1])
    # As the writer lays it out: the head on one line, then one event per line; cut inside the last event.
    trace = json.loads(cut.read_text())
    head = '{"otherData": ' + json.dumps(trace["otherData"]) + ',\n"traceEvents": [\n'
    cut.write_text(head + ",\n".join(json.dumps(ev) for ev in trace["traceEvents"])[:-20])
    assert merge(tmp_path / "t") == 1
    err = capsys.readouterr().err
    assert "rank1.trace.json: cut short" in err and "read its first 2 events" in err, err
    assert "rank(s) 2 wrote no trace" in err, err
    with open(tmp_path / "t" / "job.trace.json") as f:  # the default output; what could be read is in it
        assert [ev["pid"] for ev in json.load(f)["traceEvents"]] == [0, 0, 0, 1, 1]


def test_merge_draws_the_timeline(tmp_path):
    pytest.importorskip("matplotlib")
    for rank, (origin, offset, ts) in enumerate(CLOCKS):
        synthetic(tmp_path / "t", rank, 3, origin, offset, ts)
    assert merge(tmp_path / "t", "-o", tmp_path / "job.json", "--png", tmp_path / "job.png") == 0
    assert (tmp_path / "job.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_without_matplotlib_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    synthetic(tmp_path / "t", 0, 1, *CLOCKS[0])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert merge(tmp_path / "t", "--png", tmp_path / "job.png") == 3
    assert "--png needs matplotlib: pip install matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "job.png").exists()

