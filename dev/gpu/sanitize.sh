#!/usr/bin/env bash
# compute-sanitizer over the GPU code. Usage (make test-gpu and dev/gpu/run_on_gpu.sh call it):
#   dev/gpu/sanitize.sh ./train_gpt2cu ./test_gpt2cu
#
#   memcheck   every kernel, cuBLAS/cuBLASLt's included: the kernel tests, the in-process model at
#              -r 0/1/2, and short training runs (validation, sampling, a checkpoint) at -r 0/1/2,
#              -ge 0/1, so every kernel, copy and recompute path of the trainer runs.
#   racecheck, synccheck   our kernels only. They check shared-memory hazards and barrier use inside a
#              kernel; cuBLAS/cuBLASLt's kernels are closed code we cannot fix, and their hand-tuned
#              shared-memory pipelines make these tools slow and are not ours to judge. The filter is
#              `--kernel-name regex=<our kernel names>`, the names read from llmc/*.cuh, so a cuBLAS
#              kernel (cutlass*, sm90_xmma*, gemm*, splitKreduce*) is excluded by name and a new kernel
#              of ours is included without editing this script.
#
# Exit 0 when every run is clean; 1 when a tool reports a problem (its log is printed). When the
# sanitizer is missing, or refuses the device (as under gVisor: "Device not supported"), the script
# prints "sanitize.sh: SKIPPED (reason)" and exits 0: nothing was checked, and the line says so.
#
#   dev/gpu/sanitize.sh --racecheck-tests   prints the kernel tests racecheck runs (a gtest filter): the
#              rehearsal runs them under the emulator with EMU_NO_CUBLAS=1, which fails if one of them
#              launches a cuBLAS(Lt) product (racecheck stopped at the first one on an H100)
set -uo pipefail
# racecheck stops with "Internal Sanitizer Error: The Sanitizer failed to handle a hardware exception"
# in any process where a cuBLASLt kernel ran, even with those kernels left out by name (seen on an H100
# 2026-11-26, and again 2026-11-27 at Kernels.CublasLtDgeluBgradIsOneOfItsTwoReadings, which this list
# missed; the rehearsal now checks it). So racecheck runs our kernels in the kernel tests that call no
# cuBLAS(Lt) (flash attention's among them), and the model and trainer runs go under memcheck and
# synccheck only.
NO_CUBLAS_KERNEL_TESTS='Kernels.*-Kernels.Matmul*:Kernels.Cublas*:Kernels.AttentionForwardBackward:Kernels.Fp8Matmul*:Kernels.Fp8Linear*:Kernels.Fp8LmHead*'
if [ "${1:-}" = --racecheck-tests ]; then echo "$NO_CUBLAS_KERNEL_TESTS"; exit 0; fi
trainer=${1:?usage: sanitize.sh ./train_gpt2cu ./test_gpt2cu}
tests=${2:?usage: sanitize.sh ./train_gpt2cu ./test_gpt2cu}
root="$(cd "$(dirname "$0")/../.." && pwd)"
out=${SANITIZE_OUT:-build/test_tmp/sanitize}

skip() {
    echo "sanitize.sh: SKIPPED ($1)"
    exit 0
}

sanitizer=${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer
if [ ! -x "$sanitizer" ]; then
    sanitizer=$(command -v compute-sanitizer) || skip "compute-sanitizer not found in \$CUDA_HOME/bin or on PATH"
fi
oracle=build/oracle/tiny  # made by the test suite (or dev/gpu/prepare_gpu_run.sh) before this script
[ -f "$oracle/model.bin" ] || { echo "sanitize.sh: $oracle/model.bin missing (run test_gpt2cu first)"; exit 1; }
rm -rf "$out" && mkdir -p "$out"

# our kernels, by name: every __global__ function in llmc/*.cuh
our_kernels=$(grep -hoE '__global__ void (__launch_bounds__\([^)]*\) )?[A-Za-z_0-9]+' "$root"/llmc/*.cuh "$root"/llmc/*/*.cuh | awk '{print $NF}' |
              sort -u | paste -sd '|')
[ -n "$our_kernels" ] || { echo "sanitize.sh: found no __global__ kernels in llmc/*.cuh"; exit 1; }

# Does the sanitizer work on this device at all? One small kernel test under memcheck: a refusal shows
# as the tool's own error before or instead of the program's output.
probe="$out/probe.log"
"$sanitizer" --tool memcheck --error-exitcode 1 "$tests" --gtest_filter='Kernels.GeluForwardBackward' > "$probe" 2>&1
probe_rc=$?
refusal="device not supported|not supported on|unable to (initialize|attach|connect)|failed to initialize"
if [ $probe_rc -ne 0 ] && { grep -qiE "$refusal" "$probe" || ! grep -q "ERROR SUMMARY" "$probe"; }; then
    reason=$(grep -m 1 -iE "$refusal|error" "$probe" | sed 's/^=* *//' | cut -c1-160)
    skip "compute-sanitizer did not run on this device: ${reason:-exit $probe_rc, see $probe}"
fi

failures=0
# run TOOL NAME [sanitizer options --] PROGRAM ARGS...
run() {
    local tool=$1 name=$2
    shift 2
    local filter=()
    if [ "$tool" != memcheck ]; then filter=(--kernel-name "regex=$our_kernels"); fi
    local log="$out/$tool-$name.log"
    local start=$SECONDS
    if "$sanitizer" --tool "$tool" --error-exitcode 1 "${filter[@]}" "$@" > "$log" 2>&1; then
        echo "  $tool $name: clean ($((SECONDS - start)) s; $(grep -m 1 'ERROR SUMMARY' "$log" | sed 's/^=* *//'))"
    else
        cat "$log"
        echo "  $tool $name: FAILED (log: $log)"
        failures=$((failures + 1))
    fi
}

short_run=(-e "$oracle/model.bin" -i "$oracle/train.bin" -j "$oracle/train.bin" -b 2 -t 16 -d 64 -x 2 -v 2 -m 1
           -s 2 -g 4 -n 2)
for tool in memcheck racecheck synccheck; do
    echo "== compute-sanitizer --tool $tool"
    if [ "$tool" = racecheck ]; then
        run "$tool" kernels "$tests" --gtest_filter="$NO_CUBLAS_KERNEL_TESTS"
        continue
    fi
    run "$tool" kernels "$tests" --gtest_filter='Kernels.*'
    run "$tool" model "$tests" --gtest_filter='ModelOracle.Tiny*'
    for setting in "-r 0 -ge 0" "-r 1 -ge 0" "-r 2 -ge 0" "-r 0 -ge 1" "-r 2 -ge 1"; do
        name="trainer${setting// /}"
        run "$tool" "$name" "$trainer" "${short_run[@]}" $setting -o "$out/run-$tool$name"
    done
done
if [ $failures -gt 0 ]; then
    echo "sanitize.sh: $failures run(s) reported problems"
    exit 1
fi
echo "sanitize.sh: memcheck (everything), synccheck (our kernels) and racecheck (our kernels, in the tests without cuBLAS) clean"
