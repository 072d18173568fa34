#!/usr/bin/env python3
"""HellaSwag's validation split -> dev/data/hellaswag/hellaswag_val.bin, the file the trainers' -hs reads.

    dev/data/hellaswag.py                      download hellaswag_val.jsonl (10,042 examples) and tokenize it
    dev/data/hellaswag.py --input FILE.jsonl   tokenize a local copy (or any file in HellaSwag's format)
        [--output PATH] [--bpe-dir DIR] [--tokenizer-tool PATH]

Input: HellaSwag's JSON lines (github.com/rowanz/hellaswag, data/hellaswag_val.jsonl), one example per
line with at least "ctx" (the context), "endings" (the candidate endings, 4) and "label" (the index of
the right one). As in llm.c's dev/data/hellaswag.py, the model reads the context as it is and each
ending with one space in front ("ctx" + " " + ending); the context and the endings are tokenized
separately, with our C++ GPT-2 tokenizer (tokenizer_gpt2, llmc/tokenizer/bpe.h).

Output (../shared/FORMATS.md, "Evaluation set", llm.c's layout): a header of 256 int32 {20240522, 1,
number of examples, longest example in bytes}, then per example the uint16 stream 65535, the example's
size in bytes (these first two fields included), its index (line number from 0), the label, the number
of endings, the context's length and tokens, then each ending's length and tokens.

No third-party Python packages: the standard library and the tokenizer tool. Without internet, give
--input a copy of hellaswag_val.jsonl; the download failing says so.
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import urllib.request

URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAGIC, VERSION = 20240522, 1
EOT = 50256
MAX_ENDINGS = 16


def die(message):
    print(f"hellaswag.py: error: {message}", file=sys.stderr)
    sys.exit(1)


def download(url, dest):
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    print(f"downloading {url}")
    try:
        with urllib.request.urlopen(url, timeout=30) as response, open(dest + ".part", "wb") as f:
            f.write(response.read())
    except OSError as e:
        if os.path.exists(dest + ".part"):
            os.remove(dest + ".part")
        die(f"could not download {url} ({e}). Without internet, copy hellaswag_val.jsonl here from a machine "
            f"that has it and run: dev/data/hellaswag.py --input hellaswag_val.jsonl")
    os.replace(dest + ".part", dest)


def read_examples(path):
    """[(ctx, endings, label)] from HellaSwag's JSON lines; a malformed line is an error naming it."""
    examples = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                die(f"{where}: not JSON ({e})")
            if not isinstance(item, dict):
                die(f"{where}: not a JSON object")
            ctx, endings, label = item.get("ctx"), item.get("endings"), item.get("label")
            if not isinstance(ctx, str) or not ctx:
                die(f"{where}: \"ctx\" is missing or not a non-empty string")
            if (not isinstance(endings, list) or not 1 <= len(endings) <= MAX_ENDINGS
                    or not all(isinstance(e, str) and e for e in endings)):
                die(f"{where}: \"endings\" must be a list of 1..{MAX_ENDINGS} non-empty strings")
            if isinstance(label, str) and label.isdigit():
                label = int(label)
            if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(endings):
                die(f"{where}: \"label\" must be the index of one of the endings (0..{len(endings) - 1})")
            examples.append((ctx, endings, label))
    if not examples:
        die(f"{path}: no examples")
    if len(examples) > 65535:
        die(f"{path}: {len(examples)} examples; the format's uint16 index holds at most 65535")
    return examples


def tokenize(texts, tool, bpe_dir):
    """Token ids of each text, with tokenizer_gpt2 prepro: each text becomes a document, which prepro
    writes after an end-of-text token; the texts hold no end-of-text of their own (prepro encodes the
    string "<|endoftext|>" as ordinary text), so splitting at 50256 gives them back in order."""
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "texts.jsonl")
        with open(source, "w", encoding="utf-8") as f:
            for t in texts:
                f.write(json.dumps({"text": t}) + "\n")
        cmd = [tool, "prepro", "--input", source, "--jsonl", "text", "--output-dir", tmp, "--name", "hs",
               "--val-tokens", "0", "--shard-tokens", "2000000000", "--threads", "1"]
        if bpe_dir:
            cmd += ["--bpe-dir", bpe_dir]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            die(f"the tokenizer failed ({' '.join(cmd)}):\n{result.stdout}{result.stderr}")
        with open(os.path.join(tmp, "hs_train_000000.bin"), "rb") as f:
            data = f.read()
    n = struct.unpack_from("<3i", data)[2]
    tokens = struct.unpack_from(f"<{n}H", data, 1024)
    pieces, current = [], None
    for t in tokens:
        if t == EOT:
            if current is not None:
                pieces.append(current)
            current = []
        else:
            current.append(t)
    pieces.append(current)
    if len(pieces) != len(texts):
        die(f"the tokenizer returned {len(pieces)} texts for {len(texts)}")
    return pieces


def write_eval_file(path, examples, pieces):
    records, at = [], 0
    for index, (ctx, endings, label) in enumerate(examples):
        ctx_tokens = pieces[at]
        ending_tokens = pieces[at + 1:at + 1 + len(endings)]
        at += 1 + len(endings)
        stream = [65535, 0, index, label, len(endings), len(ctx_tokens), *ctx_tokens]
        for e in ending_tokens:
            stream += [len(e), *e]
        stream[1] = 2 * len(stream)
        if stream[1] > 65535 or max(stream) > 65535:
            die(f"example {index} is too long for the format's uint16 size field")
        records.append(stream)
    header = [MAGIC, VERSION, len(records), max(r[1] for r in records)] + [0] * 252
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".part", "wb") as f:
        f.write(struct.pack("<256i", *header))
        for r in records:
            f.write(struct.pack(f"<{len(r)}H", *r))
    os.replace(path + ".part", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", help="a local HellaSwag .jsonl (default: download the validation split)")
    ap.add_argument("--output", default=os.path.join(ROOT, "dev/data/hellaswag/hellaswag_val.bin"))
    ap.add_argument("--bpe-dir", help="GPT-2's encoder.json and vocab.bpe (default: the tokenizer tool's search)")
    ap.add_argument("--tokenizer-tool", default=os.path.join(ROOT, "tokenizer_gpt2"))
    args = ap.parse_args()
    if not os.access(args.tokenizer_tool, os.X_OK):
        die(f"{args.tokenizer_tool} is not built: run `make tokenizer_gpt2`")
    source = args.input
    if source is None:
        source = os.path.join(ROOT, "dev/data/hellaswag/hellaswag_val.jsonl")
        if not os.path.exists(source):
            download(URL, source)
    elif not os.path.isfile(source):
        die(f"--input {source}: no such file")
    examples = read_examples(source)
    texts = []
    for ctx, endings, _ in examples:
        texts.append(ctx)
        texts += [" " + e for e in endings]
    pieces = tokenize(texts, args.tokenizer_tool, args.bpe_dir)
    write_eval_file(args.output, examples, pieces)
    print(f"wrote {args.output}: {len(examples)} examples")


if __name__ == "__main__":
    main()
