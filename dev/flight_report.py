#!/usr/bin/env python3
"""Where the processes of a run diverged, from their flight recorders (llmc/parallel/flight_recorder.h).

    python3 dev/flight_report.py OUT_DIR [--processes N]

Reads OUT_DIR/flight_<rank>.json (written on a watchdog timeout, a fatal error or a stop signal) and
prints, for each group, the newest collective each process began (its number in the group, the
operation, whether its call returned) and where they part: the process(es) that never began the
collective another waits in, or processes whose collective of the same number is another operation
(they called different collectives). With --processes N, the ranks without a file are named too (a
process that was killed, or stopped, writes none). Exit status 0; 2 when no file is found; 1, naming
the file, when one is not a flight recorder's (cut short, another file of that name).
"""
import argparse
import glob
import json
import os
import re
import sys


def load(out_dir):
    runs = {}
    for path in glob.glob(os.path.join(out_dir, "flight_*.json")):
        m = re.search(r"flight_(\d+)\.json$", path)
        if not m:
            continue
        try:
            with open(path) as f:
                run = json.load(f)
            run["reason"], run["entries"]  # the fields the report reads
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"flight_report: {path} is not a flight recorder file ({type(e).__name__}: {e})")
        runs[int(m.group(1))] = run
    return runs


def describe(e):
    state = "not returned" if e["end_s"] is None else ("queued" if e["queued"] else "returned")
    return f"#{e['group_seq']} {e['op']} ({e['count']} x {e['type']}, step {e['step']}, {state})"


def report(runs, processes):
    lines = []
    missing = [r for r in range(processes) if r not in runs] if processes else []
    for r in sorted(runs):
        lines.append(f"process {r}: {runs[r]['reason']}")
    for r in missing:
        lines.append(f"process {r}: no flight file (killed, stopped, or it never reached an error exit)")
    groups = sorted({e["group"] for run in runs.values() for e in run["entries"]})
    for g in groups:
        lines.append(f"group {g}:")
        last, by_seq = {}, {}
        for r, run in sorted(runs.items()):
            entries = [e for e in run["entries"] if e["group"] == g]
            if entries:
                last[r] = entries[-1]
                by_seq[r] = {e["group_seq"]: e for e in entries}
        for r, e in sorted(last.items()):
            lines.append(f"  process {r}: last began {describe(e)}")
        if not last:
            continue
        newest = max(e["group_seq"] for e in last.values())
        behind = sorted(r for r, e in last.items() if e["group_seq"] < newest)
        waiting = sorted(r for r, e in last.items() if e["group_seq"] == newest and e["end_s"] is None)
        if behind:
            lines.append(f"  diverged at #{newest}: process(es) {', '.join(map(str, behind))} never began it "
                         f"(process(es) {', '.join(str(r) for r, e in sorted(last.items()) if e['group_seq'] == newest)} did)")
        # the same number, another operation: different collectives called
        common = set.intersection(*(set(s) for s in by_seq.values())) if by_seq else set()
        for seq in sorted(common):
            ops = {r: by_seq[r][seq]["op"] for r in by_seq}
            if len(set(ops.values())) > 1:
                lines.append(f"  mismatch at #{seq}: " + ", ".join(f"process {r} called {op}" for r, op in sorted(ops.items())))
                break
        if waiting and not behind:
            lines.append(f"  process(es) {', '.join(map(str, waiting))} wait in #{newest}, which every process with a file "
                         "began: the one(s) missing above, or the collective itself, hold it")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--processes", type=int, default=0, help="the run's process count (names ranks without a file)")
    args = parser.parse_args()
    runs = load(args.out_dir)
    if not runs:
        print(f"no flight_<rank>.json in {args.out_dir}", file=sys.stderr)
        return 2
    print(report(runs, args.processes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
