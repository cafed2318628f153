#!/usr/bin/env python3
"""Plots the JSON of shardkit's benchmarks as PNG files.

    python3 scripts/plot_bench.py RESULTS.json [MORE.json ...] [-o OUTDIR]

Reads what `--json PATH` writes ('-' reads standard input) and recognises the benchmark by its "benchmark" field:

- matmul (examples/benchmarks/matmul, bench_matmul):
    <stem>_gflops.png      GFLOP/s (median time; the dash is the best time) per size for every shardkit algorithm, the
                           best ScaLAPACK p?gemm (over grids, block sizes and PBLAS panel widths; dashed: with the
                           library's own panel width, when --pblas-kb tried others), the one-rank BLAS and the ideal
                           line (ranks x one-rank GFLOP/s)
    <stem>_efficiency.png  parallel efficiency, GFLOP/s / (ranks x one-rank GFLOP/s), per size, with the target line
    <stem>_profile.png     with --profile: per size, the time of each algorithm's parts alone (GEMM, transfers, adds
                           or copies, page faults of fresh buffers, rest) stacked up to its time without overlap, and
                           its overlapped time marked
- collectives (examples/benchmarks/collectives, bench_collectives):
    <stem>_busbw.png       bus bandwidth against message size per operation, shardkit and raw MPI
    <stem>_ratio.png       shardkit / MPI time (median) against message size per operation

Files go next to each JSON file (or to OUTDIR), named after it.

Needs matplotlib, which the build and tests do not: `python3 -m pip install matplotlib`.
"""

import argparse
import json
import math
import os
import sys

COLORS = {
    "local": "tab:blue",
    "allgather": "tab:orange",
    "reduce_scatter": "tab:green",
    "summa": "tab:red",
    "pdgemm": "tab:purple",
    "psgemm": "tab:purple",
    "blas": "tab:gray",
}


def import_pyplot():
    try:
        import matplotlib
    except ImportError:
        sys.exit("plot_bench.py: matplotlib is not installed; install it with `python3 -m pip install matplotlib`")
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    return plt


def save(plt, fig, path):
    """Lays out, writes and closes a figure; returns the path written."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def size_label(r):
    m, n, k = r["m"], r["n"], r["k"]
    return str(n) if m == n == k else f"{m}x{n}x{k}"


def flops(r):
    return 2.0 * r["m"] * r["n"] * r["k"]


# ---- matmul ---------------------------------------------------------------------------------------------------------


def matmul_plots(data, stem, plt, efficiency_target):
    rows = [r for r in data["results"] if "skipped" not in r]
    ranks = data["ranks"]
    sizes = sorted({(r["m"], r["n"], r["k"]) for r in rows}, key=lambda s: (s[0] * s[1] * s[2], s))
    if not sizes:
        print(f"plot_bench.py: {stem}: no measured result to plot", file=sys.stderr)
        return []
    x_of = {s: i for i, s in enumerate(sizes)}
    labels = [size_label({"m": m, "n": n, "k": k}) for m, n, k in sizes]

    def key(r):
        return (r["m"], r["n"], r["k"])

    # One series per shardkit algorithm; the baseline; the best p?gemm of each size (over grids and block sizes).
    series = {}
    for r in rows:
        if r["kind"] == "shardkit":
            series.setdefault(r["method"], {})[key(r)] = r
        elif r["kind"] == "baseline":
            series.setdefault("blas", {})[key(r)] = r
    def best_of(keep):
        best = {}
        for r in rows:
            if r["kind"] == "scalapack" and keep(r):
                if key(r) not in best or r["ms_median"] < best[key(r)]["ms_median"]:
                    best[key(r)] = r
        return best

    best_pgemm = best_of(lambda r: True)
    # With the library's own PBLAS panel width (kb), when --pblas-kb also tried others.
    best_stock = best_of(lambda r: not r.get("kb_tuned", False))
    tuned = any(r.get("kb_tuned", False) for r in rows)
    pgemm_name = next(iter(best_pgemm.values()))["method"] if best_pgemm else None

    def pgemm_label(r):
        return f"{r['mesh']} nb{r['nb']}" + (f" kb{r['kb']}" if r.get("kb") else "")

    title = (f"C = A @ B, {data['dtype']}, {ranks} ranks, {data.get('threads', 1)} BLAS thread(s) per rank "
             f"({data.get('repeats')} runs, median)")
    written = []

    # GFLOP/s.
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, by_size in series.items():
        pts = sorted((x_of[s], r) for s, r in by_size.items())
        xs = [p for p, _ in pts]
        ax.plot(xs, [r["gflops_median"] for _, r in pts], marker="o", color=COLORS.get(name), label=
                "one-rank BLAS" if name == "blas" else name, linestyle=":" if name == "blas" else "-")
        ax.scatter(xs, [r["gflops_min"] for _, r in pts], marker="_", color=COLORS.get(name), s=120)
    if best_pgemm:
        pts = sorted((x_of[s], r) for s, r in best_pgemm.items())
        ax.plot([p for p, _ in pts], [r["gflops_median"] for _, r in pts], marker="s", color=COLORS.get(pgemm_name),
                label=f"{pgemm_name} (best grid, nb" + (", kb)" if tuned else ")"))
        for p, r in pts:
            ax.annotate(pgemm_label(r), (p, r["gflops_median"]), textcoords="offset points", xytext=(4, -12),
                        fontsize=7, color=COLORS.get(pgemm_name))
        ax.scatter([p for p, _ in pts], [r["gflops_min"] for _, r in pts], marker="_", color=COLORS.get(pgemm_name),
                   s=120)
    if tuned and best_stock:
        pts = sorted((x_of[s], r) for s, r in best_stock.items())
        ax.plot([p for p, _ in pts], [r["gflops_median"] for _, r in pts], marker="s", linestyle="--",
                color=COLORS.get(pgemm_name), alpha=0.6, label=f"{pgemm_name}, library's panel width")
    if "blas" in series:
        pts = sorted((x_of[s], r) for s, r in series["blas"].items())
        ax.plot([p for p, _ in pts], [ranks * r["gflops_median"] for _, r in pts], color="black", linestyle="--",
                label=f"ideal ({ranks} x one-rank)")
    ax.set_xticks(range(len(sizes)), labels)
    ax.set_xlabel("size (n, or m x n x k)")
    ax.set_ylabel("GFLOP/s (median time; dash: best time)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    written.append(save(plt, fig, stem + "_gflops.png"))

    # Efficiency.
    if "blas" in series:
        fig, ax = plt.subplots(figsize=(8, 5))
        for name, by_size in series.items():
            if name == "blas":
                continue
            pts = sorted((x_of[s], r) for s, r in by_size.items() if r.get("efficiency_median") is not None)
            ax.plot([p for p, _ in pts], [r["efficiency_median"] for _, r in pts], marker="o",
                    color=COLORS.get(name), label=name)
        if best_pgemm:
            pts = sorted((x_of[s], r) for s, r in best_pgemm.items() if r.get("efficiency_median") is not None)
            ax.plot([p for p, _ in pts], [r["efficiency_median"] for _, r in pts], marker="s",
                    color=COLORS.get(pgemm_name), label=f"{pgemm_name} (best grid, nb" + (", kb)" if tuned else ")"))
        if tuned and best_stock:
            pts = sorted((x_of[s], r) for s, r in best_stock.items() if r.get("efficiency_median") is not None)
            ax.plot([p for p, _ in pts], [r["efficiency_median"] for _, r in pts], marker="s", linestyle="--",
                    color=COLORS.get(pgemm_name), alpha=0.6, label=f"{pgemm_name}, library's panel width")
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="ideal")
        if efficiency_target:
            ax.axhline(efficiency_target, color="tab:red", linestyle=":", linewidth=1,
                       label=f"target {efficiency_target:g}")
        ax.set_xticks(range(len(sizes)), labels)
        ax.set_xlabel("size (n, or m x n x k)")
        ax.set_ylabel(f"parallel efficiency = GFLOP/s / ({ranks} x one-rank GFLOP/s)")
        ax.set_ylim(0, max(1.1, ax.get_ylim()[1]))
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        written.append(save(plt, fig, stem + "_efficiency.png"))

    # Profile: per size, stacked parts of each collective algorithm.
    parts = {}
    for r in rows:
        if r["kind"] == "profile":
            parts.setdefault(key(r), {}).setdefault(r["method"], {})[r["part"]] = r["ms_median"]
    overlapped = {(key(r), r["method"]): r["ms_median"] for r in rows if r["kind"] == "shardkit"}
    if parts:
        psizes = [s for s in sizes if s in parts]
        fig, axes = plt.subplots(1, len(psizes), figsize=(4.5 * len(psizes), 4.5), squeeze=False)
        stack = [("gemm", "local GEMMs", "tab:blue"), ("comm", "transfers", "tab:orange"),
                 ("elementwise", "adds / panel copies", "tab:green"), ("fresh", "fresh buffers (page faults)",
                                                                       "tab:brown"), ("rest", "rest", "tab:gray")]
        for ax, s in zip(axes[0], psizes):
            algs = [a for a in ("local", "allgather", "reduce_scatter", "summa") if a in parts[s]]
            for i, a in enumerate(algs):
                p = parts[s][a]
                elem = p.get("adds", p.get("copies", 0.0))
                total = p.get("no_overlap", overlapped.get((s, a)))
                values = {"gemm": p.get("gemm", 0.0), "comm": p.get("comm", 0.0), "elementwise": elem,
                          "fresh": p.get("fresh", 0.0)}
                values["rest"] = max(0.0, (total or 0.0) - sum(values.values()))
                bottom = 0.0
                for part, label, color in stack:
                    ax.bar(i, values[part], bottom=bottom, color=color, label=label if i == 0 else None)
                    bottom += values[part]
                if (s, a) in overlapped:
                    ax.plot([i - 0.4, i + 0.4], [overlapped[(s, a)]] * 2, color="black", linewidth=2,
                            label="overlapped time" if i == 0 else None)
            ax.set_xticks(range(len(algs)), algs, rotation=20, fontsize=8)
            ax.set_ylabel("ms (median)")
            ax.set_title(f"size {size_label({'m': s[0], 'n': s[1], 'k': s[2]})}: parts alone, stacked to the "
                         "no-overlap time", fontsize=8)
            ax.grid(alpha=0.3, axis="y")
        axes[0][0].legend(fontsize=7)
        written.append(save(plt, fig, stem + "_profile.png"))
    return written


# ---- collectives ----------------------------------------------------------------------------------------------------


def collectives_plots(data, stem, plt):
    by_op = {}
    for r in data["results"]:
        if r["bytes"] > 0:  # a barrier's row has no data: nothing to put on a bytes axis
            by_op.setdefault(r["op"], []).append(r)
    if not by_op:
        print(f"plot_bench.py: {stem}: no result to plot", file=sys.stderr)
        return []
    title = f"{data.get('dtype')}, {data.get('ranks')} ranks"
    cols = min(3, len(by_op))
    rows_n = math.ceil(len(by_op) / cols)
    written = []

    fig, axes = plt.subplots(rows_n, cols, figsize=(5 * cols, 3.8 * rows_n), squeeze=False)
    for ax, (op, rs) in zip(axes.flat, by_op.items()):
        rs = sorted(rs, key=lambda r: r["bytes"])
        b = [r["bytes"] for r in rs]
        ax.plot(b, [r["busbw_gbs"] for r in rs], marker="o", label="shardkit")
        ax.plot(b, [r["mpi_busbw_gbs"] for r in rs], marker="s", linestyle="--", label="raw MPI")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes")
        ax.set_ylabel("busbw (GB/s, median)")
        ax.set_title(f"{op} ({title})", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(by_op):]:
        ax.axis("off")
    written.append(save(plt, fig, stem + "_busbw.png"))

    fig, ax = plt.subplots(figsize=(8, 5))
    for op, rs in by_op.items():
        rs = sorted(rs, key=lambda r: r["bytes"])
        ax.plot([r["bytes"] for r in rs], [r["ratio_median"] for r in rs], marker="o", label=op)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes")
    ax.set_ylabel("time shardkit / raw MPI (median)")
    ax.set_title(f"shardkit overhead ({title})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    written.append(save(plt, fig, stem + "_ratio.png"))
    return written


# ---- main -----------------------------------------------------------------------------------------------------------


def load(path):
    try:
        if path == "-":
            return json.load(sys.stdin)
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"plot_bench.py: cannot read {path}: {e}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+", help="JSON written by a benchmark's --json ('-': standard input)")
    ap.add_argument("-o", "--outdir", help="directory of the PNG files (default: next to each JSON file)")
    ap.add_argument("--efficiency-target", type=float, default=0.85,
                    help="matmul: draw this parallel efficiency as a line (default 0.85; 0: none)")
    args = ap.parse_args(argv)
    plt = import_pyplot()
    for path in args.json:
        data = load(path)
        base = "stdin" if path == "-" else os.path.splitext(os.path.basename(path))[0]
        outdir = args.outdir or ("." if path == "-" else os.path.dirname(os.path.abspath(path)))
        os.makedirs(outdir, exist_ok=True)
        stem = os.path.join(outdir, base)
        kind = data.get("benchmark") if isinstance(data, dict) else None
        if kind == "matmul":
            written = matmul_plots(data, stem, plt, args.efficiency_target)
        elif kind == "collectives":
            written = collectives_plots(data, stem, plt)
        else:
            sys.exit(f"plot_bench.py: {path}: not the JSON of a known benchmark (\"benchmark\": {kind!r})")
        for w in written:
            print(w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
