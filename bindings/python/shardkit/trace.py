"""shardkit-trace: reads the flight recorder's dumps (SHARDKIT_DUMP_DIR/rank<R>.json, written on a timeout, a mismatch
or an abort) and says where the ranks of a job parted: the first operation of a communicator the ranks did not all
enter, or entered with different arguments, which ranks are where, and each one's last call site; and merges the
per-rank traces of SHARDKIT_TRACE=DIR into one timeline on rank 0's clock.

    shardkit-trace analyze DIR                              (also: python -m shardkit.trace analyze DIR)
    shardkit-trace merge DIR [-o job.json] [--png job.png]

Exit status: 0 when the dumps show nothing wrong (merge: every rank's trace merged), 1 when they show a problem
(merge: written, but a rank's trace is missing, cut short or unreadable), 2 when there is nothing to read, 3 when
--png is asked for without matplotlib.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Any

from ._timeline import describe_clocks, draw, load_traces, merge

__all__ = ["load", "analyze", "load_traces", "merge", "draw", "main"]

_FIELDS = ("op", "dtype", "count", "peer")  # what must agree between the ranks of one collective


def load(directory: str) -> dict[int, dict[str, Any]]:
    """Every rank's dump in `directory`, by world rank."""
    dumps = {}
    for path in sorted(glob.glob(os.path.join(directory, "rank*.json"))):
        if path.endswith(".trace.json"):
            continue  # SHARDKIT_TRACE's files, when it names the same directory
        with open(path) as f:
            d = json.load(f)
        dumps[int(d["rank"])] = d
    return dumps


def _where(op: dict[str, Any] | None) -> str:
    return f" at {op['site']}" if op and op.get("site") else ""


def _describe(op: dict[str, Any]) -> str:
    return str(op["what"])  # written by the recorder, which names operations the same way in every message


def _ranks(rs) -> str:
    rs = sorted(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def _communicators(dumps):
    """(name, world ranks) -> {world rank: that rank's record of the communicator}."""
    comms: dict[tuple[str, tuple[int, ...]], dict[int, dict[str, Any]]] = {}
    for rank, d in dumps.items():
        for c in d["communicators"]:
            comms.setdefault((c["name"], tuple(c["world_ranks"])), {})[rank] = c
    return comms


def _doing(activity: str) -> str:
    """What a rank was doing when it wrote its dump (its watchdog's description), for a rank that never came."""
    if activity.startswith("in none"):
        return "; when it wrote its dump it was in its own code, in none of shardkit's operations"
    return f"; when it wrote its dump it was {activity}" if activity else ""


def _late_dumps(dumps: dict[int, dict[str, Any]]) -> dict[int, str]:
    """Ranks whose dump came well after the others' (stopped, or unable to write until the job ended)."""
    times = sorted(d["time_us"] for d in dumps.values())
    first = times[0]
    return {r: f"; its dump came {(d['time_us'] - first) / 1e6:.1f} s after the others' (the rank was stopped, e.g. "
               f"by SIGSTOP or a debugger, until the job ended)"
            for r, d in dumps.items() if d["time_us"] - first > 1_500_000 and len(dumps) > 1}


def _diverge(name: str, members: tuple[int, ...], by_rank: dict[int, dict[str, Any]], now_us: int,
             dumps_activity: dict[int, str], dumps_late: dict[int, str]) -> list[str]:
    """The first collective of one communicator where its dumped ranks part, in a few lines ([] when none)."""
    colls = {r: {op["seq"]: op for op in c["ops"] if op["seq"] >= 0} for r, c in by_rank.items()}
    if not any(colls.values()):
        return []
    # Only where every ring still reaches back (a ring drops its oldest operations).
    first = max((min(ops) for ops in colls.values() if ops), default=0)
    last = max(max(ops) for ops in colls.values() if ops)
    for seq in range(first, last + 1):
        have = {r: ops[seq] for r, ops in colls.items() if seq in ops}
        kinds: dict[tuple, list[int]] = {}
        for r, op in have.items():
            kinds.setdefault(tuple(op.get(f) for f in _FIELDS), []).append(r)
        missing = [r for r in colls if r not in have]
        if len(kinds) <= 1 and not missing:
            late = _late(have)
            if late:
                return [f"communicator '{name}' ({_ranks(members)}): at collective #{seq}, {late}"]
            continue
        lines = [f"communicator '{name}' ({_ranks(members)}): the ranks part at collective #{seq}:"]
        for rs in sorted(kinds.values()):
            op = have[rs[0]]
            since = ""
            if op["state"] == "started":
                since = f", waiting for {(now_us - op['start_us']) / 1e6:.1f} s"
            lines.append(f"  {_ranks(rs)}: {_describe(op)}{_where(op)} ({op['state']}{since})")
        for r in missing:
            before = [op for s, op in colls[r].items() if s < seq]
            prev = max(before, key=lambda o: o["seq"]) if before else None
            last_op = max(by_rank[r]["ops"], key=lambda o: o["id"]) if by_rank[r]["ops"] else None
            text = f"  {_ranks([r])}: never entered it"
            if prev:
                text += f"; its last collective here: {_describe(prev)}{_where(prev)} ({prev['state']})"
            if last_op and last_op is not prev:
                text += f"; its last operation: {_describe(last_op)}{_where(last_op)} ({last_op['state']})"
            lines.append(text + _doing(dumps_activity.get(r, "")) + dumps_late.get(r, ""))
        if len(kinds) > 1:
            lines.append("  their arguments differ (" + ", ".join(
                f for f in _FIELDS if len({have[rs[0]].get(f) for rs in kinds.values()}) > 1) + ")")
        return lines
    return []


_TICK_US = 10_000  # more than CLOCK_REALTIME_COARSE's resolution (1-4 ms)


def _late(have: dict[int, dict[str, Any]]) -> str:
    """Ranks that entered a collective only after others had given up on it (stopped, or busy until then)."""
    gave_up = {r: op["end_us"] for r, op in have.items() if op["state"] == "failed" and op["end_us"] > 0}
    if not gave_up:
        return ""
    first = min(gave_up.values())
    # start_us is read at the kernel's clock tick (a few ms early); end_us exactly
    late = sorted(r for r, op in have.items() if op["start_us"] + _TICK_US > first)
    if not late:
        return ""
    early = sorted(r for r in gave_up if r not in late)
    if not early:
        return ""
    op = have[early[0]]
    lag = (min(have[r]["start_us"] for r in late) - first) / 1e6
    return (f"{_ranks(late)} entered {_describe(op)}{_where(op)} only {lag:.1f} s after {_ranks(early)} had given "
            f"up on it: {_ranks(late)} stopped (SIGSTOP, a debugger) or busy elsewhere until then")


def _without_dump(name: str, members: tuple[int, ...], by_rank: dict[int, dict[str, Any]]) -> list[str]:
    """Where the ranks that did write a dump are, on a communicator some of whose members wrote none."""
    silent = [r for r in members if r not in by_rank]
    lasts = {r: max((op for op in c["ops"] if op["seq"] >= 0), key=lambda o: o["seq"], default=None)
             for r, c in by_rank.items()}
    if not silent or not any(lasts.values()):
        return []
    lines = [f"communicator '{name}' ({_ranks(members)}): {_ranks(silent)} wrote no dump; the others' last "
             f"collectives:"]
    groups: dict[tuple, list[int]] = {}
    for r, op in lasts.items():
        if op:
            groups.setdefault((op["seq"], op["state"], *(op.get(f) for f in _FIELDS), op.get("site")), []).append(r)
    for rs in sorted(groups.values()):
        op = lasts[rs[0]]
        lines.append(f"  {_ranks(rs)}: {_describe(op)}{_where(op)} ({op['state']})")
    return lines


def _unfinished_p2p(by_rank, name) -> list[str]:
    """Point-to-point operations left waiting, or that failed (a receive whose sender never came)."""
    lines = []
    for r, c in sorted(by_rank.items()):
        for op in c["ops"]:
            if op["seq"] < 0 and op["state"] != "completed":
                how = "waits in" if op["state"] == "started" else "failed in"
                lines.append(f"communicator '{name}': rank {r} {how} {_describe(op)}{_where(op)}")
    return lines


def analyze(dumps: dict[int, dict[str, Any]]) -> tuple[list[str], bool]:
    """The verdict as lines, and whether it found a problem."""
    if not dumps:
        return ["no dumps"], True
    world = sorted({w for d in dumps.values() for c in d["communicators"] for w in c["world_ranks"]} | set(dumps))
    now_us = max(d["time_us"] for d in dumps.values())
    lines = []
    for r in sorted(dumps):
        lines.append(f"rank {r} ({dumps[r]['host']}, pid {dumps[r]['pid']}): {dumps[r]['reason']}")
    silent = [r for r in world if r not in dumps]
    if silent:
        lines.append(f"{_ranks(silent)} wrote no dump (killed, stopped, or busy outside shardkit)")
    found = bool(silent)
    for (name, members), by_rank in sorted(_communicators(dumps).items()):
        activity = {r: d.get("activity", "") for r, d in dumps.items()}
        parted = _diverge(name, members, by_rank, now_us, activity, _late_dumps(dumps))
        for text in parted + (_without_dump(name, members, by_rank) if not parted else []) + _unfinished_p2p(
                by_rank, name):
            lines.append(text)
            found = True
    if not found:
        lines.append("the dumps show no rank behind the others and no operation left waiting")
    return lines, found


def _analyze(args) -> int:
    dumps = load(args.dir)
    if not dumps:
        print(f"shardkit-trace: no rank*.json in {args.dir}", file=sys.stderr)
        return 2
    lines, found = analyze(dumps)
    print("\n".join(lines))
    return 1 if found else 0


def _merge(args) -> int:
    if args.png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("shardkit-trace: --png needs matplotlib: pip install matplotlib (scripts/setup.sh installs it)",
                  file=sys.stderr)
            return 3
    traces, problems = load_traces(args.dir)
    for p in problems:
        print(f"shardkit-trace: {p}", file=sys.stderr)
    if not traces:
        print(f"shardkit-trace: no rank*.trace.json in {args.dir} (written by a job run with "
              f"SHARDKIT_TRACE={args.dir})", file=sys.stderr)
        return 2
    merged = merge(traces)
    out = args.output or os.path.join(args.dir, "job.trace.json")
    with open(out, "w") as f:
        json.dump(merged, f)
    spans = sum(ev.get("ph") == "X" for ev in merged["traceEvents"])
    print(f"merged {spans} spans of {len(traces)} rank(s) into {out} (open it in https://ui.perfetto.dev)")
    for line in describe_clocks(traces):
        print(f"  {line}")
    if args.png:
        draw(merged, args.png)
        print(f"timeline drawn to {args.png}")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shardkit-trace", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("analyze", help="say where the ranks parted, from a dump directory")
    a.add_argument("dir", help="the dump directory (SHARDKIT_DUMP_DIR)")
    m = sub.add_parser("merge", help="merge the per-rank traces of SHARDKIT_TRACE=DIR into one timeline")
    m.add_argument("dir", help="the trace directory (SHARDKIT_TRACE)")
    m.add_argument("-o", "--output", help="the merged trace (default: DIR/job.trace.json)")
    m.add_argument("--png", help="also draw the timeline to this PNG (needs matplotlib)")
    args = parser.parse_args(argv)
    return _merge(args) if args.command == "merge" else _analyze(args)


if __name__ == "__main__":
    sys.exit(main())
