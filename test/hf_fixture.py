#!/usr/bin/env python3
"""Test helper for dev/hf_gpt2.py (test/test_hf.cpp runs it). It never imports the converter: the
fixture is written, read and checked with code of its own, so a converter bug cannot hide itself.

  write DIR [shape flags] [--dtype F32|F16|BF16] [--values-of F16|BF16] [--prefix] [--buffers]
            [--lm-head] [--special] [--drop NAME]
      a tiny GPT-2 in Hugging Face's exact layout: config.json + model.safetensors with HF's names
      (h.N.attn.c_attn.weight, ...), Conv1D weights stored (in, out), vocab not padded.
  corrupt SRC_DIR DST_DIR KIND      a copy of SRC_DIR whose safetensors header or config.json is broken
  numpy-logits HF_DIR INPUTS B T OUT
      logits (B, T, V) of the HF-layout model in float64 NumPy, written from HF's semantics
      (x @ W + b for Conv1D, tied LM head); INPUTS and OUT are raw int32 / fp32 files
  transformers-logits INPUTS B T OUT HF_DIR...
      the same from transformers' GPT2LMHeadModel.from_pretrained (float64) for each HF_DIR, into
      OUT.0, OUT.1, ... (one process: importing transformers takes seconds); exit 77 if transformers
      is not installed; fails if loading reports missing or unexpected keys (buffers aside)
  compare A_DIR B_DIR [--library]
      checks that every parameter of the two model.safetensors is bit-identical, same dtype and shape
      (names compared without the `transformer.` prefix; buffers and lm_head ignored); read with the
      fixture's reader, or with --library the safetensors library (exit 77 if it is not installed)
"""

import argparse
import json
import math
import os
import shutil
import sys

import numpy as np

PREFIX = "transformer."
NP_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "I32": "<i4", "I64": "<i8"}


def round_to_bf16_bits(x):
    """fp32 -> bf16 bits, round to nearest even (finite inputs only: the fixture makes no NaN here)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


# special fp32 bit patterns for the bf16 rounding test: ties to even both ways, the largest finite
# value (rounds to inf), infinities, zeros, subnormals, quiet and signalling NaNs (a NaN whose payload
# sits only in the low 16 bits must stay NaN, not become inf)
SPECIAL_BITS = [0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F7FFFFF, 0x7F800000, 0xFF800000,
                0x00000000, 0x80000000, 0x00000001, 0x00008000, 0x00018000, 0x807FFFFF,
                0x7FC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xBF800000, 0x3EAAAAAB, 0xC2F6E979]


# ---------------------------------------------------------------------------------------------------
# safetensors, the fixture's own minimal reader and writer

def write_st(path, tensors, metadata=None):
    """tensors: {name: (dtype, numpy array already in that dtype's storage)}; keys sorted like the hub."""
    header, offset, blobs = {}, 0, []
    if metadata is not None:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        dtype, array = tensors[name]
        blob = np.ascontiguousarray(array, dtype=NP_DTYPES[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    write_raw(path, header, b"".join(blobs))


def write_raw(path, header, data):
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + data)


def read_st(path):
    """Returns (header dict, data bytes)."""
    with open(path, "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def st_array_f64(header, data, name):
    entry = header[name]
    b, e = entry["data_offsets"]
    raw = np.frombuffer(data[b:e], dtype=NP_DTYPES[entry["dtype"]]).reshape(entry["shape"])
    return (bf16_bits_to_f32(raw) if entry["dtype"] == "BF16" else raw).astype(np.float64)


# ---------------------------------------------------------------------------------------------------
# write

def make_weights(L, C, V, maxT, seed, std):
    """fp32 weights by HF name (no prefix). LayerNorm gains near 1, everything else N(0, std)."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: (rng.standard_normal(shape) * std).astype(np.float32)
    w = {"wte.weight": normal(V, C), "wpe.weight": normal(maxT, C),
         "ln_f.weight": 1 + normal(C), "ln_f.bias": normal(C)}
    for l in range(L):
        h = f"h.{l}."
        w.update({h + "ln_1.weight": 1 + normal(C), h + "ln_1.bias": normal(C),
                  h + "attn.c_attn.weight": normal(C, 3 * C), h + "attn.c_attn.bias": normal(3 * C),
                  h + "attn.c_proj.weight": normal(C, C), h + "attn.c_proj.bias": normal(C),
                  h + "ln_2.weight": 1 + normal(C), h + "ln_2.bias": normal(C),
                  h + "mlp.c_fc.weight": normal(C, 4 * C), h + "mlp.c_fc.bias": normal(4 * C),
                  h + "mlp.c_proj.weight": normal(4 * C, C), h + "mlp.c_proj.bias": normal(C)})
    return w


def cmd_write(args):
    L, C, NH, maxT, V = args.layers, args.channels, args.heads, args.max_seq_len, args.vocab
    weights = make_weights(L, C, V, maxT, args.seed, args.std)
    if args.special:
        special = np.array(SPECIAL_BITS, dtype=np.uint32).view(np.float32)
        weights["h.0.ln_1.bias"][:len(special)] = special
    values_of = args.values_of or args.dtype
    tensors = {}
    for name, w in weights.items():
        if values_of == "F16":
            w = w.astype(np.float16).astype(np.float32)
        elif values_of == "BF16":
            w = bf16_bits_to_f32(round_to_bf16_bits(w))
        if args.dtype == "F32":
            tensors[name] = ("F32", w)
        elif args.dtype == "F16":
            tensors[name] = ("F16", w.astype(np.float16))
        else:
            tensors[name] = ("BF16", round_to_bf16_bits(w))
    if args.lm_head:
        tensors["lm_head.weight"] = tensors["wte.weight"]
    if args.prefix:
        tensors = {(n if n.startswith("lm_head") else PREFIX + n): t for n, t in tensors.items()}
    if args.buffers:   # what older transformers saved: the causal mask and its fill value, per layer
        mask = np.tril(np.ones((maxT, maxT), dtype=np.float32)).reshape(1, 1, maxT, maxT)
        for l in range(L):
            p = PREFIX if args.prefix else ""
            tensors[f"{p}h.{l}.attn.bias"] = ("F32", mask)
            tensors[f"{p}h.{l}.attn.masked_bias"] = ("F32", np.array(-1e4, dtype=np.float32))
    for name in args.drop or []:
        del tensors[name]
    os.makedirs(args.dir, exist_ok=True)
    write_st(os.path.join(args.dir, "model.safetensors"), tensors, {"format": "pt"})
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
              "n_embd": C, "n_layer": L, "n_head": NH, "n_positions": maxT, "n_ctx": maxT, "vocab_size": V,
              "layer_norm_epsilon": 1e-05, "initializer_range": 0.02,
              "bos_token_id": None, "eos_token_id": None}
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


# ---------------------------------------------------------------------------------------------------
# corrupt

def cmd_corrupt(args):
    shutil.copytree(args.src, args.dst, dirs_exist_ok=True)
    path = os.path.join(args.dst, "model.safetensors")
    header, data = read_st(path)
    names = [n for n in header if n != "__metadata__"]
    by_offset = sorted(names, key=lambda n: header[n]["data_offsets"][0])
    pick = lambda suffix: next(n for n in names if n.endswith(suffix))
    kind = args.kind
    if kind == "overlap":   # two same-sized tensors share bytes
        a, b = pick("h.0.ln_1.bias"), pick("h.0.ln_2.bias")
        header[b]["data_offsets"] = list(header[a]["data_offsets"])
    elif kind == "beyond-end":   # the last tensor points past the end of the data
        last = by_offset[-1]
        header[last]["data_offsets"] = [o + 64 for o in header[last]["data_offsets"]]
    elif kind == "size-mismatch":   # shape and offsets disagree
        header[pick("ln_f.bias")]["shape"] = [7]
    elif kind == "unknown-dtype":
        header[pick("ln_f.bias")]["dtype"] = "Q4"
    elif kind == "int-dtype":   # a valid safetensors dtype, but not a float
        header[pick("ln_f.bias")]["dtype"] = "I32"
    elif kind == "transposed":   # a Conv1D weight stored (out, in), as a Linear would be
        name = pick("h.0.attn.c_attn.weight")
        header[name]["shape"] = header[name]["shape"][::-1]
    elif kind == "not-json":
        with open(path, "wb") as f:
            f.write((16).to_bytes(8, "little") + b"\x00\x01not json!\xff\xfe\x00\x00" + data)
        return
    elif kind == "bad-activation":
        cfg_path = os.path.join(args.dst, "config.json")
        with open(cfg_path) as f:
            config = json.load(f)
        config["activation_function"] = "relu"
        with open(cfg_path, "w") as f:
            json.dump(config, f)
        return
    else:
        sys.exit(f"unknown corruption {kind}")
    write_raw(path, header, data)


# ---------------------------------------------------------------------------------------------------
# logits

def read_inputs(path, B, T):
    inputs = np.fromfile(path, dtype="<i4")
    if inputs.size != B * T:
        sys.exit(f"{path}: {inputs.size} tokens, expected B*T = {B * T}")
    return inputs.reshape(B, T)


def numpy_logits(hf_dir, inputs):
    """GPT-2's forward in float64, read straight from HF's layout and names (HF's GPT2Model semantics)."""
    with open(os.path.join(hf_dir, "config.json")) as f:
        config = json.load(f)
    header, data = read_st(os.path.join(hf_dir, "model.safetensors"))
    has_prefix = any(n.startswith(PREFIX) for n in header)
    W = lambda name: st_array_f64(header, data, (PREFIX if has_prefix else "") + name)
    C, NH, L = config["n_embd"], config["n_head"], config["n_layer"]
    B, T = inputs.shape
    hs = C // NH

    def layernorm(x, prefix):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-5) * W(prefix + ".weight") + W(prefix + ".bias")

    def conv1d(x, prefix):   # HF's Conv1D: weight (in, out), y = x @ W + b
        return x @ W(prefix + ".weight") + W(prefix + ".bias")

    def gelu_new(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    wte = W("wte.weight")
    x = wte[inputs] + W("wpe.weight")[:T]
    causal = np.tril(np.ones((T, T), dtype=bool))
    for l in range(L):
        h = f"h.{l}."
        qkv = conv1d(layernorm(x, h + "ln_1"), h + "attn.c_attn")
        q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, T, NH, hs).transpose(0, 2, 1, 3) for i in range(3))
        scores = np.where(causal, q @ k.transpose(0, 1, 3, 2) / math.sqrt(hs), -np.inf)
        att = np.exp(scores - scores.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + conv1d(y, h + "attn.c_proj")
        x = x + conv1d(gelu_new(conv1d(layernorm(x, h + "ln_2"), h + "mlp.c_fc")), h + "mlp.c_proj")
    return layernorm(x, "ln_f") @ wte.T   # tied LM head


def cmd_numpy_logits(args):
    logits = numpy_logits(args.dir, read_inputs(args.inputs, args.B, args.T))
    logits.astype("<f4").tofile(args.out)


def cmd_transformers_logits(args):
    try:
        import torch
        from transformers import GPT2LMHeadModel
    except ImportError as e:
        print(f"transformers is not installed ({e})")
        sys.exit(77)
    inputs = torch.from_numpy(read_inputs(args.inputs, args.B, args.T).astype(np.int64))
    for i, hf_dir in enumerate(args.dirs):
        model, info = GPT2LMHeadModel.from_pretrained(hf_dir, output_loading_info=True)
        is_buffer = lambda key: key.endswith("attn.bias") or key.endswith("attn.masked_bias")
        problems = {k: sorted(n for n in v if not is_buffer(n)) for k, v in info.items()
                    if k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        problems = {k: v for k, v in problems.items() if v}
        if problems:
            sys.exit(f"{hf_dir}: from_pretrained reported {problems}")
        model = model.double().eval()
        with torch.no_grad():
            logits = model(inputs).logits
        logits.float().numpy().astype("<f4").tofile(f"{args.out}.{i}")
        print(f"transformers {__import__('transformers').__version__}: logits {tuple(logits.shape)} from {hf_dir}")


def cmd_compare(args):
    if args.library:
        try:
            from safetensors import safe_open
        except ImportError as e:
            print(f"safetensors is not installed ({e})")
            sys.exit(77)

    def params(d):
        path = os.path.join(d, "model.safetensors")
        if args.library:
            with safe_open(path, framework="numpy") as f:
                tensors = {name: f.get_tensor(name) for name in f.keys()}
        else:
            header, data = read_st(path)
            tensors = {}
            for name, e in header.items():
                if name != "__metadata__":
                    b, end = e["data_offsets"]
                    tensors[name] = np.frombuffer(data[b:end], dtype=NP_DTYPES[e["dtype"]]).reshape(e["shape"])
        out = {}
        for name, t in tensors.items():
            key = name[len(PREFIX):] if name.startswith(PREFIX) else name
            if not (key == "lm_head.weight" or key.endswith("attn.bias") or key.endswith("attn.masked_bias")):
                out[key] = t
        return out

    a, b = params(args.a), params(args.b)
    if sorted(a) != sorted(b):
        sys.exit(f"different tensors: only in {args.a}: {sorted(set(a) - set(b))}, only in {args.b}: {sorted(set(b) - set(a))}")
    for key in a:
        if a[key].dtype != b[key].dtype or a[key].shape != b[key].shape or a[key].tobytes() != b[key].tobytes():
            sys.exit(f"{key} differs: {a[key].dtype}{a[key].shape} vs {b[key].dtype}{b[key].shape}")
    reader = "safetensors library" if args.library else "fixture reader"
    print(f"{reader}: {len(a)} tensors bit-identical ({sorted({str(t.dtype) for t in a.values()})})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("dir")
    w.add_argument("--layers", type=int, default=2)
    w.add_argument("--channels", type=int, default=64)
    w.add_argument("--heads", type=int, default=4)
    w.add_argument("--max-seq-len", type=int, default=32)
    w.add_argument("--vocab", type=int, default=300)
    w.add_argument("--seed", type=int, default=1)
    w.add_argument("--std", type=float, default=0.1)
    w.add_argument("--dtype", choices=["F32", "F16", "BF16"], default="F32")
    w.add_argument("--values-of", choices=["F16", "BF16"], help="round values to this precision first")
    w.add_argument("--prefix", action="store_true", help="names start with transformer.")
    w.add_argument("--buffers", action="store_true", help="add the attn.bias / attn.masked_bias buffers")
    w.add_argument("--lm-head", action="store_true", help="add lm_head.weight (a copy of wte)")
    w.add_argument("--special", action="store_true", help="plant special fp32 values in h.0.ln_1.bias")
    w.add_argument("--drop", action="append", help="leave this tensor out")
    c = sub.add_parser("corrupt")
    c.add_argument("src")
    c.add_argument("dst")
    c.add_argument("kind")
    n = sub.add_parser("numpy-logits")
    n.add_argument("dir")
    n.add_argument("inputs")
    n.add_argument("B", type=int)
    n.add_argument("T", type=int)
    n.add_argument("out")
    t = sub.add_parser("transformers-logits")
    t.add_argument("inputs")
    t.add_argument("B", type=int)
    t.add_argument("T", type=int)
    t.add_argument("out")
    t.add_argument("dirs", nargs="+")
    lc = sub.add_parser("compare")
    lc.add_argument("a")
    lc.add_argument("b")
    lc.add_argument("--library", action="store_true", help="read with the safetensors library")
    args = ap.parse_args()
    {"write": cmd_write, "corrupt": cmd_corrupt, "numpy-logits": cmd_numpy_logits,
     "transformers-logits": cmd_transformers_logits, "compare": cmd_compare}[args.command](args)


if __name__ == "__main__":
    main()
