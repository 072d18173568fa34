#!/usr/bin/env bash
# Copies the CUDA sources the emulator builds into build/emu/src/ (same relative paths) with the two
# mechanical rewrites g++ needs; the copies are never edited by hand.
#   kernel<<<grid, block, shared, stream>>>(args)  ->  kernel *emu::LaunchConfig{grid, block, shared, stream}(args)
#   (each <<< with the first >>> after it: a >>> that closes nested templates, std::vector<std::pair<a, b>>>, stays)
#   with EMU_LAUNCH_BY_CALL=1 (programs written elsewhere, whose kernel templates are deduced as calls):
#   kernel<<<g, b, s, st>>>(args)  ->  emu::LaunchConfig{g, b, s, st}.by_call([](auto... emu_a) { kernel(emu_a...); }, args)
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
    EMU_LAUNCH_BY_CALL="${EMU_LAUNCH_BY_CALL:-0}" perl -0pe '
        if ($ENV{EMU_LAUNCH_BY_CALL} eq "1") {  # kernel<<<cfg>>>(args): the kernel named by a call (emu/kernel.h)
            s/([A-Za-z_][\w:]*(?:<[^;(){}<>]*(?:<[^;(){}<>]*>[^;(){}<>]*)*>)?)\s*<<<(.*?)>>>\s*\(\s*\)/emu::LaunchConfig{$2}.by_call([](auto... emu_a) { $1(emu_a...); })/gs;
            s/([A-Za-z_][\w:]*(?:<[^;(){}<>]*(?:<[^;(){}<>]*>[^;(){}<>]*)*>)?)\s*<<<(.*?)>>>\s*\(/emu::LaunchConfig{$2}.by_call([](auto... emu_a) { $1(emu_a...); }, /gs;
        }
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
