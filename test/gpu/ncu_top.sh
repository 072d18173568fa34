#!/usr/bin/env bash
# Nsight Compute over one training step of GPT-2 124M (d12, B=16, T=1024): every kernel launched, four
# counters each (duration; SM, memory and DRAM throughput as % of the GPU's peak), summed per kernel
# name; writes the five costliest kernels, with their share of the step's kernel time, as a markdown
# table to $NCU_OUT (default build/gpu_run/ncu.md). ncu runs each kernel alone, replaying it for its
# counters, at the GPU's own clocks (--clock-control none): durations are each kernel's own, not the
# step's overlapped time. Without ncu (or when it cannot read counters) prints "ncu_top.sh: SKIPPED
# (reason)" and exits 0.
#
#   TRAINER=./train_gpt2cu NCU_OUT=FILE test/gpu/ncu_top.sh [B]
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
trainer=${TRAINER:-./train_gpt2cu}
out=${NCU_OUT:-build/gpu_run/ncu.md}
B=${1:-16}
work=build/gpu_run/ncu
mkdir -p "$work" "$(dirname "$out")"
python=${PYTHON:-$(scripts/find_python.sh 2>/dev/null || command -v python3)}

ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -n 1)
[ -n "$ncu" ] && [ -x "$ncu" ] || { echo "ncu_top.sh: SKIPPED (ncu not found)"; exit 0; }

shard=build/bench_gpu/bench_train_000000.bin  # dev/bench_gpu.sh's random tokens; else made here
if [ ! -f "$shard" ]; then
    mkdir -p build/bench_gpu
    "$python" - "$shard" <<'PY' || exit 1
import array, random, sys
header = array.array("i", [0] * 256)
header[0], header[1], header[2] = 20240520, 1, 1 << 20
rng = random.Random(0)
tokens = array.array("H", (rng.randrange(50257) for _ in range(1 << 20)))
with open(sys.argv[1], "wb") as f:
    header.tofile(f)
    tokens.tofile(f)
PY
fi

metrics=gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed
metrics=$metrics,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed
echo "\$ $ncu --csv --metrics ... $trainer -e d12 -b $B -t 1024 -x 1 -v 0 -s 0"
"$ncu" --csv --print-units base --print-kernel-base function --clock-control none --launch-count 3000 \
    --metrics "$metrics" "$trainer" -e d12 -i "build/bench_gpu/bench_train_*.bin" -b "$B" -t 1024 -x 1 -v 0 -s 0 \
    > "$work/ncu.csv" 2> "$work/ncu.err"
rc=$?
if [ $rc -ne 0 ] || ! grep -q '"gpu__time_duration.sum"' "$work/ncu.csv"; then
    tail -n 20 "$work/ncu.err"; grep -v '^"' "$work/ncu.csv" | tail -n 20
    if grep -qiE "ERR_NVGPUCTRPERM|LibraryNotLoaded|not supported|permission" "$work/ncu.err" "$work/ncu.csv"; then
        echo "ncu_top.sh: SKIPPED (ncu cannot read the counters here)"; exit 0
    fi
    echo "ncu_top.sh: ncu failed (exit $rc)"; exit 1
fi

"$python" - "$work/ncu.csv" "$out" "$B" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
col = {n: i for i, n in enumerate(head)}
launch = collections.defaultdict(dict)  # ID -> {metric: value}, plus the name
for r in rows:
    d = launch[r[col["ID"]]]
    d["name"] = r[col["Kernel Name"]]
    try:
        d[r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", ""))
    except ValueError:
        pass
per = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])  # launches, ns, sm%*ns, mem%*ns, dram%*ns
for d in launch.values():
    ns = d.get("gpu__time_duration.sum", 0.0)
    p = per[d["name"]]
    p[0] += 1; p[1] += ns
    p[2] += ns * d.get("sm__throughput.avg.pct_of_peak_sustained_elapsed", 0.0)
    p[3] += ns * d.get("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", 0.0)
    p[4] += ns * d.get("dram__throughput.avg.pct_of_peak_sustained_elapsed", 0.0)
total = sum(p[1] for p in per.values())
top = sorted(per.items(), key=lambda kv: -kv[1][1])
with open(sys.argv[2], "w") as f:
    f.write(f"ncu: one d12 step (B={sys.argv[3]}, T=1024, -x 1, start-up kernels included): {len(launch)} launches, "
            f"{total / 1e6:.1f} ms of kernel time in all (each kernel alone, replayed)\n\n")
    f.write("| kernel | launches | ms in all | % of kernel time | SM % of peak | memory % of peak | DRAM % of peak |\n")
    f.write("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
    for name, p in top[:5]:
        f.write(f"| `{name[:60]}` | {p[0]} | {p[1] / 1e6:.2f} | {100 * p[1] / total:.1f} | {p[2] / p[1]:.0f} | "
                f"{p[3] / p[1]:.0f} | {p[4] / p[1]:.0f} |\n")
    f.write(f"\n(the next 10: {', '.join(f'{n[:40]} {100 * p[1] / total:.1f}%' for n, p in top[5:15])})\n")
print(open(sys.argv[2]).read())
PY
