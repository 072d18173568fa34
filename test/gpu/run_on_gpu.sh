#!/usr/bin/env bash
# Runs everything that needs the GPU, in order, on binaries and oracle files made beforehand on a
# machine without one (test/gpu/prepare_gpu_run.sh), and ends with one table: stage, result, seconds.
# Builds nothing and needs no network, googletest, MPI or apt; PyTorch only for the d12 oracle files
# (too large to carry, made here on the CPU) and the PyTorch side of the benchmark.
#
#   test/gpu/run_on_gpu.sh                  every stage, in the order below
#   test/gpu/run_on_gpu.sh kernels model-bf16   only these stages (to fit a time limit per call)
#   test/gpu/run_on_gpu.sh --list           the stages and their time limits
#
# Every stage runs under its own time limit (timeout; seconds below, or STAGE_TIMEOUT=<s> for all),
# and a failing stage does not stop the ones after it. Everything goes to one log, $GPU_RUN_LOG
# (default build/gpu_run/run_on_gpu.log; appended to, so several calls make one log), and the
# summary to the terminal and the log. A stage's result comes from the closing lines
# "tests: N passed, N failed, N skipped" its test binaries print (passed: none failed; skipped: all
# skipped), from "sanitize.sh: SKIPPED (...)", or else from its exit status. Exit status: 1 if any
# stage failed, else 0.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

# name | time limit (s) | what it runs
STAGES=(
    "smi|60|nvidia-smi: the GPU, driver, memory"
    "libs|60|every binary's shared libraries resolve (ldd)"
    "kernels|600|every kernel against its CPU op, bf16 and fp32 builds (Kernels.*)"
    "model-bf16|900|bf16 model and 10 training steps against the oracle (ModelOracle.*, TrainOracle.*)"
    "model-fp32|900|the same for the fp32 build, with CPU-like tolerances"
    "trainer-bf16|900|the trainer's promises, bf16: -r 0/1/2 and -ge 1 bit-identical, -w 0, determinism, resume, CPU<->GPU checkpoints, NCCL path"
    "trainer-fp32|900|the same for the fp32 build"
    "sanitize|1200|compute-sanitizer: memcheck everything, racecheck and synccheck our kernels (test/gpu/sanitize.sh)"
    "bench|900|dev/bench_gpu.sh 30: train_gpt2cu vs PyTorch at d12, T=1024"
    "cuda-dev|1200|dev/cuda/run_all.sh: every kernel version checked and timed"
)

log=${GPU_RUN_LOG:-build/gpu_run/run_on_gpu.log}
work=build/gpu_run
mkdir -p "$work" "$(dirname "$log")"

stage_field() {  # stage_field NAME FIELD(1 name, 2 limit, 3 description)
    local s
    for s in "${STAGES[@]}"; do
        if [ "${s%%|*}" = "$1" ]; then echo "$s" | cut -d'|' -f"$2"; return 0; fi
    done
    return 1
}

if [ "${1:-}" = "--list" ]; then
    for s in "${STAGES[@]}"; do IFS='|' read -r n t d <<< "$s"; printf "%-13s %5s s  %s\n" "$n" "$t" "$d"; done
    exit 0
fi
selected=("$@")
if [ ${#selected[@]} -eq 0 ]; then
    for s in "${STAGES[@]}"; do selected+=("${s%%|*}"); done
fi
for name in "${selected[@]}"; do
    stage_field "$name" 1 > /dev/null || { echo "run_on_gpu.sh: no stage '$name' (see --list)"; exit 2; }
done

say() { echo "$@" | tee -a "$log"; }

# ----------------------------------------------------------------------------
# environment: the repository root for the tests, the Python that has torch, and the CUDA libraries

export GPT2_ROOT="$root"
GPT2_PYTHON="$(scripts/find_python.sh 2>/dev/null || command -v python3)"
export GPT2_PYTHON
export PYTHON="$GPT2_PYTHON"  # dev/bench_gpu.sh's PyTorch side
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
BINARIES=(train_gpt2 train_gpt2cu train_gpt2fp32cu test_gpt2cu test_gpt2fp32cu)
CUDA_DEV_BINARIES=(dev/cuda/bin/*)

# cuBLAS, cuBLASLt and NCCL are linked dynamically (too large to carry; see prepare_gpu_run.sh), with
# an rpath to /usr/local/cuda/lib64. Where a library is not found there or by the loader's own search,
# look for it in the CUDA installs and in the Python packages (torch's nvidia-* wheels hold the same
# libraries) and add its folder to LD_LIBRARY_PATH.
missing_libraries() {
    local b
    for b in "${BINARIES[@]}" "${CUDA_DEV_BINARIES[@]}"; do
        [ -x "$b" ] && ldd "$b" 2>/dev/null | awk '/not found/ { print $1 }'
    done | sort -u
}
resolve_libraries() {
    local lib dir search_roots=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64)
    local site
    site=$("$GPT2_PYTHON" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) && search_roots+=($site)
    for lib in $(missing_libraries); do
        dir=$(find "${search_roots[@]}" -name "$lib" -print -quit 2>/dev/null | xargs -r dirname)
        if [ -n "$dir" ]; then
            export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            say "libraries: $lib found in $dir (added to LD_LIBRARY_PATH)"
        else
            say "libraries: $lib not found anywhere searched"
        fi
    done
}

# ----------------------------------------------------------------------------
# the stages (each runs in a subshell under `timeout`; its output goes to the log)

gtest_stage() {  # gtest_stage BINARY FILTER
    local binary=$1 filter=$2
    [ -x "$binary" ] || { echo "$binary missing: run test/gpu/prepare_gpu_run.sh and carry it"; return 1; }
    echo "\$ $binary --gtest_filter='$filter'"
    "$binary" --gtest_filter="$filter"
}

run_stage_body() {
    case "$1" in
        smi) nvidia-smi && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv ;;
        libs)
            local b bad=0
            for b in "${BINARIES[@]}" "${CUDA_DEV_BINARIES[@]}"; do
                [ -x "$b" ] || { echo "$b: missing"; bad=1; continue; }
                if ldd "$b" | grep -q "not found"; then echo "$b:"; ldd "$b" | grep "not found"; bad=1; fi
            done
            ldd ./train_gpt2cu
            echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
            return $bad ;;
        kernels)
            local rc=0
            gtest_stage ./test_gpt2cu 'Kernels.*' || rc=1
            gtest_stage ./test_gpt2fp32cu 'Kernels.*' || rc=1
            return $rc ;;
        model-bf16) gtest_stage ./test_gpt2cu 'ModelOracle.*:TrainOracle.*' ;;
        model-fp32) gtest_stage ./test_gpt2fp32cu 'ModelOracle.*:TrainOracle.*' ;;
        trainer-bf16) gtest_stage ./test_gpt2cu 'Train*:MultiGpu*-TrainOracle.*' ;;
        trainer-fp32) gtest_stage ./test_gpt2fp32cu 'Train*:MultiGpu*-TrainOracle.*' ;;
        sanitize) SANITIZE_OUT="$work/sanitize" test/gpu/sanitize.sh ./train_gpt2cu ./test_gpt2cu ;;
        bench) dev/bench_gpu.sh 30 ;;
        cuda-dev)
            # the programs were built on the CPU machine; a copy may have given them older times than
            # their sources, and run_all.sh's `make` would rebuild them here
            touch dev/cuda/bin/*
            LOG_DIR="$root/$work/cuda_logs" dev/cuda/run_all.sh ;;
    esac
}

# result of a finished stage from its output and exit status: "passed|failed|skipped<TAB>detail"
stage_result() {
    local out=$1 rc=$2
    local counts
    counts=$(awk '/^tests: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped/ { p += $2; f += $4; s += $6; n++ }
                  END { if (n) printf "%d %d %d", p, f, s }' "$out")
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        printf "failed\ttime limit reached"
    elif [ -n "$counts" ]; then
        read -r p f s <<< "$counts"
        local detail="$p passed, $f failed, $s skipped"
        if [ "$f" -gt 0 ] || [ "$rc" -ne 0 ]; then printf "failed\t%s%s" "$detail" "$([ "$rc" -ne 0 ] && echo ", exit $rc")"
        elif [ "$p" -eq 0 ] && [ "$s" -gt 0 ]; then printf "skipped\t%s" "$detail"
        else printf "passed\t%s" "$detail"; fi
    elif grep -q "SKIPPED (" "$out"; then
        printf "skipped\t%s" "$(grep -m 1 -o 'SKIPPED (.*' "$out" | sed 's/^SKIPPED (//; s/)$//' | cut -c1-100)"
    elif [ "$rc" -ne 0 ]; then
        printf "failed\texit %d" "$rc"
    else
        printf "passed\texit 0"
    fi
}

# ----------------------------------------------------------------------------

say ""
say "==== run_on_gpu.sh $(date -u '+%F %T UTC') on $(hostname): stages ${selected[*]}"
commit=unknown
if git rev-parse --short HEAD > /dev/null 2>&1; then
    commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD 2> /dev/null || echo ' (with local changes)')"
fi
say "python: $GPT2_PYTHON; commit: $commit"
# the CPU trainer prepare_gpu_run.sh built for this machine (no MPI, portable -march) goes where the
# tests look for it (on a GPU machine only: on the CPU machine ./train_gpt2 is the MPI build the CPU
# suite needs)
if [ -x build/gpu/train_gpt2 ] && nvidia-smi -L > /dev/null 2>&1; then
    cp build/gpu/train_gpt2 ./train_gpt2
    say "train_gpt2: build/gpu/train_gpt2 copied into place"
fi
resolve_libraries

export -f run_stage_body gtest_stage
export root work BINARIES_LIST="${BINARIES[*]}"
results=()
any_failed=0
for name in "${selected[@]}"; do
    limit=${STAGE_TIMEOUT:-$(stage_field "$name" 2)}
    say ""
    say "==== stage $name (limit ${limit} s): $(stage_field "$name" 3)"
    out="$work/stage-$name.log"
    start=$SECONDS
    # a function run under timeout needs a shell of its own; the arrays are passed as words
    # (the output goes to the log as it comes, so a run killed from outside still leaves it there)
    timeout --kill-after=30 "$limit" bash -c '
        BINARIES=($BINARIES_LIST); CUDA_DEV_BINARIES=(dev/cuda/bin/*)
        run_stage_body "$1"' _ "$name" < /dev/null 2>&1 | tee "$out" >> "$log"
    rc=${PIPESTATUS[0]}
    seconds=$((SECONDS - start))
    result=$(stage_result "$out" "$rc")
    status=${result%%$'\t'*}
    detail=${result#*$'\t'}
    [ "$status" = failed ] && any_failed=1
    say "==== stage $name: $status ($detail), $seconds s"
    results+=("$name|$status|$seconds|$detail")
done

{
    echo ""
    echo "| stage | result | seconds | detail |"
    echo "| --- | --- | ---: | --- |"
    for r in "${results[@]}"; do
        IFS='|' read -r n s t d <<< "$r"
        echo "| $n | $s | $t | $d |"
    done
    echo ""
    echo "log: $log"
} | tee -a "$log"
exit $any_failed
