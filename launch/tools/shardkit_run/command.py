"""A built command: Launch, the shell line that shows it, and the extra flags the environment adds to it."""

from __future__ import annotations

import dataclasses
import shlex

from .detect import Environment
from .errors import LaunchError


@dataclasses.dataclass
class Launch:
    """What to run: the command, the variables to set in its environment, and why (for --verbose)."""

    command: list[str]
    env: dict[str, str]
    np: int
    launcher: str                               # "srun" or the flavour of mpirun: "openmpi", "mpich", "unknown"
    notes: list[str] = dataclasses.field(default_factory=list)
    hosts: list[str] = dataclasses.field(default_factory=list)  # named by --hosts/--hostfile


def extra_args(environment: Environment, var: str) -> list[str]:
    """The launcher flags in the variable var (SHARDKIT_MPIRUN_ARGS, SHARDKIT_SRUN_ARGS), split as a shell would."""
    try:
        return shlex.split(environment.env.get(var, ""))
    except ValueError as e:
        raise LaunchError(f"{var}: cannot split '{environment.env[var]}': {e}") from None


def format_command(launch: Launch) -> str:
    """One shell line: the variables it sets (VAR=value ...), then the command, all quoted for a POSIX shell."""
    assignments = [f"{name}={shlex.quote(value)}" for name, value in launch.env.items()]
    return " ".join(assignments + [shlex.join(launch.command)])
