#!/usr/bin/env python3
"""Plots one or several runs' metrics.jsonl (written by train_gpt2 / train_gpt2cu with -o) into a PNG.

    dev/plot_metrics.py log_tinyshakespeare/metrics.jsonl [-o plot.png]
    dev/plot_metrics.py run_a/metrics.jsonl run_b/metrics.jsonl --labels a b -o compare.png
    dev/plot_metrics.py run_a/metrics.jsonl run_b/metrics.jsonl --x seconds   # against training time
    dev/plot_metrics.py run_a/metrics.jsonl run_b/metrics.jsonl --x mib       # against bytes communicated

Panels: train and val loss, learning rate, gradient norm, tokens/s, and HellaSwag accuracy when the
runs logged it (-hs). Several runs are overlaid, one colour per run, with a legend; a run is labelled
by its directory unless --labels names it. The PNG is 1600 x 1000 pixels (--width, --height). --x seconds
puts every value at the training time before its step (the sum of the earlier steps' "ms": evaluation,
checkpoints and samples between steps are not counted), to compare runs whose steps take different times.

metrics.jsonl: one JSON object per line, each with an integer "step" and numbers among "train_loss",
"lr", "grad_norm", "ms", "tokens_per_s", "val_loss", "hellaswag_acc", "hellaswag_acc_norm", ... A
step the trainer skipped (a non-finite gradient norm, llmc/run/loss_scaler.h) has "skipped": true and null
for its non-finite values (JSON has no inf or NaN): "skipped" is not plotted and a null point is left
out. A file that is not that (a line that is not a JSON object, no "step", a value that is not a number, or
no line at all) is refused with a message naming the file and line, exit status 1.
Needs matplotlib (scripts/install_deps.sh puts it in .venv, which the script then uses); it draws
without a display (Agg).
"""

import argparse
import json
import math
import os
import sys

from repo_python import need

DPI = 100
PANELS = [  # (title, [(key, line style)], log scale)
    ("loss", [("train_loss", "-"), ("val_loss", "o--")], False),
    ("learning rate", [("lr", "-")], False),
    ("gradient norm (before clipping)", [("grad_norm", "-")], True),
    ("tokens/s", [("tokens_per_s", "-")], False),
]
X_KEYS = {"seconds": ("ms", 1000.0), "mib": ("comm_bytes", 1048576.0)}  # --x: each step's key, per unit
HELLASWAG_PANEL = ("HellaSwag accuracy", [("hellaswag_acc_norm", "o-"), ("hellaswag_acc", "s:")], False)


def die(message):
    print(f"plot_metrics.py: error: {message}", file=sys.stderr)
    sys.exit(1)


def read_metrics(path):
    """{key: ([steps], [values])} from one metrics.jsonl; refuses anything malformed."""
    series = {}
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        die(f"{path}: {e.strerror}")
    with f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                die(f"{where}: not JSON ({e.msg}); is this a metrics.jsonl?")
            if not isinstance(item, dict):
                die(f"{where}: not a JSON object")
            step = item.get("step")
            if not isinstance(step, int) or isinstance(step, bool) or step < 0:
                die(f"{where}: no integer \"step\"")
            for key, value in item.items():
                if key == "step":
                    continue
                if key == "skipped":  # a flag, not a series
                    if not isinstance(value, bool):
                        die(f"{where}: \"skipped\" is {value!r}, not true or false")
                    continue
                if value is None:  # inf or NaN as the trainer writes it: left out
                    continue
                if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                    die(f"{where}: \"{key}\" is {value!r}, not a finite number")
                steps, values = series.setdefault(key, ([], []))
                steps.append(step)
                values.append(value)
    if not series:
        die(f"{path}: no metrics in it (empty file?)")
    return series


def seconds_before_steps(run, path, key="ms", unit=1000.0):
    """{step: seconds of training before it}, from the steps' "ms" (or, key "comm_bytes" and unit 2^20:
    MiB communicated before it)."""
    if key not in run:
        die(f"{path}: no \"{key}\" of the steps, which --x {'seconds' if key == 'ms' else 'mib'} needs")
    steps, ms = run[key]
    at, total = {}, 0.0
    for step, value in sorted(zip(steps, ms)):
        at[step] = total
        total += value / unit
    last = max(steps)
    at[last + 1] = total
    return lambda step: at.get(step, total if step > last else 0.0)


def plot(runs, labels, out, width, height, x_axis="step", paths=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = PANELS + ([HELLASWAG_PANEL] if any("hellaswag_acc_norm" in r for r in runs) else [])
    columns = 3 if len(panels) > 4 else 2
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(width / DPI, height / DPI), dpi=DPI, squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, keys, log) in zip(axes.flat, panels):
        for i, (run, label) in enumerate(zip(runs, labels)):
            for key, style in keys:
                if key not in run:
                    continue
                steps, values = run[key]
                if x_axis != "step":
                    before = seconds_before_steps(run, paths[i], *X_KEYS[x_axis])
                    steps = [before(step) for step in steps]
                name = label if len(keys) == 1 else f"{label}: {key}"
                ax.plot(steps, values, style, color=colours[i % len(colours)], label=name, markersize=3,
                        linewidth=1.2, alpha=1.0 if style.endswith("-") and "--" not in style else 0.85)
        ax.set_title(title)
        ax.set_xlabel({"step": "step", "seconds": "seconds of training", "mib": "MiB communicated (process 0)"}[x_axis])
        if log:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)  # figsize x dpi: exactly width x height pixels
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("metrics", nargs="+", help="metrics.jsonl of each run")
    ap.add_argument("-o", "--output", help="PNG to write (default: metrics.png next to the first file)")
    ap.add_argument("--labels", nargs="+", help="one name per run (default: each file's directory)")
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--height", type=int, default=1000)
    ap.add_argument("--x", choices=["step", "seconds", "mib"], default="step",
                    help="the horizontal axis: steps, seconds of training, or MiB communicated (comm_bytes)")
    args = ap.parse_args()
    if args.labels and len(args.labels) != len(args.metrics):
        die(f"{len(args.labels)} labels for {len(args.metrics)} runs")
    if not (200 <= args.width <= 10000 and 200 <= args.height <= 10000):
        die("--width and --height must be 200..10000 pixels")
    runs = [read_metrics(p) for p in args.metrics]
    labels = args.labels or [os.path.basename(os.path.dirname(os.path.abspath(p))) or p for p in args.metrics]
    out = args.output or os.path.join(os.path.dirname(os.path.abspath(args.metrics[0])), "metrics.png")
    need("matplotlib")  # else .venv/bin/python runs this script, or one line says what to run
    if args.x != "step":
        for run, path in zip(runs, args.metrics):
            seconds_before_steps(run, path, *X_KEYS[args.x])  # refuses a run without them before anything is drawn
    plot(runs, labels, out, args.width, args.height, args.x, args.metrics)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
