#!/usr/bin/env bash
# Tiny Shakespeare (1.1 MB of Shakespeare's plays, from Karpathy's char-rnn) as GPT-2 tokens:
#   dev/data/tinyshakespeare/tinyshakespeare_val_000000.bin     the first 32,768 tokens
#   dev/data/tinyshakespeare/tinyshakespeare_train_000000.bin   the other 305,260
#   dev/data/tinyshakespeare/gpt2_tokenizer.bin
# Documents are the text cut after every blank line, each preceded by end-of-text, as llm.c's
# tinyshakespeare.py cuts them, so the tokens are the same as llm.c's.
#
# The text: dev/data/tinyshakespeare/input.txt if present, else a copy of $TINYSHAKESPEARE_TXT, else
# downloaded. GPT-2's BPE files: see common.sh. VAL_TOKENS=N changes the val split.
#
#   dev/data/tinyshakespeare.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

URL=https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
OUT="$DATA_DIR/tinyshakespeare"
mkdir -p "$OUT"
if [ ! -f "$OUT/input.txt" ]; then
    if [ -n "${TINYSHAKESPEARE_TXT:-}" ]; then
        [ -f "$TINYSHAKESPEARE_TXT" ] || die "TINYSHAKESPEARE_TXT=$TINYSHAKESPEARE_TXT is not a file"
        cp "$TINYSHAKESPEARE_TXT" "$OUT/input.txt"
        chmod u+w "$OUT/input.txt"
    else
        download "$URL" "$OUT/input.txt"
    fi
fi
ensure_gpt2_bpe
ensure_tokenizer
"$TOKENIZER" prepro --input "$OUT/input.txt" --output-dir "$OUT" --name tinyshakespeare \
    --split-blank-lines --val-tokens "${VAL_TOKENS:-32768}"
