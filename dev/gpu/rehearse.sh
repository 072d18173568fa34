#!/usr/bin/env bash
# The GPU session plan rehearsed on the CPU machine: dev/gpu/run_on_gpu.sh's plans (call1, call2), each
# on the emulated binaries (dev/emu) at tiny sizes, in a copy of exactly what a device call would carry
# (the working tree as git sees it, plus dev/gpu/carry.sh emu), writing the same files under $OUT/<plan>,
# then dev/gpu/gpu_results.py over them; llm.c's binary is stood in for by dev/gpu/llmc_stub.sh.
# A plan whose stage limits exceed its budget, a broken stage, a path missing from the carry list or a
# file the device tool would not return shows here, before a GPU does. CI runs it.
#
#   OUT=DIR dev/gpu/rehearse.sh        (default OUT: build/rehearsal/out)
#
# Needs the emulated builds (made here: make train_gpt2cu_emu ...) and the tiny oracle files that
# make test makes (build/oracle/tiny, tiny_cosine). Ends with "rehearsal: plans ..., N stages, M passed";
# exits 1 if a stage failed or the files under $OUT break the device tool's rules.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
out=${OUT:-build/rehearsal/out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
python=$(scripts/find_python.sh)
tree=build/rehearsal/tree

make -s -j"${JOBS:-2}" train_gpt2cu_emu train_gpt2fp32cu_emu test_gpt2cu_emu test_gpt2fp32cu_emu build/emu/devcuda/gelu_forward ||
    { echo "rehearse.sh: the emulated builds failed"; exit 1; }
for d in build/oracle/tiny build/oracle/tiny_cosine; do
    [ -f "$d/stamp" ] || { echo "rehearse.sh: $d missing (make test, or ./test_gpt2cu_emu --prepare-oracle, makes it)"; exit 1; }
done

# the stage fp8's tinyshakespeare shards, where prepare_gpu_run.sh puts them for a GPU call
[ -f dev/data/tinyshakespeare/tinyshakespeare_train_000000.bin ] || dev/data/tinyshakespeare.sh > /dev/null ||
    { echo "rehearse.sh: dev/data/tinyshakespeare.sh failed"; exit 1; }
mkdir -p build/gpu/data && cp dev/data/tinyshakespeare/tinyshakespeare_{train,val}_000000.bin build/gpu/data/
# what a device call sends: tracked and untracked-not-ignored files, plus the carried paths
rm -rf "$tree" && mkdir -p "$tree"
mapfile -t carry < <(dev/gpu/carry.sh emu)
{ git ls-files -z --cached --others --exclude-standard; printf '%s\0' "${carry[@]}"; } |
    xargs -0 -I{} sh -c '[ -e "{}" ] && printf "%s\0" "{}"' | tar --null -T - -cf - | tar -C "$tree" -xf - ||
    { echo "rehearse.sh: copying the tree failed"; exit 1; }
for c in "${carry[@]}"; do [ -e "$tree/$c" ] || { echo "rehearse.sh: carried path $c is missing"; exit 1; }; done

bad=0
# the plans fit their budgets on paper (each stage's limit counted in full)
dev/gpu/run_on_gpu.sh --check-plans || { echo "rehearse.sh: a plan's stage limits exceed its budget"; bad=1; }
# racecheck's kernel tests launch no cuBLAS(Lt) kernel (one that did stopped the sanitizer on an H100)
dev/gpu/check_racecheck_tests.sh ./test_gpt2cu_emu || bad=1

# each plan as the device call it will be, into a folder of its own (one $OUT per call)
rm -rf "${out:?}"/*
plans=$(dev/gpu/run_on_gpu.sh --list | awk '/^plan / { sub(":", "", $2); print $2 }')
for plan in $plans; do
    mkdir -p "$out/$plan"
    ( cd "$tree" && GPT2_PYTHON="$python" PLAN_EMU=1 OUT="$out/$plan" dev/gpu/run_on_gpu.sh --plan "$plan" --budget "${REHEARSAL_BUDGET:-900}" )
    # the device tool returns at most 8 files, 2 folders down, named in letters, digits, '.', '_', '-'
    files=$(cd "$out/$plan" && find . -type f | sed 's|^\./||')
    [ "$(echo "$files" | wc -l)" -le 8 ] || { echo "rehearse.sh: plan $plan leaves more than 8 files under \$OUT:"; echo "$files"; bad=1; }
    while read -r f; do
        [[ "$f" =~ ^([A-Za-z0-9._-]+/){0,2}[A-Za-z0-9._-]+$ ]] || { echo "rehearse.sh: $f would not come back"; bad=1; }
    done <<< "$files"
done
# shellcheck disable=SC2046
"$python" dev/gpu/gpu_results.py $(for plan in $plans; do echo "$out/$plan"; done) > build/rehearsal/gpu_results.md ||
    { echo "rehearse.sh: gpu_results.py failed"; exit 1; }
for section in '^## Stages' '^## Throughput' '^## Attention' '^ratio '; do
    grep -q "$section" build/rehearsal/gpu_results.md || { echo "rehearse.sh: no '$section' in gpu_results.md"; bad=1; }
done

summary=$(cat "$out"/*/summary.tsv)
n=$(echo "$summary" | wc -l)
passed=$(echo "$summary" | awk -F'\t' '$3 == "passed"' | wc -l)
failed=$(echo "$summary" | awk -F'\t' '$3 == "failed"' | wc -l)
echo "rehearsal: plans $(echo $plans), $n stages, $passed passed ($failed failed, $((n - passed - failed)) skipped; files: $out)"
[ "$failed" -eq 0 ] && [ "$bad" -eq 0 ]
