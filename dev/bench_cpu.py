#!/usr/bin/env python3
"""
Benchmark (not a test): step time of ./train_gpt2 against the machine's FMA peak and against current
PyTorch on the same model, the same machine and the same thread count, in the same run: PyTorch eager
and torch.compile (inductor, which generates C++ for the CPU), each with the BLAS its wheel bundles.
Prints the measured peak, then a table: our ms/step, GFLOP/s and fraction of peak, PyTorch's ms/step
and the ratios.

    make bench-cpu     (= make train_gpt2 build/cpu_peak && .venv/bin/python dev/bench_cpu.py)
    .venv/bin/python dev/bench_cpu.py [--model d12] [--shapes 4x64,8x256] [--threads 2] [--steps 10]

FLOPs per step are the trainer's estimate (llmc/gpt2_config.h flops_per_token): (6N + 6LCT) * B * T,
N counting every parameter. The peak is build/cpu_peak (llmc/cpu_peak.h: a timed loop of independent
FMAs on every thread), measured at the start and at the end of the run; the fraction uses the larger
of the two (the one less disturbed by other processes). The load averages are printed with them.

A step is forward + backward + gradient clipping + AdamW on one micro-batch. PyTorch's step is written
the way a user would write it (test/oracle/gpt2_oracle.py --bench): the oracle's model with
scaled_dot_product_attention, autograd, clip_grad_norm_, torch.optim.AdamW (fused). The first 2 steps
of each are warm-up and not counted (for torch.compile they include the compilation). Our trainer
reads a shard of random token ids written here; step time does not depend on the token values.
Timings on a shared 2-core machine move by about +-10%: run it on a quiet machine.
"""
import argparse
import os
import re
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP = 2


def write_shard(path, num_tokens, vocab=50257, seed=0):
    import random
    rng = random.Random(seed)
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, num_tokens
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{num_tokens}H", *(rng.randrange(vocab) for _ in range(num_tokens))))


def ours_ms_per_step(model, B, T, steps, shard, env):
    cmd = [os.path.join(ROOT, "train_gpt2"), "-e", model, "-i", shard, "-b", str(B), "-t", str(T),
           "-x", str(steps + WARMUP), "-v", "0", "-s", "0", "-sh", "0",
           "-r", "0"]  # keep every activation, as PyTorch's autograd does (no recomputation)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"train_gpt2 failed:\n{out.stdout}\n{out.stderr}")
    times = [float(m) for m in re.findall(r"\| ([0-9.]+) ms \|", out.stdout)]
    if len(times) != steps + WARMUP:
        sys.exit(f"expected {steps + WARMUP} step lines from train_gpt2, got {len(times)}:\n{out.stdout}")
    return sum(times[WARMUP:]) / steps


def fma_peak_gflops(threads, env):
    exe = os.path.join(ROOT, "build", "cpu_peak")
    if not os.path.exists(exe):
        sys.exit("bench_cpu: build/cpu_peak is missing; run `make build/cpu_peak` (make bench-cpu does)")
    out = subprocess.run([exe, str(threads)], env=env, capture_output=True, text=True)
    m = re.search(r"fma_peak_gflops ([0-9.]+)", out.stdout)
    if out.returncode != 0 or not m:
        sys.exit(f"bench_cpu: build/cpu_peak failed:\n{out.stdout}\n{out.stderr}")
    return float(m.group(1))


def step_gflop(model, B, T):
    """FLOPs of one training step, as llmc/gpt2_config.h's flops_per_token(cfg, T) * B * T."""
    sys.path.insert(0, os.path.join(ROOT, "test", "oracle"))
    import gpt2_oracle
    if model not in gpt2_oracle.MODEL_PRESETS:
        sys.exit(f"bench_cpu: FLOPs are known for the presets {sorted(gpt2_oracle.MODEL_PRESETS)}, not '{model}'")
    L, C, NH = gpt2_oracle.MODEL_PRESETS[model]
    N = gpt2_oracle.Config(1024, 50257, L, NH, C).num_params()
    return (6.0 * N + 6.0 * L * C * T) * B * T / 1e9


def load_averages():
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def torch_ms_per_step(model, B, T, steps, threads, compile_, env):
    cmd = [sys.executable, os.path.join(ROOT, "test", "oracle", "gpt2_oracle.py"), "--model", model,
           "-b", str(B), "-t", str(T), "--threads", str(threads), "--bench", str(steps), "--sdpa"]
    if compile_:
        cmd.append("--compile")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    m = re.search(r"oracle_ms_per_step ([0-9.]+)", out.stdout)
    if out.returncode != 0 or not m:
        sys.exit(f"PyTorch benchmark failed ({' '.join(cmd)}):\n{out.stdout}\n{out.stderr}")
    return float(m.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="d12")
    p.add_argument("--shapes", default="4x64,8x256", help="comma-separated BxT micro-batch shapes")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=10, help="timed steps per run (after 2 warm-up steps)")
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit(f"bench_cpu: {sys.executable} has no torch; run it with .venv/bin/python "
                 "(scripts/install_deps.sh makes it)")
    shapes = []
    for item in args.shapes.split(","):
        m = re.fullmatch(r"(\d+)x(\d+)", item.strip())
        if not m:
            sys.exit(f"bench_cpu: --shapes wants BxT items like 4x64, got '{item}'")
        shapes.append((int(m.group(1)), int(m.group(2))))

    os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    peak_start = fma_peak_gflops(args.threads, env)
    print(f"model {args.model}, {args.threads} threads, {args.steps} timed steps after {WARMUP} warm-up, "
          f"torch {torch.__version__}")
    print(f"FMA peak at start: {peak_start:.1f} GFLOP/s ({args.threads} threads), {load_averages()}", flush=True)
    rows = []
    for B, T in shapes:
        shard = os.path.join(ROOT, "build", f"bench_tokens_{B}x{T}.bin")
        write_shard(shard, (args.steps + WARMUP + 1) * B * T + 1)
        ours = ours_ms_per_step(args.model, B, T, args.steps, shard, env)
        print(f"{B}x{T}: train_gpt2 {ours:.1f} ms/step, {load_averages()}", flush=True)
        eager = torch_ms_per_step(args.model, B, T, args.steps, args.threads, False, env)
        compiled = torch_ms_per_step(args.model, B, T, args.steps, args.threads, True, env)
        rows.append((B, T, ours, eager, compiled))
    peak_end = fma_peak_gflops(args.threads, env)
    peak = max(peak_start, peak_end)
    print(f"FMA peak at end: {peak_end:.1f} GFLOP/s, {load_averages()}; fractions below use {peak:.1f}")
    print("| B x T | train_gpt2 ms/step | GFLOP/step | our GFLOP/s | of FMA peak | PyTorch eager ms/step "
          "| torch.compile ms/step | eager / ours | compile / ours |")
    print("|---|---|---|---|---|---|---|---|---|")
    for B, T, ours, eager, compiled in rows:
        gflop = step_gflop(args.model, B, T)
        achieved = gflop / (ours / 1000)
        print(f"| {B} x {T} | {ours:.1f} | {gflop:.1f} | {achieved:.1f} | {100 * achieved / peak:.0f}% | {eager:.1f} "
              f"| {compiled:.1f} | {eager / ours:.2f}x | {compiled / ours:.2f}x |")
    print("ratios are PyTorch time / our time: > 1 means train_gpt2 is faster")


if __name__ == "__main__":
    main()
