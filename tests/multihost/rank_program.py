"""A Python rank for the multi-host tests.

    describe  print this rank's shardkit.describe() line (rank, host, local rank), after a barrier-like allreduce
    spin      allreduce in a loop, saying "ready" once every rank has done one; exits 1 if nobody stops it in time
"""

import sys
import time

import numpy as np

import shardkit as sk
import shardkit.mpi as skm


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "describe"
    x = np.ones(1 << 14)
    total, _ = skm.allreduce(x, op="sum")
    assert total[0] == sk.size(), total[0]
    if mode == "describe":
        print(sk.describe(), flush=True)
        return 0
    print(f"ready: rank {sk.rank()} on {sk.describe().split()[2]}", flush=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        skm.allreduce(x, op="sum")
    print(f"rank {sk.rank()}: ERROR: still running after 120 s, nobody was lost", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
