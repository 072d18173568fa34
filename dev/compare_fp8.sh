#!/usr/bin/env bash
# FP8 (-fp8 1 and -fp8 2, llmc/fp8_linear.cuh) against BF16 on the same data, seed and schedule (issue
# 48, doc/mixed_precision.md "FP8 training"): the CUDA trainer once per run, as alike as the runs can be
# but for the flag; prints each run's mean train loss over the last 100 steps (or the last third of a
# shorter run) and each FP8 run's against BF16's, and plots the loss curves.
#   dev/compare_fp8.sh                          under the emulator: a 2-layer, C = 64 GPT-2 (3.3 M
#                                               parameters, the GPT-2 vocabulary) on tinyshakespeare,
#                                               B = 4, T = 64, 300 steps (minutes on 2 cores)
#   TRAINER=train_gpt2cu MODEL=d12 dev/compare_fp8.sh   on an sm_89+ GPU: d12 (or d24) from scratch, B = 64,
#                                               T = 1024 (64K tokens a step), 300 steps, the issue's run
# STEPS overrides the steps; OUT (default doc/fp8_loss_<model>.png) the plot; FLAGS adds flags to both runs;
# DATA the directory of the tinyshakespeare shards (default dev/data/tinyshakespeare; the GPU plan's stage
# fp8 carries them in build/gpu/data); NO_MAKE=1 takes the trainer as it is (a GPU machine has no nvcc);
# RUNS (default "bf16 fp8-1 fp8-2") the runs to train (bf16, fp8-1: -fp8 1, fp8-2: -fp8 2; the comparison
# and plot take every one of them there is, so RUNS=fp8-2 adds a run beside earlier ones); PLOT_ONLY=1
# compares and plots the runs already there.
# Writes build/compare_fp8/<trainer>/<model>/{bf16,fp8-1,fp8-2}.
set -euo pipefail
cd "$(dirname "$0")/.."
trainer=${TRAINER:-train_gpt2cu_emu}
model=${MODEL:-small}
steps=${STEPS:-300}
python=$(scripts/find_python.sh)
data=${DATA:-dev/data/tinyshakespeare}
[ -f "$data/tinyshakespeare_train_000000.bin" ] || { echo "no $data/tinyshakespeare_train_000000.bin: run dev/data/tinyshakespeare.sh first" >&2; exit 1; }
[ "${NO_MAKE:-0}" = 1 ] || make -s "$trainer"
trainer_path=$([[ "$trainer" == */* ]] && echo "$trainer" || echo "./$trainer")
out=build/compare_fp8/$(basename "$trainer")/$model
mkdir -p "$out"
case $model in
    small)
        init="$out/init/model.bin" batch="-b 4 -t 64"
        "$python" test/oracle/gpt2_oracle.py --out "$out/init" --layers 2 --channels 64 --heads 4 --max-seq-len 64 \
            --vocab 50257 --seed 1 -b 1 -t 8 --data-tokens 100 > /dev/null ;;
    d12|d24) init=$model batch="-b 64 -t 1024" ;;
    *) echo "MODEL must be small, d12 or d24, not '$model'" >&2; exit 1 ;;
esac
for run in ${RUNS:-bf16 fp8-1 fp8-2}; do
    [ "${PLOT_ONLY:-0}" = 1 ] && break
    case $run in
        bf16) flag="-fp8 0" ;;
        fp8-1|fp8-2) flag="-fp8 ${run#fp8-}" ;;
        *) echo "RUNS: bf16, fp8-1 or fp8-2, not '$run'" >&2; exit 1 ;;
    esac
    rm -rf "${out:?}/$run"
    "$trainer_path" -e "$init" -i "$data/tinyshakespeare_train_*.bin" -j "$data/tinyshakespeare_val_*.bin" $batch \
        -x "$steps" -l 6e-4 -u 10 -q 0.1 -c 0.1 -v 0 -s 0 -sd 1 $flag ${FLAGS:-} -o "$out/$run" > "$out/$run.log" 2>&1 ||
        { tail -20 "$out/$run.log" >&2; exit 1; }
    grep -m1 "^FP8" "$out/$run.log" || true
done
"$python" - "$out" "$steps" "${OUT:-doc/fp8_loss_$model.png}" "$model" "$trainer" <<'EOF'
import json, os, sys
out, steps, png, model, trainer = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def losses(run):
    rows = [json.loads(l) for l in open(f"{out}/{run}/metrics.jsonl") if '"train_loss"' in l]
    return [r["step"] for r in rows], [r["train_loss"] for r in rows]
if not os.path.exists(f"{out}/bf16/metrics.jsonl"):
    sys.exit(f"no BF16 run in {out}: RUNS must include bf16 once")
fp8_runs = [r for r in ("fp8-1", "fp8-2") if os.path.exists(f"{out}/{r}/metrics.jsonl")]
(s16, l16) = losses("bf16")
tail = min(100, max(1, len(l16) // 3))
m16 = sum(l16[-tail:]) / tail
curves = {}
for run in fp8_runs:
    s8, l8 = losses(run)
    m8 = sum(l8[-tail:]) / tail
    curves[run] = (s8, l8, m8)
    print(f"mean train loss over the last {tail} of {len(l16)} steps: bf16 {m16:.4f}, {run} (-fp8 {run[-1]}) {m8:.4f} "
          f"({100 * (m8 - m16) / m16:+.2f}%; the issue's bar: within 1%)")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
top.plot(s16, l16, label=f"BF16 (last {tail}: {m16:.4f})", lw=1)
for run, (s8, l8, m8) in curves.items():
    what = "blocks" if run == "fp8-1" else "blocks and LM head"
    top.plot(s8, l8, label=f"FP8 {what}, -fp8 {run[-1]} (last {tail}: {m8:.4f})", lw=1)
    bottom.plot(s8, [b - a for a, b in zip(l16, l8)], lw=1, label=f"-fp8 {run[-1]}")
top.set_ylabel("train loss"); top.legend()
top.set_title(f"{model} ({trainer}): the same data, seed and schedule")
bottom.legend()
bottom.axhline(0, color="black", lw=0.5)
bottom.set_xlabel("step"); bottom.set_ylabel("FP8 - BF16")
plt.tight_layout(); plt.savefig(png, dpi=100)
print(f"plot: {png}")
EOF
