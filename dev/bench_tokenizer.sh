#!/usr/bin/env bash
# Encoding throughput of our GPT-2 tokenizer (llmc/bpe.h, through `tokenizer_gpt2 bench`) next to
# peers measured in the same run, on the same machine and the same text (tinyshakespeare by default):
#   - tiktoken from npm: OpenAI's Rust BPE compiled to WebAssembly (no cache; whole text);
#   - gpt-3-encoder from npm: Encoder.js in plain JavaScript (cached per pre-token). Its output is
#     built with one Array.concat per pre-token, quadratic in a text's length, so it gets the text's
#     blank-line documents, as prepro would feed them.
# Each peer that `npm` can install is measured; one that cannot is reported as skipped. Times cover
# encoding only: loading the vocabulary is left out for every encoder. A benchmark, not a test: the
# numbers move with the machine's load, so run it on a quiet machine and read the best of the repeats.
#
#   dev/bench_tokenizer.sh [FILE] [REPEAT]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/data/common.sh"

TEXT="${1:-}"
REPEAT="${2:-5}"
if [ -z "$TEXT" ]; then
    TEXT="$DATA_DIR/tinyshakespeare/input.txt"
    [ -f "$TEXT" ] || "$DATA_DIR/tinyshakespeare.sh" >/dev/null
fi
[ -f "$TEXT" ] || die "no text to encode at '$TEXT'"
ensure_gpt2_bpe
ensure_tokenizer

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "text:    $TEXT ($(wc -c <"$TEXT") bytes)"
"$TOKENIZER" bench --repeat "$REPEAT" "$TEXT"

# the peers, installed under build/ (git-ignored), once
NODE_DIR="$REPO_ROOT/build/bench-node"
JS_DIR="$REPO_ROOT/build/gpt-3-encoder/package"  # where the tests unpack it too
if ! command -v node >/dev/null 2>&1; then
    echo "peers skipped: node is not installed"
    exit 0
fi
if [ ! -d "$NODE_DIR/node_modules/tiktoken" ] && command -v npm >/dev/null 2>&1; then
    mkdir -p "$NODE_DIR"
    npm install --prefix "$NODE_DIR" --no-audit --no-fund --silent tiktoken@1 >/dev/null 2>&1 || true
fi
if [ ! -f "$JS_DIR/Encoder.js" ] && command -v npm >/dev/null 2>&1; then
    tmp="$(mktemp -d)"
    if (cd "$tmp" && npm pack gpt-3-encoder >/dev/null 2>&1 && tar xzf gpt-3-encoder-*.tgz); then
        mkdir -p "$(dirname "$JS_DIR")"
        rm -rf "$JS_DIR"
        mv "$tmp/package" "$JS_DIR"
    fi
    rm -rf "$tmp"
fi

node - "$TEXT" "$REPEAT" "$NODE_DIR/node_modules/tiktoken" "$JS_DIR" <<'JS'
const fs = require('fs');
const [file, repeatArg, tiktokenDir, encoderJsDir] = process.argv.slice(2);
const repeat = parseInt(repeatArg, 10);
const text = fs.readFileSync(file, 'utf8');
const mb = Buffer.byteLength(text) / 1e6;
const seconds = (f) => { const t = process.hrtime.bigint(); f(); return Number(process.hrtime.bigint() - t) / 1e9; };
const line = (name, rate, note) => console.log(`peer  ${name.padEnd(40)} ${rate.toFixed(2).padStart(8)} MB/s  (${note})`);
const version = (dir) => { try { return JSON.parse(fs.readFileSync(dir + '/package.json')).version; } catch (e) { return '?'; } };

if (fs.existsSync(tiktokenDir)) {
  const { get_encoding } = require(tiktokenDir);
  const enc = get_encoding('gpt2');
  let count = 0;
  const first = seconds(() => { count = enc.encode_ordinary(text).length; });
  let best = Infinity;
  for (let r = 0; r < repeat; r++) best = Math.min(best, seconds(() => enc.encode_ordinary(text)));
  line(`tiktoken ${version(tiktokenDir)} (WASM), first run`, mb / first, `${count} tokens`);
  line(`tiktoken ${version(tiktokenDir)} (WASM), whole text`, mb / best, `best of ${repeat}`);
  enc.free();
} else {
  console.log('peer  tiktoken skipped: `npm install tiktoken` failed');
}

if (fs.existsSync(encoderJsDir + '/Encoder.js')) {
  const { encode } = require(encoderJsDir + '/Encoder.js');
  const docs = [];  // cut after each "\n\n", as prepro --split-blank-lines
  for (let pos = 0; pos < text.length;) {
    const at = text.indexOf('\n\n', pos);
    const stop = at < 0 ? text.length : at + 2;
    docs.push(text.slice(pos, stop));
    pos = stop;
  }
  let count = 0;
  const cold = seconds(() => { for (const d of docs) count += encode(d).length; });
  let best = Infinity;
  for (let r = 0; r < repeat; r++) best = Math.min(best, seconds(() => { for (const d of docs) encode(d); }));
  line(`gpt-3-encoder ${version(encoderJsDir)} (JS), empty cache`, mb / cold, `${docs.length} documents, ${count} tokens`);
  line(`gpt-3-encoder ${version(encoderJsDir)} (JS), warm cache`, mb / best, `best of ${repeat}`);
} else {
  console.log('peer  gpt-3-encoder skipped: `npm pack gpt-3-encoder` failed');
}
JS
