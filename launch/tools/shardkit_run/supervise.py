"""Running mpirun and seeing that a job which has been ended does end: supervise().

When a rank ends the job (MPI_Abort, after a shardkit timeout or error), mpirun ends it on every host it can reach,
then waits for the daemons of the others; a host that dropped off the network without closing its connections never
answers, and mpirun waits until TCP gives up (many minutes). So shardkit-run stays mpirun's parent and watches for
the job's end: from the first sign that it was ended, mpirun has a grace period (SHARDKIT_RUN_GRACE_S, default 10 s)
to end by itself, with its own exit status; after that shardkit-run ends it and every process it started (SIGKILL),
names the ranks that did not arrive (when the ranks' message did) and the hosts that do not answer, and exits with
the abort's error code.

The signs, read from mpirun's stderr (where Open MPI and MPICH print the ranks' stderr and their own reports):
  shardkit: rank N: ending the job (MPI_Abort): REASON     shardkit's own, printed just before MPI_Abort
  MPI_ABORT was invoked on rank N ... with errorcode C     Open MPI's mpirun
  application called MPI_Abort(COMM, C) - process N       MPICH
and SIGINT, SIGTERM or SIGHUP reaching shardkit-run.

mpirun stays in shardkit-run's process group, so the terminal treats it as it did when shardkit-run replaced itself
with mpirun: Open MPI forwards stdin to rank 0 only while its process group is the terminal's foreground one, and
Ctrl-C and Ctrl-Z reach mpirun from the terminal directly. A SIGINT that the terminal sent to the whole group is
therefore not sent again (mpirun takes a second one as "kill now"); SIGINT from anywhere else, SIGTERM and SIGHUP are
passed on. "Every process it started" is mpirun's descendants, from /proc, since they share this process's group.
stdout is not touched: it is the same file as shardkit-run's. stderr is copied through as it arrives, byte for byte.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import os
import re
import select
import signal
import socket
import subprocess
import time
from typing import Mapping, Optional, Sequence

from .errors import LaunchError
from .options import GRACE_VAR

DEFAULT_GRACE_S = 10.0
PROBE_PORT = 22            # which hosts answer: ssh's, which the launcher reaches them through
PROBE_S = 2.0
DRAIN_S = 1.0              # for mpirun's last words once it has exited (descendants may hold the pipe open)
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_ABORT_LINES = (
    re.compile(rb"shardkit: rank (?P<rank>\d+): ending the job \(MPI_Abort\): (?P<reason>.*)"),
    re.compile(rb"MPI_ABORT was invoked on rank (?P<rank>\d+)"),
    re.compile(rb"application called MPI_Abort\([^,]*, (?P<code>-?\d+)\) - process (?P<rank>\d+)"),
)
_ERROR_CODE = re.compile(rb"^with errorcode (?P<code>-?\d+)\.")      # the line after Open MPI's MPI_ABORT line
_MISSING_RANKS = re.compile(r"rank\(s\) ([\d, -]+?) did not arrive")  # in shardkit's timeout reasons
_MAX_LINE = 1 << 16


def grace_seconds(env: Mapping[str, str]) -> float:
    """SHARDKIT_RUN_GRACE_S: seconds mpirun has to end a job that was ended; "inf" waits as long as mpirun does."""
    text = env.get(GRACE_VAR, "")
    if not text:
        return DEFAULT_GRACE_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise LaunchError(f"{GRACE_VAR}={text}: expected seconds (a number >= 0, or inf)")
    return value


@dataclasses.dataclass
class _Ending:
    """The first sign that the job was ended, and what shardkit-run exits with if it has to end mpirun."""

    since: float                    # time.monotonic()
    what: str
    status: int


class _Watch:
    """What the lines of mpirun's stderr say about the job's end."""

    def __init__(self) -> None:
        self.ending: Optional[_Ending] = None
        self.missing: list[str] = []     # "2, 3", from each reason that names ranks that did not arrive
        self._partial = b""
        self._after_openmpi_abort = False

    def feed(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()[-_MAX_LINE:]
        for line in lines:
            self._line(line.rstrip(b"\r"))

    def signal(self, signum: int) -> None:
        if self.ending is None:
            self.ending = _Ending(time.monotonic(), f"got {signal.Signals(signum).name}", 128 + signum)

    def _line(self, line: bytes) -> None:
        if self._after_openmpi_abort:
            self._after_openmpi_abort = False
            m = _ERROR_CODE.match(line)
            if m and self.ending is not None and int(m["code"]) != 0:
                self.ending.status = int(m["code"]) & 0xFF or 1
        for pattern in _ABORT_LINES:
            m = pattern.search(line)
            if not m:
                continue
            reason = m.groupdict().get("reason")
            if reason:
                text = reason.decode(errors="replace")
                self.missing += [r for r in _MISSING_RANKS.findall(text) if r not in self.missing]
            self._after_openmpi_abort = pattern is _ABORT_LINES[1]
            if self.ending is None:
                what = f"rank {int(m['rank'])} ended the job (MPI_Abort)"
                code = int(m.groupdict().get("code") or 1)
                self.ending = _Ending(time.monotonic(), what, code & 0xFF or 1)
            return


def descendants(pid: int) -> dict[int, str]:
    """pid's descendants as {pid: start time} (/proc; empty where there is none). The start time tells a process from
    a later one that reuses its pid."""
    children: dict[int, list[int]] = {}
    started: dict[int, str] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After "pid (comm)": state, ppid, ... starttime is field 22 of the whole line, 20 after the comm.
        children.setdefault(int(fields[1]), []).append(int(entry))
        started[int(entry)] = fields[19].decode()
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found[child] = started[child]
                todo.append(child)
    return found


def _start_time(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _signal_all(processes: Mapping[int, str], signum: int) -> None:
    for pid, start in processes.items():
        if _start_time(pid) == start:
            try:
                os.kill(pid, signum)
            except OSError:
                pass


def _terminal_signals_group() -> bool:
    """Whether this process group is its terminal's foreground group: a Ctrl-C there has reached mpirun too."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


class _Copy:
    """mpirun's stderr, copied to ours as it comes; a reader that went away (EPIPE) is no reason to stop reading."""

    def __init__(self, source: int, sink: int) -> None:
        self.source, self.sink = source, sink
        self.open = True

    def pump(self, watch: _Watch) -> bool:
        """Copies what is there; False at the end of the stream."""
        try:
            data = os.read(self.source, 1 << 16)
        except BlockingIOError:
            return True
        if not data:
            self.open = False
            return False
        watch.feed(data)
        view = memoryview(data)
        while self.sink >= 0 and view:
            try:
                view = view[os.write(self.sink, view):]
            except OSError as e:
                if e.errno != errno.EAGAIN:
                    self.sink = -1
        return True


def supervise(command: Sequence[str], env: Mapping[str, str], grace_s: float, prog: str, hosts: Sequence[str] = (),
              err_fd: int = 2) -> int:
    """Runs command (mpirun) as described above; returns the exit status for shardkit-run."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    watch = _Watch()
    received: list[int] = []
    # Every signal here, SIGCHLD too (mpirun may end while its descendants hold the stream open), wakes the loop.
    previous = {s: signal.getsignal(s) for s in (*FORWARDED_SIGNALS, signal.SIGCHLD)}
    for s in FORWARDED_SIGNALS:
        signal.signal(s, lambda signum, frame: received.append(signum))
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    old_wakeup = signal.set_wakeup_fd(wake_w)
    try:
        # close_fds=False: mpirun inherits what an exec would have passed it. Python's own descriptors (the pipes
        # here) are not inheritable.
        proc = subprocess.Popen(list(command), env=dict(env), stderr=subprocess.PIPE, close_fds=False)
        assert proc.stderr is not None
        os.set_blocking(proc.stderr.fileno(), False)
        copy = _Copy(proc.stderr.fileno(), err_fd)
        try:
            return _watch_until_end(proc, copy, watch, received, wake_r, grace_s, prog, hosts)
        finally:
            proc.stderr.close()
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for s, handler in previous.items():
            signal.signal(s, handler)
        os.close(wake_r)
        os.close(wake_w)


def _watch_until_end(proc: subprocess.Popen, copy: _Copy, watch: _Watch, received: list[int], wake_r: int,
                     grace_s: float, prog: str, hosts: Sequence[str]) -> int:
    while True:
        while received:
            signum = received.pop(0)
            if not (signum == signal.SIGINT and _terminal_signals_group()):
                _send(proc, signum)
            watch.signal(signum)
        if proc.poll() is not None:
            _drain(copy, watch, time.monotonic() + DRAIN_S)
            return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        timeout = None
        if watch.ending is not None:
            timeout = watch.ending.since + grace_s - time.monotonic()
            if timeout <= 0:
                return _end(proc, copy, watch, grace_s, prog, hosts)
        # While the stream is open it says when there is something to do; after its end, poll mpirun.
        waits = [wake_r] + ([copy.source] if copy.open else [])
        ready, _, _ = select.select(waits, [], [], timeout if copy.open else min(timeout or 0.1, 0.1))
        if wake_r in ready:
            while _read_some(wake_r):
                pass
        if copy.source in ready:
            copy.pump(watch)


def _read_some(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False


def _send(proc: subprocess.Popen, signum: int) -> None:
    try:
        proc.send_signal(signum)
    except OSError:
        pass


def _drain(copy: _Copy, watch: _Watch, until: float) -> None:
    while copy.open:
        left = until - time.monotonic()
        if left <= 0 or not select.select([copy.source], [], [], left)[0]:
            return
        copy.pump(watch)


def _end(proc: subprocess.Popen, copy: _Copy, watch: _Watch, grace_s: float, prog: str, hosts: Sequence[str]) -> int:
    """Ends mpirun and its descendants (SIGKILL), then says which hosts do not answer."""
    ending = watch.ending
    assert ending is not None
    missing = (f" (rank(s) {'; '.join(watch.missing)} did not arrive: is their host unreachable?)" if watch.missing
               else "")
    _say(copy, f"{prog}: {ending.what} {grace_s:g} s ago and mpirun has not ended{missing}; ending mpirun and the "
               f"processes it started")
    # Only SIGKILL: mpirun was asked to end the job already (by the MPI_Abort, or the signal passed on), and Open MPI
    # takes a second request for "terminate now", which it answers by crashing in PMIx_Finalize.
    processes = {proc.pid: _start_time(proc.pid) or "", **descendants(proc.pid)}
    _signal_all(processes, signal.SIGKILL)
    proc.wait()
    _drain(copy, watch, time.monotonic() + 0.2)
    if hosts:
        silent = unanswering_hosts(hosts)
        _say(copy, f"{prog}: " + (f"host(s) not answering on TCP port {PROBE_PORT} within {PROBE_S:g} s: "
                                  f"{', '.join(silent)}" if silent else
                                  f"every host answers on TCP port {PROBE_PORT}: {', '.join(hosts)}"))
    _say(copy, f"{prog}: the job was ended; exit status {ending.status}")
    return ending.status


def unanswering_hosts(hosts: Sequence[str], port: int = PROBE_PORT, timeout: float = PROBE_S) -> list[str]:
    """The hosts that neither accept nor refuse a TCP connection to port within timeout seconds (all at once). A
    refusal is an answer: the host is up and reachable, whatever listens there."""
    def answers(host: str) -> bool:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except ConnectionRefusedError:
            return True
        except OSError:  # a time-out, no route to the host, a name that does not resolve
            return False
        return True

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(hosts), 32) or 1) as pool:
        return [host for host, ok in zip(hosts, pool.map(answers, hosts)) if not ok]


def _say(copy: _Copy, line: str) -> None:
    if copy.sink >= 0:
        try:
            os.write(copy.sink, (line + "\n").encode())
        except OSError:
            pass
