#!/usr/bin/env bash
# The main job: build, prepare tinyshakespeare, train a small GPT-2 from scratch and sample from it.
#   scripts/run_tinyshakespeare.sh [extra train_gpt2 flags...]
# On a CPU-only machine this trains the fp32 CPU trainer for a few minutes on 2 cores. With an NVIDIA
# GPU (nvidia-smi works) and CUDA_TRAINER=1 it uses the CUDA trainer instead.
# Outputs: log_tinyshakespeare/main.log, metrics.jsonl, the final checkpoint model_*.bin, and the plot
# metrics.png when a Python with matplotlib is found (else the command that makes it is printed).
set -euo pipefail
cd "$(dirname "$0")/.."

make train_gpt2 tokenizer_gpt2
dev/data/tinyshakespeare.sh
data=dev/data/tinyshakespeare
out=${OUT_DIR:-log_tinyshakespeare}

trainer=./train_gpt2
if [ "${CUDA_TRAINER:-0}" = 1 ] && command -v nvidia-smi >/dev/null && nvidia-smi >/dev/null 2>&1; then
    make train_gpt2cu
    trainer=./train_gpt2cu
fi

# d6: 6 layers, 384 channels, 6 heads (30M parameters, most of them the 50257-token embedding).
# 4 x 64 tokens a step (more, smaller steps learn faster than fewer large ones at this budget), AdamW
# at 1e-3 with warmup and a cosine decay to 10%, weight decay 0.1. About 4-5 minutes on 2 cores.
# a rerun starts afresh: the previous run's checkpoints in $out go first (the trainer refuses a fresh
# run in a directory that holds another run's checkpoints: doc/reliability.md)
rm -f "$out"/model_*.bin "$out"/state_*.bin "$out"/DONE_*
steps=${STEPS:-400}
$trainer -e d6 -i "$data/tinyshakespeare_train_*.bin" -j "$data/tinyshakespeare_val_*.bin" \
    -tk "$data/gpt2_tokenizer.bin" -o "$out" \
    -b 4 -t 64 -x "$steps" -l 1e-3 -u 10 -q 0.1 -c 0.1 -v 100 -m 16 -s 200 -g 64 -n "$steps" "$@"

# how good is that? the unigram model (token frequencies of the training split) is the baseline;
# computed with od and awk, so the main job needs no Python
tokens() { for f in $1; do od -An -tu2 -v -j1024 "$f"; done; }
{ tokens "$data/tinyshakespeare_train_*.bin" | sed 's/^/T /'; tokens "$data/tinyshakespeare_val_*.bin" | sed 's/^/V /'; } |
awk -v vocab=50257 '
    $1 == "T" { for (i = 2; i <= NF; i++) { count[$i]++; n++ } }
    $1 == "V" { for (i = 2; i <= NF; i++) val[++m] = $i }
    END {
        # add-one smoothing so unseen val tokens have a finite cost
        for (j = 1; j <= m; j++) cost += -log((count[val[j]] + 1) / (n + vocab))
        printf "unigram baseline on val: %.3f nats/token (uniform over the vocabulary: %.3f)\n", cost / m, log(vocab)
    }'
awk '
    /"val_loss"/ { match($0, /"val_loss": [-0-9.eE+]+/); v = substr($0, RSTART + 12, RLENGTH - 12); if (first == "") first = v; last = v }
    /"train_loss"/ { match($0, /"train_loss": [-0-9.eE+]+/); t[++k] = substr($0, RSTART + 14, RLENGTH - 14) }
    END {
        printf "val loss: %.3f at start -> %.3f at the end\n", first, last
        for (i = (k > 10 ? k - 9 : 1); i <= k; i++) { s += t[i]; c++ }
        printf "train loss (mean of the last 10 steps): %.3f\n", s / c
    }' "$out/metrics.jsonl"

# the curves: dev/plot_metrics.py, if some Python here has matplotlib (the job itself needs no Python)
if py=$(scripts/find_matplotlib.sh); then
    "$py" dev/plot_metrics.py "$out/metrics.jsonl" -o "$out/metrics.png" --labels "d6 from scratch"
else
    echo "plot: no Python with matplotlib found (Debian: apt install python3-matplotlib); then run"
    echo "  python3 dev/plot_metrics.py $out/metrics.jsonl -o $out/metrics.png"
fi
