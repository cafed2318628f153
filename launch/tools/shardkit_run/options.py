"""What the user asked for: the parsed command line (cli.parse_args fills it in) and the variables that add flags."""

from __future__ import annotations

import dataclasses
from typing import Optional

BIND_CHOICES = ("auto", "core", "socket", "none")
LAUNCHER_CHOICES = ("auto", "mpirun", "srun")

# Extra launcher flags from the environment, inserted just before the program.
MPIRUN_ARGS_VAR = "SHARDKIT_MPIRUN_ARGS"
SRUN_ARGS_VAR = "SHARDKIT_SRUN_ARGS"
# Seconds mpirun has to end a job that a rank (MPI_Abort) or a signal ended, before shardkit-run ends it (supervise.py).
GRACE_VAR = "SHARDKIT_RUN_GRACE_S"
# The launcher's own settings, never forwarded to the ranks.
LAUNCHER_VARS = (MPIRUN_ARGS_VAR, SRUN_ARGS_VAR, GRACE_VAR)


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
