"""Which launcher runs the job, and its command: build_command() checks the -x variables, chooses srun or mpirun
(or mpiexec) and hands over to srun.py or mpirun.py."""

from __future__ import annotations

import re

from .command import Launch
from .detect import Environment
from .errors import EXIT_NOT_FOUND, LaunchError
from .mpirun import mpirun_command
from .options import Options
from .srun import srun_command

NO_LAUNCHER_MESSAGE = """no MPI launcher found: none of mpirun, mpiexec or srun is on PATH.
Install an MPI, for example:
  Debian/Ubuntu:  apt-get install openmpi-bin      (or: apt-get install mpich)
  Fedora/RHEL:    dnf install openmpi && module load mpi/openmpi-x86_64
  conda:          conda install -c conda-forge openmpi
On a cluster, load the site's MPI module, or run inside a Slurm allocation (salloc/sbatch) where srun is on PATH."""


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


def build_command(options: Options, environment: Environment) -> Launch:
    """The launch command for these options on this environment. Raises LaunchError (with its exit status) when no
    launcher fits or the options cannot be honoured."""
    exports = _exports(options, environment)
    if _choose_launcher(options, environment) == "srun":
        return srun_command(options, environment, exports)
    return mpirun_command(options, environment, exports)
