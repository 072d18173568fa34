#!/usr/bin/env bash
# The test driver of `make test`: the CPU suite and the CUDA code's suites under the CPU emulator
# (dev/emu). Each suite runs even when an earlier one failed; each logs to build/test_logs/<suite>.log.
# At the end: a table (suite, passed, failed, skipped, seconds) and one closing line
#   tests: N passed, N failed, N skipped
# over all suites (CI reads the last such line). Exit status 1 if any suite failed.
#
# Emulated suites prove the CUDA code's logic on the CPU, not its speed or the GPU's memory model;
# the table labels them "emulated". The emulated GPU suites and kernel tests run one test per process
# (run_gtest_each), so a fatal error fails one test and the others still run. Expects the binaries built (`make test` builds them first) and:
#   GPT2_ROOT   the repository (default: this script's parent)
#   EMU_BUILD   the emulator's build folder: build/emu, or build/emu-asan for AddressSanitizer builds
#   EMU_ASAN_BUILD  the AddressSanitizer and initcheck build's folder (default build/emu-asan)
#   EMU_TSAN_BUILD  the race checker's build folder (default build/emu-tsan)
#   MAKE        for the dev/cuda check modes (make emu-devcuda-check)
#   TEST_SUITES a space-separated subset of the suite names to run (default: all)
#   TEST_LANES  1 runs the emulated suites one after the other (default: two lanes side by side)
set -u
root="${GPT2_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$root"
export GPT2_ROOT="$root"
emu_build="${EMU_BUILD:-build/emu}"
emu_asan_build="${EMU_ASAN_BUILD:-build/emu-asan}"
emu_tsan_build="${EMU_TSAN_BUILD:-build/emu-tsan}"
make_cmd="${MAKE:-make}"
logs=build/test_logs
mkdir -p "$logs"
rm -f "$logs"/*.log "$logs"/*.hashes

# mpirun as CI runs it: as root, more processes than cores, no binding (an emulated process runs a
# host thread and a device thread). Open MPI leaks at exit: LeakSanitizer stays off for MPI runs.
mpirun_np() {
    echo "env ASAN_OPTIONS=detect_leaks=0 timeout 600 mpirun --allow-run-as-root --oversubscribe --bind-to none -x ASAN_OPTIONS -np $1"
}

# Every suite appends "name kind passed failed skipped seconds" to the records file of its lane; the
# table at the end is read from those files (lanes run in subshells, which cannot share variables).
records_file="$logs/0-cpu.records"
rm -f "$logs"/*.records "$logs"/*.out

# Counts of one suite's log: the last "tests: N passed, N failed, N skipped" line, else googletest's
# summary, else "N passed, N failed" (the NCCL and dev/cuda runners); without any, the exit status.
count_results() {
    local log=$1 rc=$2 line passed=0 failed=0 skipped=0
    line=$(grep -E '^tests: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$log" | tail -n 1)
    if [ -n "$line" ]; then
        read -r passed failed skipped <<<"$(sed -E 's/^tests: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped.*/\1 \2 \3/' <<<"$line")"
    elif grep -qE '^\[==========\] [0-9]+ tests? from .* ran' "$log"; then
        passed=$(grep -E '^\[  PASSED  \] [0-9]+ test' "$log" | tail -n 1 | sed -E 's/^\[  PASSED  \] ([0-9]+).*/\1/')
        failed=$(grep -E '^\[  FAILED  \] [0-9]+ test' "$log" | tail -n 1 | sed -E 's/^\[  FAILED  \] ([0-9]+).*/\1/')
        skipped=$(grep -E '^\[  SKIPPED \] [0-9]+ test' "$log" | tail -n 1 | sed -E 's/^\[  SKIPPED \] ([0-9]+).*/\1/')
        passed=${passed:-0} failed=${failed:-0} skipped=${skipped:-0}
    else
        line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
        if [ -n "$line" ]; then
            read -r passed failed <<<"$(sed -E 's/^([0-9]+) passed, ([0-9]+) failed.*/\1 \2/' <<<"$line")"
        fi
    fi
    # a crash, a timeout or a non-zero exit with no failure counted is one failure
    if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
    if [ "$rc" -eq 0 ] && [ "$passed" -eq 0 ] && [ "$failed" -eq 0 ] && [ "$skipped" -eq 0 ]; then passed=1; fi
    echo "$passed $failed $skipped"
}

wanted() { [ -z "${TEST_SUITES:-}" ] || [[ " $TEST_SUITES " == *" $1 "* ]]; }

# run_suite NAME KIND COMMAND...: KIND is "cpu" or "emulated"
run_suite() {
    local name=$1 kind=$2
    shift 2
    wanted "$name" || return 0
    local log="$logs/$name.log" start rc seconds counts
    echo "== $name ($kind): $*"
    start=$(date +%s)
    bash -c "$*" >"$log" 2>&1
    rc=$?
    seconds=$(($(date +%s) - start))
    counts=$(count_results "$log" "$rc")
    record "$name" "$kind" "$counts" "$seconds" "$rc" "$log"
}

record() {
    local name=$1 kind=$2 counts=$3 seconds=$4 rc=$5 log=$6 passed failed skipped
    read -r passed failed skipped <<<"$counts"
    echo "$name $kind $passed $failed $skipped $seconds" >>"$records_file"
    printf '   %d passed, %d failed, %d skipped, %d s (exit %d, log %s)\n' "$passed" "$failed" "$skipped" "$seconds" "$rc" "$log"
    if [ "$failed" -ne 0 ]; then grep -E '^\[  FAILED  \]|cuda-emu:|FAIL|Error' "$log" | head -n 15 | sed 's/^/   | /'; fi
}

# run_gtest_each BINARY FILTER: every test the filter selects, each in a process of its own, so that a
# fatal error (an emulated CUDA or cuBLAS refusal, a fatal() of the code under test: each ends its
# process) fails that test alone and the tests after it still run. Prints each run's output, a FAILED
# line for a run that ended badly, and at the end "tests: N passed, N failed, N skipped" over all.
run_gtest_each() {
    local binary=$1 filter=$2 passed=0 failed=0 skipped=0 name out rc line p f k
    local names
    names=$("$binary" --gtest_filter="$filter" --gtest_list_tests | awk '/^[^ ]/ {suite = $1} /^  / {print suite $1}')
    for name in $names; do
        out=$("$binary" --gtest_filter="$name" 2>&1)
        rc=$?
        printf '%s\n' "$out"
        line=$(grep -E '^tests: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' <<<"$out" | tail -n 1)
        if [ -n "$line" ]; then
            read -r p f k <<<"$(sed -E 's/^tests: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped.*/\1 \2 \3/' <<<"$line")"
        else
            p=0 f=0 k=0
        fi
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then p=0 f=1; fi  # ended before its summary: a crash or fatal()
        if [ "$rc" -ne 0 ]; then echo "FAILED: $name (exit $rc)"; fi
        passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + k))
    done
    echo "tests: $passed passed, $failed failed, $skipped skipped"
    [ "$failed" -eq 0 ]
}
export -f run_gtest_each

# Kernel tests of one build in both thread orders; the two runs must hash every output alike.
run_kernels_both_orders() {
    local precision=$1 binary=$2
    for order in forward reverse; do
        rm -f "$logs/kernels-$precision-$order.hashes"
        run_suite "kernels-$precision-$order" emulated \
            "EMU_THREAD_ORDER=$order EMU_KERNEL_HASHES=$logs/kernels-$precision-$order.hashes run_gtest_each ./$binary 'Kernels.*'"
    done
    local name="kernels-$precision-orders"
    wanted "$name" || return 0
    echo "== $name (emulated): the outputs of both thread orders, bit for bit"
    local log="$logs/$name.log" rc=0
    {
        echo "forward and reverse thread order: every kernel output must have the same bits"
        if [ ! -s "$logs/kernels-$precision-forward.hashes" ]; then
            echo "FAILED: no hashes recorded"; rc=1
        elif ! diff "$logs/kernels-$precision-forward.hashes" "$logs/kernels-$precision-reverse.hashes"; then
            echo "FAILED: the outputs differ between the thread orders (a missing __syncthreads or __syncwarp?)"; rc=1
        else
            echo "$(wc -l <"$logs/kernels-$precision-forward.hashes") outputs identical"
        fi
    } >"$log" 2>&1
    record "$name" emulated "$(count_results "$log" "$rc")" 0 "$rc" "$log"
}

# AddressSanitizer: every dev/cuda program but matmul_forward (its lesson kernels take a minute under it;
# production uses cuBLAS, and the plain check runs it) and wgmma_check (the attention programs' wgmma
# versions run the same emulated wgmma under it; the race checker's seeded bugs have wgmma's)
devcuda_asan_programs="adamw attention_backward attention_forward encoder_backward encoder_forward fused_classifier fused_residual_forward gelu_backward gelu_forward global_norm layernorm_backward layernorm_forward matmul_backward matmul_backward_bias matmul_fp8 nccl_all_reduce softmax_forward"
devcuda_tsan_programs="adamw encoder_backward encoder_forward fused_residual_forward gelu_backward gelu_forward layernorm_backward layernorm_forward matmul_backward_bias nccl_all_reduce"
start_all=$(date +%s)

# The emulated suites run one host thread each, so they go in two lanes side by side (about halving
# their time on two cores), of about equal length: the CPU suite, the emulator's own tests and the bf16
# build's suite in one; the kernel tests (sanitized, and in both thread orders), the fp32 and fp16
# builds, the seeded bugs under the race checker and dev/cuda (plain and sanitized) in the other
# (measured: 894 and 925 s at e17398b). The CPU suite keeps about one core busy (its trainer runs go
# one at a time), so it no longer runs alone first. TEST_LANES=1 runs them one after the other.
lane_a() {
    run_suite cpu cpu "build/test_cpu ${TEST_ARGS:-}"
    # llmc/parallel/comm.h's calls checked against their definitions on the MPI backend (needs mpirun)
    if command -v mpirun >/dev/null && [ -x build/comm_check ]; then
        run_suite comm-mpi-np3 cpu "$(mpirun_np 3) build/comm_check"
    fi
    run_suite emu-core emulated "$emu_build/test_emu_core"
    run_suite emu-seeded-bugs emulated "$emu_build/test_emu_seeded_bugs"
    # AddressSanitizer with initcheck, and the race checker (ThreadSanitizer): dev/emu/README.md
    run_suite emu-core-asan emulated "ASAN_OPTIONS=detect_leaks=0 $emu_asan_build/test_emu_core"
    run_suite emu-seeded-bugs-asan emulated "ASAN_OPTIONS=detect_leaks=0 $emu_asan_build/test_emu_seeded_bugs"
    run_suite emu-core-tsan emulated "$emu_tsan_build/test_emu_core"
    run_suite emu-mma-tsan emulated "$emu_tsan_build/test_mma_emu"
    run_suite emu-cublas emulated "$emu_build/test_cublas_emu"
    run_suite emu-nccl-np2 emulated "$(mpirun_np 2) $emu_build/test_nccl_emu"
    run_suite emu-nccl-np3 emulated "$(mpirun_np 3) $emu_build/test_nccl_emu"
    run_suite emu-nccl-nompi emulated "$emu_build/test_nccl_emu --no-mpi"
    run_suite comm-nccl-np3 emulated "EMU_DEVICE_COUNT=3 $(mpirun_np 3) -x EMU_DEVICE_COUNT $emu_build/comm_check_nccl"
    run_suite emu-mma emulated "$emu_build/test_mma_emu"
    run_suite gpu-suite-bf16 emulated "run_gtest_each ./test_gpt2cu_emu '-Kernels.*'"
}
lane_b() {
    # the GPU suite's kernel tests under AddressSanitizer with initcheck (a report ends its test's
    # process with status 67: that test fails)
    run_suite kernels-asan emulated "ASAN_OPTIONS=detect_leaks=0 run_gtest_each $emu_asan_build/test_gpt2cu_emu 'Kernels.*'"
    # ... and under the race checker (dev/emu/README.md), flash attention at a few shapes (all of them
    # take it 4 minutes) and the classifiers at 4 rows (TEST_SHAPES=few: test/gpu/test_kernels.cuh).
    # OMP_NUM_THREADS=1: the tests' CPU reference runs on OpenMP, whose
    # synchronization ThreadSanitizer does not see.
    run_suite kernels-tsan emulated "OMP_NUM_THREADS=1 TEST_SHAPES=few run_gtest_each $emu_tsan_build/test_gpt2cu_emu 'Kernels.*'"
    run_kernels_both_orders bf16 test_gpt2cu_emu
    run_kernels_both_orders fp32 test_gpt2fp32cu_emu
    run_suite gpu-suite-fp32 emulated "run_gtest_each ./test_gpt2fp32cu_emu '-Kernels.*'"
    # the fp16 build's kernels, its loss scaling and the oracle's tiny runs, and its emulator tests
    # (dynamic loss scaling, doc/mixed_precision.md)
    run_suite gpu-suite-fp16 emulated "run_gtest_each ./test_gpt2fp16cu_emu 'Kernels.*:TrainFp16*:TrainNonFinite*:ModelOracle.Tiny*:TrainOracle.*'"
    run_suite emu-fp16 emulated "$emu_build/test_emu_fp16"
    # the FP8 formats (issue 48) against PyTorch's float8 casts
    run_suite emu-fp8 emulated "GPT2_ROOT=$root $emu_build/test_emu_fp8"
    # the seeded bugs under the race checker (the other emulator tests: lane a)
    run_suite emu-seeded-bugs-tsan emulated "$emu_tsan_build/test_emu_seeded_bugs"
    # dev/cuda: every program checked; then under the sanitizers: every program with AddressSanitizer and
    # initcheck (each version at its first block size: dev/cuda/harness.cuh, DEV_CHECK_ONE_BLOCK_SIZE; the
    # attention programs at their length with a partial last tile alone, DEV_CHECK_PARTIAL_ONLY);
    # with the race checker (each at its largest: the most warps a block) the quick ones (the others take
    # one to several minutes each under it: attention, the classifier, matmul_forward, softmax,
    # global_norm; their llmc kernels are in kernels-tsan)
    run_suite devcuda-check emulated "$make_cmd --no-print-directory emu-devcuda-check"
    run_suite devcuda-check-asan emulated "$make_cmd --no-print-directory -f dev/emu/asan.mk emu-devcuda-check \"EMU_DEVCUDA_ENV=ASAN_OPTIONS=detect_leaks=0 DEV_CHECK_ONE_BLOCK_SIZE=1 DEV_CHECK_PARTIAL_ONLY=1\" \"EMU_DEVCUDA_PROGRAMS=$devcuda_asan_programs\""
    run_suite devcuda-check-tsan emulated "$make_cmd --no-print-directory -f dev/emu/tsan.mk emu-devcuda-check \"EMU_DEVCUDA_ENV=OMP_NUM_THREADS=1 DEV_CHECK_ONE_BLOCK_SIZE=largest\" \"EMU_DEVCUDA_PROGRAMS=$devcuda_tsan_programs\""
}
if [ "${TEST_LANES:-2}" = 1 ]; then
    records_file="$logs/1-lane-a.records" lane_a
    records_file="$logs/2-lane-b.records" lane_b
else
    echo "== emulated suites in two lanes (their output follows when both are done)"
    (records_file="$logs/1-lane-a.records" TEST_SCRATCH_TAG=lane-a; export TEST_SCRATCH_TAG; lane_a) >"$logs/1-lane-a.out" 2>&1 &
    lane_a_pid=$!
    (records_file="$logs/2-lane-b.records" TEST_SCRATCH_TAG=lane-b; export TEST_SCRATCH_TAG; lane_b) >"$logs/2-lane-b.out" 2>&1 &
    lane_b_pid=$!
    wait "$lane_a_pid"
    wait "$lane_b_pid"
    cat "$logs/1-lane-a.out" "$logs/2-lane-b.out"
fi

echo
printf '%-24s %-9s %7s %7s %8s %8s\n' suite kind passed failed skipped seconds
total_passed=0 total_failed=0 total_skipped=0 any_failed=0
while read -r name kind passed failed skipped seconds; do
    printf '%-24s %-9s %7d %7d %8d %8d\n' "$name" "$kind" "$passed" "$failed" "$skipped" "$seconds"
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failed))
    total_skipped=$((total_skipped + skipped))
    [ "$failed" -eq 0 ] || any_failed=1
done < <(cat "$logs"/*.records 2>/dev/null)
echo "(emulated: the CUDA code run on the CPU by dev/emu; proves the logic, not the speed or the GPU memory model)"
# What failed, again, right above the closing lines: CI shows only the end of this output.
if [ "$any_failed" -ne 0 ]; then
    while read -r name kind passed failed skipped seconds; do
        [ "$failed" -eq 0 ] && continue
        echo "failed in $name ($logs/$name.log):"
        {   # the failed tests' names, then the first failure's place and message
            grep -E '^\[  FAILED  \] [A-Za-z]|^FAILED: ' "$logs/$name.log" | sed -E 's/ \([0-9]+ ms\)$//' | sort -u | head -n 4
            grep -m 1 -A 3 -E 'Failure$|cuda-emu:' "$logs/$name.log"
        } | cut -c 1-200 | sed 's/^/   | /'
    done < <(cat "$logs"/*.records 2>/dev/null)
fi
echo "all suites: $(($(date +%s) - start_all)) s; logs in $logs/"
echo "tests: $total_passed passed, $total_failed failed, $total_skipped skipped"
exit $any_failed
