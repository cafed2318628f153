"""The srun command: ranks, GPUs per task and CPU binding inside a Slurm allocation."""

from __future__ import annotations

from .command import Launch, extra_args
from .detect import Environment
from .errors import LaunchError
from .options import SRUN_ARGS_VAR, Options


def srun_command(options: Options, environment: Environment, exports: list[tuple[str, str]]) -> Launch:
    """srun for these options; exports are the -x variables with their values."""
    if options.hosts or options.hostfile:
        raise LaunchError("--hosts/--hostfile are for mpirun: under srun the Slurm allocation decides the nodes "
                          f"(put srun's --nodelist in {SRUN_ARGS_VAR}, or use --launcher mpirun)")
    nodes = environment.slurm_nodes
    gpus = environment.gpus
    notes = []
    command = ["srun"]
    per_node = None
    if options.np is not None:
        np = options.np
    elif environment.slurm_tasks:
        np = environment.slurm_tasks
        notes.append(f"-n {np}: the job's task count (SLURM_NTASKS)")
    else:
        per_node = gpus or environment.slurm_cpus_on_node or environment.cores
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
    command += extra_args(environment, SRUN_ARGS_VAR)
    command += options.program
    return Launch(command=command, env=dict(exports), np=np, launcher="srun", notes=notes)
