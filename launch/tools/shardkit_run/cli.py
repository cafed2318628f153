"""The command line: shardkit-run's arguments and help, the early check of the program, and main(), which runs the
launch command: srun in place of this process, mpirun as a watched child (supervise.py)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Mapping, Optional, Sequence

from .command import format_command
from .detect import Environment, describe, detect_environment
from .errors import EXIT_NOT_FOUND, EXIT_USAGE, LaunchError
from .launcher import build_command
from .mpirun import STARTUP_VARS
from .options import BIND_CHOICES, GRACE_VAR, LAUNCHER_CHOICES, MPIRUN_ARGS_VAR, SRUN_ARGS_VAR, Options
from .supervise import DEFAULT_GRACE_S, grace_seconds, supervise

PROG = "shardkit-run"

HELP_EPILOG = f"""\
number of ranks (-n), when not given:
  this node's GPUs, else its cores, times the number of hosts. GPUs: under Slurm the job's own (SLURM_GPUS_ON_NODE,
  else CUDA_VISIBLE_DEVICES); otherwise CUDA_VISIBLE_DEVICES when set (entries up to the first invalid one; empty
  means none), else the lines of `nvidia-smi -L`. Cores: physical cores this process may run on
  (os.sched_getaffinity), as Open MPI counts slots. With --hosts/--hostfile and no GPUs: the total slots when every
  host declares them. Under srun: SLURM_NTASKS when the job set it.

--bind (Open MPI flags shown; MPICH: -bind-to core:K / -ppn G; srun: --cpu-bind=cores|sockets|none):
  auto    one node: each rank gets its own K = cores // ranks whole cores
          (--map-by slot:PE=K --bind-to core); more ranks than cores: --bind-to none.
          several hosts with GPUs: G ranks per node, G = this node's GPUs, nodes assumed alike
          (--map-by ppr:G:node:PE=K --bind-to core). several hosts without GPUs: the launcher's default.
          srun: Slurm's default (the site's task/affinity setup and the job's --cpus-per-task).
  core    one core per rank (--map-by core --bind-to core)
  socket  ranks spread over sockets, each bound to its socket (--map-by socket --bind-to socket)
  none    no binding (--bind-to none)

launchers:
  srun is used inside a Slurm job (SLURM_JOB_ID set) when it is on PATH: srun -n N, --gpus-per-task=1 when every rank
  can have a GPU of its own, --export=ALL,VAR for -x. The MPI plugin is the site's default: put extra srun flags
  (--mpi=pmix, --cpus-per-task, ...) in {SRUN_ARGS_VAR}.
  Otherwise mpirun (or mpiexec). Open MPI: --oversubscribe when there are more ranks than slots (or the slots are
  unknown); OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 set when running as root; -x VAR for
  exported variables (and, with --hosts/--hostfile, for every SHARDKIT_* variable set here and for those of
  {", ".join(STARTUP_VARS)} that are set, since Open MPI gives other hosts the environment of an ssh login, where a
  bare python3 may be another Python). MPICH (Hydra): -genv VAR VALUE (Hydra passes the whole environment itself).
  Extra mpirun flags: {MPIRUN_ARGS_VAR}.

ending the job (mpirun): shardkit-run stays mpirun's parent, passes stderr through and watches it. Once a rank has
  ended the job (MPI_Abort: shardkit's "ending the job" line, or the MPI's own report) or shardkit-run got SIGINT,
  SIGTERM or SIGHUP, mpirun has {GRACE_VAR} seconds (default {DEFAULT_GRACE_S:g}; inf: no limit) to end; if it has
  not (it waits for the daemon of a host it cannot reach), shardkit-run ends it and every process it started
  (SIGKILL), names the hosts of --hosts/--hostfile that do not answer a TCP connection to their ssh port, and exits
  with the abort's error code (128 + signal after a signal). srun is run in place of shardkit-run: Slurm ends its
  steps itself.

exit status: the launcher's; {EXIT_NOT_FOUND} when no launcher or the program cannot be found, 126 when the program
  is not executable, {EXIT_USAGE} for bad usage.
"""


def _make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, usage=f"{PROG} [options] [--] program [args...]",
        description="Run a program as one process per device (GPU, else core) under mpirun, or srun in a Slurm job.\n"
                    "Prints the command it runs (to stderr), then runs it.",
        epilog=HELP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--np", type=int, metavar="N", help="number of ranks (default: see below)")
    parser.add_argument("--hostfile", metavar="FILE", help="hosts to run on, one a line (passed to mpirun)")
    parser.add_argument("--hosts", metavar="H1:S1,H2:S2", help="hosts to run on, with slots (mpirun --host)")
    parser.add_argument("--bind", choices=BIND_CHOICES, default="auto", help="CPU binding of ranks (default: auto)")
    parser.add_argument("--launcher", choices=LAUNCHER_CHOICES, default="auto",
                        help="auto (default): srun inside a Slurm job, else mpirun")
    parser.add_argument("--dry-run", action="store_true", help="print the command (and variables it sets), run nothing")
    parser.add_argument("-x", dest="exports", action="append", default=[], metavar="VAR[=VALUE]",
                        help="set and export VAR to every rank (VAR alone: its value here); repeatable")
    parser.add_argument("--verbose", action="store_true", help="say what was detected and why each flag is there")
    parser.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def parse_args(argv: Sequence[str]) -> Options:
    """Parses shardkit-run's arguments. Raises SystemExit (argparse) for --help and malformed options."""
    parser = _make_parser()
    ns = parser.parse_args(list(argv))
    command = list(ns.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("no program given")
    if ns.np is not None and ns.np < 1:
        parser.error(f"-n must be at least 1 (got {ns.np})")
    if ns.hosts and ns.hostfile:
        parser.error("give --hosts or --hostfile, not both")
    return Options(program=command, np=ns.np, hostfile=ns.hostfile, hosts=ns.hosts, bind=ns.bind,
                   launcher=ns.launcher, dry_run=ns.dry_run, exports=list(ns.exports), verbose=ns.verbose)


def check_program(program: str, env: Mapping[str, str], cwd: Optional[str] = None) -> None:
    """Fails early, with a clear message, when the program can be neither found nor run (the launcher's own
    message for that comes once per rank, after the job has started)."""
    cwd = cwd or os.getcwd()
    if os.sep in program:
        path = os.path.join(cwd, program)
        if not os.path.exists(path):
            raise LaunchError(f"program '{program}' not found: no such file", EXIT_NOT_FOUND)
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise LaunchError(f"program '{program}' is not an executable file"
                              + (" (a script? run it through its interpreter, e.g. python3 " + program + ")"
                                 if os.path.isfile(path) else ""), 126)
        return
    if shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        hint = f" (did you mean ./{program}?)" if os.path.isfile(os.path.join(cwd, program)) else ""
        raise LaunchError(f"program '{program}' not found: not a path, and not on PATH{hint}", EXIT_NOT_FOUND)


def main(argv: Optional[Sequence[str]] = None, environment: Optional[Environment] = None) -> int:
    """Runs shardkit-run. Returns the exit status: of --dry-run, --help and errors, or mpirun's (see supervise.py);
    srun replaces this process (exec) and this does not return."""
    try:
        options = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # --help, or a usage error argparse has already printed
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        if environment is None:
            environment = detect_environment()
        if options.verbose:
            print(f"{PROG}: detected {describe(environment)}", file=sys.stderr)
        launch = build_command(options, environment)
        check_program(options.program[0], {**environment.env, **launch.env})
        grace_s = grace_seconds(environment.env)
    except LaunchError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return e.code
    if options.verbose:
        for note in launch.notes:
            print(f"{PROG}: {note}", file=sys.stderr)
    line = format_command(launch)
    if options.dry_run:
        print(line)
        return 0
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    child_env = {**environment.env, **launch.env}
    try:
        if launch.launcher != "srun":
            return supervise(launch.command, child_env, grace_s, PROG, hosts=launch.hosts)
        os.execvpe(launch.command[0], launch.command, child_env)
    except OSError as e:
        print(f"{PROG}: error: cannot run {launch.command[0]}: {e.strerror}", file=sys.stderr)
        return 126 if isinstance(e, PermissionError) else EXIT_NOT_FOUND
    return 0  # not reached
