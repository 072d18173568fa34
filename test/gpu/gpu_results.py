#!/usr/bin/env python3
"""Turns what test/gpu/run_on_gpu.sh wrote under $OUT (one folder per device call) into the markdown
of doc/gpu_results.md: the stages' results, the benchmark against PyTorch, dev/cuda's table and the
costliest kernels under Nsight Compute. Standard library only.

    python3 test/gpu/gpu_results.py DIR [DIR ...] > doc/gpu_results.md

Each DIR holds summary.tsv and main.log, and where those stages ran bench.tsv, cuda_dev.md, ncu.md.
A stage run in several calls is listed once per call, in call order."""
import os
import re
import sys


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def device_of(log, cuda_dev):
    m = re.search(r"^NVIDIA [^,\n]+, [0-9.]+, [0-9]+ MiB", log, re.M)  # nvidia-smi --query-gpu ... csv
    if m:
        return m.group(0)
    m = re.search(r"^(?:device|GPU): (NVIDIA [^,\n]+)", log + "\n" + cuda_dev, re.M)  # the header, dev/cuda's table
    if m:
        return m.group(1)
    m = re.search(r"EMULATED rehearsal", log)
    return "the emulator (dev/emu), a rehearsal" if m else "unknown"


def main(dirs):
    if not dirs:
        print(__doc__, file=sys.stderr)
        return 2
    out = ["# Results of the GPU session plan", "",
           "Made by `test/gpu/gpu_results.py` from the files `test/gpu/run_on_gpu.sh` wrote under `$OUT` "
           "(doc/cuda.md, \"A GPU session\"). Numbers are as measured once, on the machine named; nothing here "
           "is edited by hand.", ""]
    stage_rows, bench_rows, cuda_dev, ncu = [], [], [], []
    for i, d in enumerate(dirs, 1):
        log = read(os.path.join(d, "main.log"))
        head = re.search(r"^==== run_on_gpu\.sh (.*)$", log, re.M)
        commit = re.search(r"commit: (.*)$", log, re.M)
        out.append(f"Call {i}: {head.group(1) if head else '(no header)'}; device: {device_of(log, read(os.path.join(d, 'cuda_dev.md')))}; "
                   f"commit {commit.group(1) if commit else 'unknown'}.")
        out.append("")
        for line in read(os.path.join(d, "summary.tsv")).splitlines():
            f = line.split("\t")
            if len(f) == 5:
                stage_rows.append([str(i)] + f)
        for line in read(os.path.join(d, "bench.tsv")).splitlines():
            f = line.split("\t")
            if len(f) == 11:
                bench_rows.append([str(i)] + f)
        t = read(os.path.join(d, "cuda_dev.md")).strip()
        if t:
            cuda_dev.append((i, t))
        t = read(os.path.join(d, "ncu.md")).strip()
        if t:
            ncu.append((i, t))
    out += ["## Stages", "", "| call | stage | lane | result | seconds | detail |", "| ---: | --- | --- | --- | ---: | --- |"]
    out += [f"| {' | '.join(r)} |" for r in stage_rows]
    failed = sum(r[3] == "failed" for r in stage_rows)
    passed = sum(r[3] == "passed" for r in stage_rows)
    out += ["", f"{len(stage_rows)} stages: {passed} passed, {failed} failed, "
                f"{len(stage_rows) - passed - failed} skipped.", ""]
    out += ["## Throughput against PyTorch", ""]
    if bench_rows:
        out += ["| call | side | mode | model | B | T | steps | ms/step | tokens/s | MFU % | peak MiB (nvidia-smi) | warm-up s |",
                "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        out += [f"| {' | '.join(r)} |" for r in bench_rows]
        ours = {(r[0], r[2]): r for r in bench_rows if r[1] == "ours"}
        for r in bench_rows:
            if r[1] == "torch" and (r[0], "r0") in ours:
                o = ours[(r[0], "r0")]
                try:
                    out.append(f"\nCall {r[0]}: train_gpt2cu -r 0 / PyTorch {r[2]}: "
                               f"{float(o[8]) / float(r[8]):.2f}x tokens/s (B {o[4]} and {r[4]}).")
                except ValueError:
                    pass
    else:
        out.append("(no benchmark ran)")
    out += ["", "## dev/cuda", ""]
    for i, t in cuda_dev:
        out += [f"Call {i}:", "", t, ""]
    if not cuda_dev:
        out += ["(did not run)", ""]
    out += ["## The costliest kernels (Nsight Compute)", ""]
    for i, t in ncu:
        out += [f"Call {i}:", "", t, ""]
    if not ncu:
        out += ["(did not run)", ""]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
