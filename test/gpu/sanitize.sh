#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck over the kernel tests and a short training run (with
# validation, sampling and a checkpoint, so every kernel and copy of the trainer runs). Any report
# fails the script. Usage (make test-gpu calls it): test/gpu/sanitize.sh ./train_gpt2cu ./test_gpt2cu
set -euo pipefail
trainer=$1
tests=$2
sanitizer=${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer
if [ ! -x "$sanitizer" ]; then
    sanitizer=$(command -v compute-sanitizer) || { echo "sanitize.sh: compute-sanitizer not found (set CUDA_HOME)"; exit 1; }
fi
oracle=build/oracle/tiny  # made by the test suite run before this script
[ -f "$oracle/model.bin" ] || { echo "sanitize.sh: $oracle/model.bin missing (run test_gpt2cu first)"; exit 1; }
out=build/test_tmp/sanitize
rm -rf "$out" && mkdir -p "$out"

run() {
    local tool=$1 name=$2
    shift 2
    echo "== compute-sanitizer --tool $tool: $name"
    if ! "$sanitizer" --tool "$tool" --error-exitcode 1 "$@" > "$out/$tool-$name.log" 2>&1; then
        cat "$out/$tool-$name.log"
        echo "sanitize.sh: $tool found problems in $name (log: $out/$tool-$name.log)"
        exit 1
    fi
    tail -n 1 "$out/$tool-$name.log"
}

for tool in memcheck racecheck; do
    run "$tool" kernels "$tests" --gtest_filter='Kernels.*'
    run "$tool" trainer "$trainer" -e "$oracle/model.bin" -i "$oracle/train.bin" -j "$oracle/train.bin" \
        -b 2 -t 16 -d 64 -x 2 -v 2 -m 1 -s 2 -g 4 -n 2 -o "$out/run-$tool"
done
echo "sanitize.sh: memcheck and racecheck clean"
