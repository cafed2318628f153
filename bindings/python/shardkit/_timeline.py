"""The per-rank traces of ``SHARDKIT_TRACE=DIR`` (``DIR/rank<R>.trace.json``, Chrome-trace JSON) merged into one
timeline on rank 0's clock, and drawn with matplotlib: ``shardkit-trace merge DIR -o job.json [--png job.png]``.

Each rank's file holds its spans in microseconds from its own ``clock_origin_us`` (wall clock) and its clock's
offset to rank 0's (``clock_offset_us``, this rank's clock minus rank 0's, measured by ping-pongs at start-up). The
merged time of a span is ``clock_origin_us + ts - clock_offset_us``, less the earliest rank's origin.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

__all__ = ["load_traces", "merge", "draw"]

_HEAD = '{"otherData": '


def _recover(text: str) -> tuple[dict[str, Any], int]:
    """A trace cut short (its process died while writing): the head and every complete event line, and their count."""
    lines = text.split("\n")
    if not lines[0].startswith(_HEAD):
        raise ValueError("not a shardkit trace")
    other = json.loads(lines[0][len(_HEAD):].rstrip(","))
    events = []
    for line in lines[2:]:
        try:
            events.append(json.loads(line.rstrip(",")))
        except json.JSONDecodeError:
            break
    return {"otherData": other, "traceEvents": events}, len(events)


def load_traces(directory: str) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """Every rank's trace in `directory`, by rank, and what is wrong with them (unreadable, cut short, missing)."""
    traces: dict[int, dict[str, Any]] = {}
    problems = []
    size = 0
    for path in sorted(glob.glob(os.path.join(directory, "rank*.trace.json"))):
        with open(path) as f:
            text = f.read()
        try:
            trace = json.loads(text)
        except json.JSONDecodeError:
            try:
                trace, n = _recover(text)
            except (ValueError, json.JSONDecodeError):
                problems.append(f"{path}: not a shardkit trace (unreadable JSON)")
                continue
            problems.append(f"{path}: cut short (its process ended while writing it); read its first {n} events")
        other = trace.get("otherData", {})
        if "rank" not in other or "clock_origin_us" not in other:
            problems.append(f"{path}: not a shardkit trace (no rank or clock in otherData)")
            continue
        traces[int(other["rank"])] = trace
        size = max(size, int(other.get("size", 0)))
    missing = [r for r in range(size) if r not in traces]
    if traces and missing:
        problems.append(f"rank(s) {', '.join(map(str, missing))} wrote no trace in {directory}")
    return traces, problems


def merge(traces: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One Chrome trace of every rank's spans, on rank 0's clock (one process track per rank)."""
    def start(o: dict[str, Any]) -> int:
        return int(o["clock_origin_us"]) - int(o.get("clock_offset_us", 0))

    base = min(start(t["otherData"]) for t in traces.values())
    events: list[dict[str, Any]] = []
    ranks = {}
    for rank in sorted(traces):
        other = traces[rank]["otherData"]
        shift = start(other) - base
        for ev in traces[rank]["traceEvents"]:
            ev = dict(ev, pid=rank)
            if "ts" in ev:
                ev["ts"] = round(ev["ts"] + shift, 3)
            events.append(ev)
        ranks[str(rank)] = {k: other.get(k) for k in ("host", "pid", "clock_offset_us", "clock_rtt_us", "clock_rounds")}
    return {"otherData": {"shardkit_merged": 1, "clock_origin_us": base, "ranks": ranks}, "traceEvents": events}


def describe_clocks(traces: dict[int, dict[str, Any]]) -> list[str]:
    """A line per rank on its clock offset (or that it was not measured)."""
    lines = []
    for rank in sorted(traces):
        o = traces[rank]["otherData"]
        if rank == 0:
            continue
        if not o.get("clock_rounds"):
            lines.append(f"rank {rank}: clock offset not measured (SHARDKIT_TRACE was not set when shardkit started); "
                         "its times are taken as rank 0's")
        else:
            lines.append(f"rank {rank} ({o.get('host')}): clock {o['clock_offset_us']:+d} us from rank 0's "
                         f"(+/- {o['clock_rtt_us'] / 2:g} us)")
    return lines


def draw(merged: dict[str, Any], path: str) -> None:
    """The timeline as a PNG: a row per rank, a bar per span coloured by operation. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.patches as mpatches
    import matplotlib.pyplot as plt

    names = {ev["pid"]: ev["args"]["name"] for ev in merged["traceEvents"]
             if ev.get("ph") == "M" and ev.get("name") == "process_name"}
    spans = [ev for ev in merged["traceEvents"] if ev.get("ph") == "X"]
    rows = sorted({ev["pid"] for ev in spans} | set(names))
    ops = sorted({ev["name"] for ev in spans})
    cmap = plt.get_cmap("tab20")
    colour = {op: cmap(i % 20) for i, op in enumerate(ops)}
    end = max((ev["ts"] + ev["dur"] for ev in spans), default=1.0) / 1e3
    least = end / 1500  # so that microsecond operations still show
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * len(rows)))
    for y, rank in enumerate(rows):
        mine = [ev for ev in spans if ev["pid"] == rank]
        ax.broken_barh([(ev["ts"] / 1e3, max(ev["dur"] / 1e3, least)) for ev in mine], (y - 0.4, 0.8),
                       facecolors=[colour[ev["name"]] for ev in mine], edgecolors="white", linewidths=0.6)
        for ev in mine:  # where a rank gave up: a failed span is hatched
            if ev.get("args", {}).get("state") == "failed":
                ax.broken_barh([(ev["ts"] / 1e3, max(ev["dur"] / 1e3, least))], (y - 0.4, 0.8), facecolors="none",
                               edgecolors="black", hatch="//", linewidths=0)
    ax.set_yticks(range(len(rows)), [names.get(r, f"rank {r}") for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms, rank 0's clock)")
    ax.set_xlim(0, end * 1.01 if end > 0 else 1)
    failed = mpatches.Patch(facecolor="none", edgecolor="black", hatch="//", linewidth=0, label="failed")
    ax.legend(handles=[mpatches.Patch(color=colour[op], label=op) for op in ops] + [failed], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

