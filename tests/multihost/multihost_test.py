"""The multi-host tests: one case per run, inside the simulated hosts of scripts/multihost.sh.

    scripts/multihost.sh --slots 2,2 -- python3 tests/multihost/multihost_test.py CASE --build BUILD_DIR

Each case starts jobs across the hosts (mpirun with the hostfile, or shardkit-run), checks what the ranks computed
and where they ran, and prints how many hosts it ran on (from mpirun's job map or the ranks' own report) and how many
bytes the hosts sent each other through the bridge. Exit status: 0 passed, 1 failed, 77 skipped (with the reason).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SKIP = 77
SOURCE = Path(__file__).resolve().parents[2]
JOB_LIMIT_S = 240            # any one job; a hang fails the case rather than the ctest timeout
LOST_HOST_LIMIT_S = 30       # a job that lost a host must have ended within this (after the timeout, if unreachable)
UNREACHABLE_TIMEOUT_S = 5    # SHARDKIT_TIMEOUT_S of the job that loses a host's link


class Failed(Exception):
    pass


class Skipped(Exception):
    pass


def env_or_skip(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise Skipped(f"{name} is not set: run this through scripts/multihost.sh")
    return value


def hosts() -> list[tuple[str, int]]:
    """[(name, slots)] of the simulated hosts, in order."""
    return [(name, int(slots)) for name, slots in
            (item.rsplit(":", 1) for item in env_or_skip("SHARDKIT_MH_HOSTS").split(","))]


def namespaces() -> list[str]:
    return env_or_skip("SHARDKIT_MH_NAMESPACES").split()


def bridge_bytes() -> int:
    """Bytes the hosts have sent into the bridge (the launcher's side of every host's link)."""
    total = 0
    for port in Path("/sys/class/net").glob("v[0-9]*"):
        total += int((port / "statistics" / "rx_bytes").read_text())
    return total


# Environment every rank gets: checked mode with a timeout, as the other MPI tests, one BLAS thread per rank.
RANK_ENV = {"SHARDKIT_CHECK": "1", "SHARDKIT_TIMEOUT_S": "60", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def mpirun(np: int, program: list[str], forward: tuple[str, ...] = ()) -> list[str]:
    """mpirun of program on np ranks over the hostfile's hosts: ranks fill each host's slots in turn, shared memory
    within a host, TCP between hosts (multihost.sh's MCA settings), the job map printed."""
    command = ["mpirun", "--hostfile", env_or_skip("SHARDKIT_MH_HOSTFILE"), "-np", str(np), "--oversubscribe",
               "--bind-to", "none", "--display-map"]
    # The suites' dtype sweep (collective_test_util.hpp swept_dtypes) must be the same on every rank's host.
    sweep = ("SHARDKIT_TEST_WIDE_SWEEP",) if "SHARDKIT_TEST_WIDE_SWEEP" in os.environ else ()
    for name in (*RANK_ENV, *forward, *sweep):
        command += ["-x", name]
    return command + program


def run(command: list[str], what: str, timeout: float = JOB_LIMIT_S, env: dict | None = None,
        expect_ok: bool = True) -> str:
    """Runs a job; returns stdout + stderr. Fails on a non-zero exit (when expect_ok) or a time-out."""
    print(f"$ {' '.join(command)}", flush=True)
    start = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **RANK_ENV, **(env or {})})
    except subprocess.TimeoutExpired as e:
        raise Failed(f"{what}: did not end within {timeout} s:\n{e.stdout}\n{e.stderr}") from None
    output = done.stdout + done.stderr
    print(f"  ({what}: exit {done.returncode} in {time.monotonic() - start:.1f} s)", flush=True)
    if expect_ok and done.returncode != 0:
        raise Failed(f"{what}: exit status {done.returncode}:\n{output}")
    return output


def hosts_in_map(output: str) -> set[str]:
    """Hosts that mpirun's --display-map placed ranks on."""
    return {m.group(1) for m in re.finditer(r"Data for node: (\S+)\s+Num slots: \d+\s+Max slots: \d+\s+Num procs: "
                                            r"([1-9]\d*)", output)}


def expected_placement() -> list[tuple[str, int, int]]:
    """(host, local rank, local size) for every rank when ranks fill the hosts' slots in order."""
    placement = []
    for name, slots in hosts():
        placement += [(name, local, slots) for local in range(slots)]
    return placement


DESCRIBE = re.compile(r"rank (\d+)/(\d+) host=(\S+) local_rank=(\d+)/(\d+)")


def check_described_ranks(output: str, what: str) -> set[str]:
    """Checks the describe() lines of every rank against the slots of the hosts; returns the hosts seen."""
    expected = expected_placement()
    seen = {}
    for m in DESCRIBE.finditer(output):
        rank, size, host, local, local_size = int(m[1]), int(m[2]), m[3], int(m[4]), int(m[5])
        if size != len(expected):
            raise Failed(f"{what}: rank {rank} reports {size} ranks, expected {len(expected)}:\n{output}")
        seen[rank] = (host, local, local_size)
    if sorted(seen) != list(range(len(expected))):
        raise Failed(f"{what}: lines for ranks {sorted(seen)}, expected 0..{len(expected) - 1}:\n{output}")
    for rank, want in enumerate(expected):
        if seen[rank] != want:
            raise Failed(f"{what}: rank {rank} reports host={seen[rank][0]} local_rank={seen[rank][1]}/"
                         f"{seen[rank][2]}, expected host={want[0]} local_rank={want[1]}/{want[2]}:\n{output}")
    print(f"  {what}: every rank's host and local rank as placed: "
          + ", ".join(f"{h}: {s} rank(s)" for h, s in hosts()), flush=True)
    return {host for host, _, _ in seen.values()}


def require(condition: bool, message: str) -> None:
    if not condition:
        raise Failed(message)


def need_file(path: Path, what: str) -> str:
    if not path.exists():
        raise Skipped(f"{what} was not built ({path})")
    return str(path)


def need_python_package() -> None:
    done = subprocess.run([sys.executable, "-c", "import numpy, shardkit"], capture_output=True, text=True)
    if done.returncode != 0:
        raise Skipped(f"{sys.executable} cannot import shardkit (build with -DSHARDKIT_PYTHON=ON): "
                      + done.stderr.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------------------
# The cases. Each returns the hosts it ran on.


def case_hello(build: Path) -> set[str]:
    hello = need_file(build / "examples/hello/hello", "examples/hello")
    np = sum(s for _, s in hosts())
    output = run(mpirun(np, [hello]), "hello")
    seen = check_described_ranks(output, "hello")
    require(hosts_in_map(output) == seen, f"the job map and the ranks disagree on the hosts:\n{output}")
    return seen


def case_collectives(build: Path) -> set[str]:
    tests = need_file(build / "tests/collectives/collectives_tests", "tests/collectives/collectives_tests")
    np = sum(s for _, s in hosts())
    output = run(mpirun(np, [tests]), "collectives suite")
    require(re.search(r"\[  PASSED  \] \d+ tests?", output) is not None and "FAILED" not in output,
            f"the collectives suite did not pass:\n{output}")
    print("  " + re.search(r"\[  PASSED  \] .*", output)[0], flush=True)
    return hosts_in_map(output)


def case_shm_hierarchy(build: Path) -> set[str]:
    """The shm backend across hosts (hierarchical: shm on each host, MPI between one leader per host), every dtype, with
    the ranks filling each host's slots in turn and then dealt round-robin over the hosts (a host's ranks not
    contiguous in the communicator, which allgather and reduce_scatter must put back in rank order). The suite itself
    checks that those communicators took shm (backend_for; on auto, ShmAuto reads each call's route from the flight
    recorder); the log line of SHARDKIT_VERBOSE=1 says that it was the hierarchical one."""
    tests = need_file(build / "tests/collectives/collectives_tests", "tests/collectives/collectives_tests")
    np = sum(s for _, s in hosts())
    seen = set()
    for mapping in ("slot", "node"):
        command = mpirun(np, [tests, "--gtest_filter=*Shm*:Routing.*"], forward=("SHARDKIT_VERBOSE",))
        command[1:1] = ["--map-by", mapping]
        output = run(command, f"shm suite, ranks mapped by {mapping}", env={"SHARDKIT_VERBOSE": "1"})
        require(re.search(r"\[  PASSED  \] \d+ tests?", output) is not None and "FAILED" not in output,
                f"the shm suite did not pass (mapped by {mapping}):\n{output}")
        require("communicator 'shm': shm in use, hierarchical" in output,
                f"the shm suite's communicator did not take the hierarchical path (mapped by {mapping}):\n{output}")
        print(f"  mapped by {mapping}: " + re.search(r"\[  PASSED  \] .*", output)[0], flush=True)
        seen |= hosts_in_map(output)
    return seen


def case_shm_hierarchy_timeout(build: Path) -> set[str]:
    """A rank that does not lead its host skips an allreduce on the hierarchical shm path (collectives_timeout shm: the
    last rank skips, every rank has a 1.5 s timeout): the TimeoutError of its host's leader, waiting for it in shared
    memory, names it by its rank in the communicator, not by its rank on the host. Ranks are dealt round-robin over
    the hosts, so that the two differ: on slots 1,2,1 the last rank (3) is the second rank of a host that another
    leads. Every other rank must time out too (the leaders in MPI), and the job must end."""
    program = need_file(build / "tests/collectives/collectives_timeout", "tests/collectives/collectives_timeout")
    np = sum(s for _, s in hosts())
    skipper = np - 1
    with tempfile.TemporaryDirectory() as dumps:
        command = mpirun(np, [program, "shm"], forward=("SHARDKIT_DUMP_DIR",))
        command[1:1] = ["--map-by", "node"]
        output = run(command, "a rank skips an allreduce on shm", env={"SHARDKIT_DUMP_DIR": dumps}, expect_ok=False)
    for r in range(np):
        if r != skipper:
            require(re.search(rf"rank {r}: caught after [0-9.]+ s: TimeoutError: allreduce #\d+ on communicator "
                              r"'timeout-test'", output) is not None,
                    f"rank {r} did not report a TimeoutError naming the allreduce:\n{output}")
    named = re.findall(r"rank\(s\) ([0-9, ]+) did not arrive \(shared memory\)", output)
    require(named != [] and all(n == str(skipper) for n in named),
            f"the shared-memory waits should name rank {skipper} (its rank in the communicator) and only it; they "
            f"named {named}:\n{output}")
    print(f"  the shared-memory wait named rank {skipper}: {named}", flush=True)
    return hosts_in_map(output)


def case_collectives_latency(build: Path) -> set[str]:
    # The delay must really be there: every host's link has a netem qdisc with it.
    for ns in namespaces():
        qdisc = subprocess.run(["ip", "-n", ns, "-d", "qdisc", "show", "dev", "eth0"], capture_output=True,
                               text=True).stdout
        require("netem" in qdisc and re.search(r"delay \d", qdisc) is not None, f"{ns}: no netem delay: {qdisc}")
        print(f"  {ns}: {qdisc.strip()}", flush=True)
    return case_collectives(build)


def case_multiply_by_two(build: Path) -> set[str]:
    program = need_file(build / "examples/multiply_by_two/multiply_by_two", "examples/multiply_by_two")
    np = sum(s for _, s in hosts())
    output = run(mpirun(np, [program]), "multiply_by_two (C++)")
    require("allclose: true" in output, f"multiply_by_two did not match its reference:\n{output}")
    return hosts_in_map(output)


def case_distributed_matmul(build: Path) -> set[str]:
    program = need_file(build / "examples/distributed_matmul/distributed_matmul", "examples/distributed_matmul")
    np = sum(s for _, s in hosts())
    # Every algorithm, checked against the one-rank BLAS product (a mismatch exits non-zero).
    output = run(mpirun(np, [program, "--m", "48", "--k", "36", "--n", "20", "--algo", "all", "--repeat", "1",
                             "--threads", "1", "--check"]), "distributed_matmul (C++)")
    require(re.search(r"summa|allgather|reduce_scatter", output) is not None, f"no algorithm reported:\n{output}")
    return hosts_in_map(output)


def case_distributed_matmul_python(build: Path) -> set[str]:
    need_python_package()
    np = sum(s for _, s in hosts())
    seen = set()
    for mode in ("--numpy", "--sk-matmul"):
        output = run(mpirun(np, [sys.executable, str(SOURCE / "examples/python/distributed_matmul.py"), mode],
                            forward=("PYTHONPATH",)), f"distributed_matmul.py {mode}")
        require("Allclose: True" in output, f"distributed_matmul.py {mode}: result differs from NumPy's:\n{output}")
        seen |= hosts_in_map(output)
    return seen


def shardkit_run(build: Path) -> str:
    script = build / "bin/shardkit-run"
    return need_file(script, "bin/shardkit-run")


def launcher_checks(build: Path, where: list[str], what: str) -> set[str]:
    """As a new user would: a bare python3, shardkit found through PYTHONPATH, nothing else said."""
    need_python_package()
    launcher = shardkit_run(build)
    hello = need_file(build / "examples/hello/hello", "examples/hello")
    output = run([launcher, *where, hello], f"shardkit-run {what} hello")
    seen = check_described_ranks(output, f"shardkit-run {what} hello")
    output = run([launcher, *where, "python3", str(SOURCE / "tests/multihost/rank_program.py"), "describe"],
                 f"shardkit-run {what} python3 (describe)")
    require(seen == check_described_ranks(output, f"shardkit-run {what} python3"), "hosts differ")
    output = run([launcher, *where, "python3", str(SOURCE / "examples/python/multiply_by_two.py"), "--numpy"],
                 f"shardkit-run {what} python3 multiply_by_two.py")
    require("allclose: True" in output, f"multiply_by_two.py did not match its reference:\n{output}")
    # What made the bare python3 the same Python on every host: the command names what it forwards.
    line = next((l for l in output.splitlines() if l.startswith("shardkit-run: ")), "")
    forwarded = re.findall(r"-x (\w+)", line)
    # PATH always; the others where this environment sets them (PYTHONPATH when testing a build tree's package).
    wanted = {"PATH"} | {v for v in ("PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV") if os.environ.get(v)}
    require(wanted <= set(forwarded), f"shardkit-run did not forward {' '.join(sorted(wanted))}: {line}")
    print(f"  shardkit-run forwarded: {' '.join(forwarded)}", flush=True)
    return seen


def case_shardkit_run_hosts(build: Path) -> set[str]:
    return launcher_checks(build, ["--hosts", env_or_skip("SHARDKIT_MH_HOSTS")], "--hosts")


def case_shardkit_run_hostfile(build: Path) -> set[str]:
    return launcher_checks(build, ["--hostfile", env_or_skip("SHARDKIT_MH_HOSTFILE")], "--hostfile")


def start_spinning(command: list[str], env: dict | None = None) -> tuple[subprocess.Popen, list[str], dict[int, str]]:
    """Starts a job of rank_program.py spin (ranks allreduce in a loop) and waits until every rank is running. Returns
    the job, its output so far and each rank's host. The job has a process group of its own (see kill_job)."""
    np = sum(s for _, s in hosts())
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, **RANK_ENV, **(env or {})}, start_new_session=True)
    lines = []
    where = {}
    deadline = time.monotonic() + JOB_LIMIT_S
    assert job.stdout is not None
    for line in job.stdout:
        lines.append(line)
        if m := re.match(r"ready: rank (\d+) on (?:host=)?(\S+)", line):
            where[int(m[1])] = m[2]
        if len(where) == np or time.monotonic() > deadline:
            break
    if len(where) != np:
        kill_job(job)
        raise Failed(f"the job did not get going ({len(where)} of {np} ranks ready):\n{''.join(lines)}")
    return job, lines, where


def kill_job(job: subprocess.Popen) -> str:
    """Kills what is left of a job: its process group (mpirun under shardkit-run too, which holds the output open);
    returns the output not read yet."""
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        return job.communicate(timeout=10)[0] or ""
    except subprocess.TimeoutExpired:
        return ""


def await_end(job: subprocess.Popen, lines: list[str], since: float, limit: float, what: str) -> str:
    """Waits for a job that lost a host to end, within limit seconds of since; it must fail. Returns its output."""
    try:
        rest, _ = job.communicate(timeout=max(since + limit - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        rest = kill_job(job)
        raise Failed(f"the job did not end within {limit:g} s of {what}:\n{''.join(lines)}{rest}") from None
    output = "".join(lines) + rest
    require(job.returncode != 0, f"the job exited 0 after {what}:\n{output}")
    print(f"  the job ended {time.monotonic() - since:.1f} s after {what} (exit {job.returncode})", flush=True)
    return output


def spin_program() -> list[str]:
    return [sys.executable, str(SOURCE / "tests/multihost/rank_program.py"), "spin"]


def lose_host(victim_ns: str, victim: str, ranks_only: bool) -> str:
    """Starts Python ranks that allreduce in a loop; once all are running, kills the victim host's ranks (or every
    process of the host, its Open MPI daemon too: a crashed machine). Returns the job's output."""
    np = sum(s for _, s in hosts())
    command = mpirun(np, spin_program(), forward=("PYTHONPATH",))
    what = "its ranks" if ranks_only else "every process of the host"
    print(f"$ {' '.join(command)}  (then kill {what} on {victim})", flush=True)
    job, lines, _ = start_spinning(command)
    pids = subprocess.run(["ip", "netns", "pids", victim_ns], capture_output=True, text=True).stdout.split()
    killed = []
    for pid in pids:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if ranks_only and comm.startswith("orted"):
            continue
        try:
            os.kill(int(pid), signal.SIGKILL)
            killed.append(f"{pid} ({comm})")
        except ProcessLookupError:
            pass
    killed_at = time.monotonic()
    print(f"  killed on {victim}: {', '.join(killed)}", flush=True)
    require(killed != [], f"no process to kill in {victim_ns}")
    output = await_end(job, lines, killed_at, LOST_HOST_LIMIT_S, f"losing {victim}")
    named = [line.strip() for line in output.splitlines() if victim in line and not line.startswith("ready: ")
             and "Data for node" not in line]
    require(named != [], f"no message names the lost host {victim}:\n{output}")
    print(f"  named in: {named[0]!r}", flush=True)
    return output


def case_lost_host(build: Path) -> set[str]:
    need_python_package()
    (victim, _), victim_ns = hosts()[-1], namespaces()[-1]
    seen = hosts_in_map(lose_host(victim_ns, victim, ranks_only=True))
    seen |= hosts_in_map(lose_host(victim_ns, victim, ranks_only=False))
    return seen


def case_unreachable_host(build: Path) -> set[str]:
    """The last host's link taken down (its bridge port; nothing killed, no connection closed) while every rank
    allreduces, through shardkit-run: the others time out after UNREACHABLE_TIMEOUT_S, end the job (MPI_Abort), and
    mpirun waits for the unreachable host's daemon until shardkit-run ends it. The job must end within the timeout
    + LOST_HOST_LIMIT_S, fail, name the host that does not answer (and no other), and leave nothing running on the
    other hosts."""
    need_python_package()
    launcher = shardkit_run(build)
    (victim, _), victim_ns = hosts()[-1], namespaces()[-1]
    port = f"v{len(hosts())}"  # the bridge's side of the victim's veth, in this (the launcher's) namespace
    command = [launcher, "--hosts", env_or_skip("SHARDKIT_MH_HOSTS"), *spin_program()]
    print(f"$ {' '.join(command)}  (then: ip link set {port} down, cutting {victim} off)", flush=True)
    with tempfile.TemporaryDirectory() as dumps:
        job, lines, where = start_spinning(command, env={"SHARDKIT_TIMEOUT_S": str(UNREACHABLE_TIMEOUT_S),
                                                         "SHARDKIT_DUMP_DIR": dumps})
        try:
            subprocess.run(["ip", "link", "set", port, "down"], check=True)
            cut_at = time.monotonic()
            output = await_end(job, lines, cut_at, UNREACHABLE_TIMEOUT_S + LOST_HOST_LIMIT_S, f"cutting {victim} off")
        finally:
            kill_job(job)
            subprocess.run(["ip", "link", "set", port, "up"], check=True)
    reports = [line for line in output.splitlines() if line.startswith("shardkit-run: ") and " -x " not in line]
    require(any("mpirun has not ended" in line for line in reports),
            f"shardkit-run did not say that it ended mpirun:\n{output}")
    silent = next((line for line in reports if "not answering" in line), "")
    others = [name for name, _ in hosts()[:-1]]
    require(re.search(rf"\b{re.escape(victim)}\b", silent) is not None and not any(h in silent for h in others),
            f"shardkit-run did not name {victim}, and only it, as not answering:\n{output}")
    for line in reports:
        print(f"  {line}", flush=True)
    # Nothing of the job is left on the hosts that could be reached (their daemons and ranks).
    for ns in namespaces()[:-1]:
        left = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        require(left == [], f"{ns}: processes left after the job ended: "
                + ", ".join(f"{pid} ({Path(f'/proc/{pid}/cmdline').read_text().replace(chr(0), ' ')[:80]})"
                            for pid in left if Path(f"/proc/{pid}").exists()))
    return set(where.values())


CASES = {name[len("case_"):]: f for name, f in globals().items() if name.startswith("case_")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--build", type=Path, required=True, help="the CMake build folder")
    args = parser.parse_args()
    try:
        all_hosts = [name for name, _ in hosts()]
        before = bridge_bytes()
        seen = CASES[args.case](args.build.resolve())
        sent = bridge_bytes() - before
        print(f"multihost {args.case}: ran on {len(seen)} host(s) ({', '.join(sorted(seen))}); "
              f"{sent / 1e6:.2f} MB crossed the bridge", flush=True)
        require(seen == set(all_hosts), f"ran on {sorted(seen)}, expected every host {all_hosts}")
    except Skipped as e:
        print(f"multihost {args.case}: SKIPPED: {e}", flush=True)
        return SKIP
    except Failed as e:
        print(f"multihost {args.case}: FAILED: {e}", flush=True)
        return 1
    print(f"multihost {args.case}: passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
