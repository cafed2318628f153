"""What the machine looks like: launchers on PATH and their MPI, GPUs, physical cores, user id, Slurm job.

detect_environment() looks; everything that decides the command takes its answer, an Environment, as an argument, so
tests describe a machine instead of needing one.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from typing import Callable, Mapping, Optional, Sequence


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
    def slurm_nodes(self) -> int:
        """Nodes of the Slurm job (1 outside one, or when Slurm does not say)."""
        return _env_int(self.env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES") or 1

    @property
    def slurm_tasks(self) -> Optional[int]:
        """Tasks of the Slurm job when it set them (sbatch/salloc -n), else None."""
        return _env_int(self.env, "SLURM_NTASKS", "SLURM_NPROCS")

    @property
    def slurm_cpus_on_node(self) -> Optional[int]:
        """CPUs that the Slurm job has on this node, else None."""
        return _env_int(self.env, "SLURM_CPUS_ON_NODE")

    @property
    def mpi_launcher(self) -> Optional[str]:
        """mpirun when on PATH, else mpiexec, else None."""
        for name in ("mpirun", "mpiexec"):
            if name in self.launchers:
                return name
        return None


def _env_int(env: Mapping[str, str], *names: str) -> Optional[int]:
    """The first of the variables that holds a positive integer, or None."""
    for name in names:
        value = env.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
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


def describe(environment: Environment) -> str:
    """One line for --verbose: what detect_environment() found."""
    launchers = ", ".join(f"{k}={v}" for k, v in environment.launchers.items()) or "none"
    slurm = f" Slurm job {environment.env['SLURM_JOB_ID']}," if environment.in_slurm_job else ""
    return (f"{environment.gpus} GPU(s), {environment.cores} core(s), uid {environment.uid},{slurm} "
            f"launchers: {launchers}, MPI: {environment.mpi_flavour or 'none'}")
