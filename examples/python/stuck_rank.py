"""A job that hangs, for the flight recorder: three steps of an allreduce and a bcast on every rank, then the last
rank stalls in its own code while the others enter the next allreduce. Run it with a timeout, a dump directory and
a trace directory, then ask shardkit-trace what happened:

    SHARDKIT_TIMEOUT_S=2 SHARDKIT_DUMP_DIR=dumps SHARDKIT_TRACE=traces mpirun -np 4 python examples/python/stuck_rank.py
    shardkit-trace analyze dumps
    shardkit-trace merge traces -o job.json --png job.png
"""

import time

import numpy as np
from mpi4py import MPI

import shardkit as sk

x = np.ones(1 << 16)
for step in range(3):
    sk.mpi.allreduce(x, op=MPI.SUM)  # line 19: every step's sum
    sk.mpi.bcast(x[:1024], 0)  # line 20
if sk.rank() == sk.size() - 1:
    time.sleep(30)  # line 22: the last rank is stuck in its own code
sk.mpi.allreduce(x, op=MPI.SUM)  # line 23: the others wait here until the timeout
