#!/usr/bin/env bash
# The GPU session plan: everything that needs the GPU, in priority order, inside one time budget, on
# binaries and oracle files made beforehand on a machine without one (dev/gpu/prepare_gpu_run.sh).
# Builds nothing and needs no network, googletest, MPI or apt; PyTorch only for the d12 oracle files
# (too large to carry: made here, with all cores, while the kernel tests run) and the PyTorch peers.
# doc/cuda.md, "A GPU session", gives the exact device commands.
#
#   OUT=DIR dev/gpu/run_on_gpu.sh --plan call1          the first device call of a session (PLANS below)
#   OUT=DIR dev/gpu/run_on_gpu.sh --plan call2          the second, at once on the warm machine
#   OUT=DIR dev/gpu/run_on_gpu.sh --budget 200 sanitize ncu   only these stages, at their own limits
#   dev/gpu/run_on_gpu.sh --list                        the stages and plans, their lanes and time limits
#   dev/gpu/run_on_gpu.sh --check-plans                 each plan's stage limits add up within its budget?
#   PLAN_EMU=1 ...                                       the rehearsal (dev/gpu/rehearse.sh): the same
#       stages on the emulated binaries at tiny sizes, on the CPU machine
#   BENCH_MODES="ours-r0 torch-compile" CUDA_DEV_PROGRAMS="attention_forward attention_backward" ...
#       a narrower bench (dev/bench_gpu.py's modes) and cuda-dev (some programs only)
#
# A plan is the stages of one device call, each with the time limit it gets in that call, and a budget
# they add up to at most (the lanes counted once, as the longer lane): --check-plans, which the
# rehearsal runs, fails otherwise. Stages run in the order given. Those of the lanes bf16 and fp32
# (correctness: the two builds' kernels, model against the oracle, trainer promises) run as two lanes
# side by side, each lane's stages one after the other; the others (lane main) one at a time, the
# timed ones alone on the GPU. Every stage runs under its own time limit, cut to what is left of the
# budget; a stage that would get under 15 s is skipped and says so. A failing stage does not stop the
# others. A stage that measures writes its table as it goes (after each round), so a stage cut at its
# limit still returns what it measured.
#
# Everything lands under $OUT (default build/gpu_run) as it happens, so a command killed from outside
# still returns what it had: main.log, bf16.log, fp32.log (each lane's output),
# summary.tsv (stage lane result seconds detail, one line per finished stage), bench.tsv
# (dev/bench_gpu.py, one line per run), cuda_dev.md (dev/cuda's table), attention.md (ours against
# FlashAttention-2), ncu.md (the step's time split, the costliest kernels). Eight files at most, no
# subfolders: what the device tool returns. dev/gpu/gpu_results.py turns them into
# doc/gpu_results.md. Exit status: 1 if any stage failed, else 0.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

# name | lane | time limit (s) when run alone | what it runs
STAGES=(
    "smi|main|30|nvidia-smi; every binary's shared libraries resolve"
    "wgmma|main|20|dev/cuda/bin/wgmma_check: wgmma's fragments, descriptors and 128-byte swizzle against a CPU product (llmc/wgmma.cuh, and the emulator's reading of the PTX ISA: dev/emu/wgmma_emu.h)"
    "kernels-bf16|bf16|120|every kernel against its CPU op, bf16 build (Kernels.*)"
    "model-bf16|bf16|150|bf16 model (tiny and d12) and 10 training steps against the oracle"
    "trainer-bf16|bf16|180|the trainer's promises, bf16: -r 0..3, -ge, -bg, determinism, resume, checkpoints, optimizers"
    "kernels-fp32|fp32|120|the same kernels, fp32 build"
    "model-fp32|fp32|150|the fp32 model against the oracle, CPU-like tolerances"
    "trainer-fp32|fp32|180|the trainer's promises, fp32 build"
    "memory|main|30|the memory plan against cudaMemGetInfo (TrainMemory.*), both builds, alone on the GPU"
    "bench|main|300|dev/bench_gpu.py, d12 B=64 T=1024, 3 interleaved rounds: ours -r 0 beside llm.c -r 0 and PyTorch compiled two ways (BENCH_MODES)"
    "bench-recompute|main|120|dev/bench_gpu.py, 3 rounds: ours -r 1 beside llm.c -r 1 (llm.c's default: GELU recomputed)"
    "bench-d24|main|150|dev/bench_gpu.py at d24 (350M), B=32: ours -r 0 and PyTorch compiled (BENCH_D24_MODES: others)"
    "attention|main|120|3 rounds: dev/cuda attention_forward and attention_backward (every version) beside PyTorch's FlashAttention-2"
    "cuda-dev|main|180|dev/cuda/run_all.sh: every kernel version checked and timed (CUDA_DEV_PROGRAMS: some)"
    "ncu|main|120|Nsight Compute over a d12 step at B=64, -r 0: the time split by kind of kernel, the costliest kernels (dev/gpu/ncu_top.sh)"
    "sanitize|main|300|compute-sanitizer: memcheck everything, racecheck and synccheck ours (dev/gpu/sanitize.sh)"
    "fp8|main|240|dev/compare_fp8.sh: d12 from scratch, 300 steps of 64K tokens of tinyshakespeare in BF16 and in -fp8 2 (FP8_RUNS), the mean loss of the last 100 (issue 48)"
)

# name | budget (s) | environment | stage:limit ... (see doc/cuda.md, "The plan"). Call 1 answers what
# changed since the last GPU run (the kernel and trainer suites in both builds; add model-* when the
# model's arithmetic changed), then the speed question against the peers; call 2, at once on the warm
# machine, the rest: the dev/cuda programs whose sources changed, attention against FA2, the step's time
# split, the recompute setting against llm.c's, the sanitizers. The limits are what the H100 took on
# 2026-11-27 (doc/gpu_results.md, calls 9-12) with room; about 4 minutes of the 15 stay for the two
# starts and one re-run. A session adds its own questions to BENCH_MODES (ours-bg1, ours-oo1, ...).
# Plan fp8 (issue 48's measurements, in place of call2 when FP8 is the question): BF16 against -fp8 2,
# the loss of 300 steps each at d12, and the speed in interleaved rounds: -fp8 1 and -fp8 2 at d12, -fp8 2
# at d24 (BENCH_D24_B: its micro-batch, 32 by default). With call1 that is 750 s of the 900: should the
# two starts leave less, drop ours-fp8 from BENCH_MODES (bench:90).
PLANS=(
    "call1|420|BENCH_MODES='ours-r0 llmc-r0 torch-compile-loss ours-lc8' BENCH_ROUNDS=3|smi:15 wgmma:10 kernels-bf16:30 trainer-bf16:110 kernels-fp32:30 trainer-fp32:110 memory:15 bench:235"
    "call2|240|CUDA_DEV_PROGRAMS=changed|cuda-dev:45 attention:80 ncu:35 bench-recompute:45 sanitize:35"
    "fp8|330|BENCH_MODES='ours-r0 ours-fp8 ours-fp8h' BENCH_D24_MODES='ours-r0 ours-fp8h' BENCH_ROUNDS=3|fp8:140 bench:120 bench-d24:70"
)

row_field() {  # row_field TABLE NAME FIELD: field FIELD of the row of TABLE (STAGES or PLANS) named NAME
    local -n rows=$1
    local row
    for row in "${rows[@]}"; do
        if [ "${row%%|*}" = "$2" ]; then echo "$row" | cut -d'|' -f"$3"; return 0; fi
    done
    return 1
}
stage_field() { row_field STAGES "$@"; }  # fields: 1 name, 2 lane, 3 limit, 4 description
plan_field() { row_field PLANS "$@"; }    # fields: 1 name, 2 budget, 3 environment, 4 stages

# plan_seconds "stage:limit ...": the stages' limits added up, each lane's run counted as its longer lane
plan_seconds() {
    local item name limit lane total=0 bf16=0 fp32=0
    for item in $1; do
        name=${item%%:*} limit=${item#*:}
        lane=$(stage_field "$name" 2) || { echo "no stage $name" >&2; return 1; }
        case $lane in
            bf16) bf16=$((bf16 + limit)) ;;
            fp32) fp32=$((fp32 + limit)) ;;
            *) total=$((total + (bf16 > fp32 ? bf16 : fp32) + limit)); bf16=0 fp32=0 ;;
        esac
    done
    echo $((total + (bf16 > fp32 ? bf16 : fp32)))
}

budget=""
plan=""
selected=()
declare -A limit_of=()
while [ $# -gt 0 ]; do
    case $1 in
        --list)
            for s in "${STAGES[@]}"; do IFS='|' read -r n l t d <<< "$s"; printf "%-15s %-5s %4s s  %s\n" "$n" "$l" "$t" "$d"; done
            for p in "${PLANS[@]}"; do IFS='|' read -r n b e st <<< "$p"; printf "plan %s: budget %s s, stages %s (%s s); %s\n" "$n" "$b" "$st" "$(plan_seconds "$st")" "$e"; done
            exit 0 ;;
        --check-plans)
            bad=0
            for p in "${PLANS[@]}"; do
                IFS='|' read -r n b e st <<< "$p"
                sum=$(plan_seconds "$st") || { bad=1; continue; }
                if [ "$sum" -le "$b" ]; then echo "plan $n: stage limits add up to $sum s of its $b s: fits"
                else echo "plan $n: stage limits add up to $sum s, over its budget of $b s"; bad=1; fi
            done
            exit $bad ;;
        --plan) plan=${2:-}; plan_field "$plan" 1 > /dev/null || { echo "run_on_gpu.sh: no plan '$plan' (see --list)"; exit 2; }
                shift 2 ;;
        --budget) budget=${2:-}; [[ "$budget" =~ ^[0-9]+$ ]] || { echo "run_on_gpu.sh: --budget needs whole seconds, not '$budget'"; exit 2; }
                  shift 2 ;;
        -*) echo "run_on_gpu.sh: unknown option $1"; exit 2 ;;
        *) stage_field "$1" 1 > /dev/null || { echo "run_on_gpu.sh: no stage '$1' (see --list)"; exit 2; }
           selected+=("$1"); shift ;;
    esac
done
if [ -n "$plan" ]; then
    [ ${#selected[@]} -eq 0 ] || { echo "run_on_gpu.sh: --plan names its own stages"; exit 2; }
    budget=${budget:-$(plan_field "$plan" 2)}
    for item in $(plan_field "$plan" 4); do
        selected+=("${item%%:*}")
        # the rehearsal keeps each stage's own limit: emulated stages take longer than real ones
        [ "${PLAN_EMU:-0}" = 1 ] || limit_of[${item%%:*}]=${item#*:}
    done
    # the plan's settings, unless the caller's environment sets them
    eval "plan_env=($(plan_field "$plan" 3))"
    for kv in "${plan_env[@]}"; do
        name=${kv%%=*}
        [ -n "${!name:-}" ] || export "$kv"
    done
fi
if [ ${#selected[@]} -eq 0 ]; then
    for s in "${STAGES[@]}"; do selected+=("${s%%|*}"); done
fi
is_selected() { local n; for n in "${selected[@]}"; do [ "$n" = "$1" ] && return 0; done; return 1; }

out=${OUT:-build/gpu_run}
work=build/gpu_run/work
mkdir -p "$out" "$work"
out=$(cd "$out" && pwd)
rm -f "$out/summary.tsv" "$out/bench.tsv"  # this call's (the logs are appended to)
start_time=$SECONDS
deadline=$(( ${budget:-100000} + start_time ))
emu=${PLAN_EMU:-0}

say() { echo "$@" | tee -a "$out/main.log"; }

# ----------------------------------------------------------------------------
# environment: the binaries, the Python that has torch, the CUDA libraries

export GPT2_ROOT="$root"
GPT2_PYTHON="$(scripts/find_python.sh 2>/dev/null || command -v python3)"
export GPT2_PYTHON PYTHON="$GPT2_PYTHON"
if [ "$emu" = 1 ]; then
    # the rehearsal: the emulated builds (make train_gpt2cu_emu test_gpt2cu_emu ...), a few tests per
    # stage, tiny sizes; what it proves is that every stage, path and file of the plan works
    TRAIN_BF16=./train_gpt2cu_emu TEST_BF16=./test_gpt2cu_emu TEST_FP32=./test_gpt2fp32cu_emu
    BINARIES=(train_gpt2cu_emu train_gpt2fp32cu_emu test_gpt2cu_emu test_gpt2fp32cu_emu)
    F_KERNELS='Kernels.GeluForwardBackward:Kernels.EncoderForwardBackward'
    F_MODEL='ModelOracle.TinyForwardBackward'
    F_TRAINER='TrainDeterminism.MatmulAutotune*'  # the tiny model's (SameSeedSameRun's d6 runs are the suites')
    F_MEMORY='TrainMemory.PlanPredictsTheAllocationsWithoutAllocating'
else
    TRAIN_BF16=./train_gpt2cu TEST_BF16=./test_gpt2cu TEST_FP32=./test_gpt2fp32cu
    BINARIES=(train_gpt2 train_gpt2cu train_gpt2fp32cu test_gpt2cu test_gpt2fp32cu dev/cuda/bin/* build/gpu/llmc/train_gpt2cu)
    [ -x build/gpu/base/train_gpt2cu ] && BINARIES+=(build/gpu/base/train_gpt2cu)
    F_KERNELS='Kernels.*'
    F_MODEL='ModelOracle.*:TrainOracle.*'
    # TrainMemory compares cudaMemGetInfo's device-wide count with the plan: the other lane's processes
    # would move it, so it runs alone (stage memory)
    F_TRAINER='Train*:MultiGpu*-TrainOracle.*:TrainMemory.*'
    F_MEMORY='TrainMemory.*'
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}  # the CPU sides of the tests, two lanes and the oracle at once

# cuBLAS, cuBLASLt and NCCL are linked dynamically (too large to carry; see prepare_gpu_run.sh), with
# an rpath to /usr/local/cuda/lib64. A library not found there or by the loader's own search is looked
# for in the CUDA installs and the Python packages (torch's nvidia-* wheels hold the same libraries).
resolve_libraries() {
    local lib dir site b search_roots=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64)
    site=$("$GPT2_PYTHON" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) && search_roots+=($site)
    for lib in $(for b in "${BINARIES[@]}"; do [ -x "$b" ] && ldd "$b" 2>/dev/null | awk '/not found/ { print $1 }'; done | sort -u); do
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
# the stages (each runs in a shell of its own under `timeout`)

gtest_stage() {  # gtest_stage BINARY FILTER
    [ -x "$1" ] || { echo "$1 missing: run dev/gpu/prepare_gpu_run.sh and carry it"; return 1; }
    echo "\$ $1 --gtest_filter='$2'"
    "$1" --gtest_filter="$2"
}

run_stage_body() {
    case "$1" in
        smi)
            if [ "$emu" = 1 ]; then echo "emulated: no nvidia-smi"; else
                nvidia-smi && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || return 1
            fi
            local b bad=0
            for b in "${BINARIES[@]}"; do
                [ -x "$b" ] || { echo "$b: missing"; bad=1; continue; }
                if ldd "$b" | grep -q "not found"; then echo "$b:"; ldd "$b" | grep "not found"; bad=1; fi
            done
            echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
            return $bad ;;
        wgmma)
            if [ "$emu" = 1 ]; then echo "emulated: CI runs it under the emulator (make emu-devcuda-check)"; else
                dev/cuda/bin/wgmma_check | tee "$out/wgmma.md"
                [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
            fi ;;
        kernels-bf16) gtest_stage "$TEST_BF16" "$F_KERNELS" ;;
        kernels-fp32) gtest_stage "$TEST_FP32" "$F_KERNELS" ;;
        model-bf16) gtest_stage "$TEST_BF16" "$F_MODEL" ;;
        model-fp32) gtest_stage "$TEST_FP32" "$F_MODEL" ;;
        trainer-bf16) gtest_stage "$TEST_BF16" "$F_TRAINER" ;;
        trainer-fp32) gtest_stage "$TEST_FP32" "$F_TRAINER" ;;
        memory) gtest_stage "$TEST_BF16" "$F_MEMORY" && gtest_stage "$TEST_FP32" "$F_MEMORY" ;;
        bench|bench-recompute|bench-d24)
            local modes=${BENCH_MODES:-ours-r0 llmc-r0 torch-compile torch-compile-loss} baseline=ours-r0 model=d12 B=64 steps=20
            # a base trainer carried (prepare_gpu_run.sh with BASE_REF): timed beside ours in the same rounds
            [ -x build/gpu/base/train_gpt2cu ] && [[ " $modes " != *" base-r0 "* ]] && modes="ours-r0 base-r0 ${modes/ours-r0/}"
            [ "$1" = bench-recompute ] && modes="ours-r1 llmc-r1" baseline=ours-r1 steps=10
            [ "$1" = bench-d24 ] && modes="${BENCH_D24_MODES:-ours-r0 torch-compile}" model=d24 B=${BENCH_D24_B:-32}
            if [ "$emu" = 1 ]; then
                # the rehearsal: the emulated trainer on the tiny oracle model, llm.c's stand-in
                # (dev/gpu/llmc_stub.sh), PyTorch on the CPU without autocast; two rounds of two steps
                [ "$1" = bench-d24 ] && { echo "bench-d24: SKIPPED (emulated rehearsal: the bench stage rehearses the script)"; return 0; }
                TRAINER=$TRAIN_BF16 LLMC=dev/gpu/llmc_stub.sh BENCH_OURS_MODEL=build/oracle/tiny/model.bin \
                BENCH_TORCH_MODEL="--layers 2 --channels 64 --heads 4" BENCH_MODEL=tiny BENCH_MODES="$modes" BENCH_BASELINE=$baseline \
                BENCH_V=300 BENCH_B=2 BENCH_T=16 BENCH_DEVICE=cpu BENCH_STEPS=2 BENCH_ROUNDS=2 BENCH_TORCH_MODE=${BENCH_TORCH_MODE:-default} \
                BENCH_TSV="$out/bench.tsv" "$PYTHON" dev/bench_gpu.py
            else
                BENCH_MODEL=$model BENCH_B=$B BENCH_STEPS=$steps BENCH_MODES="$modes" BENCH_BASELINE=$baseline \
                BENCH_TSV="$out/bench.tsv" OMP_NUM_THREADS=16 "$PYTHON" dev/bench_gpu.py
            fi ;;
        attention)
            # our programs and FA2 in turn, 3 rounds; the table (dev/gpu/attention_rounds.py) after each
            local r rounds=${ATTENTION_ROUNDS:-3} dir="$work/attention"
            rm -rf "$dir"
            for r in $(seq 1 "$rounds"); do
                mkdir -p "$dir/r$r"
                if [ "$emu" = 1 ]; then  # the rehearsal: one emulated dev/cuda program, FA2's script on the CPU
                    build/emu/devcuda/gelu_forward > "$dir/r$r/ours.log" 2>&1
                    "$PYTHON" dev/cuda/attention_sdpa.py --device cpu --B 1 --T 64 --NH 2 --HS 16 > "$dir/r$r/fa2.log" 2>&1
                else
                    dev/cuda/bin/attention_forward > "$dir/r$r/forward.log" 2>&1 || { tail -n 5 "$dir/r$r/forward.log"; return 1; }
                    dev/cuda/bin/attention_backward > "$dir/r$r/backward.log" 2>&1 || { tail -n 5 "$dir/r$r/backward.log"; return 1; }
                    "$PYTHON" dev/cuda/attention_sdpa.py > "$dir/r$r/fa2.log" 2>&1 || { tail -n 5 "$dir/r$r/fa2.log"; return 1; }
                fi
                grep -h "FAIL" "$dir/r$r"/*.log | head -n 5
                echo "round $r of $rounds:"
                "$PYTHON" dev/gpu/attention_rounds.py "$dir" | tee "$out/attention.md"
            done
            ! grep -q "FAIL" "$dir"/r*/*.log ;;
        cuda-dev)
            if [ "$emu" = 1 ]; then
                # one program, built by rehearse.sh and carried (dev/gpu/carry.sh emu), in its check mode
                build/emu/devcuda/gelu_forward | tee "$out/cuda_dev.md"
            else
                # CUDA_DEV_PROGRAMS: a few of them (default: all); "changed": those whose sources changed
                # since the last GPU run (build/gpu/changed_programs.txt, made by prepare_gpu_run.sh)
                local programs=${CUDA_DEV_PROGRAMS:-}
                if [ "$programs" = changed ]; then
                    programs=$(cat build/gpu/changed_programs.txt 2> /dev/null)
                    [ -n "$programs" ] || { echo "cuda-dev: SKIPPED (no dev/cuda program's sources changed since the last GPU run)"; return 0; }
                fi
                # built on the CPU machine; a copy may have given them older times than their sources,
                # and run_all.sh's `make` would rebuild them here
                touch dev/cuda/bin/*
                # shellcheck disable=SC2086
                LOG_DIR="$root/$work/cuda_logs" dev/cuda/run_all.sh $programs | tee "$out/cuda_dev.md"
                # for a few programs, every version's time too (the ratios of one run), not only the best; matmul_fp8's
                # lines (bf16 against FP8 at each GEMM, FP8|...)
                for program in $programs; do
                    printf '\n%s, every version:\n\n```\n' "$program" >> "$out/cuda_dev.md"
                    grep -E '^(op:|version|v[0-9]+ |== |FP8|fp8 |bf16 |one d12|ceiling)' "$work/cuda_logs/$program.log" >> "$out/cuda_dev.md"
                    printf '```\n' >> "$out/cuda_dev.md"
                done
            fi ;;
        ncu)
            if [ "$emu" = 1 ]; then echo "ncu_top.sh: SKIPPED (emulated rehearsal: no ncu)"
            else NCU_OUT="$out/ncu.md" TRAINER=$TRAIN_BF16 dev/gpu/ncu_top.sh 64 -r 0; fi ;;
        fp8)
            # BF16 then FP8 on the same data, seed and schedule (speed: BENCH_MODES' ours-fp8 and ours-fp8h in
            # the bench stages); FP8_RUNS: which FP8 runs (default -fp8 2, the blocks and the LM head)
            if [ "$emu" = 1 ]; then
                RUNS="bf16 ${FP8_RUNS:-fp8-2}" TRAINER=$TRAIN_BF16 MODEL=small STEPS=4 DATA=build/gpu/data NO_MAKE=1 \
                    OUT="$out/fp8_loss.png" dev/compare_fp8.sh | tee "$out/fp8.md"
            else
                RUNS="bf16 ${FP8_RUNS:-fp8-2}" TRAINER=$TRAIN_BF16 MODEL=d12 STEPS=${FP8_STEPS:-300} DATA=build/gpu/data \
                    NO_MAKE=1 OUT="$out/fp8_loss.png" dev/compare_fp8.sh | tee "$out/fp8.md"
            fi ;;
        sanitize)
            if [ "$emu" = 1 ]; then echo "sanitize.sh: SKIPPED (emulated rehearsal: the emulator's own checkers run in make test)"
            else SANITIZE_OUT="$work/sanitize" dev/gpu/sanitize.sh ./train_gpt2cu ./test_gpt2cu; fi ;;
    esac
}

# result of a finished stage from its output and exit status: "passed|failed|skipped<TAB>detail"
stage_result() {
    local out=$1 rc=$2 counts
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

# run_stage NAME LOG DEADLINE: runs one stage within min(its limit, DEADLINE - now), output appended
# to LOG as it comes, one line appended to summary.tsv
run_stage() {
    local name=$1 log=$2 stage_deadline=$3 lane limit left
    lane=$(stage_field "$name" 2)
    limit=${limit_of[$name]:-$(stage_field "$name" 3)}
    [ -n "${STAGE_TIMEOUT:-}" ] && limit=$STAGE_TIMEOUT
    left=$((stage_deadline - SECONDS))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 15 ]; then
        echo "==== stage $name: skipped (no time left in the budget)" >> "$log"
        printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$lane" skipped 0 "no time left in the budget" >> "$out/summary.tsv"
        return 0
    fi
    echo "" >> "$log"
    echo "==== stage $name (limit $limit s, $(date -u +%T)): $(stage_field "$name" 4)" >> "$log"
    local start=$SECONDS tmp="$work/stage-$name.log"
    # the lanes' test binaries write under build/test_tmp/<lane>/, not into each other's directories
    TEST_SCRATCH_TAG=gpu-$lane timeout --kill-after=10 "$limit" bash -c 'BINARIES=($BINARIES_LIST); run_stage_body "$1"' _ "$name" < /dev/null 2>&1 | tee "$tmp" >> "$log"
    local rc=${PIPESTATUS[0]} seconds=$((SECONDS - start)) result
    result=$(stage_result "$tmp" "$rc")
    echo "==== stage $name: ${result%%$'\t'*} (${result#*$'\t'}), $seconds s" >> "$log"
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$lane" "${result%%$'\t'*}" "$seconds" "${result#*$'\t'}" >> "$out/summary.tsv"
}

# ----------------------------------------------------------------------------

say "==== run_on_gpu.sh $(date -u '+%F %T UTC') on $(hostname): stages ${selected[*]}; budget ${budget:-none} s$([ "$emu" = 1 ] && echo '; EMULATED rehearsal')"
# the binaries' commit, which prepare_gpu_run.sh wrote (a device's copy of the tree may carry an older .git)
if [ -f build/gpu/commit.txt ] && [ "$emu" != 1 ]; then
    commit="binaries $(cat build/gpu/commit.txt)"
elif git rev-parse --short HEAD > /dev/null 2>&1; then
    commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD 2> /dev/null || echo ' (with local changes)')"
else
    commit=unknown
fi
say "python: $GPT2_PYTHON; commit: $commit"
command -v nvidia-smi > /dev/null && say "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2> /dev/null | head -n 1)"
# the CPU trainer prepare_gpu_run.sh built for this machine (no MPI, portable -march) goes where the
# tests look for it (on a GPU machine only: on the CPU machine ./train_gpt2 is the MPI build)
if [ "$emu" != 1 ] && [ -x build/gpu/train_gpt2 ] && nvidia-smi -L > /dev/null 2>&1; then
    cp build/gpu/train_gpt2 ./train_gpt2
    say "train_gpt2: build/gpu/train_gpt2 copied into place"
fi
resolve_libraries
export -f run_stage_body gtest_stage
export root work out emu TRAIN_BF16 TEST_BF16 TEST_FP32 F_KERNELS F_MODEL F_TRAINER F_MEMORY
export BINARIES_LIST="${BINARIES[*]}"  # an array does not cross `bash -c`: rebuilt there

# the d12 oracle files (1.4 GB, too large to carry) are made now, with the CPU's cores, while the
# GPU runs the kernel tests; the model stages wait for them (the tests take the oracle's lock)
if [ "$emu" != 1 ] && { is_selected model-bf16 || is_selected model-fp32; }; then
    say "oracle: making build/oracle/d12 in the background (its log goes to the end of main.log)"
    ( OMP_NUM_THREADS=12 timeout 400 "$TEST_BF16" --prepare-oracle > "$work/oracle.log" 2>&1 ) &
fi

any_failed=0
i=0
while [ $i -lt ${#selected[@]} ]; do
    name=${selected[$i]}
    lane=$(stage_field "$name" 2)
    if [ "$lane" = main ]; then
        run_stage "$name" "$out/main.log" "$deadline"
        say "$(tail -n 1 "$out/summary.tsv" | tr '\t' ' ')"
        i=$((i + 1))
        continue
    fi
    # a run of lane stages: the bf16 and fp32 lanes side by side, until the longer lane's limits are spent
    bf16=() fp32=()
    lane_s=("" 0 0)
    while [ $i -lt ${#selected[@]} ] && [ "$(stage_field "${selected[$i]}" 2)" != main ]; do
        n=${selected[$i]}
        t=${limit_of[$n]:-$(stage_field "$n" 3)}
        if [ "$(stage_field "$n" 2)" = bf16 ]; then bf16+=("$n"); lane_s[1]=$((lane_s[1] + t))
        else fp32+=("$n"); lane_s[2]=$((lane_s[2] + t)); fi
        i=$((i + 1))
    done
    group_deadline=$((SECONDS + ${PLAN_PARALLEL_S:-$((lane_s[1] > lane_s[2] ? lane_s[1] : lane_s[2]))}))
    [ $group_deadline -gt $deadline ] && group_deadline=$deadline
    say "lanes until +$((group_deadline - start_time)) s: bf16 (${bf16[*]:-}) and fp32 (${fp32[*]:-})"
    ( for s in "${bf16[@]}"; do run_stage "$s" "$out/bf16.log" "$group_deadline"; done ) &
    lane_a=$!
    ( for s in "${fp32[@]}"; do run_stage "$s" "$out/fp32.log" "$group_deadline"; done ) &
    lane_b=$!
    wait $lane_a $lane_b
    say "lanes done at +$((SECONDS - start_time)) s"
done
wait  # the background oracle, if it outlived every stage that needed it
[ -f "$work/oracle.log" ] && { say "==== the d12 oracle's log"; tail -n 20 "$work/oracle.log" | tee -a "$out/main.log"; }

{
    echo ""
    echo "| stage | lane | result | seconds | detail |"
    echo "| --- | --- | --- | ---: | --- |"
    awk -F'\t' '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }' "$out/summary.tsv"
    echo ""
    echo "total: $((SECONDS - start_time)) s; files: $out"
} | tee -a "$out/main.log"
grep -q $'\tfailed\t' "$out/summary.tsv" && any_failed=1
exit $any_failed
