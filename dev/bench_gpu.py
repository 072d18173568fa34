#!/usr/bin/env python3
"""Throughput of train_gpt2cu beside its peers on the same GPU in the same run, in interleaved rounds:
each round runs every mode once (the order reversed every other round, A B C / C B A, so a clock or
thermal drift falls on both sides), and the table after each round gives each mode's median over the
rounds so far, its spread, and the ratios against our -r 0 taken within each round (median, min, max).
A difference under 3% is called parity. A benchmark, not a test: it prints numbers and checks nothing.

Modes (BENCH_MODES, in round order):
  ours-r0 ours-r1          train_gpt2cu at -r 0 (no recompute) and -r 1; ours-r0 is the baseline
                           (BENCH_BASELINE)
  ours-muon ours-ge1 ours-oo1 ours-at1 ours-bg1 ours-fp8 ours-fp8h ours-lc8
                           -r 0 with -opt muon / -ge 1 / -oo 1 / -at 1 / -bg 1 / -fp8 1 / -fp8 2 / -lc 8 (their
                           cost or gain)
  base-r0 base-r1          our trainer as built at another commit (TRAINER_BASE, default
                           build/gpu/base/train_gpt2cu: dev/gpu/prepare_gpu_run.sh with BASE_REF builds it)
                           at -r 0 / -r 1: a change that must keep speed (a restructuring) beside it,
                           ours-r0 / base-r0 its ratio
  llmc-r0 llmc-r1          llm.c's train_gpt2cu (cuDNN attention; dev/peers/build_llmc.sh) at -r 0 / -r 1
                           (llm.c's -r 1 recomputes GELU in the backward, as ours does)
  torch-compile            PyTorch (dev/peers/torch_gpt2.py): the whole step compiled (forward, loss,
                           backward; clip and fused AdamW as a second compiled function), SDPA flash only,
                           bf16 autocast, in mode BENCH_TORCH_MODE (default; max-autotune, whose compile
                           runs first in a process of its own under BENCH_WARM_LIMIT s, then this process
                           takes it from Inductor's caches; mode default if it does not finish)
  torch-compile-loss       the same model with the forward and loss compiled, the attention backend PyTorch's
                           choice and the update uncompiled (fused AdamW): the peer of earlier sessions'
                           measurements (test/oracle/gpt2_oracle.py --bench --compile); the faster of the
                           two is PyTorch at its strongest
  torch-eager              the model and step of torch-compile, not compiled
  Each PyTorch mode compiles once, before its first timed segment (its warm-up, counted apart).

Every side takes B x T random token ids (speed does not depend on them) and reports the mean step
time over `steps` steps after 3 untimed ones. Ours and llm.c run as processes, each its own timer
(CUDA events or a synchronized host clock around a whole step); PyTorch runs in this process,
synchronizing after each step, and hands its cached memory back between segments.

    dev/bench_gpu.py                                   d12, B=64, T=1024, 3 rounds, 20 steps
    BENCH_MODES="ours-r0 llmc-r0 torch-compile ours-bg1" BENCH_ROUNDS=3 dev/bench_gpu.py
    BENCH_TSV=FILE   also one line per run:  side mode model B T steps ms_per_step tokens_per_s
                     mfu_pct peak_mib warmup_s round baseline
                     (peak_mib: the most GPU memory the run added, by nvidia-smi for processes, by the
                     allocator for PyTorch; mfu_pct of a peer: ours' MFU scaled by the step-time ratio
                     of the same round; warmup_s: PyTorch's compile process, '-' for the others)

Environment: TRAINER (./train_gpt2cu), LLMC (build/gpu/llmc/train_gpt2cu), BENCH_MODEL (d12),
BENCH_OURS_MODEL (-e value), BENCH_TORCH_MODEL (torch_gpt2.py model flags), BENCH_V (50257),
BENCH_B (64), BENCH_T (1024), BENCH_STEPS (20), BENCH_ROUNDS (3), BENCH_DEVICE (cuda; cpu for the
rehearsal), BENCH_TORCH_MODE (default, max-autotune or eager for torch-compile*), BENCH_WARM_LIMIT (150),
BENCH_BASELINE (ours-r0: the mode every ratio is taken against; ours-r1 beside llmc-r1).
"""
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNTIMED = 3
OURS_FLAGS = {"r0": "-r 0", "r1": "-r 1", "muon": "-r 0 -opt muon", "ge1": "-r 0 -ge 1", "oo1": "-r 0 -oo 1",
              "at1": "-r 0 -at 1", "bg1": "-r 0 -bg 1", "fp8": "-r 0 -fp8 1",
              "fp8h": "-r 0 -fp8 2", "lc8": "-r 0 -lc 8"}
BASELINE = os.environ.get("BENCH_BASELINE", "ours-r0")  # the mode the ratios are taken against


def env(name, default):
    return os.environ.get(name, default)


class Settings:
    def __init__(self):
        self.model = env("BENCH_MODEL", "d12")
        self.ours_model = env("BENCH_OURS_MODEL", self.model)
        self.torch_model = shlex.split(env("BENCH_TORCH_MODEL", f"--model {self.model}"))
        self.V = int(env("BENCH_V", "50257"))
        self.B = int(env("BENCH_B", "64"))
        self.T = int(env("BENCH_T", "1024"))
        self.steps = int(env("BENCH_STEPS", "20"))
        self.rounds = int(env("BENCH_ROUNDS", "3"))
        self.device = env("BENCH_DEVICE", "cuda")
        self.torch_mode = env("BENCH_TORCH_MODE", "default")
        self.warm_limit = int(env("BENCH_WARM_LIMIT", "150"))
        self.trainer = env("TRAINER", "./train_gpt2cu")
        self.llmc = env("LLMC", "build/gpu/llmc/train_gpt2cu")
        self.trainer_base = env("TRAINER_BASE", "build/gpu/base/train_gpt2cu")
        self.modes = env("BENCH_MODES", "ours-r0 llmc-r0 torch-compile torch-compile-loss").split()
        self.tsv = env("BENCH_TSV", "")
        self.python = env("PYTHON", sys.executable)
        self.work = os.path.join(ROOT, "build", "bench_gpu")


def write_shard(path, n, V):
    sys.path.insert(0, os.path.join(ROOT, "dev"))
    from bench_cpu import write_shard as writer  # the format of llmc/io/dataloader.h (and llm.c's)
    writer(path + ".tmp", n, V)
    os.replace(path + ".tmp", path)


class GpuMemory:
    """The most GPU memory in use while a process runs, less what was in use before it (nvidia-smi)."""

    def __init__(self, work):
        self.log = os.path.join(work, "smi.log")
        self.ok = subprocess.run("nvidia-smi -L", shell=True, capture_output=True).returncode == 0

    def used(self):
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout.split()
        return int(out[0]) if out else 0

    def run(self, cmd, log):
        if not self.ok:
            with open(log, "w") as f:
                return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode, "-"
        before = self.used()
        with open(self.log, "w") as f:
            smi = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                    "-lms", "100"], stdout=f, stderr=subprocess.DEVNULL)
        with open(log, "w") as f:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        smi.terminate()
        smi.wait()
        values = [int(v) for v in open(self.log).read().split() if v.isdigit()]
        return rc, str(max(values + [before]) - before)


def step_times(log):
    """ms of each step line ("step N/M | ... | 12.34 ms | ..."), ours' and llm.c's alike."""
    return [float(m) for m in re.findall(r"^step +\d+/\d+ .*?\| ([0-9.]+) ms \|", open(log).read(), re.M)]


class Bench:
    def __init__(self, s):
        self.s = s
        os.makedirs(os.path.join(s.work, f"v{s.V}"), exist_ok=True)
        self.shard = os.path.join(s.work, f"v{s.V}", "train_000000.bin")
        if not os.path.exists(self.shard):  # 2^22 ids: 64 steps at B=64, T=1024 before they repeat
            write_shard(self.shard, 1 << 22 if s.V > 1000 else 1 << 16, s.V)
        self.memory = GpuMemory(s.work)
        self.batch = {}  # mode -> B that fitted in its first run
        self.runs = []   # dicts: mode, round, ms, tps, mfu, peak, warmup, B
        self.peers = {}    # PyTorch mode -> its Peer, alive in this process between rounds
        self.warmups = {}  # PyTorch mode -> seconds of compile before its first timed segment

    # --- one run of one mode: (ms per step, B, peak MiB, MFU or None) or None on failure -----------
    def run_process(self, mode, make_cmd):
        log = os.path.join(self.s.work, f"{mode}.log")
        B = self.batch.get(mode, self.s.B)
        while B >= max(1, self.s.B // 8):
            rc, peak = self.memory.run(make_cmd(B), log)
            text = open(log).read()
            if rc != 0:
                if mode not in self.batch and "out of memory" in text.lower():
                    print(f"{mode}: B={B} out of memory; halving")
                    B //= 2
                    continue
                print(f"{mode} failed (exit {rc}): {' '.join(make_cmd(B))}")
                print("\n".join(text.splitlines()[-6:]))
                return None
            times = step_times(log)[UNTIMED:]
            if len(times) < self.s.steps:
                print(f"{mode}: {len(times)} timed step lines, expected {self.s.steps}; log {log}")
                return None
            self.batch[mode] = B
            mfu = re.findall(r"MFU ([0-9.]+)%", text)
            ours = mode.startswith(("ours", "base"))  # llm.c's MFU counts other FLOPs: ours scaled instead
            mfu = statistics.mean(float(m) for m in mfu[UNTIMED:]) if ours and mfu[UNTIMED:] else None
            for pattern in ("^device memory", "^offload:", "^matmul autotune", "no BGRADB algorithm", "cuDNN"):
                m = re.search(pattern + ".*", text, re.M)
                if m and (len(self.runs) < 12):
                    print(f"  {mode}: {m.group(0)[:160]}")
            return statistics.mean(times), B, peak, mfu
        print(f"{mode}: not even B={self.s.B // 8} fits")
        return None

    def ours(self, mode, trainer=None):
        flags = OURS_FLAGS[mode.split("-", 1)[1]].split()
        trainer = trainer or self.s.trainer
        return self.run_process(mode, lambda B: [trainer, "-e", self.s.ours_model, "-i", self.shard, "-b", str(B),
                                                 "-t", str(self.s.T), "-x", str(UNTIMED + self.s.steps), "-v", "0",
                                                 "-s", "0"] + flags)

    def base(self, mode):
        if not os.access(self.s.trainer_base, os.X_OK):
            print(f"{mode}: no base trainer at {self.s.trainer_base} (BASE_REF=<commit> dev/gpu/prepare_gpu_run.sh)")
            return None
        source = os.path.join(os.path.dirname(self.s.trainer_base), "commit.txt")
        if mode not in self.batch and os.path.exists(source):
            print(f"  {mode}: {open(source).read().strip()}")
        return self.ours(mode, self.s.trainer_base)

    def llmc(self, mode):
        if not os.access(self.s.llmc, os.X_OK):
            print(f"{mode}: no llm.c binary at {self.s.llmc} (dev/peers/build_llmc.sh builds it)")
            return None
        r = mode[len("llmc-r"):]
        source = os.path.join(os.path.dirname(self.s.llmc), "source.txt")
        if mode not in self.batch and os.path.exists(source):
            print(f"  {mode}: {' | '.join(open(source).read().splitlines())}")
        # -v: val loss only at the first and last step (one batch, -m 1); -s 0: no sampling; no log dir
        return self.run_process(mode, lambda B: [self.s.llmc, "-e", self.s.model, "-i", self.shard, "-j", self.shard,
                                                 "-b", str(B), "-t", str(self.s.T), "-x", str(UNTIMED + self.s.steps),
                                                 "-r", r, "-v", "100000", "-m", "1", "-s", "0"])

    # the PyTorch modes: (compile mode, SDPA backends, update)
    TORCH_MODES = {"torch-compile": (None, "flash", "compiled"), "torch-compile-loss": (None, "default", "eager"),
                   "torch-eager": ("eager", "flash", "eager")}

    def torch(self, mode):
        if mode not in self.peers:
            tmode, sdpa, update = self.TORCH_MODES[mode]
            tmode = tmode or self.s.torch_mode
            args = self.s.torch_model + ["--vocab", str(self.s.V), "-b", str(self.s.B), "-t", str(self.s.T),
                                         "--device", self.s.device, "--sdpa", sdpa, "--update", update]
            warm = None
            if tmode == "max-autotune":
                # its compile in a process of its own (the warm-up, timed apart): it fills Inductor's caches
                start = time.time()
                cmd = [self.s.python, os.path.join(ROOT, "dev", "peers", "torch_gpt2.py"), "--warm", "--mode", tmode] + args
                log = os.path.join(self.s.work, f"{mode}_warm.log")
                try:
                    with open(log, "w") as f:
                        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=self.s.warm_limit).returncode
                except subprocess.TimeoutExpired:
                    rc = "timeout"
                warm = time.time() - start
                print(f"  {mode}: compile warm-up ({tmode}) in its own process: {warm:.1f} s, exit {rc}")
                if rc != 0:
                    print("\n".join(open(log).read().splitlines()[-5:]))
                    tmode = "default"
                    print(f"  {mode}: falling back to mode default (max-autotune's compile did not finish)")
            sys.path.insert(0, os.path.join(ROOT, "dev", "peers"))
            import torch
            import torch_gpt2
            import argparse
            p = argparse.ArgumentParser()
            torch_gpt2.add_arguments(p)
            L, C, NH, V = torch_gpt2.model_shape(p.parse_args(args))
            start = time.time()
            peer = torch_gpt2.Peer(L, C, NH, V, self.s.B, self.s.T, self.s.device, tmode, sdpa, update)
            peer.segment(0, untimed=2)
            here = time.time() - start
            self.warmups[mode] = (warm or 0.0) + here  # the compile (the 2 first steps), counted apart
            print(f"  {mode}: torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, Triton "
                  f"{getattr(sys.modules.get('triton'), '__version__', '-')}; {peer.describe()}")
            print(f"  {mode}: this process's compile{' (from the caches)' if warm else ''} and 2 steps: {here:.1f} s")
            peer.release()
            self.peers[mode] = peer
        peer = self.peers[mode]
        times = peer.segment(self.s.steps, untimed=UNTIMED)
        peak = peer.peak_mib()
        peer.release()
        return statistics.mean(times), self.s.B, "-" if peak != peak else f"{peak:.0f}", None

    # --- rounds -------------------------------------------------------------------------------------
    def run_mode(self, mode, rnd):
        if mode.startswith("ours-") and mode[len("ours-"):] in OURS_FLAGS:
            result = self.ours(mode)
        elif mode in ("base-r0", "base-r1"):
            result = self.base(mode)
        elif mode in ("llmc-r0", "llmc-r1"):
            result = self.llmc(mode)
        elif mode in self.TORCH_MODES:
            result = self.torch(mode)
        else:
            print(f"bench_gpu.py: no mode {mode}")
            return False
        if result is None:
            return False
        ms, B, peak, mfu = result
        tps = B * self.s.T / (ms / 1e3)
        run = dict(mode=mode, round=rnd, ms=ms, tps=tps, mfu=mfu, peak=peak, B=B,
                   warmup=f"{self.warmups[mode]:.1f}" if mode in self.warmups else "-")
        self.runs.append(run)
        # a peer's MFU: the baseline's of this round (else its latest) scaled by the step times
        base = sorted((r for r in self.runs if r["mode"] == BASELINE and r["mfu"]), key=lambda r: r["round"] != rnd)
        if mfu is None and base:
            run["mfu"] = base[0]["mfu"] * base[0]["ms"] / ms * (B / base[0]["B"])
        side, name = mode.split("-", 1)
        mfu_text = "" if run["mfu"] is None else f", MFU {run['mfu']:.1f}%"
        print(f"round {rnd}: {mode}: B={B}, {ms:.2f} ms/step, {tps:,.0f} tokens/s{mfu_text}, peak {peak} MiB")
        if self.s.tsv:
            with open(self.s.tsv, "a") as f:
                f.write("\t".join([side, name, self.s.model, str(B), str(self.s.T), str(self.s.steps), f"{ms:.3f}",
                                   f"{tps:.0f}", "-" if run["mfu"] is None else f"{run['mfu']:.1f}", peak,
                                   run["warmup"], str(rnd), BASELINE]) + "\n")
        return True

    def table(self):
        print("")
        print(f"| mode | runs | B | ms/step median | min - max | spread | tokens/s median | vs {BASELINE} (per round: median, min - max) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for mode in dict.fromkeys(r["mode"] for r in self.runs):
            rs = [r for r in self.runs if r["mode"] == mode]
            ms = [r["ms"] for r in rs]
            med = statistics.median(ms)
            ratio = self.ratios(mode)
            print(f"| {mode} | {len(rs)} | {rs[0]['B']} | {med:.2f} | {min(ms):.2f} - {max(ms):.2f} | "
                  f"{(max(ms) - min(ms)) / med * 100:.1f}% | {statistics.median(r['tps'] for r in rs):,.0f} | {ratio} |")
        print("")
        for mode in dict.fromkeys(r["mode"] for r in self.runs):
            if mode != BASELINE:
                line = self.ratios(mode, verdict=True)
                if line != "-":
                    print(f"ratio {line}")

    def ratios(self, mode, verdict=False):
        """Tokens/s ratios within each round: ours-r0 over a peer, an ours-* variant over ours-r0."""
        if mode == BASELINE:
            return "baseline"
        peer = not mode.startswith("ours-")
        values = []
        for r in (r for r in self.runs if r["mode"] == mode):
            base = [b for b in self.runs if b["mode"] == BASELINE and b["round"] == r["round"]]
            if base:
                values.append(base[0]["tps"] / r["tps"] if peer else r["tps"] / base[0]["tps"])
        if not values:
            return "-"
        med = statistics.median(values)
        name = f"{BASELINE} / {mode}" if peer else f"{mode} / {BASELINE}"
        text = f"{name}: {med:.3f}x, {min(values):.3f} - {max(values):.3f} over {len(values)} rounds (tokens/s)"
        if verdict:
            text += ": parity (under 3%)" if abs(med - 1) < 0.03 else (": faster" if med > 1 else ": slower")
        return text


def main():
    s = Settings()
    if "--help" in sys.argv or "-h" in sys.argv:
        print(__doc__)
        return 0
    if s.device == "cuda" and not os.access(s.trainer, os.X_OK) and any(m.startswith("ours") for m in s.modes):
        print(f"bench_gpu.py: no trainer {s.trainer} (make train_gpt2cu)")
        return 1
    bench = Bench(s)
    print(f"bench_gpu.py: {s.model}, B={s.B}, T={s.T}, {s.steps} timed steps after {UNTIMED}, {s.rounds} rounds of: "
          f"{' '.join(s.modes)}")
    failed = set()
    for rnd in range(1, s.rounds + 1):
        order = s.modes if rnd % 2 == 1 else list(reversed(s.modes))
        for mode in order:
            if mode not in failed and not bench.run_mode(mode, rnd):
                failed.add(mode)
        print(f"\n== after round {rnd} of {s.rounds}")
        bench.table()
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
