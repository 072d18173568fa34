#!/usr/bin/env bash
# Throughput of train_gpt2cu beside llm.c and PyTorch on the same GPU, in interleaved rounds: see
# dev/bench_gpu.py, which this runs (its environment variables pick the modes, model, sizes, rounds).
#
#   dev/bench_gpu.sh [steps]       d12, B=64, T=1024, 3 rounds of ours -r 0, llm.c -r 0, PyTorch compiled, -bg 1
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] && export BENCH_STEPS=$1
exec "${PYTHON:-$(scripts/find_python.sh)}" dev/bench_gpu.py
