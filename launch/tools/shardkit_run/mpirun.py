"""The mpirun (or mpiexec) command for Open MPI, MPICH's Hydra, or an MPI of unknown flavour: where ranks may go
(--hosts, --hostfile, this node, a Slurm allocation), how many, how they are bound, what their environment holds."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable, Mapping, Optional

from .command import Launch, extra_args
from .detect import Environment
from .errors import LaunchError
from .options import LAUNCHER_VARS, MPIRUN_ARGS_VAR, Options

# Open MPI's mpirun refuses to start as root unless both of these are set.
OPENMPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# What a program needs to start the same way on every host. Open MPI starts far hosts through ssh, whose login
# environment is not this one: without PATH a bare `python3` there is the system's, which cannot import what this
# one can (PYTHONPATH, a virtual environment), and libraries found here through LD_LIBRARY_PATH are not found there.
STARTUP_VARS = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX")


@dataclasses.dataclass
class _Placement:
    """Where ranks may go: hosts (1 on one node), slots (None: unknown to us), local (this node only), and the hosts'
    names where the user gave them."""

    hosts: int
    slots: Optional[int]
    local: bool
    names: tuple[str, ...] = ()


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


def _placement(options: Options, environment: Environment) -> _Placement:
    if options.hosts:
        hosts = parse_hosts(options.hosts)
        names = tuple(dict.fromkeys(h for h, _ in hosts))
        return _Placement(hosts=len(names), slots=sum(s for _, s in hosts), local=False, names=names)
    if options.hostfile:
        try:
            with open(options.hostfile) as f:
                listed = parse_hostfile(f.read())  # slots None where the file gives none
        except OSError as e:
            raise LaunchError(f"--hostfile {options.hostfile}: {e.strerror}") from None
        if not listed:
            raise LaunchError(f"--hostfile {options.hostfile}: no hosts in it")
        counts = [s for _, s in listed if s is not None]
        slots = sum(counts) if len(counts) == len(listed) else None
        names = tuple(dict.fromkeys(h for h, _ in listed))
        return _Placement(hosts=len(names), slots=slots, local=False, names=names)
    if environment.in_slurm_job:
        # mpirun inside a Slurm job takes its hosts and slots from the allocation.
        return _Placement(hosts=environment.slurm_nodes, slots=environment.slurm_tasks, local=False)
    return _Placement(hosts=1, slots=environment.cores, local=True)


def mpirun_command(options: Options, environment: Environment, exports: list[tuple[str, str]]) -> Launch:
    """mpirun (or mpiexec) for these options; exports are the -x variables with their values."""
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
        command += _binding(_BIND_FLAGS[flavour], options.bind, np, cores, gpus, place, oversubscribed, notes)
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
                          if k.startswith("SHARDKIT_") and k not in LAUNCHER_VARS and k not in named]
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
        command += _binding(_BIND_FLAGS[flavour], options.bind, np, cores, gpus, place, oversubscribed, notes)
        for name, value in exports:
            command += ["-genv", name, value]
    else:
        if options.bind != "auto":
            notes.append(f"--bind {options.bind} ignored: unknown MPI, binding left to {exe}")
        env.update(exports)  # local ranks inherit mpirun's environment
    command += extra_args(environment, MPIRUN_ARGS_VAR)
    command += options.program
    return Launch(command=command, env=env, np=np, launcher=flavour, notes=notes, hosts=list(place.names))


def _ranks_per_node(np: int, gpus: int, hosts: int) -> int:
    """G ranks per node while the GPUs suffice; beyond that, ranks spread evenly over the hosts."""
    return gpus if np <= gpus * hosts else math.ceil(np / hosts)


@dataclasses.dataclass(frozen=True)
class _BindFlags:
    """How one MPI's launcher spells each placement that --bind can ask for; _binding() decides which applies."""

    name: str                                   # whose default binding applies when none is chosen
    fixed: Mapping[str, list[str]]              # --bind none / core / socket
    per_rank: Callable[[int], list[str]]        # one node: K cores per rank
    per_node: Callable[[int, int], list[str]]   # several hosts: G ranks per node, K cores per rank (0: fewer cores)


_BIND_FLAGS = {
    "openmpi": _BindFlags(
        name="Open MPI",
        fixed={"none": ["--bind-to", "none"], "core": ["--map-by", "core", "--bind-to", "core"],
               "socket": ["--map-by", "socket", "--bind-to", "socket"]},
        per_rank=lambda k: ["--map-by", f"slot:PE={k}", "--bind-to", "core"],
        per_node=lambda g, k: (["--map-by", f"ppr:{g}:node:PE={k}", "--bind-to", "core"] if k >= 1
                               else ["--map-by", f"ppr:{g}:node", "--bind-to", "none"])),
    "mpich": _BindFlags(
        name="Hydra",
        fixed={bind: ["-bind-to", bind] for bind in ("none", "core", "socket")},
        per_rank=lambda k: ["-bind-to", f"core:{k}"],
        per_node=lambda g, k: ["-ppn", str(g)] + (["-bind-to", f"core:{k}"] if k >= 1 else [])),
}


def _binding(flags: _BindFlags, bind: str, np: int, cores: int, gpus: int, place: _Placement, oversubscribed: bool,
             notes: list[str]) -> list[str]:
    """The flags for --bind (see --help), in the spelling of flags."""
    if bind != "auto":
        return list(flags.fixed[bind])
    if oversubscribed:
        notes.append(f"{' '.join(flags.fixed['none'])}: more ranks than cores, bound ranks would share cores")
        return list(flags.fixed["none"])
    if place.local:
        per_rank = cores // np
        notes.append(f"{per_rank} core(s) per rank: {cores} cores / {np} ranks")
        return flags.per_rank(per_rank)
    if gpus:
        per_node = _ranks_per_node(np, gpus, place.hosts)
        notes.append(f"{per_node} ranks per node (this node's {gpus} GPUs; nodes assumed alike)")
        return flags.per_node(per_node, cores // per_node)
    notes.append(f"binding: {flags.name}'s default on several hosts")
    return []
