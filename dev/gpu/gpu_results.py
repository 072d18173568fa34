#!/usr/bin/env python3
"""Turns what dev/gpu/run_on_gpu.sh wrote under $OUT (one folder per device call) into the markdown
of doc/gpu_results.md: the stages' results, the benchmark against PyTorch, dev/cuda's table and the
costliest kernels under Nsight Compute. Standard library only.

    python3 dev/gpu/gpu_results.py DIR [DIR ...] > doc/gpu_results.md

Each DIR holds summary.tsv and main.log, and where those stages ran bench.tsv, cuda_dev.md,
attention.md, ncu.md, fp8.md (the stage fp8: BF16 and -fp8 2 trained alike) and fp8.log (dev/cuda/bin/matmul_fp8's output, run on its own). A stage run in several calls is listed once per call, in call order. The
benchmark's ratios are computed here from bench.tsv's rows: within each round, against the baseline
the rows name (ours-r0 unless said), median, min and max over the rounds."""
import os
import re
import statistics
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


def ratio_lines(rows):
    """Per call, model and baseline: each mode's median step time over its rounds, and its ratio to the
    baseline within each round (the baseline over a peer; an ours-* variant over the baseline).
    A row: call side mode model B T steps ms tokens/s MFU peak warm-up round baseline."""
    out = []
    groups = {}
    for r in rows:
        groups.setdefault((r[0], r[3], r[13]), []).append(r)
    for (call, model, baseline), rs in groups.items():
        name = lambda r: f"{r[1]}-{r[2]}"
        out += [f"Call {call}, {model}, against {baseline}:", "",
                "| mode | runs | B | ms/step median | min - max | tokens/s median | ratio (per round: median, min - max) |",
                "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        base = {r[12]: float(r[8]) for r in rs if name(r) == baseline}
        ratios = []
        for mode in dict.fromkeys(name(r) for r in rs):
            m = [r for r in rs if name(r) == mode]
            ms = [float(r[7]) for r in m]
            ratio = "baseline"
            if mode != baseline:
                peer = not mode.startswith("ours-")
                v = [(base[r[12]] / float(r[8]) if peer else float(r[8]) / base[r[12]]) for r in m if r[12] in base]
                label = f"{baseline} / {mode}" if peer else f"{mode} / {baseline}"
                ratio = "-"
                if v:
                    med = statistics.median(v)
                    verdict = "parity (under 3%)" if abs(med - 1) < 0.03 else ("faster" if med > 1 else "slower")
                    ratio = f"{label}: {med:.3f}x, {min(v):.3f} - {max(v):.3f} over {len(v)} rounds, {verdict}"
                    ratios.append(f"ratio {ratio} (tokens/s; call {call}, {model})")
            out.append(f"| {mode} | {len(m)} | {m[0][4]} | {statistics.median(ms):.2f} | {min(ms):.2f} - {max(ms):.2f} | "
                       f"{statistics.median(float(r[8]) for r in m):,.0f} | {ratio} |")
        out += [""] + ratios + [""]
    return out


def main(dirs):
    if not dirs:
        print(__doc__, file=sys.stderr)
        return 2
    out = ["# Results of the GPU session plan", "",
           "Made by `dev/gpu/gpu_results.py` from the files `dev/gpu/run_on_gpu.sh` wrote under `$OUT` "
           "(doc/cuda.md, \"A GPU session\"). Numbers are as measured once, on the machine named; nothing here "
           "is edited by hand.", ""]
    stage_rows, bench_rows, cuda_dev, attention, ncu, fp8, training = [], [], [], [], [], [], []
    for i, d in enumerate(dirs, 1):
        log = read(os.path.join(d, "main.log"))
        fp8_log = read(os.path.join(d, "fp8.log"))
        head = re.search(r"^==== run_on_gpu\.sh (.*)$", log, re.M)
        header = head.group(1) if head else "dev/cuda/bin/matmul_fp8 alone" if fp8_log else "(no header)"
        commit = re.search(r"commit: (.*)$", log, re.M)
        device = device_of(log, read(os.path.join(d, 'cuda_dev.md')) + "\n" + fp8_log)
        out.append(f"Call {i}: {header}; device: {device}; "
                   f"commit {commit.group(1) if commit else 'unknown'}.")
        out.append("")
        for line in read(os.path.join(d, "summary.tsv")).splitlines():
            f = line.split("\t")
            if len(f) == 5:
                stage_rows.append([str(i)] + f)
        for line in read(os.path.join(d, "bench.tsv")).splitlines():
            f = line.split("\t")
            if len(f) == 11:  # before rounds: one run per mode, against ours -r 0
                f += ["1", "ours-r0"]
            if len(f) == 13:
                bench_rows.append([str(i)] + f)
        t = read(os.path.join(d, "attention.md")).strip()
        if t:
            attention.append((i, t))
        t = read(os.path.join(d, "cuda_dev.md")).strip()
        if t:
            cuda_dev.append((i, t))
        t = read(os.path.join(d, "ncu.md")).strip()
        if t:
            ncu.append((i, t))
        if fp8_log:
            fp8.append((i, fp8_log))
        t = read(os.path.join(d, "fp8.md")).strip()
        if t:
            training.append((i, t))
    out += ["## Stages", "", "| call | stage | lane | result | seconds | detail |", "| ---: | --- | --- | --- | ---: | --- |"]
    out += [f"| {' | '.join(r)} |" for r in stage_rows]
    failed = sum(r[3] == "failed" for r in stage_rows)
    passed = sum(r[3] == "passed" for r in stage_rows)
    out += ["", f"{len(stage_rows)} stages: {passed} passed, {failed} failed, "
                f"{len(stage_rows) - passed - failed} skipped.", ""]
    out += ["## Throughput beside the peers (llm.c, PyTorch)", ""]
    if bench_rows:
        out += ratio_lines(bench_rows)
        out += ["", "Every run:", "",
                "| call | side | mode | model | B | T | steps | ms/step | tokens/s | MFU % | peak MiB | warm-up s | round |",
                "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        side = {"llmc": "llm.c"}  # bench.tsv's word for llm.c's train_gpt2cu
        out += [f"| {' | '.join([r[0], side.get(r[1], r[1])] + r[2:13])} |" for r in bench_rows]
    else:
        out.append("(no benchmark ran)")
    out += ["", "## Attention beside FlashAttention-2", ""]
    for i, t in attention:
        out += [f"Call {i}:", "", t, ""]
    if not attention:
        out += ["(did not run)", ""]
    out += ["", "## dev/cuda", ""]
    for i, t in cuda_dev:
        out += [f"Call {i}:", "", t, ""]
    if not cuda_dev:
        out += ["(did not run)", ""]
    out += ["## A step's time split and its costliest kernels (Nsight Compute)", ""]
    for i, t in ncu:
        out += [f"Call {i}:", "", t, ""]
    if not ncu:
        out += ["(did not run)", ""]
    out += ["## FP8 against BF16 at the trainer's GEMMs (dev/cuda/matmul_fp8)", ""]
    for i, t in fp8:
        out += [f"Call {i}:", ""] + fp8_table(t) + [""]
    if not fp8:
        out += ["(did not run)", ""]
    out += ["## FP8 training against BF16 (the stage fp8: dev/compare_fp8.sh)", ""]
    for i, t in training:
        out += [f"Call {i}:", "", "```", t, "```", ""]
    if not training:
        out += ["(did not run)", ""]
    print("\n".join(out))
    return 0


def fp8_table(log):
    """matmul_fp8's FP8| lines as a table (times in us; ratios bf16 time over the FP8 time), its step
    line, and any refusal or error it printed."""
    rows, notes = [], []
    for line in log.splitlines():
        f = line.split("|")
        if f[0] == "FP8" and len(f) == 12:
            rows.append(f"| {f[1]} | {f[2]} x {f[3]} x {f[4]} | {f[5]} | {f[6]} | {f[7]} | {f[8]} | {float(f[9]):.2f}x "
                        f"| {float(f[10]):.2f}x | {float(f[11]):.2f}x |")
        elif f[0] == "FP8" or line.startswith(("one d12", "Error", "ceiling: cuBLAS")) or "FAIL" in line:
            notes.append(line)
    table = []
    if rows:
        table = ["| GEMM | M x N x K | bf16 us | fp8 us | fp8 fast us | casts us | bf16 / fp8 | bf16 / fast "
                 "| bf16 / (fast + casts) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"] + rows
    return table + ([""] if table and notes else []) + notes


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
