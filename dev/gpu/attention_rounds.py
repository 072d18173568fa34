#!/usr/bin/env python3
"""The attention stage's table (dev/gpu/run_on_gpu.sh): our flash attention against PyTorch's
FlashAttention-2 over interleaved rounds. Reads ROUND_DIR/r<N>/*.log: the dev/cuda programs'
version lines ("vN description  block  time(us)  rate  %ceiling  spread  err  check") and
dev/cuda/attention_sdpa.py's RESULT lines. Per op, each version's median time over the rounds and
its spread, then each of our versions against FA2 within each round (FA2's time over ours: above 1,
ours is faster), median, min and max. Standard library only.

    python3 dev/gpu/attention_rounds.py ROUND_DIR > attention.md
"""
import glob
import os
import re
import statistics
import sys


def parse(path):
    """{(op, version): time_us} from one log."""
    times, op = {}, None
    for line in open(path, errors="replace"):
        m = re.match(r"^op: ([a-z_]+)", line)
        if m:
            op = m.group(1)
            continue
        m = re.match(r"^RESULT\|([a-z_]+), T \d+\|([^|]+)\|[^|]*\|([0-9.]+)\|", line)
        if m and "torch" in m.group(2):
            times[(m.group(1), m.group(2))] = float(m.group(3))
            continue
        f = line.split()
        if op and re.match(r"^v\d+ ", line) and len(f) >= 8:
            try:
                t = float(f[-6])
            except ValueError:
                continue
            version = " ".join(f[:-7]) + ("" if f[-7] == "fixed" else f" (block {f[-7]})")
            times[(op, version)] = min(t, times.get((op, version), t))
    return times


def main(root):
    rounds = sorted(glob.glob(os.path.join(root, "r*")), key=lambda d: int(re.sub(r"\D", "", os.path.basename(d)) or 0))
    data = []  # one dict per round
    for d in rounds:
        times = {}
        for log in sorted(glob.glob(os.path.join(d, "*.log"))):
            times.update(parse(log))
        if times:
            data.append(times)
    if not data:
        print("(no round finished)")
        return 1
    print(f"Attention at (B, T, C, NH) = (8, 1024, 768, 12), head size 64, causal, bf16; {len(data)} rounds, "
          "each round: our program (every version; the L2 flushed before each repetition, median of up to 25), "
          "then FA2 the same way.")
    for op in dict.fromkeys(op for times in data for op, _ in times):
        versions = list(dict.fromkeys(v for times in data for o, v in times if o == op))
        fa2 = [v for v in versions if "torch" in v]
        print(f"\n{op}:\n")
        print("| version | rounds | time (us) median | min - max | FA2 time / this (per round: median, min - max) |")
        print("| --- | ---: | ---: | ---: | --- |")
        for v in versions:
            ts = [t[(op, v)] for t in data if (op, v) in t]
            ratio = "-"
            if fa2 and v not in fa2:
                r = [t[(op, fa2[0])] / t[(op, v)] for t in data if (op, v) in t and (op, fa2[0]) in t]
                if r:
                    ratio = f"{statistics.median(r):.2f}x, {min(r):.2f} - {max(r):.2f}"
            print(f"| {v} | {len(ts)} | {statistics.median(ts):.1f} | {min(ts):.1f} - {max(ts):.1f} | {ratio} |")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
