#!/usr/bin/env python3
"""PyTorch's FlashAttention-2 (scaled_dot_product_attention's flash backend) timed the way dev/cuda times
our attention kernels, at their shape: (B, T, C, NH) = (8, 1024, 768, 12), head size 64, causal, bf16,
q, k and v strided views of one qkv (B, T, 3C) as in the trainer. Each repetition flushes the L2 (a read
of twice its size), then the op alone sits between two CUDA events; the median of 25 is reported, after
one warm-up. The forward is aten's _scaled_dot_product_flash_attention, the backward its
_scaled_dot_product_flash_attention_backward (FA2's own kernels, with no autograd around them and the
forward's out and log-sum-exp as inputs, as our backward takes them). Prints dev/cuda's RESULT lines, so
dev/gpu/run_on_gpu.sh's attention stage sets them beside attention_forward's and attention_backward's.

    python3 dev/cuda/attention_sdpa.py [--device cpu --B 1 --T 64]     (cpu: the rehearsal; math backend)
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def timer(device, reps=25):
    """time(prepare, run) -> (median ms, spread): L2 flushed before each repetition, events around run."""
    if device != "cuda":
        def time_cpu(run):
            run()
            samples = []
            for _ in range(3):
                t0 = time.perf_counter()
                run()
                samples.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(samples), (max(samples) - min(samples)) / statistics.median(samples)
        return time_cpu
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.ones(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device=device)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def time_cuda(run):
        run()
        samples = []
        for _ in range(reps):
            flush.sum()  # reads every element: what run reads next comes from memory
            start.record()
            run()
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop))
        return statistics.median(samples), (max(samples) - min(samples)) / statistics.median(samples)
    return time_cuda


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--NH", type=int, default=12)
    p.add_argument("--HS", type=int, default=64)
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("attention_sdpa.py: no CUDA GPU visible; nothing to time here.")
        return 0
    B, T, NH, HS = a.B, a.T, a.NH, a.HS
    C = NH * HS
    torch.manual_seed(0)
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    qkv = (torch.rand(B, T, 3 * C, device=a.device) * 2 - 1).to(dtype)
    dout = (torch.rand(B, NH, T, HS, device=a.device) * 2 - 1).to(dtype).transpose(1, 2).contiguous().transpose(1, 2)
    q, k, v = (z.view(B, T, NH, HS).transpose(1, 2) for z in qkv.split(C, dim=-1))  # (B, NH, T, HS) views
    time_op = timer(a.device)
    flops_fwd = 4.0 * B * NH * HS * (T * (T + 1) / 2)  # the causal work, as attention_forward.cu counts it
    name = torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"
    print(f"attention_sdpa.py: torch {torch.__version__}, {name}, B={B} T={T} NH={NH} HS={HS}, causal, {dtype}")
    if a.device == "cuda":
        fwd = torch.ops.aten._scaled_dot_product_flash_attention
        bwd = torch.ops.aten._scaled_dot_product_flash_attention_backward
        out, lse, cq, ck, mq, mk, rng, unused, _ = fwd(q, k, v, 0.0, True, False)
        # the check: the same function as the math backend in fp32 (bf16 operands: ~1e-2 of the largest)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        run_fwd = lambda: fwd(q, k, v, 0.0, True, False)
        run_bwd = lambda: bwd(dout, q, k, v, out, lse, cq, ck, mq, mk, 0.0, True, rng, unused)
        label = "FlashAttention-2 (torch SDPA flash)"
    else:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        err = 0.0
        run_fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        qg, kg, vg = (z.detach().requires_grad_() for z in (q, k, v))
        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
        run_bwd = lambda: torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True)
        label = "torch SDPA (cpu, rehearsal)"
    ok = "ok" if err < 2e-2 else f"FAIL err {err:.2e}"
    for op, run, flops in (("attention_forward", run_fwd, flops_fwd), ("attention_backward", run_bwd, 2 * flops_fwd)):
        ms, spread = time_op(run)
        tflops = flops / (ms / 1e3) / 1e12
        print(f"{op}: {label}: {ms * 1e3:.1f} us, {tflops:.1f} TFLOP/s (causal flops), spread {spread * 100:.0f}%, check {ok}")
        # dev/cuda's RESULT|op|version|block|time_us|rate|unit|pct_of_ceiling|ceiling_name|checks
        print(f"RESULT|{op}, T {T}|{label}|-|{ms * 1e3:.1f}|{tflops:.1f}|TFLOP/s|-|-|{ok} (max error {err:.1e})")
    return 0 if ok == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
