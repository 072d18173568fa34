#!/usr/bin/env bash
# Fine-tuning quick start: OpenAI's GPT-2 124M, fine-tuned on tinyshakespeare on the CPU for a few
# minutes, with samples before and after.
#
#   scripts/finetune_gpt2.sh                     download GPT-2 124M from the Hugging Face hub
#   GPT2_HF_DIR=path/to/gpt2 scripts/finetune_gpt2.sh   use a local copy (config.json + model.safetensors)
#   STEPS=60 PROMPT="ROMEO:" scripts/finetune_gpt2.sh [extra train_gpt2 flags...]
#
# Steps: (1) the weights: $GPT2_HF_DIR, or dev/data/gpt2-hf/ if it already holds them, else downloaded
# there from huggingface.co/openai-community/gpt2 (548 MB; no internet: a message saying how to bring a
# copy). (2) dev/hf_gpt2.py converts them to our checkpoint (NumPy; doc/hf_weights.md). (3) tinyshakespeare
# (dev/data/tinyshakespeare.sh). (4) a sample from the model as it is (train_gpt2 -x 0). (5) STEPS steps
# of AdamW at a small learning rate (about 2 s a step at B=4, T=64 on 2 cores). (6) a sample from the
# fine-tuned checkpoint with the same prompt and seed, and the plot of the run if matplotlib is there.
# Outputs: log_finetune/ (main.log, metrics.jsonl, model_*.bin, metrics.png).
set -euo pipefail
cd "$(dirname "$0")/.."
source dev/data/common.sh

HF_URL=https://huggingface.co/openai-community/gpt2/resolve/main
steps=${STEPS:-60}
prompt=${PROMPT:-"ROMEO:"}
out=${OUT_DIR:-log_finetune}
data=dev/data/tinyshakespeare

# an interpreter with NumPy, for the converter (the trainer itself needs no Python)
python=""
for py in "${GPT2_PYTHON:-}" .venv/bin/python "$(command -v python3 2>/dev/null || true)" /usr/bin/python3; do
    if [ -n "$py" ] && [ -x "$py" ] && "$py" -c 'import numpy' >/dev/null 2>&1; then python=$py; break; fi
done
[ -n "$python" ] || die "no Python with NumPy found for dev/hf_gpt2.py (Debian: apt install python3-numpy)"

# (1) the weights
hf_dir=${GPT2_HF_DIR:-dev/data/gpt2-hf}
if [ ! -f "$hf_dir/config.json" ] || [ ! -f "$hf_dir/model.safetensors" ]; then
    [ -z "${GPT2_HF_DIR:-}" ] || die "GPT2_HF_DIR=$GPT2_HF_DIR does not hold config.json and model.safetensors"
    mkdir -p "$hf_dir"
    if ! curl -fsI --connect-timeout 15 "$HF_URL/config.json" >/dev/null 2>&1; then
        die "cannot reach huggingface.co to download GPT-2 124M. On a machine that can, fetch
  $HF_URL/config.json
  $HF_URL/model.safetensors
(or \`huggingface-cli download openai-community/gpt2 config.json model.safetensors --local-dir DIR\`),
bring DIR here and run: GPT2_HF_DIR=DIR $0"
    fi
    download "$HF_URL/config.json" "$hf_dir/config.json"
    download "$HF_URL/model.safetensors" "$hf_dir/model.safetensors"
fi

# (2) convert
make train_gpt2 tokenizer_gpt2
model=dev/data/gpt2_124M_from_hf.bin
"$python" dev/hf_gpt2.py import "$hf_dir" "$model"

# (3) data and the BPE files (for the prompt)
dev/data/tinyshakespeare.sh
ensure_gpt2_bpe
sample_flags=(-tk "$data/gpt2_tokenizer.bin" -bp "$GPT2_BPE_DIR" -sp "$prompt" -g 64 -st 0.8 -sk 40 -ss 42 -t 64)

echo "=== before fine-tuning ==="
./train_gpt2 -e "$model" -x 0 -v 0 "${sample_flags[@]}" | sed -n '/--- sample ---/,/^--------------$/p'

echo "=== fine-tuning for $steps steps ==="
# a rerun starts afresh: the previous run's checkpoints in $out go first (the trainer refuses a fresh
# run in a directory that holds another run's checkpoints: doc/reliability.md)
rm -f "$out"/model_*.bin "$out"/state_*.bin "$out"/DONE_*
./train_gpt2 -e "$model" -i "$data/tinyshakespeare_train_*.bin" -j "$data/tinyshakespeare_val_*.bin" -o "$out" \
    -b 4 -t 64 -x "$steps" -l 3e-5 -u 5 -q 0.1 -c 0.0 -v 20 -m 8 -s 0 -n "$steps" "$@"

echo "=== after fine-tuning ==="
./train_gpt2 -e "$out/$(printf 'model_%08d.bin' "$steps")" -x 0 -v 0 "${sample_flags[@]}" |
    sed -n '/--- sample ---/,/^--------------$/p'

if py=$(scripts/find_matplotlib.sh); then
    "$py" dev/plot_metrics.py "$out/metrics.jsonl" -o "$out/metrics.png" --labels "GPT-2 124M fine-tuned"
else
    echo "plot: no Python with matplotlib; run: python3 dev/plot_metrics.py $out/metrics.jsonl -o $out/metrics.png"
fi
