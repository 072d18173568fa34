#!/usr/bin/env bash
# FineWeb or FineWeb-Edu (Hugging Face's filtered Common Crawl), a 10B- or 100B-token sample, as GPT-2
# tokens in llm.c's layout:
#   dev/data/NAME/NAME_val_000000.bin      the first 100M tokens
#   dev/data/NAME/NAME_train_000000.bin    ... 100M tokens per shard (~100 or ~1000 shards)
#   dev/data/NAME/gpt2_tokenizer.bin
# where NAME is fineweb10B, fineweb100B, edu_fineweb10B or edu_fineweb100B. Each row's "text" is one
# document preceded by end-of-text.
#
# Needs: the internet (~30 GB of parquet for 10B), python3 with pyarrow (`pip install pyarrow`) to read
# parquet, and disk: each parquet file is replaced by its JSON-lines copy once converted (the text,
# ~45 GB for 10B), and the shards take 2 bytes per token (~20 GB for 10B). Not run by CI.
#
#   dev/data/fineweb.sh [fineweb|edu] [10B|100B]      (default: fineweb 10B)
# Other datasets in the same shape (parquet or JSON lines with a text column): point
# dev/data/text_folder.sh DIR NAME --jsonl text at a folder of JSON-lines files.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

KIND="${1:-fineweb}"
SIZE="${2:-10B}"
case "$KIND" in
    fineweb) REPO=HuggingFaceFW/fineweb; NAME="fineweb$SIZE" ;;
    edu) REPO=HuggingFaceFW/fineweb-edu; NAME="edu_fineweb$SIZE" ;;
    *) die "first argument: fineweb or edu, not '$KIND'" ;;
esac
case "$SIZE" in
    10B | 100B) SAMPLE="sample/${SIZE}T" ;;
    *) die "second argument: 10B or 100B, not '$SIZE'" ;;
esac
command -v python3 >/dev/null 2>&1 || die "python3 (with pyarrow) is needed to read parquet"
python3 -c "import pyarrow.parquet" 2>/dev/null || die "python3 cannot import pyarrow: pip install pyarrow"

OUT="$DATA_DIR/$NAME"
RAW="$OUT/parquet"
JSONL="$OUT/jsonl"
mkdir -p "$RAW" "$JSONL"

# the sample's parquet files, listed by the Hugging Face API
LISTING="$OUT/files.txt"
if [ ! -f "$LISTING" ]; then
    download "https://huggingface.co/api/datasets/$REPO/tree/main/$SAMPLE" "$OUT/tree.json"
    python3 -c 'import json, sys; [print(f["path"]) for f in json.load(open(sys.argv[1])) if f["path"].endswith(".parquet")]' \
        "$OUT/tree.json" > "$LISTING"
fi
[ -s "$LISTING" ] || die "no parquet files listed for $REPO/$SAMPLE"

while read -r path; do
    base="$(basename "$path" .parquet)"
    [ -f "$JSONL/$base.jsonl" ] && continue
    [ -f "$RAW/$base.parquet" ] || download "https://huggingface.co/datasets/$REPO/resolve/main/$path" "$RAW/$base.parquet"
    python3 - "$RAW/$base.parquet" "$JSONL/$base.jsonl.part" <<'PY'
import json, sys
import pyarrow.parquet as pq
with open(sys.argv[2], "w", encoding="utf-8") as out:
    for batch in pq.ParquetFile(sys.argv[1]).iter_batches(columns=["text"], batch_size=4096):
        for text in batch.column(0).to_pylist():
            out.write(json.dumps({"text": text}) + "\n")
PY
    mv "$JSONL/$base.jsonl.part" "$JSONL/$base.jsonl"
    rm -f "$RAW/$base.parquet"  # the JSON lines copy replaces it
done < "$LISTING"

ensure_gpt2_bpe
ensure_tokenizer
"$TOKENIZER" prepro --input "$JSONL" --output-dir "$OUT" --name "$NAME" --jsonl text \
    --val-tokens 100000000 --shard-tokens 100000000
