#!/usr/bin/env python3
"""GPT-2 training in PyTorch at its strongest on one GPU: the peer dev/bench_gpu.py times our trainer
against. Written the way a PyTorch user who wants speed writes it:

  - an nn.Module GPT-2 (the model of train_gpt2cu: pre-LN blocks, GELU tanh, tied lm_head) with the
    vocabulary padded to a multiple of 128 for the matmuls (the loss sees only the real 50257 columns);
  - bf16 autocast over fp32 parameters, TF32 for what stays fp32;
  - attention through scaled_dot_product_attention with only the flash backend enabled (FlashAttention-2),
    or (--sdpa default) whichever backend PyTorch picks;
  - the whole step compiled: the forward with its loss (and so its backward, through AOTAutograd) and
    the update (clip_grad_norm_ and a fused AdamW) as a second compiled function (--update eager: the
    update as PyTorch runs it without compiling), mode "default" or "max-autotune"
    (max-autotune-no-cudagraphs: Triton GEMM templates benchmarked against cuBLAS);
  - random token ids made on the GPU: speed does not depend on them.

Compiling with max-autotune takes minutes (an H100, 2026-11-27: ~17 s of benchmarking for each GEMM
shape, and it had not finished in 100 s). Its results land in Inductor's on-disk caches, so a separate
process compiles first (`--warm`, timed as the warm-up), and the timed process then finds the compiled
graphs there. dev/bench_gpu.py imports Peer from here and times segments of steps in its own process,
between runs of the other trainers.

    python3 dev/peers/torch_gpt2.py --warm -b 64 -t 1024            # compile, fill the caches, 2 steps
    python3 dev/peers/torch_gpt2.py --steps 20 -b 64 -t 1024        # one timed segment, prints ms/step
    ... --model d24 | --layers 2 --channels 64 --heads 4 --vocab 300 --device cpu --mode eager
"""
import argparse
import contextlib
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.attention
import torch.nn.functional as F

MODELS = {"d12": (12, 768, 12), "d24": (24, 1024, 16), "d36": (36, 1280, 20), "d48": (48, 1600, 25)}
MODES = ("max-autotune", "default", "eager")  # max-autotune means max-autotune-no-cudagraphs
SDPA = ("flash", "default")
UPDATES = ("compiled", "eager")


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fc_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (z.view(B, T, self.NH, C // self.NH).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(C, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, C, NH, V, max_T):
        super().__init__()
        self.V = V
        Vp = (V + 127) // 128 * 128
        self.wte, self.wpe = nn.Embedding(Vp, C), nn.Embedding(max_T, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():  # GPT-2's initialization; speed does not depend on it
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied lm_head, (B, T, Vp)
        return F.cross_entropy(logits[..., :self.V].flatten(0, 1), targets.flatten())  # fp32 under autocast


class Peer:
    """One model, its optimizer and its compiled step; segment(n) times n steps after a few untimed ones."""

    def __init__(self, L, C, NH, V, B, T, device="cuda", mode="default", sdpa="flash", update="compiled"):
        self.B, self.T, self.V, self.device, self.mode = B, T, V, device, mode
        self.cuda = device == "cuda"
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        # FlashAttention-2 and nothing else (no silent fallback to another attention), per call: two
        # peers with different choices can live in one process; only CUDA has the flash backend
        self.flash = sdpa == "flash" and self.cuda
        self.model = GPT2(L, C, NH, V, T).to(device)
        self.params = [p for p in self.model.parameters()]
        self.fused = self.cuda
        # weight decay 0, as both trainers' default; lr a constant (no schedule on either side's timing)
        self.optimizer = torch.optim.AdamW(self.params, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                                           fused=self.fused, foreach=not self.fused)
        self.forward_backward, self.update = self._forward_backward, self._update
        self.model_c = self.model
        if mode != "eager":
            options = dict(mode="max-autotune-no-cudagraphs") if mode == "max-autotune" else {}
            self.model_c = torch.compile(self.model, **options)
            if update == "compiled":
                self.update = torch.compile(self._update, **options)
        self.gen = torch.Generator(device=device).manual_seed(0)

    def describe(self):
        return (f"mode {self.mode}, SDPA {'flash only' if self.flash else 'PyTorch choice'}, AdamW "
                f"{'fused' if self.fused else 'foreach'}, update {'compiled' if self.update != self._update else 'eager'}")

    def _forward_backward(self):
        x = torch.randint(0, self.V, (self.B, self.T + 1), device=self.device, generator=self.gen)
        attention = torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION]) if self.flash \
            else contextlib.nullcontext()
        with attention, torch.autocast(device_type=self.device, dtype=torch.bfloat16, enabled=self.cuda):
            loss = self.model_c(x[:, :-1], x[:, 1:])
        loss.backward()
        return loss

    def _update(self):
        norm = torch.nn.utils.clip_grad_norm_(self.params, 1.0, foreach=True)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def step(self):
        loss = self.forward_backward()
        if self.update == self._update or getattr(self, "update_checked", False):
            self.update()
            return loss
        try:  # the first compiled update; if this torch cannot compile it, the update runs eagerly
            self.update()
        except Exception as e:  # noqa: BLE001 (any compiler failure)
            print(f"torch_gpt2.py: the update did not compile ({type(e).__name__}: {str(e)[:200]}); "
                  "it runs eagerly", file=sys.stderr)
            self.update = self._update
            self.update()
        self.update_checked = True
        return loss

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def segment(self, steps, untimed=3):
        """[ms of each of `steps` steps], after `untimed` steps (the allocator fills again after release())."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        for _ in range(untimed):
            self.step()
        self.sync()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            self.step()
            self.sync()
            times.append((time.perf_counter() - t0) * 1e3)
        return times

    def peak_mib(self):
        return torch.cuda.max_memory_reserved() / 2**20 if self.cuda else float("nan")

    def release(self):
        """Give the GPU back the allocator's cached blocks while the other trainers run."""
        if self.cuda:
            torch.cuda.empty_cache()


def model_shape(args):
    if args.layers:
        return args.layers, args.channels, args.heads, args.vocab
    if args.model not in MODELS:
        sys.exit(f"torch_gpt2.py: no model '{args.model}' (one of {', '.join(MODELS)}, or --layers/--channels/--heads)")
    return (*MODELS[args.model], args.vocab)


def add_arguments(p):
    p.add_argument("--model", default="d12")
    p.add_argument("--layers", type=int, default=0)
    p.add_argument("--channels", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("-b", "--batch", type=int, default=64)
    p.add_argument("-t", "--seq-len", type=int, default=1024)
    p.add_argument("--device", default="cuda")
    p.add_argument("--mode", default="default", choices=MODES)
    p.add_argument("--sdpa", default="flash", choices=SDPA)
    p.add_argument("--update", default="compiled", choices=UPDATES)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.add_argument("--warm", action="store_true", help="compile and run 2 steps (fills Inductor's caches)")
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_gpt2.py: torch sees no CUDA device (use --device cpu)")
    L, C, NH, V = model_shape(args)
    t0 = time.perf_counter()
    peer = Peer(L, C, NH, V, args.batch, args.seq_len, args.device, args.mode, args.sdpa, args.update)
    for _ in range(2):
        loss = peer.step()
    peer.sync()
    print(f"torch_warmup_s {time.perf_counter() - t0:.1f}")
    print(f"torch_loss {loss.item():.4f}")
    if not args.warm:
        times = sorted(peer.segment(args.steps))
        print(f"torch_ms_per_step {times[len(times) // 2]:.3f}")
        print(f"torch_peak_mib {peer.peak_mib():.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
