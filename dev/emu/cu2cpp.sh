#!/usr/bin/env bash
# Copies the CUDA sources the emulator builds into build/emu/src/ (same relative paths) with the two
# mechanical rewrites g++ needs; the copies are never edited by hand.
#   kernel<<<grid, block, shared, stream>>>(args)  ->  kernel *emu::LaunchConfig{grid, block, shared, stream}(args)
#   (each <<< with the first >>> after it: a >>> that closes nested templates, std::vector<std::pair<a, b>>>, stays)
#   extern __shared__ <attributes> T name[];       ->  T* name = (T*)emu::dynamic_shared_memory();
#   __shared__ <attributes> T name[N]...;          ->  __shared__ <attributes> T name_emu_storage[N]...; EMU_SHARED_VARIABLE(name);
# EMU_SHARED_VARIABLE (include/emu/kernel.h) makes `name` a reference to the block's copy and fills it
# with 0xFF bytes the first time a thread of each block reaches the declaration, so a slot no thread of
# the block wrote reads as garbage (NaN), never as zero or as what the previous block left there.
# A copy is rewritten only when its content changes, so make rebuilds only what changed.
# Usage: dev/emu/cu2cpp.sh OUT_DIR FILE...   (FILE relative to the repository root)
set -euo pipefail

out="$1"
shift
for src in "$@"; do
    dst="$out/$src"
    mkdir -p "$(dirname "$dst")"
    tmp="$dst.tmp.$$"
    perl -0pe '
        s/<<<(.*?)>>>/ *emu::LaunchConfig{$1}/gs;
        s{extern\s+__shared__\s+((?:__align__\s*\(\s*\d+\s*\)\s*)*)([A-Za-z_][\w:\s<>,*]*?)\s*(\w+)\s*\[\s*\]\s*;}{$2* $3 = reinterpret_cast<$2*>(emu::dynamic_shared_memory());}g;
        s{\b__shared__(\s+(?:__align__\s*\(\s*\d+\s*\)\s*)*[A-Za-z_][\w:\s<>,]*?\s+)(\w+)(\s*(?:\[[^\];]*\]\s*)*);}{__shared__$1$2_emu_storage$3; EMU_SHARED_VARIABLE($2);}g;
    ' "$src" > "$tmp"
    if [ -f "$dst" ] && cmp -s "$tmp" "$dst"; then
        rm -f "$tmp"
    else
        mv -f "$tmp" "$dst"
    fi
done
