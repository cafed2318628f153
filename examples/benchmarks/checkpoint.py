"""Checkpoint bandwidth: shardkit's save and load against the same bytes written and read by plain file I/O, in one run.

For each total size (MiB of float32, one array cut by rows over every rank, uneven where it does not divide), the
cases, alternated over repeats:
  - save            sk.save (blocking, fsync on) of the array: Zarr v3, one chunk file per block, crc32c, manifest,
                    rename. Baseline: every rank writes its block to a file of its own with os.pwrite and fsyncs it.
  - load            sk.load onto the same sharding: each rank reads its own chunk file. Baseline: every rank preads its
                    own raw file.
  - load_reshard    sk.load onto the transposed sharding P(None, "x"): every rank reads a part of every chunk file (as
                    a load onto another number of ranks does). Baseline: the raw read again (the same bytes per rank).
  - save/load on /dev/shm  the same, the checkpoint in /dev/shm. Baseline: memcpy of the block (np.copyto); the same
                    bytes through pwrite/pread of a /dev/shm file are reported beside it (file_io_gbps_*).
  - save_async      the blocking part of sk.save(blocking=False) (staging: the copy of the block) against a plain copy
                    of the block (np.copy); the background write is then waited for, untimed.
  - train_step_during_save  a small step (a 256 x 256 float32 matmul) timed over as long as the blocking save took,
                    alone and while a background save writes: the slowdown a training loop sees.
A case's time is the slowest rank's (barrier before, max after); bandwidth is the total bytes over it. Reads are of
warm files (the page cache holds what was just written, for shardkit and the baseline alike) unless --cold, which
evicts every file (posix_fadvise DONTNEED) before each read. Every load is checked bit for bit first.

    mpirun -np 2 python examples/benchmarks/checkpoint.py [--sizes 64,256] [--repeats 5] [--dir DIR] [--cold]
        [--json -]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
from bench_helpers import write_json
from mpi4py import MPI

import shardkit as sk
from shardkit import P

COLS = 1024  # float32 columns: a row is 4 KiB


def shared_path(comm, make):
    path = make() if comm.Get_rank() == 0 else None
    return comm.bcast(path, root=0)


def timed(comm, f):
    """The slowest rank's seconds for f() (every rank starts together)."""
    comm.Barrier()
    t0 = time.perf_counter()
    f()
    dt = time.perf_counter() - t0
    return comm.allreduce(dt, op=MPI.MAX)


def evict(paths):
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_under(path):
    return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


def raw_write(path, block):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view, off = memoryview(block).cast("B"), 0
        while off < len(view):
            off += os.pwrite(fd, view[off:], off)
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_read(path, out):
    fd = os.open(path, os.O_RDONLY)
    try:
        view, off = memoryview(out).cast("B"), 0
        while off < len(view):
            n = os.preadv(fd, [view[off:]], off)
            if n == 0:
                raise RuntimeError(f"{path}: short read")
            off += n
    finally:
        os.close(fd)


STEP = np.ones((256, 256), np.float32)


def step_time(span):
    """Mean seconds of a small training-like step (a 256 x 256 float32 matmul) over `span` seconds."""
    t0 = time.perf_counter()
    count = 0
    while True:
        STEP @ STEP
        count += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= span and count >= 3:
            return elapsed / count


def summary(times, nbytes):
    gbps = [nbytes / t / 1e9 for t in times]
    return statistics.median(gbps), min(gbps)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,256", help="total MiB per case, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a new directory under the temp dir)")
    parser.add_argument("--shm-dir", default="/dev/shm", help="the memory file system ('' to skip those cases)")
    parser.add_argument("--cold", action="store_true", help="evict the files from the page cache before each read")
    parser.add_argument("--json", default=None, help="write the results as JSON to this path ('-': stdout)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    mesh = sk.Mesh((size,), ("x",))
    rows_sharding = sk.NamedSharding(mesh, P("x"), uneven=True)
    cols_sharding = P(None, "x")
    base = shared_path(comm, lambda: tempfile.mkdtemp(prefix="shardkit-bench-ckpt-", dir=args.dir))
    shm_base = None
    if args.shm_dir and os.path.isdir(args.shm_dir):
        shm_base = shared_path(comm, lambda: tempfile.mkdtemp(prefix="shardkit-bench-ckpt-", dir=args.shm_dir))
    results = []
    try:
        for mib in [int(s) for s in args.sizes.split(",")]:
            rows = max(1, (mib << 20) // (4 * COLS))
            nbytes = rows * COLS * 4
            full = np.arange(rows * COLS, dtype=np.float32).reshape(rows, COLS)
            x = sk.distribute(full if rank == 0 else None, rows_sharding)
            block = np.ascontiguousarray(x.local)
            want_cols = sk.distribute(full if rank == 0 else None, sk.NamedSharding(mesh, cols_sharding, uneven=True))
            want_cols_local = np.asarray(want_cols.local)
            del full
            spare = np.empty_like(block)
            names = ("save", "raw_write", "load", "raw_read", "load_reshard", "save_shm", "memcpy", "load_shm",
                     "save_async", "copy", "raw_write_shm", "raw_read_shm", "step_alone", "step_during")
            cases: dict[str, list[float]] = {k: [] for k in names}
            for rep in range(args.repeats):
                for where, root_dir in (("disk", base), ("shm", shm_base)):
                    if root_dir is None:
                        continue
                    ck = os.path.join(root_dir, f"ck{mib}")
                    raw = os.path.join(root_dir, f"raw{mib}-{rank}")
                    t_save = timed(comm, lambda: sk.save(ck, {"w": x}, keep_last=1))
                    if where == "disk":
                        cases["save"].append(t_save)
                        cases["raw_write"].append(timed(comm, lambda: raw_write(raw, block)))
                    else:
                        cases["save_shm"].append(t_save)
                        cases["memcpy"].append(timed(comm, lambda: np.copyto(spare, block)))
                        cases["raw_write_shm"].append(timed(comm, lambda: raw_write(raw, block)))
                    comm.Barrier()
                    if args.cold and where == "disk":
                        evict(files_under(ck) + [raw])
                    got: dict[str, Any] = {}
                    t_load = timed(comm, lambda: got.setdefault("w", sk.load(ck, mesh, P("x"))["w"]))
                    assert np.array_equal(np.asarray(got["w"].local), block), "load: wrong values"
                    if where == "disk":
                        cases["load"].append(t_load)
                        comm.Barrier()
                        if args.cold:
                            evict(files_under(ck) + [raw])
                        cases["raw_read"].append(timed(comm, lambda: raw_read(raw, spare)))
                        assert np.array_equal(spare, block), "raw read: wrong values"
                        comm.Barrier()
                        if args.cold:
                            evict(files_under(ck))
                        got.clear()
                        cases["load_reshard"].append(
                            timed(comm, lambda: got.setdefault("w", sk.load(ck, mesh, cols_sharding)["w"])))
                        assert np.array_equal(np.asarray(got["w"].local), want_cols_local), "load_reshard: wrong"
                    else:
                        cases["load_shm"].append(t_load)
                        cases["raw_read_shm"].append(timed(comm, lambda: raw_read(raw, spare)))
                    if os.path.exists(raw):
                        os.unlink(raw)
                handles = []
                cases["save_async"].append(
                    timed(comm, lambda: handles.append(sk.save(os.path.join(base, f"async{mib}"), {"w": x},
                                                              blocking=False, keep_last=1))))
                handles[0].wait()
                cases["copy"].append(timed(comm, lambda: np.copy(block)))
                # A training step's time while a background save writes, against alone, over as long as a blocking
                # save took in this repeat (the time a background writer is busy).
                span = cases["save"][-1] if cases["save"] else 0.05
                comm.Barrier()
                cases["step_alone"].append(step_time(span))
                comm.Barrier()
                h = sk.save(os.path.join(base, f"async{mib}"), {"w": x}, blocking=False, keep_last=1)
                cases["step_during"].append(step_time(span))
                h.wait()
            pairs = [("save", "disk", "save", "raw_write", "pwrite+fsync", None),
                     ("load", "disk", "load", "raw_read", "pread", None),
                     ("load_reshard", "disk", "load_reshard", "raw_read", "pread", None),
                     ("save", "shm", "save_shm", "memcpy", "memcpy", "raw_write_shm"),
                     ("load", "shm", "load_shm", "memcpy", "memcpy", "raw_read_shm"),
                     ("save_async_blocking", "disk", "save_async", "copy", "copy", None)]
            for op, fs, ours, theirs, baseline, file_io in pairs:
                if not cases[ours]:
                    continue
                med, lo = summary(cases[ours], nbytes)
                raw_med, raw_lo = summary(cases[theirs], nbytes)
                results.append({"op": op, "fs": fs, "ranks": size, "bytes": nbytes, "repeats": args.repeats,
                                "baseline": baseline, "shardkit_gbps_median": med, "shardkit_gbps_min": lo,
                                "raw_gbps_median": raw_med, "raw_gbps_min": raw_lo, "ratio_median": med / raw_med,
                                "shardkit_s_median": statistics.median(cases[ours]),
                                "raw_s_median": statistics.median(cases[theirs])})
                if file_io and cases[file_io]:  # the same bytes by plain file I/O on /dev/shm: where the time goes
                    med, lo = summary(cases[file_io], nbytes)
                    results[-1].update(file_io_gbps_median=med, file_io_gbps_min=lo)
            alone, during = statistics.median(cases["step_alone"]), statistics.median(cases["step_during"])
            results.append({"op": "train_step_during_save", "fs": "disk", "ranks": size, "bytes": nbytes,
                            "repeats": args.repeats, "step_ms_alone_median": alone * 1e3,
                            "step_ms_during_median": during * 1e3, "slowdown_median": during / alone - 1})
    finally:
        comm.Barrier()
        if rank == 0:
            shutil.rmtree(base, ignore_errors=True)
            if shm_base:
                shutil.rmtree(shm_base, ignore_errors=True)
    if rank == 0:
        out = sys.stderr if args.json == "-" else sys.stdout
        print(f"checkpoint bandwidth, {size} rank(s), {args.repeats} repeats, {'cold' if args.cold else 'warm'} reads "
              f"(GB/s, median / min; ratio of medians)", file=out)
        for r in results:
            if r["op"] == "train_step_during_save":
                print(f"  {r['op']:22s} {r['bytes'] / 2**20:5.0f} MiB  step {r['step_ms_alone_median']:.3f} ms alone, "
                      f"{r['step_ms_during_median']:.3f} ms while a save writes: {100 * r['slowdown_median']:+.1f}%",
                      file=out)
                continue
            print(f"  {r['op']:20s} {r['fs']:4s} {r['bytes'] / 2**20:7.0f} MiB  "
                  f"shardkit {r['shardkit_gbps_median']:6.2f} / {r['shardkit_gbps_min']:6.2f}  "
                  f"{r['baseline']:12s} {r['raw_gbps_median']:6.2f} / {r['raw_gbps_min']:6.2f}  "
                  f"ratio {r['ratio_median']:.2f}"
                  + (f"  (pwrite/pread {r['file_io_gbps_median']:.2f})" if "file_io_gbps_median" in r else ""),
                  file=out)
        write_json(args.json, "checkpoint", results, ranks=size, cold=args.cold)


if __name__ == "__main__":
    main()
