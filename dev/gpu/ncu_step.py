#!/usr/bin/env python3
"""dev/gpu/ncu_top.sh's analysis of ncu's CSV (standard library only):

    ncu_step.py top5 DURATIONS_CSV                      the five costliest kernels of the kept step, as a regex
    ncu_step.py table DURATIONS_CSV THROUGHPUT_CSV|/dev/null OUT_MD B [FLAGS]   the tables, into OUT_MD

The kept step: the longest suffix of the launch sequence that repeats the launches just before it (the
second of -x 2 steps; the first has start-up kernels). Kinds are told by kernel name."""
import csv, sys, collections, re

def launches(path):  # [(name, {metric: value})] in launch order
    rows = [r for r in csv.reader(l for l in open(path) if l.startswith('"'))]
    if not rows:
        return []
    col = {n: i for i, n in enumerate(rows[0])}
    out = collections.OrderedDict()
    for r in rows[1:]:
        d = out.setdefault(int(r[col["ID"]]), {"name": r[col["Kernel Name"]]})
        try:
            d[r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", ""))
        except ValueError:
            pass
    return list(out.values())

def last_step(ls):
    # the longest suffix of the launch sequence that repeats the launches just before it: one step
    names = [d["name"] for d in ls]
    n = len(names)
    for p in range(n // 2, 0, -1):
        if names[n - p:] == names[n - 2 * p:n - p]:
            return ls[n - p:], True
    return ls, False

KINDS = [("matmul (cuBLAS/cuBLASLt)", r"nvjet|gemm|cutlass|xmma|cublas|splitK|reduce_kernel"),
         ("attention", r"attention"), ("layernorm (+ residual)", r"layernorm"), ("GELU", r"gelu"),
         ("classifier + loss", r"classifier|softmax|cross"), ("bias gradients", r"dbias"),
         ("embedding", r"encoder"), ("optimizer", r"adamw|muon|adafactor|copy_to_master"),
         ("gradient norm", r"sum_of_squares|sum_partials"), ("elementwise (add_into, ...)", r"add_into")]

def kind(name):
    for k, pattern in KINDS:
        if re.search(pattern, name, re.I):
            return k
    return "other"

step, found = last_step(launches(sys.argv[2]))
T = "gpu__time_duration.sum"
per = collections.defaultdict(lambda: [0, 0.0])
for d in step:
    per[d["name"]][0] += 1
    per[d["name"]][1] += d.get(T, 0.0)
top = sorted(per.items(), key=lambda kv: -kv[1][1])
if sys.argv[1] == "top5":
    print("|".join(re.escape(n) for n, _ in top[:5]))
    sys.exit(0)
SM, MEM, DRAM = ("sm__throughput.avg.pct_of_peak_sustained_elapsed",
                 "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
                 "dram__throughput.avg.pct_of_peak_sustained_elapsed")
pct = collections.defaultdict(list)
for d in (launches(sys.argv[3]) if sys.argv[3] != "/dev/null" else []):
    pct[d["name"]].append((d.get(SM, 0.0), d.get(MEM, 0.0), d.get(DRAM, 0.0)))
total = sum(p[1] for p in per.values())
kinds = collections.defaultdict(lambda: [0, 0.0])
for name, p in per.items():
    kinds[kind(name)][0] += p[0]
    kinds[kind(name)][1] += p[1]
B, extra = sys.argv[5], sys.argv[6] if len(sys.argv) > 6 else ""
with open(sys.argv[4], "w") as f:
    f.write(f"ncu: d12, B={B}, T=1024{', ' + extra if extra else ''}, -x 2: "
            f"{'the second step' if found else 'both steps (no repeating step found)'}: {len(step)} launches, "
            f"{total / 1e6:.1f} ms of kernel time (each kernel alone, summed)\n\n")
    f.write("| kind | launches | ms | % of kernel time |\n| --- | ---: | ---: | ---: |\n")
    for k, p in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        f.write(f"| {k} | {p[0]} | {p[1] / 1e6:.2f} | {100 * p[1] / total:.1f} |\n")
    f.write("\nThe costliest kernels (throughput: the mean over the first launches measured in pass 2):\n\n")
    f.write("| kernel | kind | launches | ms | % of kernel time | SM % of peak | memory % of peak | DRAM % of peak |\n")
    f.write("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
    for name, p in top[:10]:
        m = [f"{sum(x[i] for x in pct[name]) / len(pct[name]):.0f}" if pct.get(name) else "-" for i in range(3)]
        f.write(f"| `{name[:60]}` | {kind(name)} | {p[0]} | {p[1] / 1e6:.2f} | {100 * p[1] / total:.1f} | {m[0]} | {m[1]} | {m[2]} |\n")
print(open(sys.argv[4]).read())
