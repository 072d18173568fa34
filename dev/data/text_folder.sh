#!/usr/bin/env bash
# Any folder of text files as GPT-2 tokens: every file under INPUT_DIR (recursively, in sorted order,
# names starting with '.' skipped) is one document, preceded by end-of-text.
#
#   dev/data/text_folder.sh INPUT_DIR NAME [more tokenizer_gpt2 prepro options]
#
# writes dev/data/NAME/NAME_val_000000.bin (first 32,768 tokens unless --val-tokens N),
# NAME_train_000000.bin, ... (100M tokens each unless --shard-tokens N) and gpt2_tokenizer.bin.
# OUT_DIR=... writes elsewhere. Extra options, e.g. --split-blank-lines (each file holds many
# documents separated by blank lines) or --jsonl FIELD (each file is JSON lines), go to prepro.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

[ $# -ge 2 ] || die "usage: dev/data/text_folder.sh INPUT_DIR NAME [tokenizer_gpt2 prepro options]"
INPUT="$1"
NAME="$2"
shift 2
[ -d "$INPUT" ] || die "'$INPUT' is not a directory"
OUT="${OUT_DIR:-$DATA_DIR/$NAME}"
ensure_gpt2_bpe
ensure_tokenizer
"$TOKENIZER" prepro --input "$INPUT" --output-dir "$OUT" --name "$NAME" "$@"
