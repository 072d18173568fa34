#!/usr/bin/env bash
# The memory table of doc/data_parallel.md: ZeRO stage 0..3 x 1..3 processes of the CPU trainer, a
# couple of steps each, with process 0's bytes of model state (allocated, and the ZeRO paper's
# formula) and its measured peak resident memory (getrusage, from the start of training).
#   dev/zero_memory.sh [MODEL] [STEPS] [TRAIN_FILE]     e.g. dev/zero_memory.sh d12 2 train.bin
# MODEL is a -e descriptor (d6, d12, ...) or file; TRAIN_FILE any token file (default: the test oracle's).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-d12}
steps=${2:-2}
train=${3:-build/oracle/tiny_odd/train.bin}
[ -f "$train" ] || { echo "no training tokens at $train (run the distributed tests once, or pass a file)"; exit 1; }
printf "| stage | N | model state (allocated) | formula | gather buffers | peak RSS of process 0 |\n|---|---|---|---|---|---|\n"
for z in 0 1 2 3; do
    for np in 1 2 3; do
        log=$(OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np "$np" ./train_gpt2 -e "$model" \
              -i "$train" -b 1 -t 64 -x "$steps" -v 0 -s 0 -z "$z" 2>&1) || { echo "$log" | tail -5; exit 1; }
        state=$(echo "$log" | awk '/^  model state/ {print $3; f=$5} END {sub(/\)/, "", f); print f}')
        gather=$(echo "$log" | awk '/^  gather buffers/ {print $3}')
        peak=$(echo "$log" | sed -n 's/^peak resident memory of process 0: \([0-9.]*\) MiB.*/\1/p')
        set -- $state
        printf "| %d | %d | %.1f MiB | %.1f MiB | %.1f MiB | %s MiB |\n" "$z" "$np" "$(echo "$1/1048576" | bc -l)" \
               "$(echo "$2/1048576" | bc -l)" "$(echo "$gather/1048576" | bc -l)" "$peak"
    done
done
