#!/usr/bin/env python3
"""GPT-2 weights between Hugging Face's layout and our model file (../shared/FORMATS.md).

  dev/hf_gpt2.py import HF_DIR MODEL.bin [--bf16]   model.safetensors + config.json -> version 3 (fp32)
                                                    or, with --bf16, version 5 (bf16)
  dev/hf_gpt2.py export MODEL.bin HF_DIR            version 3 or 5 -> model.safetensors (F32 tensors)
                                                    + config.json that GPT2LMHeadModel.from_pretrained loads

Needs only NumPy: the safetensors reader and writer are below (doc/hf_weights.md walks through them).

The four facts a GPT-2 converter has to get right:
  - HF's GPT-2 uses Conv1D, whose weight is stored (in_features, out_features); ours are stored
    (out_features, in_features) like nn.Linear, so every c_attn/c_proj/c_fc weight is transposed.
  - lm_head.weight is tied to wte.weight: we have no LM head tensor; if a file carries one, it must
    equal wte (we refuse it otherwise rather than silently drop a different head).
  - h.N.attn.bias and h.N.attn.masked_bias are buffers (the causal mask and its fill value) that old
    checkpoints saved; they are not parameters and are skipped.
  - our wte has Vp = V rounded up to a multiple of 128 rows (50257 -> 50304); import appends zero rows,
    export drops them and refuses a file whose padded rows are not zero (training never changes them:
    they get no gradient, so a non-zero row means a corrupt or foreign file).

Import accepts key names with or without the `transformer.` prefix (the hub's gpt2 file has none,
save_pretrained writes it), and F32, F16 and BF16 tensors, converted to fp32 exactly; --bf16 then
rounds fp32 to bf16 to nearest even, NaN kept NaN (llmc/io/checkpoint.h does the same). Export writes
every tensor as F32 (a version-5 file is upcast exactly), with the `transformer.` prefix and no
lm_head.weight, as GPT2LMHeadModel.save_pretrained does.

Our model files carry a CRC-32 per block of their weights and one of their header, in header slots
64..255 that llm.c does not read (llmc/io/checksum.h): import writes them, export checks them and
refuses a file whose bytes do not match (a disk or copy error), naming the bytes. A file without
them (llm.c's) is exported unverified, with a note.

Errors (a missing, truncated, corrupt or foreign file, a shape or config we cannot convert) print one
line, `hf_gpt2.py: error: ...`, and exit with status 1.
"""

import argparse
import json
import math
import os
import sys
import zlib

from repo_python import need

need("numpy")
import numpy as np  # noqa: E402

# ---------------------------------------------------------------------------------------------------
# our model file

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
MODEL_MAGIC = 20240326
VERSION_FP32, VERSION_BF16 = 3, 5
OUR_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
             "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]


# checksums, as llmc/io/checksum.h writes them; zlib.crc32 is the same CRC-32
CHECKSUM_TAG = 20261203
SLOT_TAG, SLOT_BLOCK_BYTES, SLOT_BLOCKS, SLOT_HEADER, SLOT_FIRST_BLOCK = 64, 65, 66, 67, 68
MAX_BLOCKS = HEADER_INTS - SLOT_FIRST_BLOCK
MIB = 1 << 20


class ConvertError(Exception):
    """Anything we refuse to convert: printed as one line, exit status 1."""


def pad_vocab(V):
    return (V + 127) // 128 * 128


def our_shapes(cfg):
    """Shapes of the 16 tensors in checkpoint order; per-layer tensors are stacked over L."""
    L, C, maxT, Vp = cfg["L"], cfg["C"], cfg["maxT"], cfg["Vp"]
    return [(Vp, C), (maxT, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C), (L, C, C), (L, C),
            (L, C), (L, C), (L, 4 * C, C), (L, 4 * C), (L, C, 4 * C), (L, C), (C,), (C,)]


def check_our_config(cfg, source):
    """The same limits as llmc/gpt2_config.h's validate_config."""
    if min(cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"]) <= 0:
        raise ConvertError(f"{source}: model sizes must be positive ({cfg})")
    if cfg["C"] % cfg["NH"]:
        raise ConvertError(f"{source}: channels {cfg['C']} are not divisible by the {cfg['NH']} heads")
    if cfg["Vp"] < cfg["V"] or cfg["Vp"] % 128:
        raise ConvertError(f"{source}: padded vocab {cfg['Vp']} must be a multiple of 128 and at least "
                           f"the vocab {cfg['V']}")
    if cfg["maxT"] > 1 << 20 or cfg["V"] > 1 << 24 or cfg["L"] > 1024 or cfg["C"] > 1 << 16:
        raise ConvertError(f"{source}: model sizes are implausibly large ({cfg})")


def checksum_block_bytes(payload):
    """1 MiB, or the fewest whole MiB that need at most MAX_BLOCKS blocks."""
    return max(1, -(-payload // (MAX_BLOCKS * MIB))) * MIB


def header_crc(header):
    """CRC-32 of the 1024-byte header with its own slot zero."""
    h = header.astype("<i4")
    h[SLOT_HEADER] = 0
    return zlib.crc32(h.tobytes())


class BlockCrcs:
    """CRC-32 of each block_bytes bytes of a stream fed in pieces of any size."""

    def __init__(self, block_bytes):
        self.block_bytes, self.sums, self.crc, self.fill = block_bytes, [], 0, 0

    def add(self, data):
        view = memoryview(data).cast("B")
        while len(view):
            take = min(len(view), self.block_bytes - self.fill)
            self.crc = zlib.crc32(view[:take], self.crc)
            self.fill += take
            view = view[take:]
            if self.fill == self.block_bytes:
                self.sums.append(self.crc)
                self.crc, self.fill = 0, 0

    def finish(self):
        if self.fill:
            self.sums.append(self.crc)
        return self.sums


def verify_checksums(path, h, payload):
    """Checks the file's blocks against the CRCs in its header h; a file without them passes with a note."""
    if h[SLOT_TAG] == 0:
        print(f"note: model file {path} carries no checksums (written by llm.c, or before checksums existed); "
              "read unverified")
        return
    block, blocks = int(h[SLOT_BLOCK_BYTES]), int(h[SLOT_BLOCKS])
    if h[SLOT_TAG] != CHECKSUM_TAG or block < MIB or block % MIB or blocks != -(-payload // block) \
            or blocks > MAX_BLOCKS:
        raise ConvertError(f"model file {path} is corrupt: its checksum fields (header slots 64..66: "
                           f"{h[SLOT_TAG]}, {block}, {blocks}) do not describe its {payload} payload bytes")
    stored = h.view("<u4")
    if header_crc(h) != stored[SLOT_HEADER]:
        raise ConvertError(f"model file {path} is corrupt: its header (bytes [0, {HEADER_BYTES})) does not match "
                           "its checksum")
    with open(path, "rb") as f:
        f.seek(HEADER_BYTES)
        for i in range(blocks):
            data = f.read(min(block, payload - i * block))
            if zlib.crc32(data) != stored[SLOT_FIRST_BLOCK + i]:
                begin = HEADER_BYTES + i * block
                raise ConvertError(f"model file {path} is corrupt: bytes [{begin}, {begin + len(data)}) (block "
                                   f"{i + 1} of {blocks}) do not match their checksum")


def read_model(path):
    """Returns (cfg, version, 16 fp32 arrays in checkpoint order); a version-5 file is upcast exactly."""
    size = file_size(path, "model file")
    if size < HEADER_BYTES:
        raise ConvertError(f"model file {path}: {size} bytes, shorter than its {HEADER_BYTES}-byte header")
    h = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if h[0] != MODEL_MAGIC:
        raise ConvertError(f"model file {path}: magic {h[0]}, expected {MODEL_MAGIC} (not a GPT-2 model file)")
    if h[1] not in (VERSION_FP32, VERSION_BF16):
        raise ConvertError(f"model file {path}: version {h[1]}, expected 3 (fp32) or 5 (bf16)")
    version = int(h[1])
    cfg = {"maxT": int(h[2]), "V": int(h[3]), "L": int(h[4]), "NH": int(h[5]), "C": int(h[6]), "Vp": int(h[7])}
    check_our_config(cfg, f"model file {path}")
    shapes = our_shapes(cfg)
    elem = 4 if version == VERSION_FP32 else 2
    expected = HEADER_BYTES + sum(math.prod(s) for s in shapes) * elem
    if size != expected:
        raise ConvertError(f"model file {path}: {size} bytes, but its header (version {version}, {cfg}) "
                           f"implies {expected} (truncated?)")
    verify_checksums(path, h, expected - HEADER_BYTES)
    flat = np.memmap(path, dtype="<f4" if elem == 4 else "<u2", mode="r", offset=HEADER_BYTES)
    tensors, offset = [], 0
    for shape in shapes:
        n = math.prod(shape)
        part = flat[offset:offset + n].reshape(shape)
        tensors.append(np.asarray(part, dtype=np.float32) if elem == 4 else bf16_to_f32(part))
        offset += n
    return cfg, version, tensors


def write_model(path, cfg, version, tensor_chunks):
    """Writes the header, then each fp32 array that tensor_chunks yields (in checkpoint order),
    as fp32 (version 3) or bf16 (version 5), then the header again with the checksums of the
    blocks. Written under a temporary name and renamed."""
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:8] = [MODEL_MAGIC, version, cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"], cfg["Vp"]]
    expected = sum(math.prod(s) for s in our_shapes(cfg))
    payload = expected * (4 if version == VERSION_FP32 else 2)
    crcs = BlockCrcs(checksum_block_bytes(payload))
    header[SLOT_TAG:SLOT_BLOCKS + 1] = [CHECKSUM_TAG, crcs.block_bytes, -(-payload // crcs.block_bytes)]
    written = 0
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            for chunk in tensor_chunks:
                chunk = np.ascontiguousarray(chunk, dtype=np.float32)
                data = (chunk.astype("<f4") if version == VERSION_FP32 else f32_to_bf16(chunk).astype("<u2")).tobytes()
                crcs.add(data)
                f.write(data)
                written += chunk.size
            if written != expected:   # a bug here, not a user error
                raise AssertionError(f"wrote {written} parameters, the header implies {expected}")
            sums = header.view("<u4")
            blocks = crcs.finish()
            sums[SLOT_FIRST_BLOCK:SLOT_FIRST_BLOCK + len(blocks)] = blocks
            sums[SLOT_HEADER] = header_crc(header)
            f.seek(0)
            f.write(header.tobytes())
        os.replace(tmp, path)
    finally:   # never leave a partial file behind
        if os.path.exists(tmp):
            os.remove(tmp)


# ---------------------------------------------------------------------------------------------------
# bf16: the top 16 bits of an fp32. NumPy has no bf16 dtype, so bf16 lives in uint16 bit patterns.

def bf16_to_f32(bits):
    """Exact: the bf16 bits become the top half of an fp32."""
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """Round to nearest, ties to even; NaN stays NaN (quiet bit set), as llmc/io/checkpoint.h."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16   # no overflow: NaN excluded below
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, (bits >> 16) | np.uint32(0x40), rounded).astype(np.uint16)


# ---------------------------------------------------------------------------------------------------
# safetensors: u64 little-endian header length N, N bytes of JSON, then the raw tensors.
# The JSON maps each name to {"dtype", "shape", "data_offsets": [begin, end]} (byte offsets into the
# data section, which starts right after the JSON) and may hold "__metadata__" (string to string).

ST_DTYPE_SIZES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
                  "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
ST_FLOAT_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}   # the ones we convert (BF16 as bits)
ST_MAX_HEADER = 100 << 20   # the safetensors library's own limit


class SafeTensor:
    """One tensor of a safetensors file: dtype, shape, and its bytes mapped from the file."""

    def __init__(self, name, dtype, shape, data):
        self.name, self.dtype, self.shape, self.data = name, dtype, tuple(shape), data

    def to_f32(self):
        """The tensor as fp32 (exact for F32, F16 and BF16)."""
        if self.dtype not in ST_FLOAT_DTYPES:
            raise ConvertError(f"tensor {self.name} has dtype {self.dtype}; expected F32, F16 or BF16")
        raw = np.frombuffer(self.data, dtype=ST_FLOAT_DTYPES[self.dtype]).reshape(self.shape)
        return bf16_to_f32(raw) if self.dtype == "BF16" else raw.astype(np.float32)


def file_size(path, what):
    try:
        return os.path.getsize(path)
    except OSError as e:
        raise ConvertError(f"{what} {path}: {e.strerror}")


def read_safetensors(path):
    """Returns ({name: SafeTensor}, metadata) after checking the whole header against the file."""
    size = file_size(path, "safetensors file")
    where = f"safetensors file {path}"
    if size < 8:
        raise ConvertError(f"{where}: {size} bytes, too short for the 8-byte header length (truncated?)")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > ST_MAX_HEADER or 8 + n > size:
            raise ConvertError(f"{where}: header length {n} does not fit the file's {size} bytes "
                               "(truncated, or not a safetensors file)")
        raw_header = f.read(n)
    try:
        header = json.loads(raw_header.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ConvertError(f"{where}: the header is not JSON (not a safetensors file?)")
    if not isinstance(header, dict):
        raise ConvertError(f"{where}: the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ConvertError(f"{where}: __metadata__ must map strings to strings")

    data_start = 8 + n
    data_len = size - data_start
    spans = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise ConvertError(f"{where}: tensor {name}: expected exactly dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in ST_DTYPE_SIZES:
            raise ConvertError(f"{where}: tensor {name}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ConvertError(f"{where}: tensor {name}: shape {shape!r} is not a list of sizes")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise ConvertError(f"{where}: tensor {name}: data_offsets {offsets!r} are not [begin, end]")
        begin, end = offsets
        nbytes = math.prod(shape) * ST_DTYPE_SIZES[dtype]
        if end - begin != nbytes:
            raise ConvertError(f"{where}: tensor {name}: {dtype} {shape} needs {nbytes} bytes, "
                               f"data_offsets span {end - begin}")
        if end > data_len:
            raise ConvertError(f"{where}: tensor {name} ends at data byte {end}, but the file holds only "
                               f"{data_len} bytes of data (truncated?)")
        spans.append((begin, end, name))
    # The tensors must tile the data section: no overlap, no gap, nothing after the last one.
    spans.sort()
    at = 0
    for begin, end, name in spans:
        if begin < at:
            raise ConvertError(f"{where}: tensor {name} overlaps the tensor before it (data bytes {begin}..{at})")
        if begin > at:
            raise ConvertError(f"{where}: {begin - at} unused data bytes before tensor {name}")
        at = end
    if at != data_len:
        raise ConvertError(f"{where}: {data_len - at} bytes after the last tensor (not a safetensors file?)")

    data = np.memmap(path, dtype=np.uint8, mode="r", offset=data_start, shape=(data_len,)) if data_len else np.zeros(0, np.uint8)
    tensors = {name: SafeTensor(name, header[name]["dtype"], header[name]["shape"], data[begin:end])
               for begin, end, name in spans}
    return tensors, metadata


def write_safetensors(path, entries, metadata):
    """entries: list of (name, shape, make) where make() returns that tensor as an fp32 array; all are
    written as F32. The header is padded with spaces to a multiple of 8 bytes, as the safetensors
    library does, so the data section is aligned. Written under a temporary name and renamed."""
    header, offset = {"__metadata__": metadata}, 0
    for name, shape, _ in entries:
        nbytes = math.prod(shape) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            for name, shape, make in entries:
                array = np.ascontiguousarray(make(), dtype="<f4")
                if array.shape != tuple(shape):   # a bug here, not a user error
                    raise AssertionError(f"{name}: made {array.shape}, header says {shape}")
                f.write(array.tobytes())
        os.replace(tmp, path)
    finally:   # never leave a partial file behind
        if os.path.exists(tmp):
            os.remove(tmp)


# ---------------------------------------------------------------------------------------------------
# Hugging Face's GPT-2: config.json and tensor names

# Per-layer tensors: our name, HF's name under h.N., and whether it is a Conv1D weight to transpose.
LAYER_TENSORS = [("ln1w", "ln_1.weight", False), ("ln1b", "ln_1.bias", False),
                 ("qkvw", "attn.c_attn.weight", True), ("qkvb", "attn.c_attn.bias", False),
                 ("attprojw", "attn.c_proj.weight", True), ("attprojb", "attn.c_proj.bias", False),
                 ("ln2w", "ln_2.weight", False), ("ln2b", "ln_2.bias", False),
                 ("fcw", "mlp.c_fc.weight", True), ("fcb", "mlp.c_fc.bias", False),
                 ("fcprojw", "mlp.c_proj.weight", True), ("fcprojb", "mlp.c_proj.bias", False)]
BUFFERS = ("attn.bias", "attn.masked_bias")   # per-layer buffers older checkpoints carry
PREFIX = "transformer."


def hf_shapes(cfg):
    """HF's shape of every parameter we convert, by HF name (without the prefix)."""
    C, L = cfg["C"], cfg["L"]
    per_layer = {"ln_1.weight": (C,), "ln_1.bias": (C,), "attn.c_attn.weight": (C, 3 * C),
                 "attn.c_attn.bias": (3 * C,), "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,),
                 "ln_2.weight": (C,), "ln_2.bias": (C,), "mlp.c_fc.weight": (C, 4 * C),
                 "mlp.c_fc.bias": (4 * C,), "mlp.c_proj.weight": (4 * C, C), "mlp.c_proj.bias": (C,)}
    shapes = {"wte.weight": (cfg["V"], C), "wpe.weight": (cfg["maxT"], C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for l in range(L):
        for name, shape in per_layer.items():
            shapes[f"h.{l}.{name}"] = shape
    return shapes


def read_hf_config(path):
    """Our config from a GPT-2 config.json; refuses the variants our model does not compute."""
    try:
        with open(path, encoding="utf-8") as f:
            hf = json.load(f)
    except OSError as e:
        raise ConvertError(f"config {path}: {e.strerror}")
    except ValueError as e:
        raise ConvertError(f"config {path}: not valid JSON ({e})")
    if not isinstance(hf, dict):
        raise ConvertError(f"config {path}: expected a JSON object")
    where = f"config {path}"
    if hf.get("model_type", "gpt2") != "gpt2":
        raise ConvertError(f"{where}: model_type is {hf['model_type']!r}; this converter reads GPT-2 only")

    def size(*keys):   # GPT-2's own key, then the generic alias transformers maps it to
        for key in keys:
            if key in hf:
                if type(hf[key]) is not int or hf[key] <= 0:
                    raise ConvertError(f"{where}: {key} is {hf[key]!r}, expected a positive integer")
                return hf[key]
        raise ConvertError(f"{where}: {keys[0]} is missing")

    cfg = {"C": size("n_embd", "hidden_size"), "L": size("n_layer", "num_hidden_layers"),
           "NH": size("n_head", "num_attention_heads"), "maxT": size("n_positions", "max_position_embeddings"),
           "V": size("vocab_size")}
    cfg["Vp"] = pad_vocab(cfg["V"])
    # what our forward computes (../shared/FORMATS.md): tanh GELU, 4C MLP, eps 1e-5, 1/sqrt(head size)
    # attention scaling, no cross-attention. reorder_and_upcast_attn only changes mixed-precision rounding.
    act = hf.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ConvertError(f"{where}: activation_function {act!r}; our model uses the tanh GELU (gelu_new)")
    if hf.get("n_inner") not in (None, 4 * cfg["C"]):
        raise ConvertError(f"{where}: n_inner {hf['n_inner']}; our MLP is 4 * n_embd = {4 * cfg['C']} wide")
    eps = hf.get("layer_norm_epsilon", 1e-5)
    if not isinstance(eps, (int, float)) or abs(eps - 1e-5) > 1e-12:
        raise ConvertError(f"{where}: layer_norm_epsilon {eps!r}; our LayerNorm uses 1e-5")
    for key, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                      ("add_cross_attention", False)):
        if hf.get(key, want) != want:
            raise ConvertError(f"{where}: {key} is {hf[key]!r}; our model needs {want}")
    check_our_config(cfg, where)
    return cfg


def hf_config_json(cfg):
    """A complete GPT-2 config.json for GPT2LMHeadModel (the fields the hub's gpt2 config sets)."""
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg["V"], "n_positions": cfg["maxT"], "n_ctx": cfg["maxT"], "n_embd": cfg["C"],
        "n_layer": cfg["L"], "n_head": cfg["NH"], "n_inner": None,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05, "initializer_range": 0.02,
        "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True, "use_cache": True, "dtype": "float32",
    }
    # GPT-2's <|endoftext|> is 50256; another vocabulary's special ids are unknown to us
    config["bos_token_id"] = config["eos_token_id"] = 50256 if cfg["V"] == 50257 else None
    return config


# ---------------------------------------------------------------------------------------------------
# the two directions

def import_hf(hf_dir, model_path, bf16):
    cfg = read_hf_config(os.path.join(hf_dir, "config.json"))
    st_path = os.path.join(hf_dir, "model.safetensors")
    tensors, _ = read_safetensors(st_path)
    where = f"safetensors file {st_path}"

    # names without the prefix; both spellings of one name is ambiguous
    plain = {}
    for name, t in tensors.items():
        key = name[len(PREFIX):] if name.startswith(PREFIX) else name
        if key in plain:
            raise ConvertError(f"{where}: holds both {key} and {PREFIX}{key}")
        plain[key] = t
    expected = hf_shapes(cfg)
    buffers = {f"h.{l}.{b}" for l in range(cfg["L"]) for b in BUFFERS}
    unknown = sorted(k for k in plain if k not in expected and k not in buffers and k != "lm_head.weight")
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise ConvertError(f"{where}: tensors that GPT-2 ({cfg['L']} layers) does not have: "
                           f"{', '.join(unknown[:5])}{more}")
    missing = [k for k in expected if k not in plain]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ConvertError(f"{where}: missing tensors {', '.join(missing[:5])}{more}")
    for key, shape in expected.items():
        t = plain[key]
        if t.dtype not in ST_FLOAT_DTYPES:
            raise ConvertError(f"{where}: tensor {t.name} has dtype {t.dtype}; expected F32, F16 or BF16")
        if t.shape != shape:
            hint = " (Conv1D weights are stored (in, out))" if key.endswith("weight") and len(shape) == 2 else ""
            raise ConvertError(f"{where}: tensor {t.name} has shape {list(t.shape)}, config.json implies "
                               f"{list(shape)}{hint}")

    wte = plain["wte.weight"].to_f32()
    if "lm_head.weight" in plain:
        head = plain["lm_head.weight"]
        if head.shape != wte.shape or head.dtype not in ST_FLOAT_DTYPES or \
                not np.array_equal(head.to_f32().view(np.uint32), wte.view(np.uint32)):
            raise ConvertError(f"{where}: lm_head.weight differs from wte.weight; our model ties the LM head "
                               "to the token embedding, so it cannot hold this checkpoint")

    def chunks():   # checkpoint order, one layer at a time (gpt2-xl's fcw alone is 2 GB stacked)
        V, Vp, C = cfg["V"], cfg["Vp"], cfg["C"]
        yield wte
        yield np.zeros((Vp - V, C), dtype=np.float32)   # the padded rows
        yield plain["wpe.weight"].to_f32()
        for ours, hf_name, transpose in LAYER_TENSORS:
            for l in range(cfg["L"]):
                w = plain[f"h.{l}.{hf_name}"].to_f32()
                yield w.T if transpose else w
        yield plain["ln_f.weight"].to_f32()
        yield plain["ln_f.bias"].to_f32()

    write_model(model_path, cfg, VERSION_BF16 if bf16 else VERSION_FP32, chunks())
    dtypes = sorted({plain[k].dtype for k in expected})
    print(f"imported {hf_dir} ({'/'.join(dtypes)}; L={cfg['L']} C={cfg['C']} NH={cfg['NH']} "
          f"maxT={cfg['maxT']} V={cfg['V']} padded to {cfg['Vp']}) -> {model_path} "
          f"(version {VERSION_BF16 if bf16 else VERSION_FP32}, {'bf16' if bf16 else 'fp32'})")


def export_hf(model_path, hf_dir):
    cfg, version, params = read_model(model_path)
    p = dict(zip(OUR_NAMES, params))
    V = cfg["V"]
    padded = p["wte"][V:]
    if np.any(padded.view(np.uint32) != 0):   # bitwise: -0.0 and NaN count as non-zero too
        rows = np.nonzero(np.any(padded.view(np.uint32) != 0, axis=1))[0] + V
        raise ConvertError(f"model file {model_path}: padded rows {V}..{cfg['Vp'] - 1} of wte must be zero "
                           f"(they are dropped on export), but row {rows[0]} is not ({len(rows)} such rows)")
    entries = [(PREFIX + "wte.weight", (V, cfg["C"]), lambda: p["wte"][:V]),
               (PREFIX + "wpe.weight", p["wpe"].shape, lambda: p["wpe"])]
    for l in range(cfg["L"]):
        for ours, hf_name, transpose in LAYER_TENSORS:
            w = p[ours][l]
            entries.append((f"{PREFIX}h.{l}.{hf_name}", w.T.shape if transpose else w.shape,
                            (lambda w=w: w.T) if transpose else (lambda w=w: w)))
    entries += [(PREFIX + "ln_f.weight", p["lnfw"].shape, lambda: p["lnfw"]),
                (PREFIX + "ln_f.bias", p["lnfb"].shape, lambda: p["lnfb"])]
    try:
        os.makedirs(hf_dir, exist_ok=True)
    except OSError as e:
        raise ConvertError(f"output directory {hf_dir}: {e.strerror}")
    write_safetensors(os.path.join(hf_dir, "model.safetensors"), entries, {"format": "pt"})
    config_path = os.path.join(hf_dir, "config.json")
    with open(config_path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(hf_config_json(cfg), f, indent=2)
        f.write("\n")
    os.replace(config_path + ".tmp", config_path)
    print(f"exported {model_path} (version {version}; L={cfg['L']} C={cfg['C']} NH={cfg['NH']} "
          f"maxT={cfg['maxT']} V={V}, {cfg['Vp'] - V} padded rows dropped) -> {hf_dir} (F32 model.safetensors, config.json)")


def main(argv):
    ap = argparse.ArgumentParser(prog="hf_gpt2.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    a = sub.add_parser("import", help="HF_DIR (model.safetensors, config.json) -> MODEL.bin")
    a.add_argument("hf_dir")
    a.add_argument("model")
    a.add_argument("--bf16", action="store_true", help="write version 5 (bf16) instead of 3 (fp32)")
    e = sub.add_parser("export", help="MODEL.bin -> HF_DIR (model.safetensors with F32 tensors, config.json)")
    e.add_argument("model")
    e.add_argument("hf_dir")
    args = ap.parse_args(argv)
    try:
        if args.command == "import":
            import_hf(args.hf_dir, args.model, args.bf16)
        else:
            export_hf(args.model, args.hf_dir)
    except ConvertError as err:
        print(f"hf_gpt2.py: error: {err}", file=sys.stderr)
        return 1
    except OSError as err:   # e.g. an unwritable output path
        print(f"hf_gpt2.py: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
