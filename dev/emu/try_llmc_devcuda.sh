#!/usr/bin/env bash
# Builds and runs CUDA programs written elsewhere (llm.c's dev/cuda: a common.h and one .cu per op, each
# checking its kernels against a CPU reference) under the emulator, the way dev/emu/devcuda.mk builds
# ours, and prints one line per program and kernel. It reads the programs from DIR and never copies
# them into the repository: what it builds goes to build/emu/foreign-devcuda/.
#
#   dev/emu/try_llmc_devcuda.sh DIR [PROGRAM...]      e.g. dev/emu/try_llmc_devcuda.sh /tmp/llmc-devcuda
#
# For each DIR/PROGRAM.cu (every .cu when none is named):
#   build  cu2cpp.sh rewrites the copy (DIR's headers too), g++ compiles it with the prelude and links
#          the emulator (flags from `make emu-devcuda-build-settings`); with nvcc, kernel_table.sh adds
#          the kernels' registers and shared memory from ptxas for sm_90, so launches an H100 would
#          refuse are refused here. Compiler output: build/emu/foreign-devcuda/logs/PROGRAM.build.log.
#   run    once per kernel number the source dispatches on (the `case N:` labels of its `switch
#          (kernel_num)` as preprocessed, so a case under an #ifdef the build leaves out, such as
#          cuDNN's, is skipped; once with no argument when there is none): `PROGRAM N`. Such programs check
#          their kernels against a CPU reference, print "All results match", then benchmark; the
#          emulator proves nothing about speed, so the build includes stop_at_first_timing.h, which ends
#          the program with status 0 at its first cudaEventElapsedTime. Verdicts: passed (status 0 and
#          the marker in the output; noted, and counted apart, when the output holds NaN: the emulator
#          fills cudaMalloc memory with NaN, and a check written `fabs(a - b) > tol` never fails on
#          NaN), FAILED (a mismatch, a CUDA error, an emulator refusal, or no marker), TIMEOUT
#          (TRY_TIMEOUT seconds, default 600).
#          Logs: build/emu/foreign-devcuda/logs/PROGRAM.N.log.
# Settings: TRY_TIMEOUT (seconds per run), TRY_MARKER (default "results match", case-insensitive),
# TRY_SANITIZER=asan (AddressSanitizer and initcheck: a read of never-written device memory fails the
# run, status 67) or tsan (the race checker: a race fails it, status 66), built from asan.mk or tsan.mk
# into build/emu-asan/ or build/emu-tsan/ with no register table; and the emulator's own settings
# (EMU_THREADS, EMU_THREAD_ORDER, ...), passed through.
set -uo pipefail

if [ $# -lt 1 ] || [ ! -d "$1" ]; then
    echo "usage: $0 DIR [PROGRAM...]   (DIR holds the .cu programs and the headers they include)" >&2
    exit 2
fi
dir="$(cd "$1" && pwd)"
shift
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
case "${TRY_SANITIZER:-}" in
    "") emu_make=(make); work="$repo/build/emu/foreign-devcuda" ;;
    asan | tsan)
        emu_make=(make -f "dev/emu/$TRY_SANITIZER.mk")
        work="$repo/build/emu-$TRY_SANITIZER/foreign-devcuda"
        export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}"
        ;;
    *) echo "TRY_SANITIZER is asan, tsan or empty, not '$TRY_SANITIZER'" >&2; exit 2 ;;
esac
timeout_s="${TRY_TIMEOUT:-600}"
marker="${TRY_MARKER:-results match}"
mkdir -p "$work/src" "$work/bin" "$work/logs"

if [ $# -gt 0 ]; then
    programs=("$@")
else
    programs=()
    for f in "$dir"/*.cu; do programs+=("$(basename "$f" .cu)"); done
fi

# the emulator's objects, and how ours are compiled and linked (emu_cxx, devcuda_flags, devcuda_link, nvcc)
settings="$("${emu_make[@]}" -s --no-print-directory emu-devcuda-build-settings)" || { echo "building the emulator failed" >&2; exit 1; }
eval "$settings"

# every header and program of DIR, rewritten (<<< >>>, __shared__) into $work/src
(cd "$dir" && "$repo/dev/emu/cu2cpp.sh" "$work/src" $(ls *.cu *.h *.cuh 2>/dev/null))

# Runs one program with one argument list; prints the verdict and seconds. The program stops itself at
# its first timing (stop_at_first_timing.h) with status 0; a failed check or an emulator error exits
# non-zero before that.
run_one() {
    local bin="$1" log="$2"
    shift 2
    local start=$SECONDS rc
    timeout "$timeout_s" "$bin" "$@" > "$log" 2>&1
    rc=$?
    if [ $rc -eq 124 ]; then
        echo "TIMEOUT (${timeout_s} s), $((SECONDS - start)) s"
    elif [ $rc -eq 66 ] && [ "${TRY_SANITIZER:-}" = tsan ]; then
        echo "FAILED (the race checker reported races), $((SECONDS - start)) s"
    elif [ $rc -eq 67 ] && [ "${TRY_SANITIZER:-}" = asan ]; then
        echo "FAILED (initcheck: reads of device memory nothing wrote), $((SECONDS - start)) s"
    elif [ $rc -ne 0 ]; then
        echo "FAILED (exit $rc), $((SECONDS - start)) s"
    elif ! grep -qi "$marker" "$log"; then
        echo "FAILED (exit 0 without \"$marker\": nothing was checked?), $((SECONDS - start)) s"
    elif grep -qE '(^|[^A-Za-z])-?nan([^A-Za-z]|$)' "$log"; then
        echo "passed, but it printed NaN (a value nobody wrote? its check compares with >, which NaN never fails), $((SECONDS - start)) s"
    else
        echo "passed, $((SECONDS - start)) s"
    fi
}

built=0
build_failed=0
runs_passed=0
runs_nan=0
runs_failed=0
for p in "${programs[@]}"; do
    src="$work/src/$p.cu"
    if [ ! -f "$src" ]; then
        echo "$p: no $dir/$p.cu"
        continue
    fi
    kernels_o=""
    if [ -z "${TRY_SANITIZER:-}" ] && command -v "$nvcc" > /dev/null 2>&1; then
        if "$repo/dev/emu/kernel_table.sh" "$work/${p}_kernels.cpp" "$nvcc" "-I$dir $dir/$p.cu" 2> "$work/logs/$p.nvcc.log" &&
            g++ -std=c++17 -O1 -Idev/emu/include -c "$work/${p}_kernels.cpp" -o "$work/${p}_kernels.o"; then
            kernels_o="$work/${p}_kernels.o"
        fi
    fi
    # shellcheck disable=SC2086
    if ! eval "$emu_cxx $devcuda_flags -include $repo/dev/emu/stop_at_first_timing.h -I$work/src $src -x none $kernels_o $devcuda_link -o $work/bin/$p" > "$work/logs/$p.build.log" 2>&1; then
        build_failed=$((build_failed + 1))
        echo "$p: BUILD FAILED (log: $work/logs/$p.build.log)"
        grep -m 3 "error" "$work/logs/$p.build.log" | sed 's/^/    /'
        continue
    fi
    built=$((built + 1))
    # the case labels of `switch (kernel_num)`, up to its default, in the preprocessed program (a case
    # under an #ifdef the build leaves out, such as cuDNN's, is not run)
    # shellcheck disable=SC2086
    numbers="$(eval "$emu_cxx $devcuda_flags -E -P -I$work/src $src" 2> /dev/null |
               awk '/switch *\( *kernel_num *\)/ { on = 1 } on && /default *:/ { on = 0 }
                    on { while (match($0, /case +[0-9]+ *:/)) { n = substr($0, RSTART, RLENGTH); gsub(/[^0-9]/, "", n); print n; $0 = substr($0, RSTART + RLENGTH) } }' |
               sort -n | uniq | tr '\n' ' ')"
    [ -z "$numbers" ] && numbers="-"
    for k in $numbers; do
        log="$work/logs/$p.$k.log"
        if [ "$k" = "-" ]; then
            verdict="$(run_one "$work/bin/$p" "$log")"
            label="$p"
        else
            verdict="$(run_one "$work/bin/$p" "$log" "$k")"
            label="$p $k"
        fi
        case "$verdict" in
            "passed, but"*) runs_nan=$((runs_nan + 1)) ;;
            passed*) runs_passed=$((runs_passed + 1)) ;;
            *) runs_failed=$((runs_failed + 1)) ;;
        esac
        printf "%-36s %s (emulated; log: %s)\n" "$label" "$verdict" "$log"
        case "$verdict" in
            passed*) ;;
            *) grep -h -m 3 "cuda-emu:\|Mismatch\|ERROR\|Invalid\|rror" "$log" | sed 's/^/    /' ;;
        esac
    done
done
echo "built $built of $((built + build_failed)) programs; runs: $runs_passed passed, $runs_nan passed their own check with NaN in the output, $runs_failed did not"
[ "$build_failed" -eq 0 ] && [ "$runs_failed" -eq 0 ]
