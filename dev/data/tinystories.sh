#!/usr/bin/env bash
# TinyStories (Eldan & Li 2023: ~2.1M short stories written by GPT-3.5/GPT-4, ~470M GPT-2 tokens) as
# GPT-2 tokens, in the layout llm.c uses:
#   dev/data/tinystories/tinystories_val_000000.bin     the first VAL_TOKENS tokens (default 10M)
#   dev/data/tinystories/tinystories_train_000000.bin   ... 100M tokens per shard
#   dev/data/tinystories/gpt2_tokenizer.bin
# Each story, stripped of surrounding whitespace, is one document preceded by end-of-text. data00.json
# comes first, so the val split is the start of data00 (llm.c's val split is that whole file).
#
# Needs: the internet (1.5 GB download from Hugging Face), python3 (standard library only, to turn
# the JSON arrays into JSON lines), ~6 GB of disk. Not run by CI.
#
#   dev/data/tinystories.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

URL=https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/TinyStories_all_data.tar.gz
OUT="$DATA_DIR/tinystories"
RAW="$OUT/raw"
JSONL="$OUT/jsonl"
command -v python3 >/dev/null 2>&1 || die "python3 is needed to convert TinyStories' JSON to JSON lines"
mkdir -p "$RAW" "$JSONL"

if [ ! -f "$RAW/TinyStories_all_data.tar.gz" ]; then
    download "$URL" "$RAW/TinyStories_all_data.tar.gz"
fi
if [ ! -f "$RAW/data00.json" ]; then
    echo "unpacking"
    tar xzf "$RAW/TinyStories_all_data.tar.gz" -C "$RAW"
fi

# data00.json .. data49.json: each one JSON array of {"story": ..., ...} -> one JSON line per story
for json in "$RAW"/data*.json; do
    out="$JSONL/$(basename "$json" .json).jsonl"
    [ -f "$out" ] && continue
    python3 - "$json" "$out.part" <<'PY'
import json, sys
with open(sys.argv[1], encoding="utf-8") as f:
    stories = json.load(f)
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for example in stories:
        f.write(json.dumps({"text": example["story"].strip()}) + "\n")
PY
    mv "$out.part" "$out"
done

ensure_gpt2_bpe
ensure_tokenizer
"$TOKENIZER" prepro --input "$JSONL" --output-dir "$OUT" --name tinystories --jsonl text \
    --val-tokens "${VAL_TOKENS:-10000000}" --shard-tokens 100000000
