#!/usr/bin/env bash
# Nsight Compute over one training step of GPT-2 124M (d12, B=8, T=1024): every kernel's duration,
# summed per kernel name, then SM, memory and DRAM throughput (% of the GPU's peak) of the five
# costliest; writes them, with their share of the step's kernel time, as a markdown table to $NCU_OUT
# (default build/gpu_run/ncu.md). ncu runs each kernel alone at the GPU's own clocks (--clock-control
# none): durations are each kernel's own, not the step's overlapped time. Without ncu (or when it cannot read counters) prints "ncu_top.sh: SKIPPED
# (reason)" and exits 0.
#
#   TRAINER=./train_gpt2cu NCU_OUT=FILE test/gpu/ncu_top.sh [B]
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
trainer=${TRAINER:-./train_gpt2cu}
out=${NCU_OUT:-build/gpu_run/ncu.md}
B=${1:-8}
work=build/gpu_run/ncu
mkdir -p "$work" "$(dirname "$out")"
python=${PYTHON:-$(scripts/find_python.sh 2>/dev/null || command -v python3)}

ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -n 1)
[ -n "$ncu" ] && [ -x "$ncu" ] || { echo "ncu_top.sh: SKIPPED (ncu not found)"; exit 0; }

shard=build/bench_gpu/v50257/train_000000.bin  # dev/bench_gpu.sh's random tokens; else made here
if [ ! -f "$shard" ]; then  # what dev/bench_gpu.sh writes: 2^22 token ids by dev/bench_cpu.py's writer
    mkdir -p build/bench_gpu/v50257
    "$python" -c 'import sys; sys.path.insert(0, "dev"); from bench_cpu import write_shard; write_shard(sys.argv[1], 1 << 22)' \
        "$shard.tmp" && mv "$shard.tmp" "$shard" || exit 1
fi

# Pass 1: each kernel's duration only (one counter pass, so no kernel is replayed: a replay saves and
# restores the device memory, slow with gigabytes allocated). Pass 2: the throughput counters, on the
# first 40 launches of the five costliest kernels only.
run_ncu() {  # run_ncu CSV [ncu options]
    local csv=$1
    shift
    echo "\$ $ncu --csv $* $trainer -e d12 -b $B -t 1024 -x 1 -v 0 -s 0"
    "$ncu" --csv --print-units base --print-kernel-base function --clock-control none "$@" \
        "$trainer" -e d12 -i "build/bench_gpu/v50257/train_*.bin" -b "$B" -t 1024 -x 1 -v 0 -s 0 > "$csv" 2> "$work/ncu.err"
    local rc=$?
    if [ $rc -ne 0 ] || ! grep -q '"gpu__time_duration.sum"\|"sm__throughput' "$csv"; then
        tail -n 20 "$work/ncu.err"; grep -v '^"' "$csv" | tail -n 20
        if grep -qiE "ERR_NVGPUCTRPERM|LibraryNotLoaded|not supported|permission" "$work/ncu.err" "$csv"; then
            echo "ncu_top.sh: SKIPPED (ncu cannot read the counters here)"; exit 0
        fi
        echo "ncu_top.sh: ncu failed (exit $rc)"; exit 1
    fi
}
start=$SECONDS
run_ncu "$work/durations.csv" --metrics gpu__time_duration.sum --launch-count 3000
echo "pass 1: $((SECONDS - start)) s"
top5=$("$python" - "$work/durations.csv" <<'PY'
import csv, sys, collections, re
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
col = {n: i for i, n in enumerate(rows[0])}
ns = collections.Counter()
for r in rows[1:]:
    if r[col["Metric Name"]] == "gpu__time_duration.sum":
        ns[r[col["Kernel Name"]]] += float(r[col["Metric Value"]].replace(",", ""))
print("|".join(re.escape(n) for n, _ in ns.most_common(5)))
PY
)
metrics=sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed
metrics=$metrics,dram__throughput.avg.pct_of_peak_sustained_elapsed

write_table() {  # write_table THROUGHPUT_CSV (empty: durations only)
"$python" - "$work/durations.csv" "$1" "$out" "$B" <<'PY'
import csv, sys, collections

def launches(path):  # ID -> {metric: value, "name": kernel}
    rows = [r for r in csv.reader(l for l in open(path) if l.startswith('"'))]
    if not rows:
        return {}
    col = {n: i for i, n in enumerate(rows[0])}
    out = collections.defaultdict(dict)
    for r in rows[1:]:
        d = out[r[col["ID"]]]
        d["name"] = r[col["Kernel Name"]]
        try:
            d[r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", ""))
        except ValueError:
            pass
    return out

launch = launches(sys.argv[1])
SM, MEM, DRAM = ("sm__throughput.avg.pct_of_peak_sustained_elapsed",
                 "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
                 "dram__throughput.avg.pct_of_peak_sustained_elapsed")
pct = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])  # launches measured, sum of the three %
for d in launches(sys.argv[2]).values():
    p = pct[d["name"]]
    p[0] += 1; p[1] += d.get(SM, 0.0); p[2] += d.get(MEM, 0.0); p[3] += d.get(DRAM, 0.0)
per = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])  # launches, ns, then mean %s
for d in launch.values():
    p = per[d["name"]]
    p[0] += 1; p[1] += d.get("gpu__time_duration.sum", 0.0)
for name, q in pct.items():
    if q[0]:
        per[name][2:] = [q[1] / q[0] * per[name][1], q[2] / q[0] * per[name][1], q[3] / q[0] * per[name][1]]
total = sum(p[1] for p in per.values())
top = sorted(per.items(), key=lambda kv: -kv[1][1])
with open(sys.argv[3], "w") as f:
    f.write(f"ncu: one d12 step (B={sys.argv[4]}, T=1024, -x 1, start-up kernels included): {len(launch)} launches, "
            f"{total / 1e6:.1f} ms of kernel time in all (each kernel alone); throughput: the mean over the first 40 launches of the five costliest\n\n")
    f.write("| kernel | launches | ms in all | % of kernel time | SM % of peak | memory % of peak | DRAM % of peak |\n")
    f.write("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
    for name, p in top[:5]:
        m = [f"{x / p[1]:.0f}" if name in pct and p[1] else "-" for x in p[2:]]
        f.write(f"| `{name[:60]}` | {p[0]} | {p[1] / 1e6:.2f} | {100 * p[1] / total:.1f} | {m[0]} | {m[1]} | {m[2]} |\n")
    f.write(f"\n(the next 10: {', '.join(f'{n[:40]} {100 * p[1] / total:.1f}%' for n, p in top[5:15])})\n")
print(open(sys.argv[3]).read())
PY
}
write_table /dev/null  # what pass 1 gives, in case pass 2 does not finish in time
run_ncu "$work/throughput.csv" --metrics "$metrics" --kernel-name "regex:^($top5)\$" --launch-count 40
echo "pass 2: $((SECONDS - start)) s"
write_table "$work/throughput.csv"
