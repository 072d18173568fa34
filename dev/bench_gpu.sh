#!/usr/bin/env bash
# Throughput of train_gpt2cu next to PyTorch (the oracle's model: test/oracle/gpt2_oracle.py --bench)
# on the same GPU in the same run, and their ratio. A benchmark, not a test: it prints numbers and
# checks nothing. Default: GPT-2 124M (d12), B=64, T=1024 for both sides; ours at -r 0 and -r 1,
# PyTorch eager and torch.compile (bf16 autocast, scaled_dot_product_attention, fused AdamW), the
# compile's time counted apart from the timed steps.
#
#   dev/bench_gpu.sh [steps]                     d12, B=64 (halved on out-of-memory, for each side alone)
#   BENCH_MODEL=d24 BENCH_B=32 dev/bench_gpu.sh 20
#   BENCH_TSV=FILE                               also append one tab-separated line per run to FILE:
#       side  mode  model  B  T  steps  ms_per_step  tokens_per_s  mfu_pct  peak_mib  warmup_s
#     (peak_mib: the most GPU memory in use during the run by nvidia-smi, process context included,
#     for both sides; "-" where nvidia-smi is missing. mfu_pct of PyTorch: ours scaled by the tokens/s
#     ratio, the same FLOPs per token on the same peak. warmup_s: start to the first timed step.)
#
# Environment (for the rehearsal under the emulator, test/gpu/rehearse.sh): TRAINER (default
# ./train_gpt2cu), BENCH_OURS_MODEL (a -e value, default BENCH_MODEL), BENCH_TORCH_MODEL (oracle model
# flags, default --model BENCH_MODEL), BENCH_V (token ids drawn below it, default 50257),
# BENCH_DEVICE (cuda; cpu leaves out bf16 autocast), BENCH_MODES (default "ours-r0 torch-eager ours-r1
# torch-compile ours-muon": the order they run in, most wanted first, so a time limit cuts the least
# wanted; ours-muon is -r 0 with -opt muon, its ratio against ours-r0 the cost of Newton-Schulz;
# ours-ge1, not in the default list, is -r 0 with -ge 1, GELU in the cuBLASLt epilogues; ours-oo1, last,
# is -r 0 with -oo 1, AdamW's state on the host, its ratio against ours-r0 the cost of the offload;
# ours-at1, after it, is -r 0 with -at 1, cuBLASLt's candidates timed per matmul problem, its ratio
# against ours-r0 what autotuning gains; ours-bg1, last, is -r 0 with -bg 1, the bias gradients from
# cuBLASLt's BGRADB epilogue, its ratio against ours-r0 whether that beats our kernel).
# Tokens are random ids in a synthetic shard: speed does not depend on them.
set -uo pipefail
steps=${1:-20}
python=${PYTHON:-$(scripts/find_python.sh)}
model=${BENCH_MODEL:-d12}
ours_model=${BENCH_OURS_MODEL:-$model}
torch_model=${BENCH_TORCH_MODEL:---model $model}
B0=${BENCH_B:-64}
T=${BENCH_T:-1024}
V=${BENCH_V:-50257}
device=${BENCH_DEVICE:-cuda}
trainer=${TRAINER:-./train_gpt2cu}
modes=${BENCH_MODES:-ours-r0 torch-eager ours-r1 torch-compile ours-muon ours-oo1 ours-at1 ours-bg1}
tsv=${BENCH_TSV:-/dev/null}
work=build/bench_gpu
mkdir -p "$work"

[ -x "$trainer" ] || { echo "bench_gpu.sh: build the trainer first (make train_gpt2cu)"; exit 1; }

# 2^22 random token ids below V (2^16 for a small V): 64 steps at B=64, T=1024 before they repeat;
# made once per V
shard="$work/v$V/train_000000.bin"
mkdir -p "$work/v$V"
if [ ! -f "$shard" ]; then  # dev/bench_cpu.py's writer, the format of llmc/io/dataloader.h
    n=$([ "$V" -gt 1000 ] && echo $((1 << 22)) || echo $((1 << 16)))
    "$python" -c 'import sys; sys.path.insert(0, "dev"); from bench_cpu import write_shard; write_shard(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))' \
        "$shard.tmp" "$n" "$V" && mv "$shard.tmp" "$shard" || exit 1
fi

# the most GPU memory in use while "$@" runs (MiB, nvidia-smi every 100 ms), into $work/peak
with_peak_memory() {
    if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
        echo "-" > "$work/peak"; "$@"; return $?
    fi
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$work/smi.log" 2> /dev/null &
    local smi=$! rc
    "$@"; rc=$?
    kill $smi 2> /dev/null; wait $smi 2> /dev/null
    awk 'BEGIN { m = 0 } { if ($1 + 0 > m) m = $1 + 0 } END { print m }' "$work/smi.log" > "$work/peak"
    return $rc
}

ours_tps="" ours_mfu="" ours_B=""
row() { printf '%s\n' "$*" | tr ' ' '\t' >> "$tsv"; }

run_ours() {  # run_ours RECOMPUTE [OPTIMIZER [GELU_FUSION [OFFLOAD [AUTOTUNE [BIAS_GRAD_EPILOGUE]]]]]
    local r=$1 opt=${2:-adamw} ge=${3:-0} oo=${4:-0} at=${5:-0} bg=${6:-0} b
    local log="$work/ours_r${r}_${opt}_ge${ge}_oo${oo}_at${at}_bg$bg.log" mode="r$r"
    [ "$opt" = adamw ] || mode="$opt-r$r"
    [ "$ge" = 0 ] || mode="ge$ge-$mode"
    [ "$oo" = 0 ] || mode="oo$oo-$mode"
    [ "$at" = 0 ] || mode="at$at-$mode"
    [ "$bg" = 0 ] || mode="bg$bg-$mode"
    for b in $B0 $((B0 / 2)) $((B0 / 4)) $((B0 / 8)); do
        [ "$b" -ge 1 ] || break
        local start=$SECONDS
        with_peak_memory "$trainer" -e "$ours_model" -i "$work/v$V/train_*.bin" -b $b -t $T -x "$steps" -v 0 -s 0 \
            -r "$r" -opt "$opt" -ge "$ge" -oo "$oo" -at "$at" -bg "$bg" > "$log" 2>&1
        local rc=$?
        if [ $rc -ne 0 ]; then
            if grep -qi "out of memory" "$log"; then echo "train_gpt2cu -r $r: B=$b out of memory"; continue; fi
            echo "train_gpt2cu -r $r failed (exit $rc):"; tail -n 5 "$log"; return 1
        fi
        # the mean over the steps after the first 3 (warm-up: cuBLASLt's heuristics, clocks)
        read -r ms tps mfu < <(awk '/^step +[0-9]+\// { n++; if (n <= 3) next
                match($0, /\| [0-9.]+ ms \|/); ms += substr($0, RSTART + 2, RLENGTH - 6)
                match($0, /\| [0-9.]+ tok\/s/); tps += substr($0, RSTART + 2, RLENGTH - 8)
                if (match($0, /MFU [0-9.]+%/)) mfu += substr($0, RSTART + 4, RLENGTH - 5); k++ }
            END { if (k == 0) print "nan nan nan"; else printf "%.2f %.0f %.1f\n", ms / k, tps / k, mfu / k }' "$log")
        grep -m 1 "^device memory" "$log"
        grep -m 1 "^offload:" "$log"
        grep -m 1 "^matmul autotune" "$log"
        grep -m 1 "no BGRADB algorithm" "$log"
        echo "train_gpt2cu -r $r -opt $opt -ge $ge -oo $oo -at $at -bg $bg: $ours_model, B=$b, T=$T, $steps steps: $ms ms/step, $tps tokens/s, MFU $mfu%," \
             "peak $(cat "$work/peak") MiB in use (nvidia-smi)"
        row ours "$mode" "$ours_model" $b $T "$steps" "$ms" "$tps" "$mfu" "$(cat "$work/peak")" "-"
        if [ "$opt" != adamw ] || [ "$ge" != 0 ] || [ "$oo" != 0 ] || [ "$at" != 0 ] || [ "$bg" != 0 ]; then
            [ -n "$ours_tps" ] && awk -v a="$tps" -v b="$ours_tps" -v o="-opt $opt -ge $ge -oo $oo -at $at -bg $bg" \
                'BEGIN { printf "ratio train_gpt2cu %s / -opt adamw -ge 0 -oo 0 -at 0 -bg 0: %.3fx (tokens/s)\n", o, a / b }'
        elif [ "$r" = 0 ] || [ -z "$ours_tps" ]; then ours_tps=$tps; ours_mfu=$mfu; ours_B=$b; fi
        return 0
    done
    echo "train_gpt2cu -r $r: not even B=$((B0 / 8)) fits"; return 1
}

run_torch() {  # run_torch eager|compile
    local mode=$1 b flags="--bench $steps --device $device --sdpa"
    [ "$device" = cuda ] && flags="$flags --bf16"
    [ "$mode" = compile ] && flags="$flags --compile"
    for b in $B0 $((B0 / 2)) $((B0 / 4)) $((B0 / 8)); do
        [ "$b" -ge 1 ] || break
        # shellcheck disable=SC2086
        with_peak_memory "$python" test/oracle/gpt2_oracle.py $torch_model -b $b -t $T $flags \
            > "$work/torch_$mode.log" 2> "$work/torch_$mode.err"
        local rc=$?
        if [ $rc -ne 0 ]; then
            if grep -qi "out of memory" "$work/torch_$mode.err"; then echo "pytorch $mode: B=$b out of memory"; continue; fi
            echo "pytorch $mode failed (exit $rc):"; tail -n 5 "$work/torch_$mode.err"; return 1
        fi
        local ms warm tps mfu peak
        ms=$(awk '/^oracle_ms_per_step/ { print $2 }' "$work/torch_$mode.log")
        warm=$(awk '/^oracle_warmup_s/ { print $2 }' "$work/torch_$mode.log")
        tps=$(awk -v b=$b -v t=$T -v ms="$ms" 'BEGIN { printf "%.0f", b * t / (ms / 1000) }')
        mfu=$(awk -v m="$ours_mfu" -v a="$tps" -v o="$ours_tps" 'BEGIN { if (o + 0 > 0 && m != "" && m != "nan") printf "%.1f", m * a / o; else print "-" }')
        peak=$(cat "$work/peak")
        echo "pytorch $mode (bf16 autocast, sdpa, fused AdamW): B=$b, T=$T, $steps steps: $ms ms/step, $tps tokens/s," \
             "MFU $mfu%, peak $peak MiB in use (nvidia-smi), $(awk '/^oracle_peak_mib/ { print $2 }' "$work/torch_$mode.log") MiB" \
             "allocated (torch), warm-up (2 steps, compile included) $warm s"
        row torch "$mode" "$model" $b $T "$steps" "$ms" "$tps" "$mfu" "$peak" "$warm"
        if [ -n "$ours_tps" ]; then
            awk -v a="$ours_tps" -v b="$tps" -v m="$mode" 'BEGIN { printf "ratio train_gpt2cu / pytorch %s: %.2fx (tokens/s)\n", m, a / b }'
        fi
        return 0
    done
    echo "pytorch $mode: not even B=$((B0 / 8)) fits"; return 1
}

rc=0
for m in $modes; do
    case $m in
        ours-r0) run_ours 0 || rc=1 ;;
        ours-r1) run_ours 1 || rc=1 ;;
        ours-muon) run_ours 0 muon || rc=1 ;;
        ours-ge1) run_ours 0 adamw 1 || rc=1 ;;
        ours-oo1) run_ours 0 adamw 0 1 || rc=1 ;;
        ours-at1) run_ours 0 adamw 0 0 1 || rc=1 ;;
        ours-bg1) run_ours 0 adamw 0 0 0 1 || rc=1 ;;
        torch-eager) run_torch eager || rc=1 ;;
        torch-compile) run_torch compile || rc=1 ;;
        *) echo "bench_gpu.sh: no mode $m"; rc=1 ;;
    esac
done
exit $rc
