#!/usr/bin/env python3
"""shardkit-run: start a program as one process per device, through mpirun or srun.

A thin launcher: it works out the command line that this machine (or this Slurm job) needs, prints it, and replaces
itself with it, so that signals and the exit status are the launcher's own. Standard library only, and importable
without side effects: the pure functions below (detect_environment, build_command, format_command) take every
fact about the machine as an argument, so tests can describe a machine instead of needing one.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from typing import Callable, Mapping, Optional, Sequence

PROG = "shardkit-run"
EXIT_USAGE = 2
EXIT_NOT_FOUND = 127  # what a shell answers for a command it cannot find

BIND_CHOICES = ("auto", "core", "socket", "none")
LAUNCHER_CHOICES = ("auto", "mpirun", "srun")

# Open MPI's mpirun refuses to start as root unless both of these are set.
OPENMPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# Extra launcher flags from the environment, inserted just before the program.
MPIRUN_ARGS_VAR = "SHARDKIT_MPIRUN_ARGS"
SRUN_ARGS_VAR = "SHARDKIT_SRUN_ARGS"
# What a program needs to start the same way on every host. Open MPI starts far hosts through ssh, whose login
# environment is not this one: without PATH a bare `python3` there is the system's, which cannot import what this
# one can (PYTHONPATH, a virtual environment), and libraries found here through LD_LIBRARY_PATH are not found there.
STARTUP_VARS = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX")

NO_LAUNCHER_MESSAGE = """no MPI launcher found: none of mpirun, mpiexec or srun is on PATH.
Install an MPI, for example:
  Debian/Ubuntu:  apt-get install openmpi-bin      (or: apt-get install mpich)
  Fedora/RHEL:    dnf install openmpi && module load mpi/openmpi-x86_64
  conda:          conda install -c conda-forge openmpi
On a cluster, load the site's MPI module, or run inside a Slurm allocation (salloc/sbatch) where srun is on PATH."""

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

exit status: the launcher's; {EXIT_NOT_FOUND} when no launcher or the program cannot be found, 126 when the program
  is not executable, {EXIT_USAGE} for bad usage.
"""


class LaunchError(Exception):
    """A problem that ends shardkit-run with a message and an exit status."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


# ----------------------------------------------------------------------------------------------------------------------
# What the machine looks like.


@dataclasses.dataclass(frozen=True)
class Environment:
    """Facts about the machine that decide the command. detect_environment() fills it in; tests build it directly."""

    cores: int = 1                              # physical cores this process may use (>= 1)
    gpus: int = 0                               # GPUs on this node that the job may use
    uid: int = 1000                             # effective user id (0: root)
    launchers: Mapping[str, str] = dataclasses.field(default_factory=dict)  # mpirun/mpiexec/srun -> path on PATH
    mpi_flavour: str = ""                       # of mpirun/mpiexec: "openmpi", "mpich", "unknown"; "" when neither
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # the process environment

    @property
    def in_slurm_job(self) -> bool:
        return bool(self.env.get("SLURM_JOB_ID"))

    @property
    def mpi_launcher(self) -> Optional[str]:
        """mpirun when on PATH, else mpiexec, else None."""
        for name in ("mpirun", "mpiexec"):
            if name in self.launchers:
                return name
        return None


def count_cuda_visible_devices(value: str) -> int:
    """Devices that CUDA would see for a CUDA_VISIBLE_DEVICES value: the entries before the first invalid one
    (CUDA stops there), so "" , "-1" and "NoDevFiles" all mean none."""
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if re.fullmatch(r"\d+", entry) or entry.startswith(("GPU-", "MIG-")):
            count += 1
        else:
            break
    return count


def count_nvidia_smi_gpus(output: str) -> int:
    """GPUs in the output of `nvidia-smi -L` (one "GPU i: ..." line each; MIG lines below them are not counted)."""
    return sum(1 for line in output.splitlines() if line.startswith("GPU "))


def count_gpus(env: Mapping[str, str], nvidia_smi_output: Callable[[], Optional[str]]) -> int:
    """GPUs this node gives the job. Under Slurm only the job's own GPUs count, so nvidia-smi (which may list GPUs
    allocated to other jobs) is not asked there."""
    if env.get("SLURM_JOB_ID"):
        on_node = env.get("SLURM_GPUS_ON_NODE", "").strip()
        if on_node.isdigit():
            return int(on_node)
        if "CUDA_VISIBLE_DEVICES" in env:
            return count_cuda_visible_devices(env["CUDA_VISIBLE_DEVICES"])
        return 0
    if "CUDA_VISIBLE_DEVICES" in env:
        visible = count_cuda_visible_devices(env["CUDA_VISIBLE_DEVICES"])
        if visible == 0:
            return 0
        output = nvidia_smi_output()
        # Indices past the installed GPUs are invalid and end CUDA's list too.
        return min(visible, count_nvidia_smi_gpus(output)) if output is not None else visible
    output = nvidia_smi_output()
    return count_nvidia_smi_gpus(output) if output is not None else 0


def count_physical_cores(cpus: Sequence[int], sysfs: str = "/sys/devices/system/cpu") -> int:
    """Distinct physical cores among the given logical CPUs (hardware threads of one core count once, as Open MPI
    counts slots). Falls back to the number of logical CPUs when the topology cannot be read."""
    cores = set()
    for cpu in cpus:
        try:
            with open(f"{sysfs}/cpu{cpu}/topology/physical_package_id") as f:
                package = f.read().strip()
            with open(f"{sysfs}/cpu{cpu}/topology/core_id") as f:
                core = f.read().strip()
        except OSError:
            return max(1, len(cpus))
        cores.add((package, core))
    return max(1, len(cores))


def mpi_flavour_from_version(text: str) -> str:
    """"openmpi", "mpich" (any Hydra-based mpiexec) or "unknown", from the output of `mpirun --version`."""
    if "Open MPI" in text or "OpenRTE" in text:
        return "openmpi"
    if "HYDRA" in text.upper():
        return "mpich"
    return "unknown"


def _run_output(command: Sequence[str], env: Mapping[str, str]) -> Optional[str]:
    """stdout + stderr of a short command, or None when it cannot be run or fails."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=30, env=dict(env))
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout + done.stderr


def detect_environment(env: Optional[Mapping[str, str]] = None, *,
                       which: Callable[..., Optional[str]] = shutil.which,
                       run: Callable[[Sequence[str], Mapping[str, str]], Optional[str]] = _run_output,
                       cpus: Optional[Sequence[int]] = None,
                       uid: Optional[int] = None,
                       sysfs: str = "/sys/devices/system/cpu") -> Environment:
    """Looks at this machine: launchers on env's PATH and the MPI flavour, GPUs, physical cores, user id."""
    env = dict(os.environ if env is None else env)
    path = env.get("PATH", os.defpath)
    launchers = {}
    for name in ("mpirun", "mpiexec", "srun"):
        found = which(name, path=path)
        if found:
            launchers[name] = found

    flavour = ""
    for name in ("mpirun", "mpiexec"):
        if name in launchers:
            flavour = mpi_flavour_from_version(run([launchers[name], "--version"], env) or "")
            break

    smi = which("nvidia-smi", path=path)
    gpus = count_gpus(env, lambda: run([smi, "-L"], env) if smi else None)

    if cpus is None:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = count_physical_cores(cpus, sysfs)
    if uid is None:
        uid = os.geteuid() if hasattr(os, "geteuid") else 1000
    return Environment(cores=cores, gpus=gpus, uid=uid, launchers=launchers, mpi_flavour=flavour, env=env)


# ----------------------------------------------------------------------------------------------------------------------
# What the user asked for.


@dataclasses.dataclass
class Options:
    """The parsed command line."""

    program: list[str]                          # program and its arguments
    np: Optional[int] = None
    hostfile: Optional[str] = None
    hosts: Optional[str] = None
    bind: str = "auto"
    launcher: str = "auto"
    dry_run: bool = False
    exports: list[str] = dataclasses.field(default_factory=list)  # VAR=VALUE or VAR, in order
    verbose: bool = False


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


# ----------------------------------------------------------------------------------------------------------------------
# The command.


@dataclasses.dataclass
class Launch:
    """What to run: the command, the variables to set in its environment, and why (for --verbose)."""

    command: list[str]
    env: dict[str, str]
    np: int
    launcher: str                               # "srun" or the flavour of mpirun: "openmpi", "mpich", "unknown"
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Placement:
    """Where ranks may go: hosts (1 on one node), slots (None: unknown to us), local (this node only)."""

    hosts: int
    slots: Optional[int]
    local: bool


def parse_hosts(spec: str) -> list[tuple[str, int]]:
    """"h1:4,h2:4" -> [("h1", 4), ("h2", 4)]; a host without ":slots" has one slot (as in mpirun --host)."""
    hosts = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            raise LaunchError(f"--hosts '{spec}': empty host name")
        name, sep, slots = item.rpartition(":")
        if not sep:
            name, slots = item, "1"
        if not name or not slots.isdigit() or int(slots) < 1:
            raise LaunchError(f"--hosts '{spec}': expected host[:slots],... with slots >= 1, got '{item}'")
        hosts.append((name, int(slots)))
    return hosts


def parse_hostfile(text: str) -> list[tuple[str, Optional[int]]]:
    """Hosts of a hostfile in Open MPI form ("host slots=4") or Hydra form ("host:4"); slots None when not given."""
    hosts = []
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        name, slots = fields[0], None
        if re.fullmatch(r".+:\d+", name):
            name, count = name.rsplit(":", 1)
            slots = int(count)
        for field in fields[1:]:
            if field.startswith("slots="):
                value = field[len("slots="):]
                if not value.isdigit():
                    raise LaunchError(f"hostfile line '{line.strip()}': slots must be a number")
                slots = int(value)
        hosts.append((name, slots))
    return hosts


def _env_int(env: Mapping[str, str], *names: str) -> Optional[int]:
    for name in names:
        value = env.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def _exports(options: Options, environment: Environment) -> list[tuple[str, str]]:
    result = []
    for item in options.exports:
        name, sep, value = item.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise LaunchError(f"-x '{item}': expected VAR=VALUE or VAR, with VAR a variable name")
        if not sep:
            if name not in environment.env:
                raise LaunchError(f"-x {name}: {name} is not set here; give a value with -x {name}=VALUE")
            value = environment.env[name]
        result.append((name, value))
    return result


def _choose_launcher(options: Options, environment: Environment) -> str:
    """"srun" or "mpirun" (meaning mpirun or mpiexec)."""
    has_srun = "srun" in environment.launchers
    has_mpi = environment.mpi_launcher is not None
    if options.launcher == "srun":
        if not has_srun:
            raise LaunchError("--launcher srun: srun is not on PATH (is Slurm installed on this node?)", EXIT_NOT_FOUND)
        return "srun"
    if options.launcher == "mpirun":
        if not has_mpi:
            message = NO_LAUNCHER_MESSAGE.replace("none of mpirun, mpiexec or srun", "neither mpirun nor mpiexec")
            raise LaunchError(message, EXIT_NOT_FOUND)
        return "mpirun"
    if environment.in_slurm_job and has_srun:
        return "srun"
    if has_mpi:
        return "mpirun"
    if has_srun:
        return "srun"  # srun outside an allocation asks Slurm for one
    raise LaunchError(NO_LAUNCHER_MESSAGE, EXIT_NOT_FOUND)


def _extra_args(environment: Environment, var: str) -> list[str]:
    try:
        return shlex.split(environment.env.get(var, ""))
    except ValueError as e:
        raise LaunchError(f"{var}: cannot split '{environment.env[var]}': {e}") from None


def _srun_command(options: Options, environment: Environment, exports: list[tuple[str, str]]) -> Launch:
    if options.hosts or options.hostfile:
        raise LaunchError("--hosts/--hostfile are for mpirun: under srun the Slurm allocation decides the nodes "
                          f"(put srun's --nodelist in {SRUN_ARGS_VAR}, or use --launcher mpirun)")
    env = environment.env
    nodes = _env_int(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES") or 1
    gpus = environment.gpus
    notes = []
    command = ["srun"]
    per_node = None
    if options.np is not None:
        np = options.np
    elif _env_int(env, "SLURM_NTASKS", "SLURM_NPROCS"):
        np = _env_int(env, "SLURM_NTASKS", "SLURM_NPROCS")
        notes.append(f"-n {np}: the job's task count (SLURM_NTASKS)")
    else:
        per_node = gpus or _env_int(env, "SLURM_CPUS_ON_NODE") or environment.cores
        np = per_node * nodes
        what = "GPUs" if gpus else "CPUs"
        notes.append(f"-n {np}: {per_node} {what} per node x {nodes} node(s)")
    command += ["-n", str(np)]
    if per_node is not None and nodes > 1:
        command.append(f"--ntasks-per-node={per_node}")
    if gpus and np <= gpus * nodes:
        command.append("--gpus-per-task=1")
        notes.append(f"--gpus-per-task=1: {gpus} GPU(s) per node, enough for one per rank")
    elif gpus:
        notes.append(f"no --gpus-per-task: {np} ranks share {gpus * nodes} GPU(s)")
    bind = {"core": "cores", "socket": "sockets", "none": "none"}.get(options.bind)
    if bind:
        command.append(f"--cpu-bind={bind}")
    if exports:
        # Names only: srun takes each value from its own environment, so values may hold commas.
        command.append("--export=" + ",".join(["ALL"] + [name for name, _ in exports]))
    command += _extra_args(environment, SRUN_ARGS_VAR)
    command += options.program
    return Launch(command=command, env=dict(exports), np=np, launcher="srun", notes=notes)


def _placement(options: Options, environment: Environment) -> _Placement:
    if options.hosts:
        hosts = parse_hosts(options.hosts)
        return _Placement(hosts=len({h for h, _ in hosts}), slots=sum(s for _, s in hosts), local=False)
    if options.hostfile:
        try:
            with open(options.hostfile) as f:
                hosts = parse_hostfile(f.read())
        except OSError as e:
            raise LaunchError(f"--hostfile {options.hostfile}: {e.strerror}") from None
        if not hosts:
            raise LaunchError(f"--hostfile {options.hostfile}: no hosts in it")
        slots = None if any(s is None for _, s in hosts) else sum(s for _, s in hosts)
        return _Placement(hosts=len({h for h, _ in hosts}), slots=slots, local=False)
    if environment.in_slurm_job:
        # mpirun inside a Slurm job takes its hosts and slots from the allocation.
        nodes = _env_int(environment.env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES") or 1
        return _Placement(hosts=nodes, slots=_env_int(environment.env, "SLURM_NTASKS", "SLURM_NPROCS"), local=False)
    return _Placement(hosts=1, slots=environment.cores, local=True)


def _mpirun_command(options: Options, environment: Environment, exports: list[tuple[str, str]]) -> Launch:
    exe = environment.mpi_launcher
    assert exe is not None
    flavour = environment.mpi_flavour or "unknown"
    place = _placement(options, environment)
    cores, gpus = environment.cores, environment.gpus
    notes = [f"{exe}: {dict(openmpi='Open MPI', mpich='MPICH (Hydra)').get(flavour, 'unknown MPI')}"]

    if options.np is not None:
        np = options.np
    elif gpus:
        np = gpus * place.hosts
        notes.append(f"-n {np}: {gpus} GPU(s) on this node x {place.hosts} host(s)")
    elif place.slots is not None:
        np = place.slots
        notes.append(f"-n {np}: {'cores on this node' if place.local else 'slots of the hosts'}")
    else:
        np = cores * place.hosts
        notes.append(f"-n {np}: {cores} cores on this node x {place.hosts} host(s), hosts assumed alike")
    oversubscribed = place.slots is not None and np > place.slots

    command = [exe, "-n", str(np)]
    env: dict[str, str] = {}
    if flavour == "unknown" and (options.hosts or options.hostfile):
        raise LaunchError(f"--hosts/--hostfile: {exe} is neither Open MPI nor MPICH, so shardkit-run does not know "
                          f"its host flags; run {exe} directly")
    if options.hosts:
        command += ["--host" if flavour == "openmpi" else "-hosts", options.hosts]
    elif options.hostfile:
        command += ["--hostfile" if flavour == "openmpi" else "-f", options.hostfile]

    if flavour == "openmpi":
        if place.slots is None or oversubscribed:
            command.append("--oversubscribe")
            notes.append("--oversubscribe: " + (f"{np} ranks > {place.slots} slots" if oversubscribed
                                                 else "the number of slots is not known here"))
        command += _openmpi_binding(options.bind, np, cores, gpus, place, oversubscribed, notes)
        if environment.uid == 0:
            env.update(OPENMPI_ROOT_ENV)
            notes.append("running as root: Open MPI needs " + " and ".join(OPENMPI_ROOT_ENV))
        forwarded = list(exports)
        named = {name for name, _ in exports}
        startup = []
        if not place.local:
            # Open MPI passes no environment to other hosts: forward shardkit's own settings, and what the program
            # needs to start as it does here (the values are this environment's, which mpirun inherits).
            forwarded += [(k, v) for k, v in sorted(environment.env.items())
                          if k.startswith("SHARDKIT_") and k not in (MPIRUN_ARGS_VAR, SRUN_ARGS_VAR) and k not in named]
            # (Inside a Slurm allocation mpirun starts its daemons through srun, which passes the environment.)
            if options.hosts or options.hostfile:
                startup = [k for k in STARTUP_VARS if k in environment.env and k not in named]
            if startup:
                notes.append("-x " + " -x ".join(startup) + ": other hosts start the program with this environment's "
                             "paths, not their login's")
        for name, value in forwarded:
            env[name] = value
            command += ["-x", name]
        for name in startup:
            command += ["-x", name]
    elif flavour == "mpich":
        command += _hydra_binding(options.bind, np, cores, gpus, place, oversubscribed, notes)
        for name, value in exports:
            command += ["-genv", name, value]
    else:
        if options.bind != "auto":
            notes.append(f"--bind {options.bind} ignored: unknown MPI, binding left to {exe}")
        env.update(exports)  # local ranks inherit mpirun's environment
    command += _extra_args(environment, MPIRUN_ARGS_VAR)
    command += options.program
    return Launch(command=command, env=env, np=np, launcher=flavour, notes=notes)


def _ranks_per_node(np: int, gpus: int, hosts: int) -> int:
    """G ranks per node while the GPUs suffice; beyond that, ranks spread evenly over the hosts."""
    return gpus if np <= gpus * hosts else math.ceil(np / hosts)


def _openmpi_binding(bind: str, np: int, cores: int, gpus: int, place: _Placement, oversubscribed: bool,
                     notes: list[str]) -> list[str]:
    if bind == "none":
        return ["--bind-to", "none"]
    if bind == "core":
        return ["--map-by", "core", "--bind-to", "core"]
    if bind == "socket":
        return ["--map-by", "socket", "--bind-to", "socket"]
    if oversubscribed:
        notes.append("--bind-to none: more ranks than cores, bound ranks would share cores")
        return ["--bind-to", "none"]
    if place.local:
        per_rank = cores // np
        notes.append(f"{per_rank} core(s) per rank: {cores} cores / {np} ranks")
        return ["--map-by", f"slot:PE={per_rank}", "--bind-to", "core"]
    if gpus:
        per_node = _ranks_per_node(np, gpus, place.hosts)
        per_rank = cores // per_node
        notes.append(f"{per_node} ranks per node (this node's {gpus} GPUs; nodes assumed alike)")
        if per_rank >= 1:
            return ["--map-by", f"ppr:{per_node}:node:PE={per_rank}", "--bind-to", "core"]
        return ["--map-by", f"ppr:{per_node}:node", "--bind-to", "none"]
    notes.append("binding: Open MPI's default on several hosts")
    return []


def _hydra_binding(bind: str, np: int, cores: int, gpus: int, place: _Placement, oversubscribed: bool,
                   notes: list[str]) -> list[str]:
    if bind in ("none", "core", "socket"):
        return ["-bind-to", bind]
    if oversubscribed:
        notes.append("-bind-to none: more ranks than cores")
        return ["-bind-to", "none"]
    if place.local:
        per_rank = cores // np
        notes.append(f"{per_rank} core(s) per rank: {cores} cores / {np} ranks")
        return ["-bind-to", f"core:{per_rank}"]
    if gpus:
        per_node = _ranks_per_node(np, gpus, place.hosts)
        per_rank = cores // per_node
        notes.append(f"{per_node} ranks per node (this node's {gpus} GPUs; nodes assumed alike)")
        return ["-ppn", str(per_node)] + (["-bind-to", f"core:{per_rank}"] if per_rank >= 1 else [])
    notes.append("binding: Hydra's default on several hosts")
    return []


def build_command(options: Options, environment: Environment) -> Launch:
    """The launch command for these options on this environment. Raises LaunchError (with its exit status) when no
    launcher fits or the options cannot be honoured."""
    exports = _exports(options, environment)
    if _choose_launcher(options, environment) == "srun":
        return _srun_command(options, environment, exports)
    return _mpirun_command(options, environment, exports)


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


def format_command(launch: Launch) -> str:
    """One shell line: the variables it sets (VAR=value ...), then the command, all quoted for a POSIX shell."""
    assignments = [f"{name}={shlex.quote(value)}" for name, value in launch.env.items()]
    return " ".join(assignments + [shlex.join(launch.command)])


def _describe(environment: Environment) -> str:
    launchers = ", ".join(f"{k}={v}" for k, v in environment.launchers.items()) or "none"
    slurm = f" Slurm job {environment.env['SLURM_JOB_ID']}," if environment.in_slurm_job else ""
    return (f"{environment.gpus} GPU(s), {environment.cores} core(s), uid {environment.uid},{slurm} "
            f"launchers: {launchers}, MPI: {environment.mpi_flavour or 'none'}")


def main(argv: Optional[Sequence[str]] = None, environment: Optional[Environment] = None) -> int:
    """Runs shardkit-run. Returns the exit status for --dry-run, --help and errors; otherwise replaces this process
    with the launcher (exec) and does not return."""
    try:
        options = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # --help, or a usage error argparse has already printed
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        if environment is None:
            environment = detect_environment()
        if options.verbose:
            print(f"{PROG}: detected {_describe(environment)}", file=sys.stderr)
        launch = build_command(options, environment)
        check_program(options.program[0], {**environment.env, **launch.env})
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
        os.execvpe(launch.command[0], launch.command, child_env)
    except OSError as e:
        print(f"{PROG}: error: cannot run {launch.command[0]}: {e.strerror}", file=sys.stderr)
        return 126 if isinstance(e, PermissionError) else EXIT_NOT_FOUND
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
