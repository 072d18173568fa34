#!/usr/bin/env bash
# AdamW against Muon on the CPU (doc/optimizers.md, "A measured comparison"), on tinyshakespeare
# (dev/data/tinyshakespeare.sh), the same steps and schedule for every run:
#   1. AdamW at each -l of ADAMW_LRS; the best val loss at the end picks -l
#   2. Muon at each -ml of MUON_LRS, with that -l for the tensors AdamW keeps
#   3. the step time of each optimizer measured back to back (3 rounds of 30 steps, median), because
#      the runs' own timings are only as steady as the machine: on a shared one they are not
#   4. val and train loss against steps, and against seconds (each step counted at its measured time),
#      the best run of each, as PNGs in doc/
# MODEL=small (default): a 4-layer, C = 128 GPT-2, 500 steps of 8 x 64 tokens, warmup 25, -l 1e-3 3e-3
#   1e-2, -ml 0.003 0.01 0.03 0.1; doc/optimizers_steps.png, doc/optimizers_seconds.png.
# MODEL=main: the main job's model and batch (scripts/run_tinyshakespeare.sh: d6, 400 steps of 4 x 64
#   tokens, warmup 10), -l 1e-3 3e-3, -ml 0.01 0.03; doc/optimizers_main_steps.png, ..._seconds.png.
# Writes under build/compare_optimizers[_main]/. STEPS, VAL_EVERY (50), ADAMW_LRS and MUON_LRS change them.
#
#   dev/compare_optimizers.sh
#   MODEL=main dev/compare_optimizers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-small}
val_every=${VAL_EVERY:-50}
python=$(scripts/find_python.sh)
[ -f dev/data/tinyshakespeare/tinyshakespeare_train_000000.bin ] || { echo "run dev/data/tinyshakespeare.sh first" >&2; exit 1; }
make -s train_gpt2
case $model in
    small)
        out=build/compare_optimizers png=doc/optimizers steps=${STEPS:-500} B=8 T=64
        adamw_lrs=${ADAMW_LRS:-1e-3 3e-3 1e-2} muon_lrs=${MUON_LRS:-0.003 0.01 0.03 0.1}
        mkdir -p "$out"
        "$python" test/oracle/gpt2_oracle.py --out "$out/init" --layers 4 --channels 128 --heads 4 --max-seq-len 64 \
            --vocab 50257 --seed 1 -b 1 -t 8 --data-tokens 100 > /dev/null
        init="$out/init/model.bin" schedule="-u 25 -q 0.1 -m 32" ;;
    main)  # scripts/run_tinyshakespeare.sh's model, batch and schedule
        out=build/compare_optimizers_main png=doc/optimizers_main steps=${STEPS:-400} B=4 T=64
        adamw_lrs=${ADAMW_LRS:-1e-3 3e-3} muon_lrs=${MUON_LRS:-0.01 0.03}
        init=d6 schedule="-u 10 -q 0.1 -m 16" ;;
    *) echo "MODEL must be small or main, not '$model'" >&2; exit 1 ;;
esac
mkdir -p "$out"
common="-e $init -b $B -t $T -x $steps $schedule -k cosine -c 0.1 -v $val_every -s 0 -sh 1"
final_val() { grep 'val loss' "$out/$1.log" | tail -1 | awk '{print $NF}'; }
run() {
    local name=$1
    shift
    rm -rf "${out:?}/$name"
    OMP_NUM_THREADS=2 ./train_gpt2 $common "$@" -o "$out/$name" > "$out/$name.log" 2>&1
    echo "$name: val loss $(final_val "$name") at step $steps"
}
for lr in $adamw_lrs; do run "adamw_l$lr" -l $lr; done
best_lr=$(for lr in $adamw_lrs; do echo "$(final_val "adamw_l$lr") $lr"; done | sort -g | head -1 | awk '{print $2}')
for ml in $muon_lrs; do run "muon_ml$ml" -opt muon -l "$best_lr" -ml $ml; done
best_ml=$(for ml in $muon_lrs; do echo "$(final_val "muon_ml$ml") $ml"; done | sort -g | head -1 | awk '{print $2}')
echo "tuned: AdamW -l $best_lr; Muon -ml $best_ml (with -l $best_lr)"

# each step's milliseconds, steps 5..29 of 3 rounds, AdamW and Muon alternating
for round in 1 2 3; do
    for opt in adamw muon; do
        OMP_NUM_THREADS=2 ./train_gpt2 -e "$init" -b $B -t $T -x 30 -v 0 -s 0 -opt $opt -l "$best_lr" \
            -ml "$best_ml" 2>&1 | grep -E '^step +([5-9]|[12][0-9])/30 ' | sed -E "s/.*\| ([0-9.]+) ms \| .*/$opt \1/"
    done
done > "$out/step_ms.txt"

"$python" - "$out" "adamw_l$best_lr" "muon_ml$best_ml" $((B * T)) <<'EOF'
import json, os, statistics, sys
out, adamw, muon, tokens = sys.argv[1:]
ms = {"adamw": [], "muon": []}
for line in open(os.path.join(out, "step_ms.txt")):
    opt, value = line.split()
    ms[opt].append(float(value))
median = {opt: statistics.median(values) for opt, values in ms.items()}
print(f"step time, back to back: AdamW {median['adamw']:.1f} ms, Muon {median['muon']:.1f} ms (median of {len(ms['muon'])})")
for name, opt in ((adamw, "adamw"), (muon, "muon")):  # the runs' metrics, each step at the measured time
    os.makedirs(os.path.join(out, "timed", name), exist_ok=True)
    with open(os.path.join(out, name, "metrics.jsonl")) as f, open(os.path.join(out, "timed", name, "metrics.jsonl"), "w") as g:
        for line in f:
            item = json.loads(line)
            if "ms" in item:
                item["ms"], item["tokens_per_s"] = median[opt], int(tokens) / (median[opt] / 1000)
            g.write(json.dumps(item) + "\n")
EOF
labels=("AdamW -l $best_lr" "Muon -ml $best_ml (AdamW -l $best_lr)")
"$python" dev/plot_metrics.py "$out/adamw_l$best_lr/metrics.jsonl" "$out/muon_ml$best_ml/metrics.jsonl" --labels "${labels[@]}" \
    -o "${png}_steps.png" --width 1200 --height 750
"$python" dev/plot_metrics.py "$out/timed/adamw_l$best_lr/metrics.jsonl" "$out/timed/muon_ml$best_ml/metrics.jsonl" \
    --labels "${labels[@]}" --x seconds -o "${png}_seconds.png" --width 1200 --height 750
