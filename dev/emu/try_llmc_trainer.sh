#!/usr/bin/env bash
# llm.c's own CUDA trainer (its train_gpt2.cu, bf16) against this project's checkpoints, both ways, here on
# the CPU: llm.c's source from DIR is built under the emulator (never copied into the repository: the
# build goes to build/emu/foreign-trainer/), and each side continues a checkpoint the other wrote (issue
# 51, item 6; doc/reliability.md, "Runs that move to and from llm.c").
#
#   dev/emu/try_llmc_trainer.sh DIR        e.g. DIR = build/peers/llm.c (doc/cuda.md says how to fetch it)
#
# The build: cu2cpp.sh with EMU_LAUNCH_BY_CALL=1 (llm.c launches kernel templates whose arguments CUDA
# deduces as a call would), g++ with the emulator's flags. The model: the oracle's 2 layers, 64 channels,
# T 32, and a vocabulary of 8200 (llm.c's fused classifier kernel assumes V >= 8 x 1024: with fewer its
# first loop runs past the row on a GPU too), in bf16 as llm.c reads it; 8193 tokens of data (256 samples
# of T = 32, so llm.c's loader reads our unshuffled stream). Three checks, each step's loss compared
# with the uninterrupted run's (bf16 on both sides with different kernels: within 2e-3; measured 5e-4):
#   stream    ours (-sh 0, 2 micro-batches a step) writes checkpoint 3 with -cf llmc; llm.c's -y 1 runs
#             steps 4-6 from its data position: the losses of our uninterrupted run
#   from llm.c   llm.c writes checkpoint 3 (-a 1: llm.c always shuffles otherwise, in its own order); ours
#             continues it with -a 1: llm.c's uninterrupted losses
#   to llm.c  ours writes checkpoint 3 with -a 1 -cf llmc; llm.c continues: llm.c's uninterrupted losses
# Prints one line per check and "try_llmc_trainer: N of 3 checks passed"; exit 0 when all pass.
set -uo pipefail

if [ $# -ne 1 ] || [ ! -f "$1/train_gpt2.cu" ]; then
    echo "usage: $0 DIR   (DIR holds llm.c's train_gpt2.cu and llmc/)" >&2
    exit 2
fi
src="$(cd "$1" && pwd)"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
work=build/emu/foreign-trainer
python=${PYTHON:-.venv/bin/python}
mkdir -p "$work/bin"

make -s train_gpt2cu_emu || { echo "try_llmc_trainer: building train_gpt2cu_emu failed" >&2; exit 1; }
settings="$(make -s --no-print-directory emu-devcuda-build-settings)" || { echo "building the emulator failed" >&2; exit 1; }
eval "$settings"
rm -rf "$work/src"
(cd "$src" && EMU_LAUNCH_BY_CALL=1 "$repo/dev/emu/cu2cpp.sh" "$repo/$work/src" train_gpt2.cu llmc/*.cuh llmc/*.h)
# shellcheck disable=SC2086
if ! eval "$emu_cxx $devcuda_flags -DENABLE_BF16 -I$work/src $work/src/train_gpt2.cu -x none $devcuda_link -o $work/bin/train_gpt2cu" > "$work/build.log" 2>&1; then
    echo "try_llmc_trainer: llm.c's trainer did not build (log: $work/build.log)"
    grep -m 5 error "$work/build.log"
    exit 1
fi

data="$work/data"
rm -rf "$data" "$work/runs"
mkdir -p "$work/runs"
"$python" test/oracle/gpt2_oracle.py --out "$data" --layers 2 --channels 64 --heads 4 --max-seq-len 32 --vocab 8200 \
    --seed 1 -b 4 -t 32 --data-tokens 8193 > "$work/oracle.log" 2>&1 || { echo "try_llmc_trainer: the oracle failed"; exit 1; }
"$python" - "$data/model.bin" "$data/model_bf16.bin" <<'EOF'
import sys
import numpy as np
header = np.fromfile(sys.argv[1], dtype="<i4", count=256).copy()
bits = np.fromfile(sys.argv[1], dtype="<u4", offset=1024).astype(np.uint64)
bf16 = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")   # round to nearest even
header[1] = 5
with open(sys.argv[2], "wb") as f:
    f.write(header.tobytes())
    f.write(bf16.tobytes())
EOF

common="-i $data/train.bin -j $data/train.bin -b 4 -t 32 -x 6 -l 1e-3 -u 1 -q 0.1 -c 0"
ours() { ./train_gpt2cu_emu -e "$data/model_bf16.bin" $common -v 0 -s 0 -sh 0 "$@" > /dev/null 2>&1; }
llmc() { EMU_REGISTER_WARNINGS=0 "$work/bin/train_gpt2cu" -e "$data/model_bf16.bin" $common -v 1000 -s 1000 -g 16 -h 0 "$@" > /dev/null 2>&1; }
# losses of steps 4-6 (0-based 3-5): ours from metrics.jsonl, llm.c's from main.log ("s:3 trl:...")
our_losses() { grep -o '"train_loss": [0-9.]*' "$1/metrics.jsonl" | tail -n 3 | awk '{print $2}' | tr '\n' ' '; }
llmc_losses() { grep -o 's:[345] trl:[0-9.]*' "$1/main.log" | sed 's/.*trl://' | tr '\n' ' '; }
# checkpoint 3 of DIR alone in a new directory (what -y 1 there resumes)
only_checkpoint_3() { mkdir -p "$2" && cp "$1/model_00000003.bin" "$1"/state_00000003_*.bin "$1/DONE_00000003" "$2/"; }

passed=0
check() {  # check NAME CONTINUED REFERENCE
    local verdict
    verdict=$(awk -v a="$2" -v b="$3" 'BEGIN { n = split(a, x, " "); m = split(b, y, " "); worst = 0
        if (n != 3 || m != 3) { print "FAILED (missing losses)"; exit }
        for (i = 1; i <= 3; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > worst) worst = d }
        printf "%s, largest difference %.1e", worst <= 2e-3 ? "passed" : "FAILED", worst }')
    echo "$1: continued $2| uninterrupted $3| $verdict"
    [[ "$verdict" == passed* ]] && passed=$((passed + 1))
}

r="$work/runs"
ours -d 256 -o "$r/stream_ours" -n 3 -cf llmc
only_checkpoint_3 "$r/stream_ours" "$r/stream_llmc"
llmc -d 256 -o "$r/stream_llmc" -y 1 -n 0
check "stream (ours -> llm.c)" "$(llmc_losses "$r/stream_llmc")" "$(our_losses "$r/stream_ours")"

llmc -d 128 -a 1 -o "$r/from_llmc" -n 3
only_checkpoint_3 "$r/from_llmc" "$r/from_llmc_ours"
ours -d 128 -a 1 -o "$r/from_llmc_ours" -y 1
check "from llm.c (-a 1)" "$(our_losses "$r/from_llmc_ours")" "$(llmc_losses "$r/from_llmc")"

ours -d 128 -a 1 -o "$r/to_llmc" -n 3 -cf llmc
only_checkpoint_3 "$r/to_llmc" "$r/to_llmc_llmc"
llmc -d 128 -a 1 -o "$r/to_llmc_llmc" -y 1 -n 0
check "to llm.c (-a 1)" "$(llmc_losses "$r/to_llmc_llmc")" "$(llmc_losses "$r/from_llmc")"

echo "try_llmc_trainer: $passed of 3 checks passed (runs in $r)"
[ "$passed" -eq 3 ]
