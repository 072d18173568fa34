#!/usr/bin/env bash
# AdamW against Muon on the CPU (doc/optimizers.md, "A measured comparison"): a 4-layer, C = 128 GPT-2 on
# tinyshakespeare (dev/data/tinyshakespeare.sh), the same steps and schedule for every run.
#   1. AdamW at -l 1e-3, 3e-3, 1e-2; the best val loss at the end picks -l
#   2. Muon at -ml 0.003, 0.01, 0.03, 0.1, with that -l for the tensors AdamW keeps
#   3. the step time of each optimizer measured back to back (3 rounds of 30 steps, median), because
#      the runs' own timings are only as steady as the machine: on a shared one they are not
#   4. doc/optimizers_steps.png (val and train loss against steps, the best run of each) and
#      doc/optimizers_seconds.png (the same against seconds, each step counted at its measured time)
# Writes under build/compare_optimizers/. STEPS (default 500) and VAL_EVERY (50) shorten a trial run.
#
#   dev/compare_optimizers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/compare_optimizers
steps=${STEPS:-500}
val_every=${VAL_EVERY:-50}
python=$(scripts/find_python.sh)
mkdir -p "$out"
[ -f dev/data/tinyshakespeare/tinyshakespeare_train_000000.bin ] || { echo "run dev/data/tinyshakespeare.sh first" >&2; exit 1; }
make -s train_gpt2
"$python" test/oracle/gpt2_oracle.py --out "$out/init" --layers 4 --channels 128 --heads 4 --max-seq-len 64 --vocab 50257 \
    --seed 1 -b 1 -t 8 --data-tokens 100 > /dev/null
common="-e $out/init/model.bin -b 8 -t 64 -x $steps -u 25 -q 0.1 -k cosine -c 0.1 -v $val_every -m 32 -s 0 -sh 1"
final_val() { grep 'val loss' "$out/$1.log" | tail -1 | awk '{print $NF}'; }
run() {
    local name=$1
    shift
    rm -rf "${out:?}/$name"
    OMP_NUM_THREADS=2 ./train_gpt2 $common "$@" -o "$out/$name" > "$out/$name.log" 2>&1
    echo "$name: val loss $(final_val "$name") at step $steps"
}
for lr in 1e-3 3e-3 1e-2; do run "adamw_l$lr" -l $lr; done
best_lr=$(for lr in 1e-3 3e-3 1e-2; do echo "$(final_val "adamw_l$lr") $lr"; done | sort -g | head -1 | awk '{print $2}')
for ml in 0.003 0.01 0.03 0.1; do run "muon_ml$ml" -opt muon -l "$best_lr" -ml $ml; done
best_ml=$(for ml in 0.003 0.01 0.03 0.1; do echo "$(final_val "muon_ml$ml") $ml"; done | sort -g | head -1 | awk '{print $2}')
echo "tuned: AdamW -l $best_lr; Muon -ml $best_ml (with -l $best_lr)"

# each step's milliseconds, steps 5..29 of 3 rounds, AdamW and Muon alternating
for round in 1 2 3; do
    for opt in adamw muon; do
        OMP_NUM_THREADS=2 ./train_gpt2 -e "$out/init/model.bin" -b 8 -t 64 -x 30 -v 0 -s 0 -opt $opt -l "$best_lr" \
            -ml "$best_ml" 2>&1 | grep -E '^step +([5-9]|[12][0-9])/30 ' | sed -E "s/.*\| ([0-9.]+) ms \| .*/$opt \1/"
    done
done > "$out/step_ms.txt"

"$python" - "$out" "adamw_l$best_lr" "muon_ml$best_ml" <<'EOF'
import json, os, statistics, sys
out, adamw, muon = sys.argv[1:]
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
                item["ms"], item["tokens_per_s"] = median[opt], 8 * 64 / (median[opt] / 1000)
            g.write(json.dumps(item) + "\n")
EOF
labels=("AdamW -l $best_lr" "Muon -ml $best_ml (AdamW -l $best_lr)")
"$python" dev/plot_metrics.py "$out/adamw_l$best_lr/metrics.jsonl" "$out/muon_ml$best_ml/metrics.jsonl" --labels "${labels[@]}" \
    -o doc/optimizers_steps.png --width 1200 --height 750
"$python" dev/plot_metrics.py "$out/timed/adamw_l$best_lr/metrics.jsonl" "$out/timed/muon_ml$best_ml/metrics.jsonl" \
    --labels "${labels[@]}" --x seconds -o doc/optimizers_seconds.png --width 1200 --height 750
