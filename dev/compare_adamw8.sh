#!/usr/bin/env bash
# 8-bit AdamW against AdamW (issue 49's check; doc/optimizers.md, "8-bit AdamW"): 2 data-parallel
# processes, 30 steps of a small GPT-2 (2 layers, C = 64, the GPT-2 vocabulary: 3.3 M parameters, most
# of them wte) on tinyshakespeare, the same flags for both; prints each run's final val loss, their
# ratio, and the state files' and the optimizer state's bytes.
#   dev/compare_adamw8.sh                 the CPU trainer (mpirun -np 2)
#   TRAINER=train_gpt2cu_emu dev/compare_adamw8.sh     the CUDA trainer under the emulator (minutes)
#   TRAINER=train_gpt2cu dev/compare_adamw8.sh         on GPUs (2 of them)
# Z (default 1) is the ZeRO stage; STEPS (30) the steps. Writes under build/compare_adamw8/.
set -euo pipefail
cd "$(dirname "$0")/.."
trainer=${TRAINER:-train_gpt2}
z=${Z:-1}
steps=${STEPS:-30}
python=$(scripts/find_python.sh)
data=dev/data/tinyshakespeare
[ -f $data/tinyshakespeare_train_000000.bin ] || { echo "run dev/data/tinyshakespeare.sh first" >&2; exit 1; }
make -s "$trainer"
out=build/compare_adamw8/$trainer
mkdir -p "$out"
"$python" test/oracle/gpt2_oracle.py --out "$out/init" --layers 2 --channels 64 --heads 4 --max-seq-len 64 \
    --vocab 50257 --seed 1 -b 1 -t 8 --data-tokens 100 > /dev/null
launch="mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2"
case $trainer in *_emu) launch="env EMU_DEVICE_COUNT=2 $launch -x EMU_DEVICE_COUNT" ;; esac
for opt in adamw adamw8; do
    rm -rf "${out:?}/$opt"
    OMP_NUM_THREADS=1 $launch ./$trainer -e "$out/init/model.bin" -i "$data/tinyshakespeare_train_*.bin" \
        -j "$data/tinyshakespeare_val_*.bin" -b 4 -t 64 -x "$steps" -l 1e-3 -u 3 -c 0.1 -v "$steps" -m 16 -s 0 \
        -n "$steps" -z "$z" -opt $opt -o "$out/$opt" > "$out/$opt.log" 2>&1
done
val() { grep 'val loss' "$out/$1.log" | tail -1 | awk '{print $NF}'; }
state() { cat "$out/$1"/state_*_00000.bin | wc -c; }
optimizer_line() { grep -m1 '^optimizer:' "$out/$1.log"; }
a=$(val adamw) b=$(val adamw8) sa=$(state adamw) sb=$(state adamw8)
echo "$trainer, 2 processes, -z $z, $steps steps"
echo "  AdamW:       val loss $a, process 0's state file $sa bytes"
echo "  8-bit AdamW: val loss $b, process 0's state file $sb bytes"
awk -v a="$a" -v b="$b" -v sa="$sa" -v sb="$sb" 'BEGIN {
    printf "  val loss: 8-bit / AdamW = %.4f (%+.2f%%); state file: %.1f%% of AdamW'"'"'s\n", b / a, 100 * (b / a - 1), 100 * sb / sa }'
echo "  $(optimizer_line adamw)"
echo "  $(optimizer_line adamw8)"
