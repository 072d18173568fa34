#!/usr/bin/env bash
# Throughput of train_gpt2cu on GPT-2 124M (d12, T=1024, the largest micro-batch B that fits) next to
# the oracle's PyTorch model (torch.compile, bf16 autocast, scaled_dot_product_attention) on the same
# GPU in the same run, and their ratio. A benchmark, not a test: it prints numbers and checks nothing.
#
#   dev/bench_gpu.sh [steps] [extra train_gpt2cu flags, e.g. -ge 1 or -r 0]
#
# Needs a GPU, a built ./train_gpt2cu (make train_gpt2cu) and, for the PyTorch side, a python3 (scripts/find_python.sh picks one)
# with torch >= 2.0 and CUDA. Tokens are random ids in a synthetic shard: speed does not depend on them.
set -euo pipefail
steps=${1:-30}
shift || true
extra="$*"
python=${PYTHON:-$(scripts/find_python.sh)}
T=1024
work=build/bench_gpu
mkdir -p "$work"

[ -x ./train_gpt2cu ] || { echo "bench_gpu.sh: build the trainer first (make train_gpt2cu)"; exit 1; }
if ! ./train_gpt2cu -h > /dev/null; then echo "bench_gpu.sh: train_gpt2cu does not run"; exit 1; fi

# 2^24 random GPT-2 token ids, enough for dozens of steps at the largest batch
"$python" - "$work/bench_train_000000.bin" <<'PY'
import array, random, sys
n = 1 << 24
header = array.array("i", [0] * 256)
header[0], header[1], header[2] = 20240520, 1, n
rng = random.Random(0)
tokens = array.array("H", (rng.randrange(50257) for _ in range(n)))
with open(sys.argv[1], "wb") as f:
    header.tofile(f)
    tokens.tofile(f)
PY

# ours: the largest B (of 128, 64, 32, ...) that trains a step without running out of memory
B=""
for b in 128 64 32 16 8 4 2 1; do
    if ./train_gpt2cu -e d12 -i "$work/bench_train_*.bin" -b $b -t $T -x 1 -v 0 -s 0 $extra > "$work/probe.log" 2>&1; then
        B=$b
        break
    fi
    grep -q "out of memory" "$work/probe.log" || { cat "$work/probe.log"; exit 1; }
done
[ -n "$B" ] || { echo "bench_gpu.sh: not even B=1 fits"; exit 1; }
echo "train_gpt2cu: d12, B=$B, T=$T, $steps steps $extra"
./train_gpt2cu -e d12 -i "$work/bench_train_*.bin" -b $B -t $T -x "$steps" -v 0 -s 0 $extra | tee "$work/ours.log" | grep -E "^(train_gpt2cu|model|activations|step +[0-9]+/)" | tail -n 4
# mean over the steps after the first 3 (warm-up: cuBLASLt heuristics, allocator, clocks)
read -r ours_tps ours_mfu < <(awk '/^step +[0-9]+\// { n++; if (n > 3) { split($0, f, "|"); tps += f[6] + 0; m = f[7]; gsub(/[^0-9.]/, "", m); mfu += m; k++ } }
    END { if (k == 0) { print "nan nan" } else { printf "%.0f %.1f\n", tps / k, mfu / k } }' "$work/ours.log")
echo "train_gpt2cu: $ours_tps tokens/s, MFU $ours_mfu%"

# PyTorch on the same GPU: the same B if it fits, else the largest that does
torch_tps=""
for b in $B $((B / 2)) $((B / 4)) $((B / 8)); do
    [ "$b" -ge 1 ] || break
    if "$python" test/oracle/gpt2_oracle.py --model d12 -b $b -t $T --bench "$steps" --device cuda --bf16 --compile --sdpa \
        > "$work/torch.log" 2> "$work/torch.err"; then
        ms=$(awk '/^oracle_ms_per_step/ { print $2 }' "$work/torch.log")
        torch_tps=$(awk -v b=$b -v t=$T -v ms="$ms" 'BEGIN { printf "%.0f", b * t / (ms / 1000) }')
        echo "pytorch (compile, bf16 autocast, sdpa): d12, B=$b, T=$T: $ms ms/step, $torch_tps tokens/s"
        break
    fi
    if ! grep -qi "out of memory" "$work/torch.err"; then
        echo "pytorch run failed (see $work/torch.err):"; tail -n 5 "$work/torch.err"; break
    fi
done
if [ -n "$torch_tps" ]; then
    awk -v a="$ours_tps" -v b="$torch_tps" 'BEGIN { printf "ratio train_gpt2cu / pytorch: %.2fx\n", a / b }'
fi
