#!/usr/bin/env python3
"""PyTorch oracle for the GPT-2 trainer: the reference the C++/CUDA code is tested against.

It is written from the model spec (doc: shared/FORMATS.md), not from the C++ sources; autograd does
every backward pass, so a disagreement with the C++ points at the C++ (or at the spec).

What it writes into --out DIR:
  model.bin   the initial parameters, checkpoint version 3 (fp32)
  state.bin   a debug test state for sample 0 of the shard: inputs, targets, logits (B,T,V), loss,
              and the gradients of the 16 parameter tensors (version 2, same layout as llm.c's)
  train.bin   with --data-tokens N: a synthetic data shard the run (and the C++) trains on
  run.json    with --steps S: per-step loss, learning rate and gradient norm of the run (--opt: AdamW,
              or torch.optim.Muon / torch.optim.Adafactor as train_gpt2's -opt uses them)
  final.bin   with --steps S: the parameters after S updates (version 3)
  llmc/       with --llmc-checkpoint S: llm.c's checkpoint of step S (its state file format, see
              write_llmc_checkpoint); --resume-llmc DIR:S continues one
  llmc_test.json  with --llmc-test-steps N: N losses of llm.c's test_gpt2 recipe on state.bin's batch

Other modes: --check-grads compares autograd with central finite differences (float64);
--hellaswag FILE.jsonl --init-from MODEL.bin --bpe-dir DIR scores HellaSwag-format examples with the
model (float64) and writes DIR/hellaswag.json (see score_hellaswag);
--bench N prints `oracle_ms_per_step <ms>` for N training steps (optionally on CUDA);
--check-muon-ns checks that newton_schulz() below, run in bfloat16, is torch.optim.Muon's own
orthogonalization bit for bit (so that --muon-ns-dtype compute changes only the precision).

Examples (with the interpreter that has torch: .venv/bin/python after scripts/install_deps.sh, or
whatever scripts/find_python.sh prints; PyTorch 2.x):
  .venv/bin/python test/oracle/gpt2_oracle.py --out /tmp/or --layers 2 --channels 64 --heads 4 \\
      --max-seq-len 32 --vocab 300 -b 2 -t 16 --data-tokens 4096 --steps 10 --lr 1e-3
  .venv/bin/python test/oracle/gpt2_oracle.py --check-grads
  .venv/bin/python test/oracle/gpt2_oracle.py --model d12 -b 4 -t 64 --bench 5 --threads 2 [--compile]

Errors in flags or input files print one line to stderr and exit with status 2.
"""

import argparse
import json
import math
import os
import sys
import time
# numpy and torch are imported in main(), after --threads has set the thread pools' variables;
# a script that imports this module must set gpt2_oracle.torch, .F and .np itself.

# ---------------------------------------------------------------------------------------------------
# constants of the file formats and of the training recipe

HEADER_INTS = 256                 # every file starts with 256 little-endian int32
MODEL_MAGIC = 20240326            # version 3: fp32 tensors, version 5: bf16 tensors
STATE_MAGIC, STATE_VERSION = 20240327, 2
SHARD_MAGIC, SHARD_VERSION = 20240520, 1
LLMC_STATE_MAGIC, LLMC_STATE_VERSION = 20240527, 1   # llm.c's train_gpt2.cu optimizer state (its save_state)

PARAM_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}   # 2-D weights get weight decay

MODEL_PRESETS = {   # name: (layers, channels, heads); all have maxT 1024, V 50257
    "d6": (6, 384, 6), "d12": (12, 768, 12), "d24": (24, 1024, 16),
    "d36": (36, 1280, 20), "d48": (48, 1600, 25),
}

LN_EPS = 1e-5
INIT_STD = 0.02
BETA1, BETA2, ADAM_EPS = 0.9, 0.95, 1e-8
GRAD_CLIP = 1.0


class UsageError(Exception):
    """A bad flag or input file: reported on stderr, exit status 2."""


# ---------------------------------------------------------------------------------------------------
# command line (parsed before torch is imported, so --threads can reach OpenBLAS through its env var)

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output directory (created if missing)")
    g = ap.add_argument_group("model")
    g.add_argument("--model", choices=sorted(MODEL_PRESETS), help="preset size (maxT 1024, V 50257)")
    g.add_argument("--layers", type=int, help="L")
    g.add_argument("--channels", type=int, help="C")
    g.add_argument("--heads", type=int, help="NH")
    g.add_argument("--max-seq-len", type=int, help="maxT")
    g.add_argument("--vocab", type=int, help="V (padded to Vp, a multiple of 128)")
    g.add_argument("--init-from", help="start from this checkpoint (version 3 or 5) instead of random init")
    g.add_argument("--seed", type=int, default=0, help="seed of the parameter init and synthetic data")
    g = ap.add_argument_group("batch and numerics")
    g.add_argument("-b", "--batch-size", type=int, dest="B", help="micro-batch B (default 4)")
    g.add_argument("-t", "--seq-len", type=int, dest="T", help="sequence length T (default min(64, maxT))")
    g.add_argument("--dtype", choices=["float64", "float32"],
                   help="compute dtype (default float64; float32 for --bench)")
    g.add_argument("--threads", type=int, help="CPU threads for torch and OpenBLAS")
    g.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    g = ap.add_argument_group("data (one of)")
    g.add_argument("--data-tokens", type=int, help="write DIR/train.bin with N synthetic tokens")
    g.add_argument("--shard", help="read tokens from this existing data shard")
    g = ap.add_argument_group("training run")
    g.add_argument("--steps", type=int, default=0, help="training steps (0: only model.bin and state.bin)")
    g.add_argument("--lr", type=float, default=1e-4)
    g.add_argument("--warmup", type=int, default=0, help="linear warm-up steps W")
    g.add_argument("--final-frac", type=float, default=1.0, help="final lr as a fraction of --lr")
    g.add_argument("--schedule", choices=["cosine", "linear", "constant", "wsd"], default="cosine")
    g.add_argument("--weight-decay", type=float, default=0.0)
    g.add_argument("--accum", type=int, default=1, help="gradient accumulation micro-steps K")
    g.add_argument("--opt", choices=["adamw", "muon", "adafactor", "adamw8"], default="adamw",
                   help="optimizer, as train_gpt2 -opt (see train_with_optimizer)")
    g.add_argument("--muon-lr", type=float, default=0.02, help="--opt muon: Muon's learning rate (-ml)")
    g.add_argument("--local-steps", type=int, default=0, metavar="H",
                   help="train_gpt2 -lh H: --replicas replicas, each with its share of --accum's micro-batches, "
                        "synchronized every H steps and after the last (--opt adamw)")
    g.add_argument("--replicas", type=int, default=2, help="--local-steps, --powersgd, --sign: data-parallel replicas P")
    g.add_argument("--powersgd", type=int, default=0, metavar="R",
                   help="train_gpt2 -gc powersgd -gr R: --replicas replicas' gradients compressed (--opt adamw)")
    g.add_argument("--sign", action="store_true",
                   help="train_gpt2 -gc sign: --replicas replicas' gradients by EF21's scaled sign (--opt adamw)")
    g.add_argument("--outer", choices=["nesterov", "mean"], default="nesterov",
                   help="--local-steps: DiLoCo's outer Nesterov step (lr 0.7, momentum 0.9; -lo 1) or the mean (-lo 0)")
    g.add_argument("--muon-ns-dtype", choices=["bfloat16", "compute"], default="bfloat16",
                   help="--opt muon: Newton-Schulz in bfloat16 (torch.optim.Muon as it is) or in --dtype")
    g.add_argument("--llmc-checkpoint", metavar="S[:J]",
                   help="--opt adamw: after step S write llm.c's checkpoint of it into OUT/llmc (model_S.bin, "
                        "state_S_00000.bin in llm.c's format, DONE_S) whose loader stands at batch J of the shard "
                        "(default S*accum, where a straight run is), and continue the run from batch J")
    g.add_argument("--resume-llmc", metavar="DIR:S",
                   help="--opt adamw: start from llm.c's checkpoint S in DIR (one process, unshuffled): its master "
                        "weights (else its model file), m, v, step and loader batch; train steps S+1..--steps")
    g.add_argument("--llmc-test-steps", type=int, default=0, metavar="N",
                   help="also write llmc_test.json: the losses of N steps on the debug state's batch as llm.c's "
                        "test_gpt2 takes them (torch.optim.AdamW lr 1e-4, betas 0.9/0.999, eps 1e-8, weight decay 0.01 "
                        "on every tensor, no clipping), for check_gpt2 -l")
    g = ap.add_argument_group("other modes")
    g.add_argument("--check-grads", action="store_true",
                   help="compare autograd with finite differences (float64; tiny model by default)")
    g.add_argument("--hellaswag", metavar="JSONL", help="score these HellaSwag examples (needs --init-from, --bpe-dir)")
    g.add_argument("--bpe-dir", help="GPT-2's encoder.json and vocab.bpe, for --hellaswag (tokenized by tiktoken)")
    g.add_argument("--bench", type=int, metavar="N", help="time N training steps, print ms/step, exit")
    g.add_argument("--check-muon-ns", action="store_true",
                   help="check newton_schulz() in bfloat16 against torch.optim.Muon's, bit for bit")
    g.add_argument("--bf16", action="store_true", help="bench on cuda: torch.autocast bf16")
    g.add_argument("--compile", action="store_true", help="bench: torch.compile the loss (CPU or cuda)")
    g.add_argument("--sdpa", action="store_true", help="bench: F.scaled_dot_product_attention")
    return ap.parse_args(argv)


class Config:
    """Model shape. Vp is V rounded up to a multiple of 128 unless a checkpoint says otherwise."""

    def __init__(self, maxT, V, L, NH, C, Vp=None):
        self.maxT, self.V, self.L, self.NH, self.C = maxT, V, L, NH, C
        self.Vp = Vp if Vp is not None else (V + 127) // 128 * 128

    def shapes(self):
        L, C, maxT, Vp = self.L, self.C, self.maxT, self.Vp
        return [(Vp, C), (maxT, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C), (L, C, C), (L, C),
                (L, C), (L, C), (L, 4 * C, C), (L, 4 * C), (L, C, 4 * C), (L, C), (C,), (C,)]

    def num_params(self):
        return sum(math.prod(s) for s in self.shapes())

    def as_dict(self):
        return {"maxT": self.maxT, "V": self.V, "Vp": self.Vp, "L": self.L, "NH": self.NH, "C": self.C}

    def __str__(self):
        return (f"L={self.L} C={self.C} NH={self.NH} maxT={self.maxT} V={self.V} Vp={self.Vp} "
                f"params={self.num_params():,}")


def check_config(cfg):
    if min(cfg.L, cfg.C, cfg.NH, cfg.maxT, cfg.V) < 1:
        raise UsageError("layers, channels, heads, max-seq-len and vocab must all be >= 1")
    if cfg.C % cfg.NH:
        raise UsageError(f"channels ({cfg.C}) must be divisible by heads ({cfg.NH})")
    if cfg.Vp < cfg.V:
        raise UsageError(f"padded vocab {cfg.Vp} is smaller than vocab {cfg.V}")


def config_from_args(args, default_tiny):
    """The model shape from --model or the five explicit flags (or a tiny default for --check-grads)."""
    explicit = [args.layers, args.channels, args.heads, args.max_seq_len, args.vocab]
    if args.model and any(x is not None for x in explicit):
        raise UsageError("give either --model or --layers/--channels/--heads/--max-seq-len/--vocab, not both")
    if args.model:
        L, C, NH = MODEL_PRESETS[args.model]
        cfg = Config(1024, 50257, L, NH, C)
    elif all(x is not None for x in explicit):
        cfg = Config(args.max_seq_len, args.vocab, args.layers, args.heads, args.channels)
    elif all(x is None for x in explicit) and default_tiny:
        cfg = Config(16, 100, 2, 4, 32)
    else:
        raise UsageError("model shape needed: --model dN, or all of --layers --channels --heads "
                         "--max-seq-len --vocab, or --init-from FILE")
    check_config(cfg)
    return cfg


# ---------------------------------------------------------------------------------------------------
# file formats (all little-endian; header of 256 int32; numpy does the byte work)

def write_header(f, values):
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:len(values)] = values
    f.write(header.tobytes())


def write_f32(f, tensor):
    array = tensor.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False)
    f.write(memoryview(array).cast("B"))


def read_header(path, what):
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(HEADER_INTS * 4)
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror}")
    if len(raw) < HEADER_INTS * 4:
        raise UsageError(f"{what} {path}: {size} bytes, shorter than the 1024-byte header")
    return np.frombuffer(raw, dtype="<i4"), size


def write_model(path, cfg, params):
    """Checkpoint version 3: header then the 16 tensors in fp32."""
    with open(path, "wb") as f:
        write_header(f, [MODEL_MAGIC, 3, cfg.maxT, cfg.V, cfg.L, cfg.NH, cfg.C, cfg.Vp])
        for p in params:
            write_f32(f, p)


def read_model(path):
    """Checkpoint version 3 (fp32) or 5 (bf16, upcast exactly to fp32). Returns (cfg, fp32 tensors)."""
    h, size = read_header(path, "checkpoint")
    if h[0] != MODEL_MAGIC:
        raise UsageError(f"checkpoint {path}: magic {h[0]}, expected {MODEL_MAGIC}")
    if h[1] not in (3, 5):
        raise UsageError(f"checkpoint {path}: version {h[1]}, expected 3 (fp32) or 5 (bf16)")
    cfg = Config(int(h[2]), int(h[3]), int(h[4]), int(h[5]), int(h[6]), int(h[7]))
    try:
        check_config(cfg)
    except UsageError as e:
        raise UsageError(f"checkpoint {path}: bad header ({e})")
    elem = 4 if h[1] == 3 else 2
    expected = HEADER_INTS * 4 + cfg.num_params() * elem
    if size != expected:
        raise UsageError(f"checkpoint {path}: {size} bytes, but the header ({cfg}, version {h[1]}) "
                         f"implies {expected}")
    if h[1] == 3:
        flat = np.fromfile(path, dtype="<f4", offset=HEADER_INTS * 4).astype(np.float32)
    else:   # bf16 is the top half of an fp32: shift the bits up 16
        bits = np.fromfile(path, dtype="<u2", offset=HEADER_INTS * 4).astype(np.uint32) << 16
        flat = bits.view(np.float32)
    params, offset = [], 0
    for shape in cfg.shapes():
        n = math.prod(shape)
        params.append(torch.from_numpy(flat[offset:offset + n].copy()).view(shape))
        offset += n
    return cfg, params


def write_shard(path, tokens):
    with open(path, "wb") as f:
        write_header(f, [SHARD_MAGIC, SHARD_VERSION, len(tokens)])
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def read_shard(path, vocab):
    h, size = read_header(path, "data shard")
    if h[0] != SHARD_MAGIC:
        raise UsageError(f"data shard {path}: magic {h[0]}, expected {SHARD_MAGIC}")
    if h[1] != SHARD_VERSION:
        raise UsageError(f"data shard {path}: version {h[1]}, expected {SHARD_VERSION} (uint16 tokens)")
    n = int(h[2])
    if n < 0 or size != HEADER_INTS * 4 + 2 * n:
        raise UsageError(f"data shard {path}: {size} bytes, but the header says {n} tokens "
                         f"= {HEADER_INTS * 4 + 2 * n} bytes")
    tokens = np.fromfile(path, dtype="<u2", offset=HEADER_INTS * 4, count=n)
    if n and int(tokens.max()) >= vocab:
        raise UsageError(f"data shard {path}: token {int(tokens.max())} is outside the vocab of {vocab}")
    return torch.from_numpy(tokens.astype(np.int64))


def write_state(path, B, T, inputs, targets, logits, loss, grads):
    """Debug state version 2: inputs, targets (int32), logits (B,T,V), loss, then the 16 gradients."""
    with open(path, "wb") as f:
        write_header(f, [STATE_MAGIC, STATE_VERSION, B, T])
        f.write(inputs.to("cpu", torch.int32).numpy().astype("<i4").tobytes())
        f.write(targets.to("cpu", torch.int32).numpy().astype("<i4").tobytes())
        write_f32(f, logits)
        write_f32(f, loss.reshape(1))
        for g in grads:
            write_f32(f, g)


# ---------------------------------------------------------------------------------------------------
# synthetic data: a random bigram Markov chain, so a model can learn it and the loss visibly falls

def write_llmc_checkpoint(out_dir, step, cfg, params, m_state, v_state, batch):
    """llm.c's checkpoint of step S as its train_gpt2.cu writes one with one process: model_S.bin (here fp32,
    version 3), state_S_00000.bin and then the empty DONE_S. The state file: 256 int32 with h[0] magic,
    h[1] version, h[2] processes (1), h[3] rank (0), h[4] master weights follow (1), h[5] shuffled (0),
    h[10] the step, h[20..23] two uint64 (its rounding generator: any value), h[30..33] two uint64, the
    loader's shard (0) and batch in it (a batch = B*T tokens with one process); then fp32 m, v and the
    master weights over all parameters in checkpoint order."""
    os.makedirs(out_dir, exist_ok=True)
    write_model(os.path.join(out_dir, f"model_{step:08d}.bin"), cfg, params)
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:6] = [LLMC_STATE_MAGIC, LLMC_STATE_VERSION, 1, 0, 1, 0]
    header[10] = step
    wide = header.view("<u8")   # int32 slots 2k, 2k+1 are uint64 k
    wide[10] = wide[11] = 13371337
    wide[15], wide[16] = 0, batch
    with open(os.path.join(out_dir, f"state_{step:08d}_00000.bin"), "wb") as f:
        f.write(header.tobytes())
        for group in (m_state, v_state, params):
            for t in group:
                write_f32(f, t)
    open(os.path.join(out_dir, f"DONE_{step:08d}"), "wb").close()


def read_llmc_checkpoint(directory, step):
    """llm.c's checkpoint S of one process, unshuffled: (cfg, parameters (its master weights when the state
    has them, else the model file's), m, v, the step, the loader's batch), each a list of 16 fp32 tensors."""
    cfg, params = read_model(os.path.join(directory, f"model_{step:08d}.bin"))
    path = os.path.join(directory, f"state_{step:08d}_00000.bin")
    h, size = read_header(path, "llm.c state file")
    if h[0] != LLMC_STATE_MAGIC or h[1] != LLMC_STATE_VERSION:
        raise UsageError(f"{path}: magic {h[0]} version {h[1]}, not llm.c's state file")
    if h[2] != 1 or h[3] != 0 or h[5] != 0:
        raise UsageError(f"{path}: processes {h[2]} rank {h[3]} shuffled {h[5]}; this reader takes one "
                         f"unshuffled process")
    N, arrays = cfg.num_params(), 3 if h[4] == 1 else 2
    if size != HEADER_INTS * 4 + 4 * N * arrays:
        raise UsageError(f"{path}: {size} bytes, expected {HEADER_INTS * 4 + 4 * N * arrays} for {N} parameters")
    wide = h.view("<u8")
    shard, batch = int(wide[15]), int(wide[16])
    if shard != 0:
        raise UsageError(f"{path}: loader at shard {shard}; this reader takes one shard")
    flat = np.fromfile(path, dtype="<f4", offset=HEADER_INTS * 4)

    def tensors(k):
        out, offset = [], k * N
        for shape in cfg.shapes():
            n = math.prod(shape)
            out.append(torch.from_numpy(flat[offset:offset + n].copy()).view(shape))
            offset += n
        return out
    return cfg, (tensors(2) if arrays == 3 else params), tensors(0), tensors(1), int(h[10]), batch


def markov_tokens(n, vocab, seed):
    """Each token has 4 random successors, taken with probability 0.6/0.2/0.1/0.05; with probability
    0.05 the next token is uniform instead. The chain's entropy rate is about 1.15 + 0.05 ln V nats
    (1.4 at V=300, 1.7 at V=50257), far below the ln V of an untrained model."""
    gen = torch.Generator().manual_seed(seed + 1)   # the params use `seed`; keep the streams apart
    successors = torch.randint(0, vocab, (vocab, 4), generator=gen).tolist()
    coin = torch.rand(n, generator=gen).tolist()
    uniform = torch.randint(0, vocab, (n,), generator=gen).tolist()
    cumulative = [0.05, 0.65, 0.85, 0.95]   # below 0.05: uniform; then successor 0, 1, 2, 3
    tokens = [uniform[0]]
    for i in range(1, n):
        u = coin[i]
        if u < cumulative[0]:
            tokens.append(uniform[i])
        else:
            k = 0 if u < cumulative[1] else 1 if u < cumulative[2] else 2 if u < cumulative[3] else 3
            tokens.append(successors[tokens[-1]][k])
    return torch.tensor(tokens, dtype=torch.int64)


def sample(tokens, i, B, T):
    """Batch i of the shard read from its start: B*T+1 tokens from i*B*T; inputs the first B*T, targets the last B*T."""
    chunk = tokens[i * B * T: i * B * T + B * T + 1]
    return chunk[:-1].view(B, T), chunk[1:].view(B, T)


def stream_batch(tokens, first, B, T):
    """B rows from the unshuffled sample stream (llmc/io/dataloader.h: sample j of the shard is the T+1
    tokens from j*T; after the last whole sample the stream starts over): rows are samples first .. first+B-1."""
    n = (len(tokens) - 1) // T
    rows = [tokens[(j % n) * T: (j % n) * T + T + 1] for j in range(first, first + B)]
    return torch.stack([r[:-1] for r in rows]), torch.stack([r[1:] for r in rows])


# ---------------------------------------------------------------------------------------------------
# the model: 16 tensors in checkpoint order, per-layer tensors stacked over L

def init_params(cfg, seed):
    """GPT-2 init in fp32 from one generator, drawn in checkpoint order."""
    gen = torch.Generator().manual_seed(seed)
    L, C = cfg.L, cfg.C
    proj_std = INIT_STD / math.sqrt(2 * L)   # residual projections: scaled by depth

    def normal(shape, std):
        return torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen)

    zeros = lambda shape: torch.zeros(shape, dtype=torch.float32)
    ones = lambda shape: torch.ones(shape, dtype=torch.float32)
    wte = normal((cfg.Vp, C), INIT_STD)
    wte[cfg.V:] = 0.0                         # padded rows never get a token and must stay zero
    wpe = normal((cfg.maxT, C), INIT_STD)
    qkvw = normal((L, 3 * C, C), INIT_STD)
    attprojw = normal((L, C, C), proj_std)
    fcw = normal((L, 4 * C, C), INIT_STD)
    fcprojw = normal((L, C, 4 * C), proj_std)
    return [wte, wpe, ones((L, C)), zeros((L, C)), qkvw, zeros((L, 3 * C)), attprojw, zeros((L, C)),
            ones((L, C)), zeros((L, C)), fcw, zeros((L, 4 * C)), fcprojw, zeros((L, C)),
            ones((C,)), zeros((C,))]


def layernorm(x, w, b):
    """(x - mean) / sqrt(var + eps) * w + b over the last axis; var is the biased (1/C) variance."""
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + LN_EPS) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(qkv, NH, use_sdpa):
    """Causal multi-head self-attention. qkv (B,T,3C) = [q | k | v]; head h is channels h*hs..(h+1)*hs-1."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // NH
    q, k, v = (z.view(B, T, NH, hs).transpose(1, 2) for z in qkv.split(C, dim=-1))   # (B,NH,T,hs)
    if use_sdpa:
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))                  # (B,NH,T,T)
        future = torch.ones(T, T, dtype=torch.bool, device=qkv.device).triu(diagonal=1)
        att = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        y = att @ v                                                                 # (B,NH,T,hs)
    return y.transpose(1, 2).reshape(B, T, C)


def forward(params, inputs, cfg, use_sdpa=False):
    """inputs (B,T) int64 -> logits (B,T,Vp)."""
    (wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb,
     ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb) = params
    T = inputs.shape[1]
    # Split the stacked (L, ...) tensors into per-layer views once: unbind's backward stacks the L
    # gradients in one go, where indexing qkvw[l] in the loop would add L full-size zero-padded
    # gradients (O(L^2) memory traffic; 3x the backward time at d12).
    (ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb) = (
        t.unbind(0) for t in (ln1w, ln1b, qkvw, qkvb, attprojw, attprojb,
                              ln2w, ln2b, fcw, fcb, fcprojw, fcprojb))
    x = wte[inputs] + wpe[:T]                                                      # (B,T,C)
    for l in range(cfg.L):
        qkv = F.linear(layernorm(x, ln1w[l], ln1b[l]), qkvw[l], qkvb[l])           # (B,T,3C)
        x = x + F.linear(attention(qkv, cfg.NH, use_sdpa), attprojw[l], attprojb[l])
        h = gelu_tanh(F.linear(layernorm(x, ln2w[l], ln2b[l]), fcw[l], fcb[l]))    # (B,T,4C)
        x = x + F.linear(h, fcprojw[l], fcprojb[l])
    return layernorm(x, lnfw, lnfb) @ wte.t()                                      # (B,T,Vp)


def cross_entropy(logits, targets, V):
    """Mean over all B*T positions, over the real vocab only: the padded logits take no part."""
    return F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1))


def loss_fn(params, inputs, targets, cfg, use_sdpa=False):
    logits = forward(params, inputs, cfg, use_sdpa)
    return cross_entropy(logits, targets, cfg.V), logits


# ---------------------------------------------------------------------------------------------------
# optimization: learning-rate schedule, clipping, AdamW (all written out, to match the C++ exactly)

def learning_rate(step, max_steps, lr, warmup, final_frac, schedule):
    """LR at 0-based `step`, in Python double. Warm-up is linear from lr/W at step 0 to lr at step W-1."""
    lr_min = final_frac * lr
    if step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "wsd":   # warmup-stable-decay: flat until 80% of the run, then a 1-sqrt decay
        decay_start = max(warmup, math.floor(0.8 * max_steps))
        if step < decay_start:
            return lr
        return lr_min + (lr - lr_min) * (1.0 - math.sqrt((step - decay_start) / (max_steps - decay_start)))
    r = (step - warmup) / (max_steps - warmup)
    if schedule == "cosine":
        return lr_min + 0.5 * (1.0 + math.cos(math.pi * r)) * (lr - lr_min)
    if schedule == "linear":
        return lr - r * (lr - lr_min)
    return lr   # constant


def clip_gradients(grads):
    """Returns the global L2 norm before clipping; scales every gradient by 1/norm if norm > 1."""
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
    if norm > GRAD_CLIP:
        scale = GRAD_CLIP / norm
        for g in grads:
            g.mul_(scale)
    return norm


def adamw_update(params, grads, m_state, v_state, step, lr, weight_decay, names=PARAM_NAMES):
    """One AdamW update at t = step+1, in the params' dtype:
    m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  m^ = m/(1-b1^t);  v^ = v/(1-b2^t)
    p = p - lr * (m^ / (sqrt(v^) + eps) + wd_i * p),  wd_i = weight_decay for 2-D weights, else 0.
    names: the tensors' names (PARAM_NAMES, or the part of them that AdamW updates)."""
    t = step + 1
    bias1, bias2 = 1.0 - BETA1 ** t, 1.0 - BETA2 ** t
    with torch.no_grad():
        for name, p, g, m, v in zip(names, params, grads, m_state, v_state):
            m.mul_(BETA1).add_(g, alpha=1.0 - BETA1)
            v.mul_(BETA2).addcmul_(g, g, value=1.0 - BETA2)
            update = torch.div(m, bias1).div_(torch.div(v, bias2).sqrt_().add_(ADAM_EPS))
            if name in DECAYED and weight_decay != 0.0:
                update.add_(p, alpha=weight_decay)
            p.add_(update, alpha=-lr)


# The matrix optimizers, as train_gpt2 -opt muon|adafactor uses them: PyTorch's own classes, given each
# layer's matrix as a tensor of its own (views into the stacked (L, ...) tensors, whose gradients are
# pointed at the matching views of the stacked gradients before every step).
MUON_MATRICES = ["qkvw", "attprojw", "fcw", "fcprojw"]   # per layer; AdamW updates the rest
STACKED = {"ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb", "fcprojw",
           "fcprojb"}   # (L, ...): one tensor per layer for the optimizers
FP32_EPS = 2.0 ** -23   # torch.finfo(torch.float32).eps: Adafactor's default eps1 for fp32 parameters


def newton_schulz(G, steps, a, b, c, eps, dtype):
    """torch.optim.Muon's orthogonalization written out, in `dtype` (Muon's own is bfloat16): X = G or
    Gᵀ (whichever is wide), X /= max(‖X‖_F, eps), then `steps` times A = X Xᵀ, X = a X + (b A + c A²) X,
    with torch.addmm as Muon calls it. --check-muon-ns checks this against Muon's in bfloat16."""
    X = G.to(dtype)
    tall = G.size(0) > G.size(1)
    if tall:
        X = X.T
    X = X / X.norm().clamp(min=eps)
    for _ in range(steps):
        A = X @ X.T
        B = torch.addmm(A, A, A, beta=b, alpha=c)
        X = torch.addmm(X, B, X, beta=a)
    return X.T if tall else X


def check_muon_ns():
    """newton_schulz in bfloat16 against torch.optim._muon's own function, bit for bit, on a wide, a tall
    and a square matrix."""
    import torch.optim._muon as muon_module
    gen = torch.Generator().manual_seed(0)
    ok = True
    for shape in [(24, 40), (96, 32), (32, 32)]:
        G = torch.randn(shape, generator=gen, dtype=torch.float32)
        args = ((muon_module.DEFAULT_A, muon_module.DEFAULT_B, muon_module.DEFAULT_C), muon_module.DEFAULT_NS_STEPS,
                muon_module.EPS)
        want = muon_module._zeropower_via_newtonschulz(G, *args)
        got = newton_schulz(G, args[1], *args[0], args[2], torch.bfloat16)
        same = want.dtype == got.dtype and torch.equal(want, got)
        print(f"check-muon-ns: {shape}: {'identical' if same else 'DIFFERENT'} ({want.dtype})")
        ok = ok and same
    print("check-muon-ns " + ("PASSED" if ok else "FAILED"))
    return 0 if ok else 1


def layer_views(names, params):
    """(name, layer or None, view) for each tensor the matrix optimizers see: a layer's slice of a stacked
    tensor, or a whole unstacked one. The views share the parameters' storage."""
    views = []
    for name, p in zip(names, params):
        if name in STACKED:
            views += [(name, l, p.detach()[l]) for l in range(p.shape[0])]
        else:
            views.append((name, None, p.detach()))
    return views


class MatrixOptimizer:
    """torch.optim.Muon on each layer's qkvw, attprojw, fcw, fcprojw with AdamW (adamw_update) on the other
    tensors, or torch.optim.Adafactor on every tensor (each layer's its own; 2-D ones factored). Weight
    decay: Muon's matrices and AdamW's wte/wpe; Adafactor's 2-D tensors. step() takes the clipped
    gradients of the 16 tensors and the step's learning rates."""

    def __init__(self, args, params):
        self.kind, self.params = args.opt, params
        views = layer_views(PARAM_NAMES, params)
        if self.kind == "muon":
            if args.muon_ns_dtype == "compute":   # the same iteration in the oracle's dtype
                import torch.optim._muon as muon_module
                muon_module._zeropower_via_newtonschulz = (
                    lambda G, coefficients, steps, eps: newton_schulz(G, steps, *coefficients, eps, G.dtype))
            self.muon_views = [(n, l, v) for n, l, v in views if n in MUON_MATRICES]
            self.muon = torch.optim.Muon([v for _, _, v in self.muon_views], lr=args.muon_lr,
                                         weight_decay=args.weight_decay)
            self.adamw_names = [n for n in PARAM_NAMES if n not in MUON_MATRICES]
            self.adamw_params = [p for n, p in zip(PARAM_NAMES, params) if n not in MUON_MATRICES]
            self.m = [torch.zeros_like(p) for p in self.adamw_params]
            self.v = [torch.zeros_like(p) for p in self.adamw_params]
        else:
            self.views = views
            matrices = [v for _, _, v in views if v.dim() == 2]
            vectors = [v for _, _, v in views if v.dim() == 1]
            self.adafactor = torch.optim.Adafactor(
                [{"params": matrices, "weight_decay": args.weight_decay}, {"params": vectors, "weight_decay": 0.0}],
                lr=args.lr, eps=(FP32_EPS, 1e-3))

    def step(self, grads, step, lr, muon_lr, weight_decay):
        by_name = dict(zip(PARAM_NAMES, grads))
        point = lambda views: [setattr(v, "grad", by_name[n] if l is None else by_name[n][l]) for n, l, v in views]
        if self.kind == "muon":
            point(self.muon_views)
            self.muon.param_groups[0]["lr"] = muon_lr
            self.muon.step()
            adamw_update(self.adamw_params, [by_name[n] for n in self.adamw_names], self.m, self.v, step, lr,
                         weight_decay, self.adamw_names)
        else:
            point(self.views)
            for group in self.adafactor.param_groups:
                group["lr"] = lr
            self.adafactor.step()


class Adamw8:
    """8-bit AdamW as train_gpt2 -opt adamw8 defines it (doc/optimizers.md), written from the definition
    with torch's operations: AdamW's update on moments kept as 8-bit codes in blocks of 256 elements,
    counted from the start of each tensor the matrix optimizers see (a layer's slice of a stacked tensor,
    or a whole unstacked one; layer_views), the last block of each shorter. Per block, a = max |m| and
    b = max v of the new moments; m = code * (a / 127) with code = round(m * (127 / a)) in [-127, 127]
    (half to even); v = b * 2^((code - 255) / 8), code 0 meaning 0, the code being the number of
    thresholds 2^((k - 254.5) / 8) (k = 1..254) and 2^-32.75 at or below v / b; where v's code is 0, m's
    is 0 too. The step uses the new moments before they are encoded."""

    def __init__(self, params):
        self.views = layer_views(PARAM_NAMES, params)
        levels = [0.0] + [2.0 ** ((q - 255) / 8) for q in range(1, 256)]
        thresholds = [levels[1] / 2] + [2.0 ** ((k - 254.5) / 8) for k in range(1, 255)]
        # the codes' tables in float32, as the trainer's (computed in double, rounded once)
        self.levels = torch.tensor(levels, dtype=torch.float32)
        self.thresholds = torch.tensor(thresholds, dtype=torch.float32)
        self.state = []
        for _, _, v in self.views:
            blocks = (v.numel() + 255) // 256
            self.state.append({"m": torch.zeros(blocks * 256, dtype=torch.int64),
                               "v": torch.zeros(blocks * 256, dtype=torch.int64),
                               "a": torch.zeros(blocks, dtype=torch.float32),
                               "b": torch.zeros(blocks, dtype=torch.float32)})

    def step(self, grads, step, lr, weight_decay):
        t = step + 1
        bias1, bias2 = 1.0 - BETA1 ** t, 1.0 - BETA2 ** t
        by_name = dict(zip(PARAM_NAMES, grads))
        with torch.no_grad():
            for (name, l, p), st in zip(self.views, self.state):
                n = p.numel()
                g = (by_name[name] if l is None else by_name[name][l]).reshape(-1)
                blocks = st["a"].numel()
                pad = blocks * 256 - n
                gb = torch.nn.functional.pad(g, (0, pad)).view(blocks, 256)
                # decode (float32, as stored), then AdamW's moments in the run's dtype
                m = (st["m"].view(blocks, 256).to(torch.float32) * (st["a"] / 127.0)[:, None]).to(p.dtype)
                v = (st["b"][:, None] * self.levels[st["v"].view(blocks, 256)]).to(p.dtype)
                m = BETA1 * m + (1.0 - BETA1) * gb
                v = BETA2 * v + (1.0 - BETA2) * gb * gb
                update = ((m / bias1) / ((v / bias2).sqrt() + ADAM_EPS)).reshape(-1)[:n]
                flat = p.view(-1)
                if name in DECAYED and weight_decay != 0.0:
                    update = update + weight_decay * flat
                flat.sub_(lr * update)
                # encode: the padding's moments are 0 and change no maximum
                m32, v32 = m.to(torch.float32), v.to(torch.float32)
                a = m32.abs().amax(dim=1)
                b = v32.amax(dim=1)
                x = torch.where(b[:, None] > 0, v32 / torch.where(b > 0, b, 1.0)[:, None], torch.zeros_like(v32))
                qv = torch.bucketize(x, self.thresholds, right=True)
                r = torch.where(a > 0, 127.0 / torch.where(a > 0, a, 1.0), torch.zeros_like(a))
                qm = torch.round(m32 * r[:, None]).clamp(-127, 127).to(torch.int64)
                qm = torch.where(qv == 0, torch.zeros_like(qm), qm)
                st["m"], st["v"], st["a"], st["b"] = qm.reshape(-1), qv.reshape(-1), a, b


def train_step(params, update, batches, loss_impl, autocast=None):
    """Accumulates the grads of loss_m / K over the K micro-batches, clips, calls update(grads).
    loss_impl(params, inputs, targets) -> scalar loss. Returns (mean of the K losses, grad norm)."""
    for p in params:
        p.grad = None
    K = len(batches)
    losses = []
    for inputs, targets in batches:
        if autocast is not None:
            with autocast():
                loss = loss_impl(params, inputs, targets)
        else:
            loss = loss_impl(params, inputs, targets)
        (loss / K).backward()
        losses.append(loss.item())
    grads = [p.grad for p in params]
    norm = clip_gradients(grads)
    update(grads)
    return sum(losses) / K, norm


def require_replicas(args, flag):
    """The data-parallel modes' common demands: AdamW, at least 2 replicas, each with as many micro-batches."""
    if args.opt != "adamw" or args.accum % args.replicas != 0 or args.replicas < 2:
        raise UsageError(f"{flag} needs --opt adamw, --replicas >= 2 and --accum a multiple of --replicas")


def train_local_steps(args, cfg, params, tokens, B, T, out_dir):
    """train_gpt2 -lh H (llmc/parallel/local_steps.h) from its definition: P replicas, replica p taking the
    step's micro-batches p, p + P, ... (the data loader's order: each micro-step's P batches in rank order),
    each with its own AdamW moments and clipping; after every H steps and after the last, with theta_0 the
    anchor: d = mean_p (theta_0 - theta_p); Nesterov: u = 0.9 u + d, theta = theta_0 - 0.7 (d + 0.9 u);
    mean: theta = theta_0 - d; every replica and the anchor become theta. Logs the mean of the replicas'
    losses and replica 0's gradient norm (train_gpt2's process 0)."""
    S, K, P, H = args.steps, args.accum, args.replicas, args.local_steps
    require_replicas(args, "--local-steps")
    loss_impl = lambda p, x, y: loss_fn(p, x, y, cfg)[0]
    replicas = [[p.detach().clone().requires_grad_(True) for p in params] for _ in range(P)]
    moments = [([torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]) for _ in range(P)]
    anchor = [p.detach().clone() for p in params]
    momentum = [torch.zeros_like(p) for p in params]
    losses, lrs, norms = [], [], []
    for s in range(S):
        lr = learning_rate(s, S, args.lr, args.warmup, args.final_frac, args.schedule)
        step_losses, step_norms = [], []
        for r in range(P):
            batches = [stream_batch(tokens, (s * K + m) * B, B, T) for m in range(r, K, P)]
            m_state, v_state = moments[r]
            update = lambda grads: adamw_update(replicas[r], grads, m_state, v_state, s, lr, args.weight_decay)
            loss, norm = train_step(replicas[r], update, batches, loss_impl)
            step_losses.append(loss), step_norms.append(norm)
        if (s + 1) % H == 0 or s + 1 == S:
            with torch.no_grad():
                for i in range(len(params)):
                    d = sum(anchor[i] - rep[i] for rep in replicas) / P
                    if args.outer == "nesterov":
                        momentum[i].mul_(0.9).add_(d)
                        anchor[i] = anchor[i] - 0.7 * (d + 0.9 * momentum[i])
                    else:
                        anchor[i] = anchor[i] - d
                    for rep in replicas:
                        rep[i].copy_(anchor[i])
        losses.append(sum(step_losses) / P), lrs.append(lr), norms.append(step_norms[0])
        print(f"step {s + 1:4d}/{S} | loss {losses[-1]:.6f} | lr {lr:.4e} | replica 0's grad norm {norms[-1]:.4f}")
    with open(os.path.join(out_dir, "run.json"), "w") as f:
        json.dump({"losses": losses, "lrs": lrs, "grad_norms": norms, "first_step": 0,
                   "config": {**cfg.as_dict(), "B": B, "T": T, "steps": S, "accum": K, "local_steps": H,
                              "replicas": P, "outer": args.outer}}, f, indent=1)
    write_model(os.path.join(out_dir, "final.bin"), cfg, replicas[0])
    return losses


def xorshift_uniforms(seed, count):
    """llmc/rand.h's xorshift64*: count floats uniform in [0, 1) (24 bits each) from state seed."""
    mask, out, x = (1 << 64) - 1, [], seed
    for _ in range(count):
        x ^= x >> 12
        x ^= (x << 25) & mask
        x ^= x >> 27
        out.append((((x * 0x2545F4914F6CDD1D) & mask) >> 32 >> 8) / 16777216.0)
    return out


def replica_shares(params, tokens, cfg, s, K, P, B, T):
    """Step s's gradient shares of P replicas: replica p's from micro-batches p, p + P, ... (each weighted
    1/K, so the shares sum to the step's gradient); and the micro-batches' losses in replica order."""
    shares, step_losses = [], []
    for r in range(P):
        for p in params:
            p.grad = None
        for m in range(r, K, P):
            inputs, targets = stream_batch(tokens, (s * K + m) * B, B, T)
            loss = loss_fn(params, inputs, targets, cfg)[0]
            (loss / K).backward()
            step_losses.append(loss.item())
        shares.append([p.grad.detach().clone() for p in params])
    return shares, step_losses


def train_compressed(args, cfg, params, tokens, B, T, out_dir, scheme, reduce_view):
    """A run of P replicas whose gradient shares are reduced view by view (layer_views) by
    reduce_view(k, view, shares of that view) -> the view's gradient; then clipping and AdamW as without
    compression. Writes run.json and final.bin as train does."""
    S, K, P = args.steps, args.accum, args.replicas
    m_state = [torch.zeros_like(p) for p in params]
    v_state = [torch.zeros_like(p) for p in params]
    views = layer_views(PARAM_NAMES, params)
    losses, lrs, norms = [], [], []
    for s in range(S):
        lr = learning_rate(s, S, args.lr, args.warmup, args.final_frac, args.schedule)
        shares, step_losses = replica_shares(params, tokens, cfg, s, K, P, B, T)
        grads = [torch.zeros_like(p) for p in params]
        with torch.no_grad():
            for k, (name, l, v) in enumerate(views):
                i = PARAM_NAMES.index(name)
                part = lambda g: g[i] if l is None else g[i][l]
                part(grads).copy_(reduce_view(k, v, [part(share) for share in shares]))
        norm = clip_gradients(grads)
        adamw_update(params, grads, m_state, v_state, s, lr, args.weight_decay)
        losses.append(sum(step_losses) / K), lrs.append(lr), norms.append(norm)
        print(f"step {s + 1:4d}/{S} | loss {losses[-1]:.6f} | lr {lr:.4e} | grad norm {norm:.4f}")
    with open(os.path.join(out_dir, "run.json"), "w") as f:
        json.dump({"losses": losses, "lrs": lrs, "grad_norms": norms, "first_step": 0,
                   "config": {**cfg.as_dict(), "B": B, "T": T, "steps": S, "accum": K, **scheme,
                              "replicas": P}}, f, indent=1)
    write_model(os.path.join(out_dir, "final.bin"), cfg, params)
    return losses


def train_powersgd(args, cfg, params, tokens, B, T, out_dir):
    """train_gpt2 -gc powersgd -gr R (llmc/parallel/powersgd.h) from its definition, with torch's QR: for
    each matrix view (layer_views) with (rows + cols) R < rows cols: M_p = g_p + e_p, P = sum_p M_p Q, P^ =
    an orthonormal basis of P's columns (QR), Q = sum_p M_p^T P^, g = P^ Q^T, e_p = M_p - g / P, Q kept;
    the other views summed exactly. Q's first value: matrix k's entries 2u - 1 from xorshift64* seeded
    with (k + 1) * 0x9E3779B97F4A7C15, (cols x R) row by row. The result is the same whichever orthonormal
    basis of P's columns is taken."""
    P, R = args.replicas, args.powersgd
    require_replicas(args, "--powersgd")
    views = layer_views(PARAM_NAMES, params)
    compressed = [v.dim() == 2 and (v.shape[0] + v.shape[1]) * R < v.numel() for _, _, v in views]
    Q = {k: torch.tensor(xorshift_uniforms((k + 1) * 0x9E3779B97F4A7C15 & ((1 << 64) - 1), v.shape[1] * R),
                         dtype=params[0].dtype).view(v.shape[1], R) * 2 - 1
         for k, (_, _, v) in enumerate(views) if compressed[k]}
    residual = [{k: torch.zeros_like(v) for k, (_, _, v) in enumerate(views) if compressed[k]} for _ in range(P)]

    def reduce_view(k, v, shares):
        if not compressed[k]:
            return sum(shares)
        M = [shares[r] + residual[r][k] for r in range(P)]
        basis = torch.linalg.qr(sum(x @ Q[k] for x in M)).Q
        Q[k] = sum(x.T @ basis for x in M)
        g = basis @ Q[k].T
        for r in range(P):
            residual[r][k] = M[r] - g / P
        return g
    return train_compressed(args, cfg, params, tokens, B, T, out_dir, {"powersgd": R}, reduce_view)


def train_sign(args, cfg, params, tokens, B, T, out_dir):
    """train_gpt2 -gc sign (llmc/parallel/grad_compression.h) from its definition, EF21 with the scaled
    sign: for each view (layer_views), flattened, in blocks of 64 from its start, on replica p with h_p
    what the others hold for its gradient and H their sum (both from 0): d = g_p - h_p, s = mean |d| over
    the block, q_p = s sign(d) (+s where d = 0), h_p += q_p, H += sum_p q_p; the view's gradient is H."""
    P = args.replicas
    require_replicas(args, "--sign")
    views = layer_views(PARAM_NAMES, params)
    h = [[torch.zeros(v.numel(), dtype=v.dtype) for _, _, v in views] for _ in range(P)]
    H = [torch.zeros(v.numel(), dtype=v.dtype) for _, _, v in views]

    def scaled_sign(d):
        n = d.numel()
        blocks = torch.nn.functional.pad(d, (0, (-n) % 64)).view(-1, 64)
        counts = torch.full((blocks.shape[0], 1), 64.0, dtype=d.dtype)
        counts[-1] = n - 64 * (blocks.shape[0] - 1)
        scale = (blocks.abs().sum(1, keepdim=True) / counts).expand(-1, 64).reshape(-1)[:n]
        return torch.where(d < 0, -scale, scale)

    def reduce_view(k, v, shares):
        q = [scaled_sign(shares[r].reshape(-1) - h[r][k]) for r in range(P)]
        for r in range(P):
            h[r][k] += q[r]
        H[k] += sum(q)
        return H[k].view_as(v)
    return train_compressed(args, cfg, params, tokens, B, T, out_dir, {"sign": True}, reduce_view)


def train(args, cfg, params, tokens, B, T, out_dir, start=None):
    """start: (step, m, v, batch) to continue llm.c's checkpoint (--resume-llmc), else None."""
    if args.powersgd:
        return train_powersgd(args, cfg, params, tokens, B, T, out_dir)
    if args.sign:
        return train_sign(args, cfg, params, tokens, B, T, out_dir)
    if args.local_steps:
        return train_local_steps(args, cfg, params, tokens, B, T, out_dir)
    S, K = args.steps, args.accum
    num_samples = (len(tokens) - 1) // T  # samples of T tokens; a micro-step reads B of them
    first_step, jump = 0, None   # jump (s0, J): from step s0 on, the stream continues from batch J (B*T-token units)
    if args.llmc_checkpoint:
        s0, _, j = args.llmc_checkpoint.partition(":")
        jump = (int(s0), int(j) if j else int(s0) * K)
        if args.opt != "adamw" or not 0 < jump[0] <= S or jump[1] < 0:
            raise UsageError("--llmc-checkpoint S[:J] needs --opt adamw, 0 < S <= --steps and J >= 0")
    if start is not None:
        first_step, jump = start[0], (start[0], start[3])
    if args.opt == "adamw":
        m_state = [torch.zeros_like(p) for p in params] if start is None else [t.to(params[0]) for t in start[1]]
        v_state = [torch.zeros_like(p) for p in params] if start is None else [t.to(params[0]) for t in start[2]]
        optimizer_step = lambda grads, s, lr, muon_lr: adamw_update(params, grads, m_state, v_state, s, lr,
                                                                      args.weight_decay)
    elif args.opt == "adamw8":
        adamw8 = Adamw8(params)
        optimizer_step = lambda grads, s, lr, muon_lr: adamw8.step(grads, s, lr, args.weight_decay)
    else:
        matrix_optimizer = MatrixOptimizer(args, params)
        optimizer_step = lambda grads, s, lr, muon_lr: matrix_optimizer.step(grads, s, lr, muon_lr, args.weight_decay)
    device = params[0].device
    loss_impl = lambda p, x, y: loss_fn(p, x, y, cfg)[0]
    losses, lrs, norms = [], [], []
    t0 = time.perf_counter()
    def first_sample(s, m):
        if jump is not None and s >= jump[0]:
            return (jump[1] + (s - jump[0]) * K + m) * B
        return (s * K + m) * B
    for s in range(first_step, S):
        if args.llmc_checkpoint and s == jump[0]:
            write_llmc_checkpoint(os.path.join(out_dir, "llmc"), s, cfg, params, m_state, v_state, jump[1])
        batches = [tuple(z.to(device) for z in stream_batch(tokens, first_sample(s, m), B, T)) for m in range(K)]
        lr = learning_rate(s, S, args.lr, args.warmup, args.final_frac, args.schedule)
        muon_lr = learning_rate(s, S, args.muon_lr, args.warmup, args.final_frac, args.schedule)
        loss, norm = train_step(params, lambda grads: optimizer_step(grads, s, lr, muon_lr), batches, loss_impl)
        losses.append(loss), lrs.append(lr), norms.append(norm)
        print(f"step {s + 1:4d}/{S} | loss {loss:.6f} | lr {lr:.4e} | grad norm {norm:.4f} "
              f"| {time.perf_counter() - t0:.1f} s")
    if args.llmc_checkpoint and S == jump[0]:
        write_llmc_checkpoint(os.path.join(out_dir, "llmc"), S, cfg, params, m_state, v_state, jump[1])
    run = {"losses": losses, "lrs": lrs, "grad_norms": norms, "first_step": first_step, "config": {
        **cfg.as_dict(), "B": B, "T": T, "dtype": args.dtype, "seed": args.seed, "steps": S,
        "lr": args.lr, "warmup": args.warmup, "final_frac": args.final_frac,
        "schedule": args.schedule, "weight_decay": args.weight_decay, "accum": K,
        "num_samples": num_samples, "beta1": BETA1, "beta2": BETA2, "eps": ADAM_EPS,
        "grad_clip": GRAD_CLIP, "init_from": args.init_from, "opt": args.opt,
        "data": args.shard or os.path.join(out_dir, "train.bin")}}
    if args.opt == "muon":
        run["config"].update({"muon_lr": args.muon_lr, "muon_ns_dtype": args.muon_ns_dtype})
    with open(os.path.join(out_dir, "run.json"), "w") as f:
        json.dump(run, f, indent=1)
    write_model(os.path.join(out_dir, "final.bin"), cfg, params)
    return losses


# ---------------------------------------------------------------------------------------------------
# modes

def resolve_batch(args, cfg):
    B = args.B if args.B is not None else 4
    T = args.T if args.T is not None else min(64, cfg.maxT)
    if B < 1 or T < 1:
        raise UsageError("-b and -t must be >= 1")
    if T > cfg.maxT:
        raise UsageError(f"-t {T} is longer than the model's max-seq-len {cfg.maxT}")
    return B, T


def run_oracle(args):
    if not args.out:
        raise UsageError("--out DIR is required")
    if args.bf16 or args.compile or args.sdpa:
        raise UsageError("--bf16, --compile and --sdpa are for --bench only")
    start = None
    if args.init_from or args.resume_llmc:
        if args.model or any(x is not None for x in
                             [args.layers, args.channels, args.heads, args.max_seq_len, args.vocab]):
            raise UsageError("--init-from and --resume-llmc take the model shape from the file; drop the model flags")
    if args.resume_llmc:
        directory, _, step = args.resume_llmc.rpartition(":")
        if args.opt != "adamw" or args.init_from or not step.isdigit():
            raise UsageError("--resume-llmc DIR:S needs --opt adamw, a step S, and no --init-from")
        cfg, params32, m, v, step, batch = read_llmc_checkpoint(directory, int(step))
        start = (step, m, v, batch)
    elif args.init_from:
        cfg, params32 = read_model(args.init_from)
    else:
        cfg = config_from_args(args, default_tiny=False)
        params32 = init_params(cfg, args.seed)
    B, T = resolve_batch(args, cfg)
    if (args.data_tokens is None) == (args.shard is None):
        raise UsageError("give exactly one of --data-tokens N and --shard PATH")
    if args.steps < 0 or args.accum < 1 or args.warmup < 0 or args.final_frac < 0:
        raise UsageError("need --steps >= 0, --accum >= 1, --warmup >= 0, --final-frac >= 0")
    if cfg.V > 65536:
        raise UsageError(f"vocab {cfg.V} does not fit the uint16 tokens of a data shard")
    os.makedirs(args.out, exist_ok=True)

    if args.shard:
        tokens = read_shard(args.shard, cfg.V)
        if len(tokens) < B * T + 1:
            raise UsageError(f"data shard {args.shard}: {len(tokens)} tokens, "
                             f"need at least B*T+1 = {B * T + 1}")
    else:
        if args.data_tokens < B * T + 1:
            raise UsageError(f"--data-tokens {args.data_tokens}: need at least B*T+1 = {B * T + 1}")
        tokens = markov_tokens(args.data_tokens, cfg.V, args.seed)
        write_shard(os.path.join(args.out, "train.bin"), tokens.numpy())

    model_path = os.path.join(args.out, "model.bin")
    write_model(model_path, cfg, params32)
    dtype = getattr(torch, args.dtype)
    params = [p.to(args.device, dtype).requires_grad_() for p in params32]
    del params32

    inputs, targets = (z.to(args.device) for z in sample(tokens, 0, B, T))
    loss, logits = loss_fn(params, inputs, targets, cfg)
    loss.backward()
    state_path = os.path.join(args.out, "state.bin")
    write_state(state_path, B, T, inputs, targets, logits[..., :cfg.V], loss.detach(),
                [p.grad for p in params])
    if args.llmc_test_steps > 0:
        test_params = [p.detach().clone().requires_grad_() for p in params]
        optimizer = torch.optim.AdamW(test_params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        test_losses = []
        for _ in range(args.llmc_test_steps):
            optimizer.zero_grad()
            step_loss = loss_fn(test_params, inputs, targets, cfg)[0]
            step_loss.backward()
            optimizer.step()
            test_losses.append(step_loss.item())
        with open(os.path.join(args.out, "llmc_test.json"), "w") as f:
            json.dump({"losses": test_losses}, f, indent=1)
    print(f"model {cfg} | B={B} T={T} dtype={args.dtype} seed={args.seed} tokens={len(tokens)}")
    print(f"loss at init {loss.item():.6f} (ln V = {math.log(cfg.V):.6f})")
    print(f"wrote {model_path}, {state_path}"
          + (f", {os.path.join(args.out, 'train.bin')}" if args.data_tokens is not None else ""))
    if args.steps > 0:
        losses = train(args, cfg, params, tokens, B, T, args.out, start)
        print(f"trained {args.steps} steps: loss {losses[0]:.6f} -> {losses[-1]:.6f}; wrote "
              f"{os.path.join(args.out, 'run.json')}, {os.path.join(args.out, 'final.bin')}")


def score_hellaswag(args):
    """HellaSwag scoring written from its definition (the lm-evaluation-harness's multiple_choice task,
    as in the GPT-2/GPT-3 papers): the model reads ctx + " " + ending, tokenized separately with
    tiktoken's GPT-2 encoding; an ending's log-likelihood is the sum of log p(token | everything before
    it) over the ending's tokens. Per example:
      pred        argmax of the log-likelihoods                                  (harness: acc)
      pred_norm   argmax of log-likelihood / len(ending), len in characters      (harness: acc_norm)
      pred_token  argmax of log-likelihood / number of ending tokens             (llm.c's "acc_norm")
    np.argmax's first-maximum rule breaks ties. Writes OUT/hellaswag.json."""
    if not (args.init_from and args.bpe_dir and args.out):
        raise UsageError("--hellaswag needs --init-from MODEL.bin, --bpe-dir DIR and --out DIR")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from tokenizer_oracle import gpt2_encoding
    enc = gpt2_encoding(args.bpe_dir)
    cfg, params32 = read_model(args.init_from)
    params = [p.to(torch.float64) for p in params32]
    results = []
    with open(args.hellaswag, encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.strip()]
    for item in items:
        ctx = enc.encode_ordinary(item["ctx"])
        lls, ntok = [], []
        for ending in item["endings"]:
            cont = enc.encode_ordinary(" " + ending)
            tokens = torch.tensor([ctx + cont], dtype=torch.int64)
            if tokens.shape[1] - 1 > cfg.maxT:
                raise UsageError(f"an example needs {tokens.shape[1] - 1} positions, the model has {cfg.maxT}")
            with torch.no_grad():
                logits = forward(params, tokens[:, :-1], cfg)[0, :, :cfg.V]
            logp = torch.log_softmax(logits, dim=-1)
            positions = range(len(ctx) - 1, len(ctx) + len(cont) - 1)
            lls.append(sum(logp[t, tokens[0, t + 1]].item() for t in positions))
            ntok.append(len(cont))
        lls = np.array(lls)
        chars = np.array([float(len(e)) for e in item["endings"]])
        results.append({"label": int(item["label"]), "sum_loss": [-x for x in lls.tolist()],
                        "pred": int(np.argmax(lls)), "pred_norm": int(np.argmax(lls / chars)),
                        "pred_token": int(np.argmax(lls / np.array(ntok, dtype=float)))})
    n = len(results)
    summary = {key: sum(r[p] == r["label"] for r in results) / n
               for key, p in (("acc", "pred"), ("acc_norm", "pred_norm"), ("acc_token", "pred_token"))}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "hellaswag.json"), "w") as f:
        json.dump({"examples": results, **summary}, f)
    print(f"hellaswag: {n} examples, acc {summary['acc']:.4f} acc_norm {summary['acc_norm']:.4f} "
          f"acc_token {summary['acc_token']:.4f}")


def run_check_grads(args):
    """Fourth-order central differences (float64) on a few entries of each tensor vs autograd:
    f' = (f(x-2h) - 8 f(x-h) + 8 f(x+h) - f(x+2h)) / 12h, truncation error O(h^4).
    Error measure per entry: |a - n| / max(|a|, |n|, 1e-4) (the floor keeps near-zero gradients, whose
    finite difference is dominated by rounding, from reading as large relative errors)."""
    if args.bf16 or args.compile or args.sdpa or args.device != "cpu":
        raise UsageError("--check-grads runs on the CPU in float64; drop --device/--bf16/--compile/--sdpa")
    cfg = config_from_args(args, default_tiny=True)
    B, T = (args.B or 2), (args.T or min(8, cfg.maxT))
    if T > cfg.maxT:
        raise UsageError(f"-t {T} is longer than the model's max-seq-len {cfg.maxT}")
    gen = torch.Generator().manual_seed(args.seed)
    params = [p.double() for p in init_params(cfg, args.seed)]
    for p in params:   # move LN weights off 1 and biases off 0 so every path is exercised
        p += 0.05 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
    params[0][cfg.V:] = 0.0
    params = [p.requires_grad_() for p in params]
    tokens = torch.randint(0, cfg.V, (B * T + 1,), generator=gen)
    inputs, targets = sample(tokens, 0, B, T)
    loss, _ = loss_fn(params, inputs, targets, cfg)
    loss.backward()
    h, per_tensor, worst = 1e-3, 4, 0.0
    print(f"check-grads: {cfg} | B={B} T={T} | loss {float(loss):.6f} | h={h}")
    with torch.no_grad():
        for name, p in zip(PARAM_NAMES, params):
            rows = cfg.V if name == "wte" else T if name == "wpe" else p.shape[0]   # reachable rows
            reach = p[:rows].reshape(-1)
            idx = torch.randint(0, reach.numel(), (per_tensor,), generator=gen).tolist()
            tensor_err = 0.0
            for i in idx:
                old = float(reach[i])
                f = {}
                for k in (-2, -1, 1, 2):
                    reach[i] = old + k * h
                    f[k] = float(loss_fn(params, inputs, targets, cfg)[0])
                reach[i] = old
                numeric = (f[-2] - 8 * f[-1] + 8 * f[1] - f[2]) / (12 * h)
                analytic = float(p.grad[:rows].reshape(-1)[i])
                err = abs(analytic - numeric) / max(abs(analytic), abs(numeric), 1e-4)
                tensor_err = max(tensor_err, err)
            worst = max(worst, tensor_err)
            print(f"  {name:9s} max rel err {tensor_err:.3e}")
    pad_ok = cfg.Vp == cfg.V or float(params[0].grad[cfg.V:].abs().max()) == 0.0
    print(f"max rel err {worst:.3e}; padded wte rows have zero grad: {pad_ok}")
    ok = worst < 1e-5 and pad_ok
    print("check-grads " + ("PASSED" if ok else "FAILED"))
    return 0 if ok else 1


def run_bench(args):
    """Times N training steps after 2 warm-up steps (with --compile, the warm-up also compiles), the
    way a PyTorch user would write the step: the oracle's model (optionally with SDPA attention and
    torch.compile), autograd, clip_grad_norm_ to 1.0 and torch.optim.AdamW (fused where this torch
    has it). So this is PyTorch's speed on our model, not the oracle's hand-written AdamW's."""
    if args.bench < 1:
        raise UsageError("--bench N needs N >= 1")
    if args.device != "cuda" and args.bf16:
        raise UsageError("--bf16 needs --device cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch sees no CUDA device")
    if args.compile and not hasattr(torch, "compile"):
        raise UsageError(f"--compile needs torch >= 2.0 (this is {torch.__version__})")
    if args.sdpa and not hasattr(F, "scaled_dot_product_attention"):
        raise UsageError(f"--sdpa needs torch >= 2.0 (this is {torch.__version__})")
    cfg = config_from_args(args, default_tiny=False)
    B, T = resolve_batch(args, cfg)
    dtype = getattr(torch, args.dtype)
    params = [p.to(args.device, dtype).requires_grad_() for p in init_params(cfg, args.seed)]
    # weight decay 0, as train_gpt2's default (-c 0): it would add one elementwise pass either way
    try:
        optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(BETA1, BETA2), eps=ADAM_EPS, weight_decay=0.0,
                                      fused=True)
        fused = True
    except (RuntimeError, TypeError):  # no fused AdamW for this device in this torch
        optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(BETA1, BETA2), eps=ADAM_EPS, weight_decay=0.0,
                                      foreach=True)
        fused = False
    gen = torch.Generator().manual_seed(args.seed + 2)
    inputs, targets = (z.to(args.device)
                       for z in sample(torch.randint(0, cfg.V, (B * T + 1,), generator=gen), 0, B, T))
    loss_impl = lambda p, x, y: loss_fn(p, x, y, cfg, args.sdpa)[0]
    if args.compile:
        loss_impl = torch.compile(loss_impl)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync()
    t_start = time.perf_counter()
    for s in range(2 + args.bench):
        if s == 2:
            sync()
            t0, cpu0 = time.perf_counter(), time.process_time()
            # the first two steps: torch.compile's tracing and code generation (when --compile), warm-up
            warmup_s = t0 - t_start
        optimizer.zero_grad(set_to_none=True)
        if args.bf16:
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = loss_impl(params, inputs, targets)
        else:
            loss = loss_impl(params, inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
        optimizer.step()
    sync()
    ms = (time.perf_counter() - t0) * 1e3 / args.bench
    # CPU time of all threads: wall time far above cpu_ms / threads means the machine is busy
    cpu_ms = (time.process_time() - cpu0) * 1e3 / args.bench
    print(f"# torch {torch.__version__} {cfg} B={B} T={T} dtype={args.dtype} device={args.device} "
          f"threads={torch.get_num_threads()} bf16={args.bf16} compile={args.compile} sdpa={args.sdpa} "
          f"adamw={'fused' if fused else 'foreach'} cpu_ms_per_step={cpu_ms:.1f}", file=sys.stderr)
    print(f"oracle_ms_per_step {ms:.3f}")
    print(f"oracle_warmup_s {warmup_s:.1f}")  # the two untimed steps, compilation included
    if args.device == "cuda":
        print(f"oracle_peak_mib {torch.cuda.max_memory_allocated() / 2**20:.0f}")  # torch's allocator's peak


def keep_freed_memory():
    """Every training step frees and re-allocates gigabytes of tensors (gradients, AdamW temporaries).
    glibc hands blocks over 32 MB back to the kernel on free, so each step page-faults them in again
    (at d12, float64: about 2 s of system time per step). On glibc, serve every block from the heap
    and never trim it, so freed tensors are reused. Elsewhere this does nothing."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
        libc.mallopt(M_MMAP_MAX, 0)
        libc.mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1)
    except (OSError, AttributeError):
        pass


def main(argv):
    args = parse_args(argv)
    keep_freed_memory()
    if args.threads is not None:
        if args.threads < 1:
            raise UsageError("--threads must be >= 1")
        # torch's OpenMP pool, and OpenBLAS's own pool in a torch built on it (Debian's), read these
        # variables when they load. Idle threads of either pool spin by default and then starve the
        # other pool's workers (2-5x slower steps on 2 cores), so both are told to sleep when idle:
        # OpenMP's passive wait, OpenBLAS's shortest spin (2^4 cycles).
        os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(args.threads)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    global torch, F, np
    import numpy as np
    import torch
    import torch.nn.functional as F
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.bench is not None:
        args.dtype = args.dtype or "float32"
        return run_bench(args)
    args.dtype = args.dtype or "float64"
    if args.check_grads:
        return run_check_grads(args)
    if args.check_muon_ns:
        return check_muon_ns()
    if args.hellaswag:
        return score_hellaswag(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch sees no CUDA device")
    return run_oracle(args)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]) or 0)
    except UsageError as e:
        print(f"gpt2_oracle: error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:   # writing an output file failed (no space, --out is a file, ...)
        print(f"gpt2_oracle: error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        sys.exit(2)
