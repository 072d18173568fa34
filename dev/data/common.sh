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

# GPT-2's BPE files as OpenAI publishes them, with their SHA-256 sums (the ones tiktoken pins).
GPT2_BPE_URL=https://openaipublic.blob.core.windows.net/gpt-2/encodings/main
gpt2_bpe_sha256() {
    case "$1" in
    encoder.json) echo 196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783 ;;
    vocab.bpe) echo 1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5 ;;
    esac
}

has_gpt2_bpe() { [ -f "$1/encoder.json" ] && [ -f "$1/vocab.bpe" ]; }

# Sets GPT2_BPE_DIR to a directory holding GPT-2's encoder.json and vocab.bpe, the first of:
# $GPT2_BPE_DIR if set; a local copy in dev/data/gpt2-bpe or ../shared/data/gpt2-bpe (the places the
# tests look too); else dev/data/gpt2-bpe, downloaded there from OpenAI's public blob storage and
# checked against the published SHA-256 sums.
ensure_gpt2_bpe() {
    if [ -n "${GPT2_BPE_DIR:-}" ]; then
        has_gpt2_bpe "$GPT2_BPE_DIR" || die "GPT2_BPE_DIR=$GPT2_BPE_DIR does not hold encoder.json and vocab.bpe"
        return
    fi
    local dir
    for dir in "$DATA_DIR/gpt2-bpe" "$REPO_ROOT/../shared/data/gpt2-bpe"; do
        if has_gpt2_bpe "$dir"; then
            export GPT2_BPE_DIR="$dir"
            return
        fi
    done
    dir="$DATA_DIR/gpt2-bpe"
    mkdir -p "$dir"
    echo "GPT-2 BPE files: downloading OpenAI's public copies into $dir"
    local name expected actual
    for name in encoder.json vocab.bpe; do
        download "$GPT2_BPE_URL/$name" "$dir/$name"
        expected="$(gpt2_bpe_sha256 "$name")"
        actual="$(sha256sum "$dir/$name" | cut -d' ' -f1)"
        if [ "$actual" != "$expected" ]; then
            rm -f "$dir/$name"
            die "$GPT2_BPE_URL/$name has sha256 $actual, expected $expected"
        fi
    done
    export GPT2_BPE_DIR="$dir"
}

# Builds tokenizer_gpt2 if it is missing or older than its sources.
ensure_tokenizer() {
    make -C "$REPO_ROOT" --no-print-directory tokenizer_gpt2 >/dev/null || die "could not build tokenizer_gpt2 (make tokenizer_gpt2)"
}
