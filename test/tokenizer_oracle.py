"""Reference GPT-2 tokenizer for test/test_tokenizer.cpp and dev/bench_tokenizer.sh: OpenAI's tiktoken
(a Rust BPE), given GPT-2's encoding built from the local encoder.json / vocab.bpe, so nothing is
downloaded.

    python test/tokenizer_oracle.py encode BPE_DIR RECORDS_IN IDS_OUT
    python test/tokenizer_oracle.py vocab  BPE_DIR BYTES_OUT

RECORDS_IN holds texts as records: uint32 little-endian byte length, then that many bytes of UTF-8.
`encode` writes to IDS_OUT one line per record: its ids (encode_ordinary: `<|endoftext|>` is text),
separated by spaces. `vocab` writes to BYTES_OUT the bytes of ids 0..50256, as records.

The encoding is the one tiktoken names "gpt2" (tiktoken_ext/openai_public.py): tiktoken's own loader
for the data-gym format (encoder.json + vocab.bpe; it checks that the two agree), GPT-2's pattern in
tiktoken's faster but equivalent spelling, and <|endoftext|> = 50256. The two files are checked against
the SHA-256 sums tiktoken pins for OpenAI's copies, so the ids are GPT-2's and no one else's.
"""
import hashlib
import os
import struct
import sys

# GPT-2's release writes 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
# tiktoken's r50k_pat_str: the same pieces, with possessive runs and no backtracking into whitespace.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
ENDOFTEXT = "<|endoftext|>"
ENDOFTEXT_ID = 50256
VOCAB_SIZE = 50257
SHA256 = {  # of https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/{vocab.bpe,encoder.json}
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}


def fail(message, status=1):
    print(f"tokenizer_oracle.py: {message}", file=sys.stderr)
    sys.exit(status)


def gpt2_encoding(bpe_dir):
    """tiktoken's "gpt2" Encoding, from BPE_DIR/encoder.json and BPE_DIR/vocab.bpe."""
    try:
        import tiktoken
        from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    except ImportError as e:
        fail(f"tiktoken is not importable by {sys.executable}: {e}")
    for name, expected in SHA256.items():
        path = os.path.join(bpe_dir, name)
        if not os.path.isfile(path):
            fail(f"'{path}' does not exist")
        with open(path, "rb") as f:
            actual = hashlib.sha256(f.read()).hexdigest()
        if actual != expected:
            fail(f"'{path}' is not GPT-2's {name}: sha256 {actual}, expected {expected}")
    # local paths: tiktoken's reader opens them directly; an empty cache dir keeps it from copying them
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=os.path.join(bpe_dir, "vocab.bpe"),
        encoder_json_file=os.path.join(bpe_dir, "encoder.json"),
    )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: ENDOFTEXT_ID},
        explicit_n_vocab=VOCAB_SIZE,
    )


def read_records(path):
    with open(path, "rb") as f:
        data = f.read()
    texts, pos = [], 0
    while pos < len(data):
        if pos + 4 > len(data):
            fail(f"'{path}': truncated record header at byte {pos}")
        (length,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if pos + length > len(data):
            fail(f"'{path}': truncated record at byte {pos}")
        try:
            texts.append(data[pos : pos + length].decode("utf-8"))
        except UnicodeDecodeError as e:
            fail(f"'{path}': record {len(texts)} is not UTF-8 ({e}); tiktoken encodes text, not bytes")
        pos += length
    return texts


def main(argv):
    if len(argv) == 4 and argv[0] == "encode":
        enc = gpt2_encoding(argv[1])
        texts = read_records(argv[2])
        with open(argv[3], "w") as out:
            for text in texts:
                out.write(" ".join(map(str, enc.encode_ordinary(text))) + "\n")
    elif len(argv) == 3 and argv[0] == "vocab":
        enc = gpt2_encoding(argv[1])
        with open(argv[2], "wb") as out:
            for i in range(VOCAB_SIZE):
                token = enc.decode_single_token_bytes(i)
                out.write(struct.pack("<I", len(token)) + token)
    else:
        fail("usage: tokenizer_oracle.py encode BPE_DIR RECORDS_IN IDS_OUT | vocab BPE_DIR BYTES_OUT", status=2)


if __name__ == "__main__":
    main(sys.argv[1:])
