"""Compares two builds of bench_collectives (before and after a change) in one run, alternating them.

    python examples/benchmarks/compare_builds.py --a OLD/bench_collectives --b NEW/bench_collectives \
        [--np 2] [--runs 4] [--ops allreduce,allgather,bcast,sendrecv] [--json -] -- -b 8 -e 32M -f 8 -r 5

Each run starts both binaries once (every operation in one job), A first in even runs and B first in odd ones. The figure compared is
each row's ratio to raw MPI measured beside it in the same process (ratio_median: shardkit / MPI), which cancels much
of this machine's drift. Per operation and size it reports A's ratios (their spread across runs: the A/A spread), B's,
and whether B's median lies within A's spread (min to max of A's runs), the verdict "within" or "outside".
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


def run_once(binary, np, ops, extra):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "--oversubscribe", "-np", str(np), binary, "--op", ops, *extra, "--json", "-"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=True).stdout
    return {(row["op"], row["bytes"]): row["ratio_median"] for row in json.loads(out)["results"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="bench_collectives before the change")
    ap.add_argument("--b", required=True, help="bench_collectives after it")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--ops", default="allreduce,allgather,bcast,sendrecv")
    ap.add_argument("--json", help="write the rows as JSON to this path ('-': stdout)")
    ap.add_argument("extra", nargs="*", help="bench_collectives arguments (after --)")
    args = ap.parse_args()
    if args.runs < 2:
        ap.error("--runs must be at least 2 (the A/A spread needs two runs of A)")
    ratios: dict[tuple[str, int], dict[str, list[float]]] = {}  # (op, bytes) -> each side's ratios
    for run in range(args.runs):
        for side in ("a", "b") if run % 2 == 0 else ("b", "a"):
            for key, ratio in run_once(getattr(args, side), args.np, args.ops, args.extra).items():
                ratios.setdefault(key, {"a": [], "b": []})[side].append(ratio)
    rows = []
    for (op, size), r in sorted(ratios.items()):
        lo, hi = min(r["a"]), max(r["a"])
        b = statistics.median(r["b"])
        rows.append({"op": op, "bytes": size, "a_ratio_median": statistics.median(r["a"]), "a_ratio_min": lo,
                     "a_ratio_max": hi, "b_ratio_median": b, "b_ratio_min": min(r["b"]), "b_ratio_max": max(r["b"]),
                     "b_over_a": b / statistics.median(r["a"]), "verdict": "within" if lo <= b <= hi else "outside"})
    out = sys.stderr if args.json == "-" else sys.stdout
    print(f"{'op':<10} {'bytes':>10} {'A ratio (min-max)':>22} {'B ratio (min-max)':>22} {'B/A':>6}  verdict", file=out)
    for w in rows:
        print(f"{w['op']:<10} {w['bytes']:>10} {w['a_ratio_median']:>6.2f} ({w['a_ratio_min']:.2f}-{w['a_ratio_max']:.2f})"
              f"{'':>5} {w['b_ratio_median']:>6.2f} ({w['b_ratio_min']:.2f}-{w['b_ratio_max']:.2f}){'':>5}"
              f" {w['b_over_a']:>6.2f}  {w['verdict']}", file=out)
    within = sum(w["verdict"] == "within" for w in rows)
    print(f"# {within} of {len(rows)} rows: B's median within A's run-to-run spread ({args.runs} runs each)", file=out)
    if args.json:
        text = json.dumps({"benchmark": "compare_builds", "np": args.np, "runs": args.runs, "results": rows}, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")


if __name__ == "__main__":
    main()
