#!/usr/bin/env bash
# Encoding throughput of our GPT-2 tokenizer (llmc/tokenizer/bpe.h, through `tokenizer_gpt2 bench`) next to
# OpenAI's tiktoken (its Rust core, from Python), measured in the same run, on the same machine and the
# same text (tinyshakespeare by default), and printed as one table:
#   - ours: 1 thread with an empty cache, then warm (best of REPEAT), on the whole text; prepro's batch
#     encoder on 1 thread and on all cores, over the text's blank-line documents copied REPEAT times;
#   - tiktoken: encode_ordinary and encode (which also looks for special tokens) on the whole text, first
#     run and best of REPEAT; encode_ordinary_batch (a Python thread pool around the Rust core, which
#     releases the GIL) on 1 thread and on all cores, over the same documents, and over copies of the
#     whole text, where the pool's cost per item (a future, a GIL handoff) no longer counts.
# tiktoken gets GPT-2's encoding from the same local encoder.json / vocab.bpe (test/tokenizer_oracle.py
# builds it), so nothing is downloaded. Python: $GPT2_PYTHON, else the project's .venv, else python3;
# without tiktoken there, its rows are reported as skipped. Times cover encoding only: loading the
# vocabulary is left out for both. A benchmark, not a test: the numbers move with the machine's load,
# so run it on a quiet machine and read the best of the repeats.
#
#   dev/bench_tokenizer.sh [FILE] [REPEAT]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/data/common.sh"

TEXT="${1:-}"
REPEAT="${2:-5}"
if [ -z "$TEXT" ]; then  # tinyshakespeare, where the tests look for it, else fetched
    for TEXT in "${TINYSHAKESPEARE_TXT:-}" "$DATA_DIR/tinyshakespeare/input.txt" \
        "$REPO_ROOT/../shared/data/tinyshakespeare/input.txt" ""; do
        [ -n "$TEXT" ] && [ -f "$TEXT" ] && break
    done
    if [ -z "$TEXT" ]; then
        "$DATA_DIR/tinyshakespeare.sh" >/dev/null
        TEXT="$DATA_DIR/tinyshakespeare/input.txt"
    fi
fi
[ -f "$TEXT" ] || die "no text to encode at '$TEXT'"
ensure_gpt2_bpe
ensure_tokenizer
PYTHON="${GPT2_PYTHON:-}"
if [ -z "$PYTHON" ]; then
    if [ -x "$REPO_ROOT/.venv/bin/python" ]; then PYTHON="$REPO_ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "text:    $TEXT ($(wc -c <"$TEXT") bytes)"
OURS="$("$TOKENIZER" bench --repeat "$REPEAT" "$TEXT")"
if ! "$PYTHON" -c 'import tiktoken' >/dev/null 2>&1; then
    echo "$OURS"
    echo "tiktoken skipped: $PYTHON cannot import it (pip install tiktoken, or set GPT2_PYTHON)"
    exit 0
fi

# tiktoken's rows, then one table of both (ours' lines read "ours  WHAT  RATE MB/s  (NOTE)")
"$PYTHON" - "$REPO_ROOT/test" "$GPT2_BPE_DIR" "$TEXT" "$REPEAT" "$(nproc)" "$OURS" <<'PY'
import re
import sys
import time

test_dir, bpe_dir, path, repeat, cores, ours = sys.argv[1:]
repeat, cores = int(repeat), int(cores)
sys.path.insert(0, test_dir)
import tiktoken
from tokenizer_oracle import gpt2_encoding

rows = []  # (encoder, what, MB/s, note)
for line in ours.splitlines():
    m = re.match(r"ours\s+(.*?)\s+([0-9.]+) MB/s\s+\((.*)\)$", line)
    if not m:
        sys.exit(f"bench_tokenizer.sh: cannot read tokenizer_gpt2 bench's line {line!r}")
    rows.append(("ours", m.group(1), float(m.group(2)), m.group(3)))

enc = gpt2_encoding(bpe_dir)
with open(path, encoding="utf-8") as f:
    text = f.read()
mb = len(text.encode("utf-8")) / 1e6
name = f"tiktoken {tiktoken.__version__}"


def seconds(f):
    start = time.perf_counter()
    f()
    return time.perf_counter() - start


for method in ("encode_ordinary", "encode"):
    encode = getattr(enc, method)
    first = seconds(lambda: encode(text))
    best = min(seconds(lambda: encode(text)) for _ in range(repeat))
    rows.append((name, f"{method}, 1 thread, first run, whole text", mb / first, f"{len(encode(text))} tokens"))
    rows.append((name, f"{method}, 1 thread, whole text", mb / best, f"best of {repeat}"))

docs = []  # cut after each "\n\n", as prepro --split-blank-lines, then copied `repeat` times, as ours
pos = 0
while pos < len(text):
    at = text.find("\n\n", pos)
    stop = len(text) if at < 0 else at + 2
    docs.append(text[pos:stop])
    pos = stop
docs *= repeat
wholes = [text] * (repeat * cores)  # few large items: the thread pool's cost per item disappears
for threads in sorted({1, cores}):
    batch = seconds(lambda: enc.encode_ordinary_batch(docs, num_threads=threads))
    rows.append((name, f"encode_ordinary_batch, {threads} thread(s), documents", mb * repeat / batch,
                 f"{len(docs)} documents = the text x {repeat}"))
for threads in sorted({1, cores}):
    batch = seconds(lambda: enc.encode_ordinary_batch(wholes, num_threads=threads))
    rows.append((name, f"encode_ordinary_batch, {threads} thread(s), whole texts", mb * len(wholes) / batch,
                 f"the whole text x {len(wholes)}"))

width = [max(len(r[i]) for r in rows) for i in (0, 1)]
print(f"{'encoder':<{width[0]}}  {'how':<{width[1]}}  {'MB/s':>8}  note")
for encoder, what, rate, note in rows:
    print(f"{encoder:<{width[0]}}  {what:<{width[1]}}  {rate:8.2f}  {note}")
PY
