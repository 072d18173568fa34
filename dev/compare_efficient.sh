#!/usr/bin/env bash
# Memory- and communication-efficient training against plain data parallelism (issue 49; doc/optimizers.md
# "8-bit AdamW", doc/data_parallel.md "Moving fewer bytes"): NP (default 2) data-parallel processes, 30 steps of a
# small GPT-2 (2 layers, C = 64, the GPT-2 vocabulary: 3.3 M parameters, most of them wte) on
# tinyshakespeare, the same flags for every run but the one under test; prints each run's final val loss
# against plain AdamW's, its bytes moved a step (metrics.jsonl's comm_bytes, process 0) and its state
# file (process 0).
#   dev/compare_efficient.sh                                 the CPU trainer (mpirun -np 2)
#   TRAINER=train_gpt2cu_emu dev/compare_efficient.sh        the CUDA trainer under the emulator (minutes)
#   TRAINER=train_gpt2cu dev/compare_efficient.sh            on GPUs (2 of them)
#   MODEL=main dev/compare_efficient.sh                      the main job's model and batch instead (d6, 400
#       steps of 4 x 64 tokens a process, warmup 10, val every 50), with plots of val loss against steps
#       and against MiB communicated: doc/efficient_main_steps.png, doc/efficient_main_mib.png
# RUNS picks the runs besides plain AdamW (default "adamw8 sign powersgd lh4"; also powersgd1 (-gr 1),
# lh16, lh4avg (-lh 4 -lo 0)); Z (default 0) the ZeRO stage of all of them (-gc and -lh need 0); STEPS
# (30, main: 400); REUSE=1 keeps the runs whose log has their last val loss already. Writes
# build/compare_efficient/.
set -euo pipefail
cd "$(dirname "$0")/.."
trainer=${TRAINER:-train_gpt2}
z=${Z:-0}
model=${MODEL:-small}
runs=${RUNS:-adamw8 sign powersgd lh4}
python=$(scripts/find_python.sh)
data=dev/data/tinyshakespeare
[ -f $data/tinyshakespeare_train_000000.bin ] || { echo "run dev/data/tinyshakespeare.sh first" >&2; exit 1; }
make -s "$trainer"
out=build/compare_efficient/$trainer/$model$([ "${NP:-2}" = 2 ] || echo "_np${NP}")
mkdir -p "$out"
case $model in
    small)
        steps=${STEPS:-30} val_every=$steps init="$out/init/model.bin" schedule="-u 3 -m 16"
        "$python" test/oracle/gpt2_oracle.py --out "$out/init" --layers 2 --channels 64 --heads 4 --max-seq-len 64 \
            --vocab 50257 --seed 1 -b 1 -t 8 --data-tokens 100 > /dev/null ;;
    main)  # scripts/run_tinyshakespeare.sh's model, batch and schedule
        steps=${STEPS:-400} val_every=50 init=d6 schedule="-u 10 -q 0.1 -m 16" ;;
    *) echo "MODEL must be small or main, not '$model'" >&2; exit 1 ;;
esac
np=${NP:-2}
launch="mpirun --allow-run-as-root --oversubscribe --bind-to none -np $np"
case $trainer in *_emu) launch="env EMU_DEVICE_COUNT=$np $launch -x EMU_DEVICE_COUNT" ;; esac
flags_of() {
    case $1 in
        adamw) echo "" ;;
        adamw8) echo "-opt adamw8" ;;
        sign) echo "-gc sign" ;;
        powersgd) echo "-gc powersgd -gr 4" ;;
        powersgd1) echo "-gc powersgd -gr 1" ;;
        lh4) echo "-lh 4" ;;
        lh16) echo "-lh 16" ;;
        lh4avg) echo "-lh 4 -lo 0" ;;
        *) echo "unknown run '$1' (adamw8, sign, powersgd, powersgd1, lh4, lh16, lh4avg)" >&2; exit 1 ;;
    esac
}
for run in adamw $runs; do
    if [ "${REUSE:-0}" = 1 ] && grep -q "^step $steps: val loss" "$out/$run.log" 2>/dev/null; then continue; fi
    rm -rf "${out:?}/$run"
    OMP_NUM_THREADS=1 $launch ./$trainer -e "$init" -i "$data/tinyshakespeare_train_*.bin" \
        -j "$data/tinyshakespeare_val_*.bin" -b 4 -t 64 -x "$steps" -l 1e-3 $schedule -c 0.1 -v "$val_every" -s 0 \
        -n "$steps" -z "$z" $(flags_of $run) -o "$out/$run" > "$out/$run.log" 2>&1
done
val() { grep 'val loss' "$out/$1.log" | tail -1 | awk '{print $NF}'; }
state() { cat "$out/$1"/state_*_00000.bin | wc -c; }
bytes() { grep -o '"comm_bytes": [0-9]*' "$out/$1/metrics.jsonl" | awk '{s += $2; n++} END {printf "%.0f", s / n}'; }
echo "$trainer, $np processes, -z $z, MODEL=$model, $steps steps"
printf "  %-8s %10s %9s %14s %9s %12s %9s\n" run "val loss" "vs adamw" "bytes a step" "vs adamw" "state file" "vs adamw"
for run in adamw $runs; do
    awk -v r="$run" -v v="$(val $run)" -v v0="$(val adamw)" -v b="$(bytes $run)" -v b0="$(bytes adamw)" \
        -v s="$(state $run)" -v s0="$(state adamw)" 'BEGIN {
        printf "  %-8s %10.4f %8.2f%% %14d %8.1f%% %12d %8.1f%%\n", r, v, 100 * (v / v0 - 1), b, 100 * b / b0, s, 100 * s / s0 }'
done
if [ "$model" = main ]; then
    files=() labels=()
    for run in adamw $runs; do files+=("$out/$run/metrics.jsonl"); labels+=("$run"); done
    "$python" dev/plot_metrics.py "${files[@]}" --labels "${labels[@]}" -o doc/efficient_main_steps.png --width 1200 --height 750
    "$python" dev/plot_metrics.py "${files[@]}" --labels "${labels[@]}" --x mib -o doc/efficient_main_mib.png --width 1200 --height 750
fi
