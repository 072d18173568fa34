#!/usr/bin/env bash
# Nsight Compute over GPT-2 124M (d12) training at B=64, T=1024 (the benchmark's setting): every kernel's
# duration over 2 steps (-x 2), of which the second, steady step is kept (the longest suffix of the
# launch sequence that repeats the launches just before it); then the step's time split by kind of
# kernel (matmuls, attention, layernorm, GELU, classifier, optimizer, ...) and the costliest kernels,
# with SM, memory and DRAM throughput (% of the GPU's peak) of the five costliest from a second pass
# over their first 10 launches. Writes the tables to $NCU_OUT (default build/gpu_run/ncu.md): after
# pass 1 already, so a time limit during pass 2 keeps the split. ncu runs each kernel alone at the
# GPU's own clocks (--clock-control none): durations are each kernel's own, summed; the step's wall
# time is longer by whatever gaps the GPU idles (the benchmark's ms/step beside it says how much).
# Without ncu (or when it cannot read counters) prints "ncu_top.sh: SKIPPED (reason)" and exits 0.
#
#   TRAINER=./train_gpt2cu NCU_OUT=FILE dev/gpu/ncu_top.sh [B] [extra trainer flags]
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
trainer=${TRAINER:-./train_gpt2cu}
out=${NCU_OUT:-build/gpu_run/ncu.md}
B=${1:-64}
shift $(( $# > 0 ? 1 : 0 ))
extra=("$@")
work=build/gpu_run/ncu
mkdir -p "$work" "$(dirname "$out")"
python=${PYTHON:-$(scripts/find_python.sh 2>/dev/null || command -v python3)}

ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -n 1)
[ -n "$ncu" ] && [ -x "$ncu" ] || { echo "ncu_top.sh: SKIPPED (ncu not found)"; exit 0; }

shard=build/bench_gpu/v50257/train_000000.bin  # dev/bench_gpu.sh's random tokens; else made here
if [ ! -f "$shard" ]; then  # what dev/bench_gpu.sh writes: 2^22 token ids by dev/bench_cpu.py's writer
    mkdir -p build/bench_gpu/v50257
    "$python" -c 'import sys; sys.path.insert(0, "dev"); from bench_cpu import write_shard; write_shard(sys.argv[1], 1 << 22)' \
        "$shard.tmp" && mv "$shard.tmp" "$shard" || exit 1
fi

# Pass 1: each kernel's duration only (one counter pass, so no kernel is replayed: a replay saves and
# restores the device memory, slow with gigabytes allocated). Pass 2: the throughput counters, on the
# first 10 launches of the five costliest kernels only.
run_ncu() {  # run_ncu CSV [ncu options]
    local csv=$1
    shift
    echo "\$ $ncu --csv $* $trainer -e d12 -b $B -t 1024 -x 2 -v 0 -s 0 ${extra[*]}"
    "$ncu" --csv --print-units base --print-kernel-base function --clock-control none "$@" \
        "$trainer" -e d12 -i "build/bench_gpu/v50257/train_*.bin" -b "$B" -t 1024 -x 2 -v 0 -s 0 "${extra[@]}" > "$csv" 2> "$work/ncu.err"
    local rc=$?
    if [ $rc -ne 0 ] || ! grep -q '"gpu__time_duration.sum"\|"sm__throughput' "$csv"; then
        tail -n 20 "$work/ncu.err"; grep -v '^"' "$csv" | tail -n 20
        if grep -qiE "ERR_NVGPUCTRPERM|LibraryNotLoaded|not supported|permission" "$work/ncu.err" "$csv"; then
            echo "ncu_top.sh: SKIPPED (ncu cannot read the counters here)"; exit 0
        fi
        echo "ncu_top.sh: ncu failed (exit $rc)"; exit 1
    fi
}

start=$SECONDS
run_ncu "$work/durations.csv" --metrics gpu__time_duration.sum --launch-count 5000
echo "pass 1: $((SECONDS - start)) s"
# the kernels of the second step, and the five costliest names in it
top5=$("$python" dev/gpu/ncu_step.py top5 "$work/durations.csv")
metrics=sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed
metrics=$metrics,dram__throughput.avg.pct_of_peak_sustained_elapsed

write_table() {  # write_table THROUGHPUT_CSV (empty: durations only)
    "$python" dev/gpu/ncu_step.py table "$work/durations.csv" "$1" "$out" "$B" "${extra[*]:-}"
}
write_table /dev/null  # what pass 1 gives, in case pass 2 does not finish in time
run_ncu "$work/throughput.csv" --metrics "$metrics" --kernel-name "regex:^($top5)\$" --launch-count 10
echo "pass 2: $((SECONDS - start)) s"
write_table "$work/throughput.csv"
