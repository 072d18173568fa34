#!/usr/bin/env bash
# Builds and runs every dev/cuda program, then prints one table: op, best version, time, % of ceiling,
# in markdown, ready for dev/cuda/README.md.
#
#   dev/cuda/run_all.sh                            all programs, in the Makefile's order
#   dev/cuda/run_all.sh gelu_forward adamw         only these
#
# Each program's full output goes to $LOG_DIR/<program>.log (default dev/cuda/logs). Without a GPU every
# program says so and exits 0, and so does this script. It exits 1 if a program failed a check or crashed.
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
make -s -j"$(nproc)" || { echo "run_all: the build failed" >&2; exit 1; }

if [ $# -gt 0 ]; then
    programs=("$@")
else
    read -r -a programs <<< "$(make -s --no-print-directory list)"
fi
log_dir="${LOG_DIR:-$here/logs}"
mkdir -p "$log_dir"

failed=()
for program in "${programs[@]}"; do
    if [ ! -x "bin/$program" ]; then
        echo "run_all: no program bin/$program (see: make -C dev/cuda list)" >&2
        exit 1
    fi
    start=$(date +%s)
    "./bin/$program" > "$log_dir/$program.log" 2>&1
    rc=$?
    echo "$program: exit $rc, $(( $(date +%s) - start )) s (log: $log_dir/$program.log)"
    grep -h "FAIL" "$log_dir/$program.log" | head -5
    if [ $rc -ne 0 ]; then failed+=("$program (exit $rc)"); fi
done

logs=()
for program in "${programs[@]}"; do logs+=("$log_dir/$program.log"); done
if ! grep -q -h '^RESULT|' "${logs[@]}"; then
    if [ ${#failed[@]} -eq 0 ]; then
        echo
        head -n 1 "${logs[0]}"
        echo "run_all: nothing was measured (no usable GPU here); every program exited cleanly."
        exit 0
    fi
fi

gpu="$(grep -h -m 1 '^device:' "${logs[@]}" | head -n 1 | sed 's/^device: //')"
echo
echo "GPU: ${gpu:-unknown}"
echo "Date: $(date +%F)"
echo
echo "| op | best version | block | time (us) | rate | % of ceiling | checks |"
echo "| --- | --- | --- | ---: | ---: | ---: | --- |"
grep -h '^RESULT|' "${logs[@]}" | awk -F'|' '{
    pct = ($8 == "-") ? "-" : $8 "% of " $9;
    printf "| %s | %s | %s | %s | %s %s | %s | %s |\n", $2, $3, $4, $5, $6, $7, pct, $10
}'
if grep -q -h '^RATIO|' "${logs[@]}"; then
    echo
    echo "Our tensor-core matmul (v3, mma.sync) against cuBLAS and cuBLASLt at the trainer's shapes:"
    echo
    echo "| shape | v3 mma.sync (us) | v4 cuBLAS + bias kernel (us) | v5 cuBLASLt (us) | v3 speed as % of cuBLASLt |"
    echo "| --- | ---: | ---: | ---: | ---: |"
    grep -h '^RATIO|' "${logs[@]}" | awk -F'|' '{ printf "| %s | %s | %s | %s | %s%% |\n", $2, $3, $4, $5, $6 }'
fi

if [ ${#failed[@]} -gt 0 ]; then
    echo
    echo "run_all: FAILED: ${failed[*]}" >&2
    exit 1
fi
