#!/usr/bin/env python3
"""
Benchmark (not a test): step time of ./train_gpt2 against the oracle's PyTorch model (OpenBLAS) on the
same config, same machine, same thread count, run back to back. Prints both and the ratio.

    make train_gpt2 && /usr/bin/python3 dev/bench_cpu.py [--model d12] [-b 4] [-t 64] [--threads 2] [--steps 10]

A step is forward + backward + AdamW update on one micro-batch. The first 2 steps of each are warm-up
and not counted. Our trainer reads a shard of random token ids written here (the oracle's --bench
draws its own); the step time does not depend on the token values.
"""
import argparse
import os
import re
import struct
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_shard(path, num_tokens, vocab=50257, seed=0):
    tokens = np.random.default_rng(seed).integers(0, vocab, size=num_tokens, dtype=np.uint16)
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, num_tokens
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def ours_ms_per_step(args, shard, env):
    warmup = 2
    cmd = [os.path.join(ROOT, "train_gpt2"), "-e", args.model, "-i", shard, "-b", str(args.b), "-t", str(args.t),
           "-x", str(args.steps + warmup), "-v", "0", "-s", "0", "-sh", "0"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"train_gpt2 failed:\n{out.stdout}\n{out.stderr}")
    times = [float(m) for m in re.findall(r"\| ([0-9.]+) ms \|", out.stdout)]
    if len(times) != args.steps + warmup:
        sys.exit(f"expected {args.steps + warmup} step lines from train_gpt2, got {len(times)}:\n{out.stdout}")
    return sum(times[warmup:]) / args.steps


def oracle_ms_per_step(args, env):
    cmd = [sys.executable, os.path.join(ROOT, "test", "oracle", "gpt2_oracle.py"), "--model", args.model,
           "-b", str(args.b), "-t", str(args.t), "--threads", str(args.threads), "--bench", str(args.steps)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    m = re.search(r"oracle_ms_per_step ([0-9.]+)", out.stdout)
    if out.returncode != 0 or not m:
        sys.exit(f"oracle benchmark failed:\n{out.stdout}\n{out.stderr}")
    return float(m.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="d12")
    p.add_argument("-b", type=int, default=4)
    p.add_argument("-t", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()

    os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
    shard = os.path.join(ROOT, "build", "bench_tokens.bin")
    write_shard(shard, (args.steps + 3) * args.b * args.t + 1)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))

    ours = ours_ms_per_step(args, shard, env)
    torch_ms = oracle_ms_per_step(args, env)
    print(f"config: {args.model} B={args.b} T={args.t}, {args.threads} threads, {args.steps} timed steps")
    print(f"train_gpt2 (ours):  {ours:9.1f} ms/step")
    print(f"PyTorch (oracle):   {torch_ms:9.1f} ms/step")
    print(f"speedup: {torch_ms / ours:.2f}x (PyTorch time / our time; > 1 means we are faster)")


if __name__ == "__main__":
    main()
