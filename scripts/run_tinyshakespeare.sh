#!/usr/bin/env bash
# The main job: build, prepare tinyshakespeare, train a small GPT-2 from scratch and sample from it.
#   scripts/run_tinyshakespeare.sh [extra train_gpt2 flags...]
# On a CPU-only machine this trains the fp32 CPU trainer for a few minutes on 2 cores. With an NVIDIA
# GPU (nvidia-smi works) and CUDA_TRAINER=1 it uses the CUDA trainer instead.
# Outputs: log_tinyshakespeare/main.log, metrics.jsonl and the final checkpoint model_*.bin.
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
steps=${STEPS:-400}
$trainer -e d6 -i "$data/tinyshakespeare_train_*.bin" -j "$data/tinyshakespeare_val_*.bin" \
    -tk "$data/gpt2_tokenizer.bin" -o "$out" \
    -b 4 -t 64 -x "$steps" -l 1e-3 -u 10 -q 0.1 -c 0.1 -v 100 -m 16 -s 200 -g 64 -n "$steps" "$@"

# how good is that? the unigram model (token frequencies of the training split) is the baseline
python3 - "$data" "$out" <<'PY'
import array, glob, json, math, sys
data, out = sys.argv[1], sys.argv[2]
def tokens(pattern):
    t = array.array("H")
    for path in sorted(glob.glob(pattern)):
        with open(path, "rb") as f:
            f.seek(1024)
            t.frombytes(f.read())
    return t
train, val = tokens(f"{data}/tinyshakespeare_train_*.bin"), tokens(f"{data}/tinyshakespeare_val_*.bin")
counts = {}
for x in train:
    counts[x] = counts.get(x, 0) + 1
vocab, n = 50257, len(train)
# add-one smoothing so unseen val tokens have a finite cost
unigram = sum(-math.log((counts.get(x, 0) + 1) / (n + vocab)) for x in val) / len(val)
metrics = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
val_losses = [m["val_loss"] for m in metrics if "val_loss" in m]
train_losses = [m["train_loss"] for m in metrics if "train_loss" in m]
print(f"unigram baseline on val: {unigram:.3f} nats/token (uniform over the vocabulary: {math.log(vocab):.3f})")
print(f"val loss: {val_losses[0]:.3f} at start -> {val_losses[-1]:.3f} at the end")
print(f"train loss (mean of the last 10 steps): {sum(train_losses[-10:]) / len(train_losses[-10:]):.3f}")
PY
