#!/usr/bin/env bash
# Does dev/gpu/sanitize.sh's racecheck run only kernel tests that launch no cuBLAS(Lt) kernel? On an
# H100 racecheck stopped the whole process at the first cuBLASLt kernel (2026-11-26), and again on
# 2026-11-27 at Kernels.CublasLtDgeluBgradIsOneOfItsTwoReadings, a test added after the list was made.
# Two checks, on the CPU machine (the rehearsal runs this):
#   1. each test the list selects (the emulated test binary's --gtest_list_tests) is read in
#      test/gpu/test_kernels.cuh: its body must not name cuBLAS or one of our matmul entry points
#      (a test skipped under the emulator, like the DGELU one, is seen only this way);
#   2. the emulated binary runs the list with EMU_NO_CUBLAS=1, under which any cuBLAS product call
#      ends the program (a product reached through a helper is seen this way).
#
#   dev/gpu/check_racecheck_tests.sh [TEST_BINARY]       default ./test_gpt2cu_emu
#   RACECHECK_TESTS=FILTER ...                            check another list than sanitize.sh's
set -uo pipefail
cd "$(dirname "$0")/../.."
binary=${1:-./test_gpt2cu_emu}
[ -x "$binary" ] || { echo "check_racecheck_tests.sh: $binary missing (make test_gpt2cu_emu)"; exit 1; }
filter=${RACECHECK_TESTS:-$(dev/gpu/sanitize.sh --racecheck-tests)}
tests=$("$binary" --gtest_list_tests --gtest_filter="$filter" | awk '/^[A-Za-z]/ { suite = $1 } /^  / { print suite $1 }')
[ -n "$tests" ] || { echo "check_racecheck_tests.sh: the list '$filter' selects no test"; exit 1; }
bad=0
for t in $tests; do
    name=${t#Kernels.}
    body=$(awk -v name="$name" '$0 ~ "^TEST\\(Kernels, " name "\\)" { on = 1; next } on && /^TEST\(/ { exit } on' test/gpu/test_kernels.cuh)
    if echo "$body" | grep -qE 'cublas|matmul_forward|matmul_backward|matmul_autotune'; then
        echo "check_racecheck_tests.sh: racecheck's list runs $t, whose body calls cuBLAS(Lt): $(echo "$body" | grep -m 1 -oE '[A-Za-z_]*(cublas|matmul_)[A-Za-z_]*')"
        bad=1
    fi
done
if ! EMU_NO_CUBLAS=1 "$binary" --gtest_filter="$filter" > build/check_racecheck_tests.log 2>&1; then
    echo "check_racecheck_tests.sh: under EMU_NO_CUBLAS=1 the list failed (a cuBLAS call?):"
    grep -E "EMU_NO_CUBLAS|^\[ RUN|FAILED" build/check_racecheck_tests.log | tail -n 3
    bad=1
fi
[ $bad -eq 0 ] && echo "check_racecheck_tests.sh: racecheck's $(echo "$tests" | wc -w) kernel tests call no cuBLAS(Lt)"
exit $bad
