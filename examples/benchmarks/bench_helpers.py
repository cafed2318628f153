"""What the Python benchmarks share: writing their JSON, and running a baseline in plain (non-MPI) helper processes,
one per rank, as JAX's own multi-process runtime needs (jax.distributed must be set up before JAX computes anything
and changes what jax.devices() means, so it stays out of the ranks that measure shardkit)."""

import json
import os
import socket
import subprocess
import sys
import time


def write_json(path, benchmark, results, **extra):
    """Writes {"benchmark", "results", **extra} to path ('-': stdout); nothing when path is None."""
    if not path:
        return
    text = json.dumps({"benchmark": benchmark, "results": results, **extra}, indent=2)
    if path == "-":
        print(text)
    else:
        with open(path, "w") as f:
            f.write(text)


def coordinator_address(comm):
    """host:port of a free port on rank 0 (for jax.distributed's coordinator, which rank 0's helper runs)."""
    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    return f"127.0.0.1:{comm.bcast(port, root=0)}"


def run_helpers(comm, script, argv_of_rank, timeout=600):
    """Runs `python script argv_of_rank(rank)` (None: no helper on this rank) as a plain process on every rank; the
    helper prints one line of JSON last. The ranks wait for each other without spinning. Returns (this rank's parsed
    JSON, None), or (None, why) on every rank when a helper failed."""
    rank = comm.Get_rank()
    argv = argv_of_rank(rank)
    result, why = None, None
    if argv is not None:
        # Without the launcher's variables nothing in the helper tries to join this job.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
        env["JAX_PLATFORMS"] = "cpu"
        try:
            p = subprocess.run([sys.executable, os.path.abspath(script)] + argv, env=env, capture_output=True,
                               text=True, timeout=timeout)
            if p.returncode != 0:
                lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
                why = f"rank {rank}'s helper failed: {lines[-1] if lines else f'exit code {p.returncode}'}"
            else:
                result = json.loads(p.stdout.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            why = f"rank {rank}'s helper did not finish in {timeout} s"
    req = comm.Ibarrier()  # a blocking MPI barrier would spin on a core another rank's helper may be measuring on
    while not req.Test():
        time.sleep(0.01)
    whys = [w for w in comm.allgather(why) if w]
    return (None, whys[0]) if whys else (result, None)
