"""Checkpoint bandwidth: shardkit's save and load against the same bytes written and read by plain file I/O, in one run.

For each total size (MiB of float32, one array cut by rows over every rank, uneven where it does not divide), the
cases, repeated (the write baselines before the save in odd repeats, after it in even ones):
  - save            sk.save (blocking, fsync on, keep_last=1) of the array: Zarr v3, one chunk file per block, crc32c,
                    manifest, rename. Baseline: every rank writes its block to a file of its own with os.pwrite and
                    fsyncs it.
  - load            sk.load onto the same sharding: each rank reads its own chunk file. Baseline: every rank preads its
                    own raw file.
  - load_other_count  sk.load of a step saved by the first n-1 ranks (at 2 and more ranks): every rank reads the parts
                    of the chunk files its rows meet, as a job restarted on another number of ranks does. Baseline: the
                    same ranks pread the same rows from raw files written by the same n-1 ranks.
  - load_transposed sk.load onto P(None, "x"): every rank needs a part of every row, so it reads every inner chunk
                    whole (n times its block's bytes: the chunks are cut along rows). Baseline: the raw read of its own
                    block; the ratio is bounded by 1/n by the bytes alone.
  - save/load on /dev/shm  the same, the checkpoint in /dev/shm. Baseline: memcpy into (save) and out of (load, into a
                    new array as a load makes) a mapping of a /dev/shm file, the fastest way to put the same bytes there.
                    Beside it: a memcpy between two warm buffers (memcpy_ram_*, what no file system reaches: tmpfs
                    allocates and maps each page a write touches) and pwrite/pread of a /dev/shm file (file_io_*).
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

import os

# One BLAS thread per rank (as MPI jobs run): the training-like step below measures the writer's effect on a rank's
# own core, not the ranks' BLAS threads fighting over the cores.
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import mmap
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
    """The slowest rank's seconds for f() (every rank starts together, with no removal of an older step in progress:
    keep_last's run in the background, as they would between the saves of a training job)."""
    sk.checkpoint.wait_for_saves()
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


def read_rows(paths_rows, out, rows):
    """Preads rows [rows.start, rows.stop) of the global array into `out` from raw files, each holding the rows
    (start, stop) of one saving rank."""
    row_bytes = out.strides[0] if out.ndim else 0
    view = memoryview(out).cast("B")
    for path, (start, stop) in paths_rows:
        lo, hi = max(start, rows.start), min(stop, rows.stop)
        if lo >= hi:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            dst, off, end = (lo - rows.start) * row_bytes, (lo - start) * row_bytes, (hi - rows.start) * row_bytes
            while dst < end:
                n = os.preadv(fd, [view[dst:end]], off)
                if n == 0:
                    raise RuntimeError(f"{path}: short read")
                dst, off = dst + n, off + n
        finally:
            os.close(fd)


def map_write(path, block):
    """memcpy of the block into a new file's mapping (the fastest way to put it in a memory file system)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, block.nbytes)
        with mmap.mmap(fd, block.nbytes) as m:
            np.frombuffer(m, np.uint8)[:] = block.reshape(-1).view(np.uint8)
    finally:
        os.close(fd)


def map_read(path, like):
    """memcpy of a file's mapping into a new array."""
    fd = os.open(path, os.O_RDONLY)
    try:
        with mmap.mmap(fd, like.nbytes, prot=mmap.PROT_READ) as m:
            out = np.empty_like(like)
            out.reshape(-1).view(np.uint8)[:] = np.frombuffer(m, np.uint8)
            return out
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
            my_rows = slice(*rows_sharding.devices_indices_map((rows, COLS))[rank][0].indices(rows)[:2])
            # The step another count saved: the first n-1 ranks, and their rows as raw files for the baseline.
            other = os.path.join(base, f"other{mib}")
            other_raw: list[tuple[str, tuple[int, int]]] = []
            mine = slice(0, 0)
            if size > 1:
                savers_comm = comm.Split(0 if rank < size - 1 else 1, rank)
                if rank < size - 1:
                    savers = sk.NamedSharding(sk.Mesh((size - 1,), ("x",), comm=savers_comm), P("x"), uneven=True)
                    y = sk.distribute(full if rank == 0 else None, savers)
                    sk.save(other, {"w": y}, step=0)
                    mine = slice(*savers.devices_indices_map((rows, COLS))[rank][0].indices(rows)[:2])
                    raw_write(os.path.join(base, f"raw_other{mib}-{rank}"), np.ascontiguousarray(y.local))
                    del y
                savers_comm.Free()
                for k in range(size - 1):
                    start_stop = comm.bcast((mine.start, mine.stop) if rank == k else None, root=k)
                    other_raw.append((os.path.join(base, f"raw_other{mib}-{k}"), start_stop))
            del full
            spare = np.empty_like(block)
            names = ("save", "raw_write", "load", "raw_read", "load_other_count", "raw_read_other", "load_transposed",
                     "save_shm", "map_write", "load_shm", "map_read", "memcpy", "save_async", "copy", "raw_write_shm",
                     "raw_read_shm", "step_alone", "step_during")
            cases: dict[str, list[float]] = {k: [] for k in names}
            for rep in range(args.repeats):
                for where, root_dir in (("disk", base), ("shm", shm_base)):
                    if root_dir is None:
                        continue
                    ck = os.path.join(root_dir, f"ck{mib}")
                    raw = os.path.join(root_dir, f"raw{mib}-{rank}")
                    def write_baselines(where=where, raw=raw):
                        if where == "disk":
                            cases["raw_write"].append(timed(comm, lambda: raw_write(raw, block)))
                        else:
                            cases["map_write"].append(timed(comm, lambda: map_write(raw, block)))
                            cases["memcpy"].append(timed(comm, lambda: np.copyto(spare, block)))
                            cases["raw_write_shm"].append(timed(comm, lambda: raw_write(raw, block)))

                    # The baselines go first in odd repeats, second in even ones: neither side always follows the
                    # other's writes.
                    if rep % 2:
                        write_baselines()
                    cases["save" if where == "disk" else "save_shm"].append(
                        timed(comm, lambda: sk.save(ck, {"w": x}, keep_last=1)))
                    if not rep % 2:
                        write_baselines()
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
                        cases["load_transposed"].append(
                            timed(comm, lambda: got.setdefault("w", sk.load(ck, mesh, cols_sharding)["w"])))
                        assert np.array_equal(np.asarray(got["w"].local), want_cols_local), "load_transposed: wrong"
                        if other_raw:
                            comm.Barrier()
                            if args.cold:
                                evict(files_under(other) + [p for p, _ in other_raw])
                            got.clear()
                            cases["load_other_count"].append(
                                timed(comm, lambda: got.setdefault("w", sk.load(other, mesh, P("x"))["w"])))
                            assert np.array_equal(np.asarray(got["w"].local), block), "load_other_count: wrong"
                            spare[...] = 0
                            cases["raw_read_other"].append(timed(comm, lambda: read_rows(other_raw, spare, my_rows)))
                            assert np.array_equal(spare, block), "raw read of other rows: wrong values"
                    else:
                        cases["load_shm"].append(t_load)
                        mapped: list[np.ndarray] = []
                        cases["map_read"].append(timed(comm, lambda: mapped.append(map_read(raw, block))))
                        assert np.array_equal(mapped.pop(), block), "map read: wrong values"
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
                sk.checkpoint.wait_for_saves()
                comm.Barrier()
                cases["step_alone"].append(step_time(span))
                comm.Barrier()
                h = sk.save(os.path.join(base, f"async{mib}"), {"w": x}, blocking=False, keep_last=1)
                cases["step_during"].append(step_time(span))
                h.wait()
            pairs = [("save", "disk", "save", "raw_write", "pwrite+fsync", None),
                     ("load", "disk", "load", "raw_read", "pread", None),
                     ("load_other_count", "disk", "load_other_count", "raw_read_other", "pread", None),
                     ("load_transposed", "disk", "load_transposed", "raw_read", "pread", None),
                     ("save", "shm", "save_shm", "map_write", "mmap+memcpy", "raw_write_shm"),
                     ("load", "shm", "load_shm", "map_read", "mmap+memcpy", "raw_read_shm"),
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
                if file_io and cases[file_io]:  # the same bytes by plain file I/O on /dev/shm, and between buffers
                    med, lo = summary(cases[file_io], nbytes)
                    ram_med, ram_lo = summary(cases["memcpy"], nbytes)
                    results[-1].update(file_io_gbps_median=med, file_io_gbps_min=lo, memcpy_ram_gbps_median=ram_med,
                                       memcpy_ram_gbps_min=ram_lo)
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
                  + (f"  (pwrite/pread {r['file_io_gbps_median']:.2f}, memcpy between buffers "
                     f"{r['memcpy_ram_gbps_median']:.2f})" if "file_io_gbps_median" in r else ""),
                  file=out)
        write_json(args.json, "checkpoint", results, ranks=size, cold=args.cold)


if __name__ == "__main__":
    main()
