#!/usr/bin/env bash
# A stand-in for llm.c's train_gpt2cu in the rehearsal of the GPU plan (dev/gpu/rehearse.sh): CI has
# no llm.c binary, and what the rehearsal checks is dev/bench_gpu.py's side of it (the command line it
# builds, the step lines it parses, the rows and tables it writes), not llm.c. Takes the flags
# bench_gpu.py passes, refuses others, checks the data file exists, and prints -x step lines in the
# format of llm.c's train_gpt2.cu with made-up times (marked STUB). Never a measurement.
set -euo pipefail
steps=0 B=0 T=0 files=()
while [ $# -gt 0 ]; do
    case $1 in
        -x) steps=$2 ;;
        -b) B=$2 ;;
        -t) T=$2 ;;
        -i|-j) files+=("$2") ;;
        -e|-r|-v|-m|-s) ;;
        *) echo "llmc_stub.sh: flag $1 is not one dev/bench_gpu.py passes" >&2; exit 2 ;;
    esac
    shift 2
done
for f in "${files[@]}"; do [ -f "$f" ] || { echo "llmc_stub.sh: no data file $f" >&2; exit 1; }; done
[ "$steps" -gt 0 ] && [ "$B" -gt 0 ] && [ "$T" -gt 0 ] || { echo "llmc_stub.sh: -x, -b and -t are needed" >&2; exit 2; }
echo "STUB of llm.c's train_gpt2cu (dev/gpu/llmc_stub.sh): the times below are made up"
for ((s = 1; s <= steps; s++)); do
    ms="1$((s % 10)).00"
    printf 'step %4d/%d | loss 7.000000 (+0.00z)| norm 1.0000 (+0.00z)| lr 3.00e-04 | %s ms | 1.0%% bf16 MFU | %d tok/s\n' \
        "$s" "$steps" "$ms" "$((B * T * 100))"
done
