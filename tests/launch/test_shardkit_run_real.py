"""Tests of the shardkit-run launcher run for real on this machine: --dry-run, then real jobs of 2 ranks (a Python
program, and examples/hello when ctest passes its path in SHARDKIT_HELLO), failures, signals and restarts. SHARDKIT_RUN
names the built script; without it the source script is used. The commands it builds for other machines:
test_shardkit_run.py.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "launch" / "tools"
SOURCE = TOOLS / "shardkit-run"
sys.path.insert(0, str(TOOLS))

from shardkit_run import cli, command, detect, launcher, supervise  # noqa: E402

PYTHON = sys.executable


def script_command():
    built = os.environ.get("SHARDKIT_RUN")
    return [built] if built else [PYTHON, str(SOURCE)]


def run_script(args, env=None, timeout=120):
    return subprocess.run(script_command() + list(args), capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else os.environ.copy())


def test_built_script_is_the_source():
    built = os.environ.get("SHARDKIT_RUN")
    if not built:
        pytest.skip("SHARDKIT_RUN not set (ctest sets it to the built bin/shardkit-run)")
    assert os.access(built, os.X_OK)
    assert Path(built).read_bytes() == SOURCE.read_bytes()
    # The package, where the script looks for it: every module, as in the source tree.
    package = Path(built).resolve().parent.parent / "share" / "shardkit" / "shardkit_run"
    for module in (TOOLS / "shardkit_run").glob("*.py"):
        assert (package / module.name).read_bytes() == module.read_bytes(), module.name


def test_cli_dry_run_on_this_machine():
    result = run_script(["--dry-run", "--verbose", "-x", "SHARDKIT_TEST_VALUE=1 2", PYTHON, "-c", "pass"])
    environment = detect.detect_environment()
    if environment.mpi_launcher is None and "srun" not in environment.launchers:
        assert result.returncode == 127 and "no MPI launcher found" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    options = cli.parse_args(["-x", "SHARDKIT_TEST_VALUE=1 2", PYTHON, "-c", "pass"])
    expected = launcher.build_command(options, environment)
    assert result.stdout == command.format_command(expected) + "\n"
    assert "shardkit-run: detected" in result.stderr


def test_cli_without_any_launcher_on_path(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # nothing on PATH: the program is given by its full path
    result = subprocess.run([PYTHON, str(SOURCE), "--dry-run", PYTHON], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 127
    assert "no MPI launcher found" in result.stderr and "apt-get install openmpi-bin" in result.stderr


def need_launcher():
    if not (shutil.which("mpirun") or shutil.which("mpiexec") or shutil.which("srun")):
        pytest.skip("no MPI launcher on this machine")


# The rank, from whichever launcher started the process.
RANK = """
import os, sys
names = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
rank = next((os.environ[n] for n in names if n in os.environ), None)
"""
# One write per line: print() writes its pieces one by one, and under load the launcher forwarded "rank" from one rank
# and " 0 ..." after another rank's "rank" (seen once in CI).
RANK_PROGRAM = RANK + 'os.write(1, f"rank {rank} {os.environ.get(\'SHARDKIT_TEST_VALUE\')}\\n".encode())\n'
FAIL_ON_RANK_1_PROGRAM = RANK + 'sys.exit(3 if rank == "1" else 0)\n'


def test_real_run_of_two_python_ranks():
    need_launcher()
    result = run_script(["-n", "2", "-x", "SHARDKIT_TEST_VALUE=passed through", PYTHON, "-c", RANK_PROGRAM])
    assert result.returncode == 0, result.stdout + result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank "))
    assert lines == ["rank 0 passed through", "rank 1 passed through"], result.stdout + result.stderr
    assert result.stderr.startswith("shardkit-run: ")  # the command, printed before it runs


def test_real_run_passes_on_a_failing_exit_status():
    need_launcher()
    result = run_script(["-n", "2", PYTHON, "-c", FAIL_ON_RANK_1_PROGRAM])
    assert result.returncode != 0, result.stdout + result.stderr


def test_real_run_of_hello_example():
    hello = os.environ.get("SHARDKIT_HELLO")
    if not hello:
        pytest.skip("SHARDKIT_HELLO not set (ctest sets it to the built examples/hello)")
    need_launcher()
    result = run_script(["-n", "2", hello])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 0/2" in result.stdout and "rank 1/2" in result.stdout, result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------------------------------
# Watching mpirun (supervise.py), with a stand-in mpirun on PATH: what it prints and how it ends is up to each test.

FAKE_MPIRUN = """
import os, signal, subprocess, sys, time
if sys.argv[1:] == ["--version"]:
    print("mpirun (Open MPI) 4.1.4")
    sys.exit(0)
mode = os.environ["FAKE_MPIRUN_MODE"]
say = lambda fd, text: os.write(fd, text.encode())
if mode == "abort_then_hang":
    # A daemon that mpirun started, deaf to SIGTERM as mpirun is here; both must be gone when shardkit-run returns.
    helper = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                               "signal.SIG_IGN); print(flush=True); time.sleep(20)"], stdout=subprocess.PIPE)
    helper.stdout.readline()
    say(1, f"helper {helper.pid}\\n")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    say(2, "shardkit: rank 0: ending the job (MPI_Abort): TimeoutError: allreduce on communicator 'world' "
           "timed out after 5 s: rank(s) 2, 3 did not arrive (skipped this collective, stuck, or lost)\\n")
    time.sleep(20)
elif mode == "abort_then_exit":
    say(2, "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\\nwith errorcode 7.\\n")
    time.sleep(0.3)
    sys.exit(7)
elif mode == "echo_stdin":
    say(1, "rank 0 read: " + sys.stdin.read())
    say(2, "to stderr\\n")
elif mode == "deaf_to_sigint":
    signal.signal(signal.SIGINT, lambda *a: say(2, "mpirun got SIGINT\\n"))
    say(2, "ready\\n")
    time.sleep(20)
"""


def fake_mpirun_env(tmp_path, mode, grace="1"):
    fake = tmp_path / "mpirun"
    fake.write_text(f"#!{PYTHON}\n{FAKE_MPIRUN}")
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}", "FAKE_MPIRUN_MODE": mode,
            "SHARDKIT_RUN_GRACE_S": grace}


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] if Path(f"/proc/{pid}").exists() else ""
    return state != "Z"  # a zombie has ended; its parent (reparented: init) has yet to reap it


def test_a_job_ended_by_a_rank_ends_when_mpirun_does_not(tmp_path):
    # mpirun still waiting after the abort (a host it cannot reach), deaf to SIGTERM: ended after the 1 s grace period,
    # then the hosts probed (up to 2 s). A name under .invalid never resolves (RFC 6761): no answer from it, whatever
    # the network here (some sandboxes accept every connection).
    start = time.monotonic()
    result = run_script(["--launcher", "mpirun", "--hosts", "localhost:2,nohost.invalid:2", "true"],
                        env=fake_mpirun_env(tmp_path, "abort_then_hang"), timeout=30)
    elapsed = time.monotonic() - start
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert elapsed < 1 + 2 + 3, f"took {elapsed:.1f} s\n{output}"
    # What mpirun printed, unchanged, then shardkit-run's own account naming the ranks that never arrived and the
    # host that does not answer (localhost refuses or accepts: it answers).
    assert "shardkit: rank 0: ending the job (MPI_Abort): TimeoutError: allreduce" in result.stderr
    assert ("shardkit-run: rank 0 ended the job (MPI_Abort) 1 s ago and mpirun has not ended (rank(s) 2, 3 did not "
            "arrive: is their host unreachable?); ending mpirun") in result.stderr, output
    assert "shardkit-run: host(s) not answering on TCP port 22 within 2 s: nohost.invalid\n" in result.stderr, output
    helper = int(re.search(r"helper (\d+)", result.stdout)[1])
    assert not alive(helper), f"mpirun's helper {helper} still runs"


@pytest.mark.parametrize("lines, rank, status", [
    ([b"shardkit: rank 3: ending the job (MPI_Abort): uncaught TimeoutError on rank 3\n"], 3, 1),
    ([b"MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\n", b"with errorcode 42.\n"], 1, 42),
    ([b"application called MPI_Abort(MPI_COMM_WORLD, 5) - process 2\n"], 2, 5),  # MPICH
])
def test_the_signs_of_an_ended_job_are_read_across_chunks(lines, rank, status):
    watch = supervise._Watch()
    text = b"rank 0 says hello\n" + b"".join(lines)
    for i in range(0, len(text), 7):  # as a pipe may cut it
        watch.feed(text[i:i + 7])
    assert watch.ending is not None and watch.ending.what == f"rank {rank} ended the job (MPI_Abort)"
    assert watch.ending.status == status
    quiet = supervise._Watch()
    quiet.feed(b"rank 0: the word MPI_Abort alone is not a sign\n")
    assert quiet.ending is None


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_grace_period_that_is_not_seconds_is_refused(tmp_path, value):
    result = run_script(["--launcher", "mpirun", "-n", "2", "true"],
                        env=fake_mpirun_env(tmp_path, "echo_stdin", grace=value))
    assert result.returncode == 2, result.stdout + result.stderr
    assert (f"shardkit-run: error: SHARDKIT_RUN_GRACE_S={value}: expected seconds (a number >= 0, or inf)"
            in result.stderr)


def test_mpirun_ending_by_itself_keeps_its_exit_status(tmp_path):
    start = time.monotonic()
    result = run_script(["--launcher", "mpirun", "-n", "2", "true"],
                        env=fake_mpirun_env(tmp_path, "abort_then_exit", grace="20"))
    assert result.returncode == 7 and time.monotonic() - start < 10, result.stdout + result.stderr
    assert "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\nwith errorcode 7.\n" in result.stderr
    assert "has not ended" not in result.stderr


def test_stdin_stdout_and_stderr_pass_through(tmp_path):
    result = subprocess.run(script_command() + ["--launcher", "mpirun", "-n", "2", "true"], input="some input\n",
                            capture_output=True, text=True, timeout=60, env=fake_mpirun_env(tmp_path, "echo_stdin"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "rank 0 read: some input\n"
    assert result.stderr.endswith("\nto stderr\n"), result.stderr


def test_a_signal_is_passed_on_and_ends_the_job_after_the_grace_period(tmp_path):
    # SIGINT from elsewhere than the terminal reaches mpirun once; an mpirun that does not end is ended.
    job = subprocess.Popen(script_command() + ["--launcher", "mpirun", "-n", "2", "true"], stderr=subprocess.PIPE,
                           text=True, env=fake_mpirun_env(tmp_path, "deaf_to_sigint"), start_new_session=True)
    assert job.stderr is not None
    lines = [job.stderr.readline(), job.stderr.readline()]
    assert lines[1] == "ready\n", lines
    start = time.monotonic()
    job.send_signal(signal.SIGINT)
    _, rest = job.communicate(timeout=30)
    assert job.returncode == 130 and time.monotonic() - start < 1 + 2, rest
    assert rest.count("mpirun got SIGINT") == 1, rest
    assert "shardkit-run: got SIGINT 1 s ago and mpirun has not ended; ending mpirun" in rest, rest
