"""shardkit-run: start a program as one process per device, through mpirun or srun.

A thin launcher: it works out the command line that this machine (or this Slurm job) needs, prints it, and runs it:
srun in its place, mpirun as a child it watches, so that a job a rank has ended (MPI_Abort) ends even when mpirun
would wait for a host it cannot reach; the exit status is otherwise the launcher's own. Standard library only, and
importable without side effects: the functions that decide the command take every fact about the machine as an
argument, so tests can describe a machine instead of needing one.

Modules, in the order a run goes through them:
  cli       arguments and --help, the early check of the program, main()
  detect    what the machine looks like (detect_environment -> Environment)
  options   what the user asked for (Options) and the variables that add launcher flags
  launcher  build_command: the -x variables, the choice of srun or mpirun
  srun      the srun command
  mpirun    the mpirun/mpiexec command: hosts, slots, binding, environment
  command   a built command (Launch) and the shell line that shows it
  supervise running mpirun, and ending a job that was ended but did not end
  errors    LaunchError and exit statuses

The same files run as the package shardkit_run (the shardkit-run script: launch/tools/shardkit-run, bin/shardkit-run
of the build tree and of `cmake --install`, which find it beside themselves or in ../share/shardkit) and as
shardkit._run (pip's shardkit-run console script), so they import one another relatively.
"""

from .cli import main

__all__ = ["main"]
