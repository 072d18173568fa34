#!/usr/bin/env bash
# Copies the CUDA sources the emulator builds into build/emu/src/ (same relative paths) with the two
# mechanical rewrites g++ needs; the copies are never edited by hand.
#   kernel<<<grid, block, shared, stream>>>(args)  ->  kernel *emu::LaunchConfig{grid, block, shared, stream}(args)
#   extern __shared__ <attributes> T name[];       ->  T* name = (T*)emu::dynamic_shared_memory();
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
        s/<<</ *emu::LaunchConfig{/g;
        s/>>>/}/g;
        s{extern\s+__shared__\s+((?:__align__\s*\(\s*\d+\s*\)\s*)*)([A-Za-z_][\w:\s<>,]*?)\s+(\w+)\s*\[\s*\]\s*;}{$2* $3 = reinterpret_cast<$2*>(emu::dynamic_shared_memory());}g;
    ' "$src" > "$tmp"
    if [ -f "$dst" ] && cmp -s "$tmp" "$dst"; then
        rm -f "$tmp"
    else
        mv -f "$tmp" "$dst"
    fi
done
