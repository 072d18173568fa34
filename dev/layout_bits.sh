#!/usr/bin/env bash
# Before/after check for changes that must keep every bit: builds the trainer at a base commit (in a
# temporary git worktree) and at the working tree, runs both over a set of process layouts on the same
# tiny model and data, and compares, byte for byte, each run's per-step losses and gradient norms
# (metrics.jsonl, timings left out), its samples, and every file of its final checkpoint (model, state
# files; their headers without the version and the checksums).
#
#   dev/layout_bits.sh [BASE_REF]          the CPU trainer, 22 layouts; default BASE_REF: HEAD
#   dev/layout_bits.sh --cuda [BASE_REF]   the CUDA trainer under the emulator (train_gpt2cu_emu and
#                                          train_gpt2fp32cu_emu; several processes over emulated NCCL)
#   LAYOUTS="single dp2_z1" dev/layout_bits.sh main~3   only these layouts (names below)
#   LAYOUT_BITS_BASE_TREE=DIR dev/layout_bits.sh REF    the base built in DIR, a checkout of REF made
#                                          beforehand (.ci/run builds it beside the tests), not in a
#                                          worktree of its own
#
# Changes that must keep the bits compare against one fixed base: 3fbd63f (the one data stream of issue 51,
# which changed every shuffled run's bits; the tutorial redesign of issue 47 used bdc40c7). With --cuda
# each layout's bytes per step are also checked against the trainer's own prediction (comm_prediction_off).
# Needs mpirun (scripts/install_deps.sh) and the PyTorch oracle (test/oracle/gpt2_oracle.py, for the
# model and data files). Prints one line per layout and exits non-zero if any differ. Both binaries are
# built with the same compiler and flags on this machine, so any difference is the code's.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cuda=0
if [ "${1:-}" = --cuda ]; then cuda=1; shift; fi
base_ref="${1:-HEAD}"
work="$(mktemp -d /tmp/layout_bits.XXXXXX)"
python="$("$root/scripts/find_python.sh")"
base_tree="${LAYOUT_BITS_BASE_TREE:-}"
if [ -n "$base_tree" ]; then
    trap 'rm -rf "$work"' EXIT
    want="$(git -C "$root" rev-parse "$base_ref^{commit}")"
    have="$(git -C "$base_tree" rev-parse HEAD 2>/dev/null || echo none)"
    if [ "$have" != "$want" ] || [ -n "$(git -C "$base_tree" status --porcelain --untracked-files=no)" ]; then
        echo "layout_bits: LAYOUT_BITS_BASE_TREE=$base_tree is not a clean checkout of $base_ref (its HEAD: $have)" >&2
        exit 1
    fi
else
    base_tree="$work/base"
    trap 'git -C "$root" worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
    git -C "$root" worktree add --detach "$base_tree" "$base_ref" >/dev/null 2>&1
fi

echo "layout_bits: base $(git -C "$root" rev-parse --short "$base_ref") vs the working tree; scratch in $work"
# the binaries: kind -> make target (the CPU trainer; or the CUDA trainer's two emulated builds)
declare -A target=([cpu]=train_gpt2)
[ $cuda -eq 1 ] && target=([bf16]=train_gpt2cu_emu [fp32]=train_gpt2fp32cu_emu)
make -C "$base_tree" -s -j"${JOBS:-2}" "${target[@]}" >/dev/null
make -C "$root" -s -j"${JOBS:-2}" "${target[@]}" >/dev/null
for kind in "${!target[@]}"; do
    cp "$base_tree/${target[$kind]}" "$work/$kind.base"
    cp "$root/${target[$kind]}" "$work/$kind.new"
done

# L=5, C=32: pipelines of 2 and 4 stages split it unevenly; 300 tokens of vocabulary, 4 heads.
"$python" "$root/test/oracle/gpt2_oracle.py" --out "$work/data" --layers 5 --channels 32 --heads 4 \
    --max-seq-len 32 --vocab 300 --seed 1 -b 2 -t 16 --data-tokens 8192 >/dev/null

mpi="mpirun --allow-run-as-root --oversubscribe --bind-to none"
# name | processes | binary | flags (each layout trains 6 steps of 256 tokens, a checkpoint at 3 and 6;
# with -v the val loss of 2 batches of the train shard, with -s a sample of 8 tokens, printed as ids)
layouts=(
    "single|1|cpu|"
    "single_r3|1|cpu|-r 3"
    "single_eval|1|cpu|-v 3 -m 2 -s 3 -g 8"
    "dp2_z0|2|cpu|-z 0"
    "dp2_z1|2|cpu|-z 1"
    "dp2_z2|2|cpu|-z 2"
    "dp2_z3|2|cpu|-z 3"
    "dp2_z3_eval|2|cpu|-z 3 -v 3 -m 2 -s 3 -g 8"
    "dp4_z1|4|cpu|-z 1"
    "tp2|2|cpu|-tp 2"
    "tp2_sq|2|cpu|-tp 2 -sq 1"
    "tp2_dp2_z1|4|cpu|-tp 2 -z 1"
    "pp2_gpipe|2|cpu|-pp 2 -pm gpipe"
    "pp2_1f1b|2|cpu|-pp 2 -pm 1f1b"
    "pp2_eval|2|cpu|-pp 2 -v 3 -m 2"
    "pp4_1f1b|4|cpu|-pp 4 -pm 1f1b"
    "tp2_pp2|4|cpu|-tp 2 -pp 2"
    "pp2_dp2_z1|4|cpu|-pp 2 -z 1"
    "resume_dp2|2|cpu|-z 1 RESUME"
    "muon_dp2_z1|2|cpu|-opt muon -z 1"
    "muon_dp2_z2|2|cpu|-opt muon -z 2"
    "muon_tp2|2|cpu|-opt muon -tp 2"
)
# the CUDA trainer under the emulator: issue 47's list (one GPU in bf16 and fp32, every -r, dp2 at every
# ZeRO stage, tp2 with and without -sq, pp2 with both schedules, tp2 x pp2, tp2 x dp2 -z 3, Muon,
# Adafactor, -oo 1), plus GELU in the matmul's epilogue (-ge 1, recomputed at -r 1), the cuBLAS +
# softmax attention (-fa 0), evaluation and a resume
[ $cuda -eq 1 ] && layouts=(
    "bf16|1|bf16|-r 0"
    "bf16_r1|1|bf16|-r 1"
    "bf16_r2|1|bf16|-r 2"
    "bf16_r3|1|bf16|-r 3"
    "bf16_eval|1|bf16|-v 3 -m 2 -s 3 -g 8"
    "bf16_ge1_r1|1|bf16|-ge 1 -r 1"
    "bf16_fa0_r3|1|bf16|-fa 0 -r 3"
    "fp32|1|fp32|-r 0"
    "fp32_r3|1|fp32|-r 3"
    "dp2_z0|2|bf16|-z 0"
    "dp2_z1|2|bf16|-z 1"
    "dp2_z2|2|bf16|-z 2"
    "dp2_z3|2|bf16|-z 3"
    "tp2|2|bf16|-tp 2"
    "tp2_sq|2|bf16|-tp 2 -sq 1"
    "pp2_gpipe|2|bf16|-pp 2 -pm gpipe"
    "pp2_1f1b|2|bf16|-pp 2 -pm 1f1b"
    "tp2_pp2|4|bf16|-tp 2 -pp 2"
    "tp2_dp2_z3|4|bf16|-tp 2 -z 3"
    "muon|1|bf16|-opt muon"
    "muon_dp2_z1|2|bf16|-opt muon -z 1"
    "muon_dp2_z3|2|bf16|-opt muon -z 3"
    "muon_tp2|2|bf16|-opt muon -tp 2"
    "adafactor|1|bf16|-opt adafactor"
    "offload|1|bf16|-oo 1"
    "resume_dp2|2|bf16|-z 1 RESUME"
)

run_layout() {  # binary name np flags dir
    local bin=$1 np=$2 flags=$3 dir=$4 resume=0
    if [[ "$flags" == *RESUME* ]]; then resume=1; flags="${flags/RESUME/}"; fi
    local cmd="$work/$bin -e $work/data/model.bin -i $work/data/train.bin -b 2 -t 16 -d 256 -l 1e-3 -c 0.1 -u 1 \
        -q 0.5 -v 0 -s 0 -n 3 -x 6 -j $work/data/train.bin -o $dir $flags"
    local launch="env OMP_NUM_THREADS=1"
    # under the emulator each process sees one device of its own, as on a node with a GPU per process
    [ $cuda -eq 1 ] && launch="env OMP_NUM_THREADS=1 EMU_DEVICE_COUNT=$np ASAN_OPTIONS=detect_leaks=0"
    [ "$np" -gt 1 ] && launch="$launch $mpi -x EMU_DEVICE_COUNT -x ASAN_OPTIONS -np $np"
    [ "$np" -eq 1 ] && launch="${launch/OMP_NUM_THREADS=1/OMP_NUM_THREADS=2}"
    if [ $resume -eq 1 ]; then  # the whole run, then step 6's checkpoint removed and resumed from step 3's
        $launch $cmd >"$dir.log1" 2>&1
        rm -f "$dir"/*00000006*
        $launch $cmd -y 1 >"$dir.log" 2>&1
    else
        $launch $cmd >"$dir.log" 2>&1
    fi
}

# the per-step numbers of a run, without its timings
step_numbers() {
    "$python" - "$1/metrics.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print({k: r[k] for k in sorted(r) if k in ("step", "train_loss", "grad_norm", "lr", "val_loss", "skipped")})
EOF
}

# the samples a run printed
samples() { sed -n '/^--- sample ---$/,/^--------------$/p' "$1"; }

# The CUDA trainer's bytes per step, predicted at start-up from its plan (llmc/gpt2_plan.cuh,
# "communication: N bytes per step predicted"), against every step's count (metrics.jsonl's comm_bytes,
# llmc/parallel/comm.h): "as predicted: N bytes a step" when they agree within 1% (the count rounds each
# piece's 1/P share down, the formula does not), nothing when the run communicates nothing, else what differs
comm_prediction_off() {
    "$python" - "$1" "$2/metrics.jsonl" <<'EOF'
import json, re, sys
m = re.search(r"^communication: ([0-9.e+]+) bytes per step predicted", open(sys.argv[1]).read(), re.M)
if m:
    predicted = float(m.group(1))
    counted = [json.loads(l)["comm_bytes"] for l in open(sys.argv[2]) if '"comm_bytes"' in l]
    off = [c for c in counted if abs(c - predicted) > 0.01 * predicted]
    if off or not counted:
        print(f"counted {off[:3] if off else 'nothing'} against {predicted:.0f} predicted")
    else:
        print(f"as predicted: {predicted:.0f} bytes a step")
EOF
}

selected="${LAYOUTS:-}"
failed=0
for entry in "${layouts[@]}"; do
    IFS='|' read -r name np kind flags <<<"$entry"
    if [ -n "$selected" ] && [[ " $selected " != *" $name "* ]]; then continue; fi
    for side in base new; do
        run_layout "$kind.$side" "$np" "$flags" "$work/$side.$name" || {
            echo "layout_bits: $name: the $side binary failed (log: $work/$side.$name.log)"; tail -5 "$work/$side.$name.log"
            failed=1; continue 2; }
    done
    verdict="same bits"
    if ! diff <(step_numbers "$work/base.$name") <(step_numbers "$work/new.$name") >/dev/null; then
        verdict="DIFFERENT per-step numbers"
    elif ! diff <(samples "$work/base.$name.log") <(samples "$work/new.$name.log") >/dev/null; then
        verdict="DIFFERENT samples"
    fi
    # every byte but the header's version (h[1]) and checksums (h[64..255]), so that a base from before a
    # file format change (state files version 3, checksums: llmc/io/checksum.h) still compares its contents;
    # between two versions of a state file not its data position either (h[12..15]: per process up to
    # version 3, a place in the sample stream from version 4, llmc/io/checkpoint.h)
    for f in "$work/base.$name"/model_00000006.bin "$work/base.$name"/state_00000006_*.bin; do
        [ -e "$f" ] || { verdict="no final checkpoint"; break; }
        g="$work/new.$name/$(basename "$f")"
        if cmp -s -i 4 -n 4 "$f" "$g"; then
            header="cmp -s -i 8 -n 248"
        else
            header="cmp -s -i 8 -n 40"
            cmp -s -i 64 -n 192 "$f" "$g" || { verdict="DIFFERENT $(basename "$f")"; break; }
        fi
        { cmp -s -n 4 "$f" "$g" && $header "$f" "$g" && cmp -s -i 1024 "$f" "$g"; } ||
            { verdict="DIFFERENT $(basename "$f")"; break; }
    done
    if [ $cuda -eq 1 ] && [ "$verdict" = "same bits" ]; then
        off=$(comm_prediction_off "$work/new.$name.log" "$work/new.$name")
        case "$off" in
            "") ;;
            "as predicted"*) verdict="same bits, $off" ;;
            *) verdict="same bits, but the PREDICTED BYTES are off: $off"; failed=1 ;;
        esac
    fi
    [[ "$verdict" == "same bits"* ]] || failed=1
    printf 'layout_bits: %-12s %d process(es) %-24s %s (%d steps, %d sample lines, %d checkpoint files)\n' \
        "$name" "$np" "${flags:--}" "$verdict" "$(grep -c train_loss "$work/new.$name/metrics.jsonl")" \
        "$(samples "$work/new.$name.log" | wc -l)" "$(ls "$work/new.$name"/*_00000006*.bin | wc -l)"
done
if [ $failed -ne 0 ]; then
    echo "layout_bits: FAILED (scratch kept in $work)"
    trap - EXIT
    exit 1
fi
echo "layout_bits: every layout gives the same bits"
