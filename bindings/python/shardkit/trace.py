"""shardkit-trace: reads the flight recorder's dumps (SHARDKIT_DUMP_DIR/rank<R>.json, written on a timeout, a mismatch
or an abort) and says where the ranks of a job parted: the first operation of a communicator the ranks did not all
enter, or entered with different arguments, which ranks are where, and each one's last call site; and merges the
per-rank traces of SHARDKIT_TRACE=DIR into one timeline on rank 0's clock.

    shardkit-trace analyze DIR [--job ID]                   (also: python -m shardkit.trace analyze DIR)
    shardkit-trace merge DIR [-o job.json] [--png job.png]

Every dump names its job (an identity all its ranks agreed on at start): a directory that also holds dumps an earlier
job left is analyzed for the newest job only (or the one --job names), and the others are listed as ignored.
Communicators are told apart by the identity their members agreed on when they were made, not by their names: two
dup()s or two meshes over the same ranks are two communicators.

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

__all__ = ["load", "load_all", "select_job", "analyze", "load_traces", "merge", "draw", "main"]

# What every rank of one collective agrees on (checked mode's signature), as the dumps name it, and as a message names
# it. Per-rank counts (a scatter's root holds every block, an allgatherv's ranks give their own) are not compared.
_AGREED = (("op", "operation"), ("dtype", "dtype"), ("agreed_count", "count"), ("peer", "root"),
           ("reduce", "reduction"), ("agreed_extra", "counts"))


def load_all(directory: str) -> list[dict[str, Any]]:
    """Every dump in `directory` (each with its file name as "file"), of whatever job."""
    dumps = []
    for path in sorted(glob.glob(os.path.join(directory, "rank*.json"))):
        if path.endswith(".trace.json"):
            continue  # SHARDKIT_TRACE's files, when it names the same directory
        with open(path) as f:
            d = json.load(f)
        d["file"] = os.path.basename(path)
        dumps.append(d)
    return dumps


def select_job(dumps: list[dict[str, Any]], job: str | None = None):
    """(the job analyzed, its dumps by world rank, the others' dumps): the job given, else the one of the newest dump."""
    if not dumps:
        return None, {}, []
    if job is None:
        job = max(dumps, key=lambda d: d["time_us"]).get("job")
    mine = {int(d["rank"]): d for d in dumps if d.get("job") == job}
    return job, mine, [d for d in dumps if d.get("job") != job]


def load(directory: str, job: str | None = None) -> dict[int, dict[str, Any]]:
    """The dumps of one job in `directory` (the newest's, or `job`'s), by world rank."""
    return select_job(load_all(directory), job)[1]


def _where(op: dict[str, Any] | None) -> str:
    return f" at {op['site']}" if op and op.get("site") else ""


def _describe(op: dict[str, Any]) -> str:
    return str(op["what"])  # written by the recorder, which names operations the same way in every message


def _ranks(rs) -> str:
    rs = sorted(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def _communicators(dumps):
    """key -> {world rank: that rank's record of the communicator}. A communicator is keyed by the identity its members
    agreed on; one that never agreed on one (wrapping the caller's, used for point-to-point only) by its name and ranks,
    and where a rank has several of those, by their order in its dump (each rank made them in program order)."""
    comms: dict[tuple, dict[int, dict[str, Any]]] = {}
    for rank, d in dumps.items():
        seen: dict[tuple, int] = {}
        for c in d["communicators"]:
            members = tuple(c["world_ranks"])
            if c.get("id", -1) >= 0:
                key: tuple = (c["id"], members)
            else:
                nth = seen[(c["name"], members)] = seen.get((c["name"], members), -1) + 1
                key = (c["name"], members, nth)
            comms.setdefault(key, {})[rank] = c
    return comms


def _title(c: dict[str, Any], members, ambiguous: bool) -> str:
    """communicator 'world' (ranks 0, 1), with its identity where another has the same name and ranks."""
    ident = f" [identity {c['id']}]" if ambiguous and c.get("id", -1) >= 0 else ""
    return f"communicator '{c['name']}' ({_ranks(members)}){ident}"


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


def _agreed(op: dict[str, Any]) -> tuple:
    """What must be equal on every rank of a collective (older dumps, without the agreed fields: their count)."""
    if "agreed_count" not in op:
        return tuple(op.get(f) for f in ("op", "dtype", "count", "peer"))
    return tuple(op.get(f) for f, _ in _AGREED)


def _differing(records: list[dict[str, Any]]) -> list[str]:
    fields = _AGREED if all("agreed_count" in r for r in records) else (
        ("op", "operation"), ("dtype", "dtype"), ("count", "count"), ("peer", "root"))
    return [name for f, name in fields if len({r.get(f) for r in records}) > 1]


def _started(c: dict[str, Any]) -> int:
    """Collectives the rank has started on the communicator (older dumps: those its ring shows)."""
    if "collectives" in c:
        return int(c["collectives"])
    seqs = [op["seq"] for op in c["ops"] if op["seq"] >= 0]
    return max(seqs) + 1 if seqs else 0


def _diverge(title: str, by_rank: dict[int, dict[str, Any]], now_us: int, dumps_activity: dict[int, str],
             dumps_late: dict[int, str]) -> list[str]:
    """The first collective of one communicator where its dumped ranks part, in a few lines ([] when none)."""
    colls = {r: {op["seq"]: op for op in c["ops"] if op["seq"] >= 0} for r, c in by_rank.items()}
    started = {r: _started(c) for r, c in by_rank.items()}
    if not any(started.values()):
        return []
    # From the oldest collective some ring still holds (a ring drops its oldest operations), or the first one a rank
    # has not started, whichever comes first.
    first = min([min(ops) for ops in colls.values() if ops] + [min(started.values())])
    last = max(started.values()) - 1
    for seq in range(first, last + 1):
        have = {r: ops[seq] for r, ops in colls.items() if seq in ops}
        # Started, but no longer in its ring: it entered it, what it did there is not known.
        gone = [r for r in colls if seq not in colls[r] and started[r] > seq]
        missing = [r for r in colls if started[r] <= seq]
        kinds: dict[tuple, list[int]] = {}
        for r, op in have.items():
            kinds.setdefault(_agreed(op), []).append(r)
        if len(kinds) <= 1 and not missing:
            late = _late(have)
            if late:
                return [f"{title}: at collective #{seq}, {late}"]
            continue
        lines = [f"{title}: the ranks part at collective #{seq}:"]
        for rs in sorted(kinds.values()):
            op = have[rs[0]]
            since = ""
            if op["state"] in ("started", "pending"):
                since = f", waiting for {(now_us - op['start_us']) / 1e6:.1f} s"
            lines.append(f"  {_ranks(rs)}: {_describe(op)}{_where(op)} ({op['state']}{since})")
        for r in gone:
            lines.append(f"  rank {r}: entered it, but its ring no longer reaches collective #{seq} (it has started "
                         f"{started[r] - seq - 1} more collective(s) here since, and its ring keeps its last "
                         f"{len(by_rank[r]['ops'])} operations)")
        for r in missing:
            before = [op for s, op in colls[r].items() if s < seq]
            prev = max(before, key=lambda o: o["seq"]) if before else None
            last_op = max(by_rank[r]["ops"], key=lambda o: o["id"]) if by_rank[r]["ops"] else None
            text = f"  {_ranks([r])}: never entered it"
            if prev:
                text += f"; its last collective here: {_describe(prev)}{_where(prev)} ({prev['state']})"
            elif started[r]:
                text += f"; its last collective here, #{started[r] - 1}, is no longer in its ring"
            if last_op and last_op is not prev:
                text += f"; its last operation: {_describe(last_op)}{_where(last_op)} ({last_op['state']})"
            lines.append(text + _doing(dumps_activity.get(r, "")) + dumps_late.get(r, ""))
        if len(kinds) > 1:
            lines.append("  their arguments differ (" + ", ".join(
                _differing([have[rs[0]] for rs in kinds.values()])) + ")")
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


def _without_dump(title: str, members: tuple[int, ...], by_rank: dict[int, dict[str, Any]]) -> list[str]:
    """Where the ranks that did write a dump are, on a communicator some of whose members wrote none."""
    silent = [r for r in members if r not in by_rank]
    lasts = {r: max((op for op in c["ops"] if op["seq"] >= 0), key=lambda o: o["seq"], default=None)
             for r, c in by_rank.items()}
    if not silent or not any(lasts.values()):
        return []
    lines = [f"{title}: {_ranks(silent)} wrote no dump; the others' last collectives:"]
    groups: dict[tuple, list[int]] = {}
    for r, op in lasts.items():
        if op:
            groups.setdefault((op["seq"], op["state"], *_agreed(op), op.get("site")), []).append(r)
    for rs in sorted(groups.values()):
        op = lasts[rs[0]]
        lines.append(f"  {_ranks(rs)}: {_describe(op)}{_where(op)} ({op['state']})")
    return lines


def _counterparts(op: dict[str, Any], me: int, peer: dict[str, Any]) -> list[dict[str, Any]]:
    """The peer's point-to-point operations that would complete `op` of rank `me`: a receive from `me` (or from any
    rank) for a send, a send to `me` for a receive; for a sendrecv, either (its destination's receive, its source's
    send)."""
    me_there = {w: i for i, w in enumerate(peer["world_ranks"])}.get(me)
    out = []
    for p in peer["ops"]:
        if p["seq"] >= 0:
            continue
        sends_to_me = p["op"] in ("send", "sendrecv") and p["peer"] == me_there
        takes_from_me = (p["op"] == "recv" and p["peer"] in (me_there, -1)) or (
            p["op"] == "sendrecv" and p.get("source", -1) in (me_there, -1))
        if (op["op"] == "send" and takes_from_me) or (op["op"] == "recv" and sends_to_me) or (
                op["op"] == "sendrecv" and (takes_from_me or sends_to_me)):
            out.append(p)
    return out


def _peer_side(op: dict[str, Any], me: int, peer_rank: int, peer: dict[str, Any] | None, activity: str) -> str:
    """What the other end of an unfinished point-to-point operation was doing: the rank to look at."""
    if peer is None:
        return f"    rank {peer_rank}, its peer, has no record of this communicator"
    match = [p for p in _counterparts(op, me, peer) if p["state"] != "completed"]
    if match:
        p = match[-1]
        return f"    rank {peer_rank}, its peer, is in {_describe(p)}{_where(p)} ({p['state']})"
    verb = {"send": "never received it", "recv": "never sent it"}.get(op["op"], "never took part")
    doing = activity or "in none of shardkit's operations"
    return f"    rank {peer_rank}, its peer, {verb}; when it wrote its dump it was {doing}"


def _done_by_peer(op: dict[str, Any], me: int, c: dict[str, Any], by_rank: dict[int, dict[str, Any]]) -> bool:
    """Whether the peer of a pending point-to-point operation completed its side of it: as many of its counterparts
    completed as this rank's ring holds operations of that kind to it up to this one (messages match in order)."""
    if not 0 <= op["peer"] < len(c["world_ranks"]):
        return False
    peer = by_rank.get(c["world_ranks"][op["peer"]])
    if peer is None:
        return False
    mine = [o for o in c["ops"] if o["seq"] < 0 and o["op"] == op["op"] and o["peer"] == op["peer"]
            and o["id"] <= op["id"]]
    done = [p for p in _counterparts(op, me, peer) if p["state"] == "completed"]
    return len(done) >= len(mine)


def _unfinished_p2p(by_rank, name, dumps) -> list[str]:
    """Point-to-point operations left waiting or pending, or that failed (a receive whose sender never came), and what
    their peer (a sendrecv's destination, and its source where that is another rank) was doing."""
    how = {"started": "waits in", "pending": "left pending (its token not completed) in", "failed": "failed in"}
    lines = []
    for r, c in sorted(by_rank.items()):
        for op in c["ops"]:
            if op["seq"] >= 0 or op["state"] == "completed":
                continue
            if op["state"] == "pending" and _done_by_peer(op, r, c, by_rank):
                continue  # its token was not waited for yet, but the other end has it: nothing waits
            lines.append(f"communicator '{name}': rank {r} {how[op['state']]} {_describe(op)}{_where(op)}")
            peers = [op["peer"]] + ([op["source"]] if op["op"] == "sendrecv" and op.get("source", -1) not in
                                    (-1, op["peer"]) else [])
            for local in peers:
                if not 0 <= local < len(c["world_ranks"]) or c["world_ranks"][local] == r:
                    continue  # any source, or itself
                peer_rank = c["world_ranks"][local]
                if peer_rank not in dumps:
                    lines.append(f"    rank {peer_rank}, its peer, wrote no dump (killed, stopped, or busy outside "
                                 f"shardkit)")
                else:
                    lines.append(_peer_side(op, r, peer_rank, by_rank.get(peer_rank),
                                            dumps[peer_rank].get("activity", "")))
    return lines


def _ignored(others: list[dict[str, Any]], now_us: int) -> list[str]:
    lines = []
    for d in sorted(others, key=lambda d: d["file"]):
        when = (now_us - d["time_us"]) / 1e6
        ago = f"{when:.1f} s before" if when >= 0 else f"{-when:.1f} s after"
        lines.append(f"ignored {d['file']}: a dump of another job ({d.get('job') or 'unknown'}, written {ago} this "
                     f"job's newest)")
    return lines


def analyze(dumps: dict[int, dict[str, Any]], others: list[dict[str, Any]] | None = None) -> tuple[list[str], bool]:
    """The verdict on one job's dumps as lines, and whether it found a problem. `others`: dumps of other jobs found
    beside them, which are listed as ignored."""
    if not dumps:
        return ["no dumps"], True
    world = sorted({w for d in dumps.values() for c in d["communicators"] for w in c["world_ranks"]} | set(dumps))
    now_us = max(d["time_us"] for d in dumps.values())
    job = next(iter(dumps.values())).get("job")
    lines = [f"job {job}:"] if job else []
    for r in sorted(dumps):
        lines.append(f"rank {r} ({dumps[r]['host']}, pid {dumps[r]['pid']}): {dumps[r]['reason']}")
    lines += _ignored(others or [], now_us)
    silent = [r for r in world if r not in dumps]
    if silent:
        lines.append(f"{_ranks(silent)} wrote no dump (killed, stopped, or busy outside shardkit)")
    found = bool(silent)
    comms = _communicators(dumps)
    names: dict[tuple, int] = {}
    for by_rank in comms.values():
        c = next(iter(by_rank.values()))
        names[(c["name"], tuple(c["world_ranks"]))] = names.get((c["name"], tuple(c["world_ranks"])), 0) + 1
    activity = {r: d.get("activity", "") for r, d in dumps.items()}
    late = _late_dumps(dumps)
    for key, by_rank in sorted(comms.items(), key=lambda kv: (isinstance(kv[0][0], str), str(kv[0][0]).zfill(20),
                                                               kv[0][1])):
        c = next(iter(by_rank.values()))
        members = tuple(c["world_ranks"])
        title = _title(c, members, names[(c["name"], members)] > 1)
        parted = _diverge(title, by_rank, now_us, activity, late)
        for text in parted + (_without_dump(title, members, by_rank) if not parted else []) + _unfinished_p2p(
                by_rank, c["name"], dumps):
            lines.append(text)
            found = True
    if not found:
        lines.append("the dumps show no rank behind the others and no operation left waiting")
    return lines, found


def _analyze(args) -> int:
    everything = load_all(args.dir)
    job, dumps, others = select_job(everything, args.job)
    if not dumps:
        print(f"shardkit-trace: no rank*.json in {args.dir}" if not everything else
              f"shardkit-trace: no dump of job {args.job} in {args.dir} (jobs there: " +
              ", ".join(sorted({str(d.get('job')) for d in everything})) + ")", file=sys.stderr)
        return 2
    lines, found = analyze(dumps, others)
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
    a.add_argument("--job", help="the job to analyze, where the directory holds several's dumps (default: the newest)")
    m = sub.add_parser("merge", help="merge the per-rank traces of SHARDKIT_TRACE=DIR into one timeline")
    m.add_argument("dir", help="the trace directory (SHARDKIT_TRACE)")
    m.add_argument("-o", "--output", help="the merged trace (default: DIR/job.trace.json)")
    m.add_argument("--png", help="also draw the timeline to this PNG (needs matplotlib)")
    args = parser.parse_args(argv)
    return _merge(args) if args.command == "merge" else _analyze(args)


if __name__ == "__main__":
    sys.exit(main())
