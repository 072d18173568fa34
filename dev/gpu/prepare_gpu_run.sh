#!/usr/bin/env bash
# Run on the CPU machine (nvcc, googletest and PyTorch here, no GPU): builds everything
# dev/gpu/run_on_gpu.sh runs and makes the oracle files, so the GPU machine (no googletest, no MPI,
# no apt, no network) only runs. Prints the paths to carry there and their sizes.
#
#   dev/gpu/prepare_gpu_run.sh          build (2 jobs; JOBS=<n> for more), make oracles, check, list
#
# What it builds, and how:
#   train_gpt2cu, train_gpt2fp32cu, test_gpt2cu, test_gpt2fp32cu, dev/cuda/bin/* with NO_MPI=1 (the GPU
#   machine has no MPI), and the CPU trainer (for the checkpoint-crossing test) as build/gpu/train_gpt2:
#   the Makefile's own command for train_gpt2 with NO_MPI=1 and -march=x86-64-v2 rather than native (it
#   runs on another machine's CPU), written beside the checkout's ./train_gpt2, which the CPU suite runs
#   under mpirun and which stays as `make` builds it. run_on_gpu.sh puts it in place on the GPU machine.
#   Linking: googletest is static (Debian ships only libgtest.a); the CUDA runtime is static (nvcc's
#   default, -cudart static); cuBLAS, cuBLASLt and NCCL are dynamic, because no static cuBLAS is
#   installed here and the shared ones (54 + 542 + 218 MB) are far over the 64 MiB the GPU tool
#   carries. They are part of the CUDA toolkit and of PyTorch's nvidia-* wheels on the GPU machine:
#   the binaries get an rpath to /usr/local/cuda/lib64, and run_on_gpu.sh looks further (the other CUDA
#   folders, Python's site-packages) for any the loader does not find. This script checks with ldd
#   that nothing else is dynamic: only libc, libm, libstdc++, libgcc_s, libgomp, the loader, and
#   libcublas, libcublasLt, libnccl, and libpcre2-8 (the prompt tokenizer's regular expressions; part
#   of every Ubuntu/Debian base system, grep needs it).
#   Binaries already there that were built otherwise (with MPI, without the rpath) are rebuilt.
#
# Oracle files (build/oracle/, test/oracle/gpt2_oracle.py run by the Python that scripts/find_python.sh
# names): `test_gpt2cu --prepare-oracle` and `test_gpt2fp32cu --prepare-oracle` (the same files: the
# second finds them made). tiny and tiny_cosine are carried; d12 (a GPT-2 small model file and its
# gradients, 1.4 GB) is too large, and the GPU machine's own PyTorch makes it when the test needs it.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
jobs=${JOBS:-2}
RPATH_FLAG="-Xlinker -rpath=/usr/local/cuda/lib64"
MAKE_FLAGS=(NO_MPI=1 CPU_ARCH=-march=x86-64-v2 "NVCC_LDLIBS=-lcublasLt -lcublas -lnccl -lpcre2-8 $RPATH_FLAG")
CUDA_BINARIES=(train_gpt2cu train_gpt2fp32cu test_gpt2cu test_gpt2fp32cu)
ALLOWED_LIBS='^(linux-vdso|libc|libm|libstdc\+\+|libgcc_s|libgomp|libpthread|libdl|librt|ld-linux-x86-64|libcublas|libcublasLt|libnccl|libpcre2-8)\.so'

command -v "${NVCC:-/usr/local/cuda/bin/nvcc}" > /dev/null || { echo "prepare: nvcc not found (CUDA_HOME/NVCC)"; exit 1; }
[ -f /usr/lib/x86_64-linux-gnu/libgtest.a ] || [ -f /usr/lib/libgtest.a ] || [ -f /usr/local/lib/libgtest.a ] ||
    { echo "prepare: no static googletest (libgtest.a); scripts/install_deps.sh installs it"; exit 1; }
python=$(scripts/find_python.sh)
"$python" -c 'import torch' 2> /dev/null || { echo "prepare: $python cannot import torch (needed for the oracle)"; exit 1; }

# A binary built another way is removed so make rebuilds it: linked against MPI, or without the rpath.
built_otherwise() {
    [ -f "$1" ] || return 1
    ldd "$1" 2> /dev/null | grep -q "libmpi" && return 0
    [ "$2" = cuda ] && ! readelf -d "$1" 2> /dev/null | grep -qE "R(UN)?PATH.*/usr/local/cuda/lib64" && return 0
    return 1
}
for b in "${CUDA_BINARIES[@]}" dev/cuda/bin/*; do
    if built_otherwise "$b" cuda; then echo "prepare: $b was built another way; rebuilding"; rm -f "$b"; fi
done

echo "== build (make -j$jobs ${MAKE_FLAGS[*]})"
start=$SECONDS
# the CPU trainer: the Makefile's command (make -n), with the output renamed
mkdir -p build/gpu
cpu_cmd=$(make -s -n -B "${MAKE_FLAGS[@]}" train_gpt2)
[[ "$cpu_cmd" == *" -o train_gpt2" ]] || { echo "prepare: unexpected command for train_gpt2: $cpu_cmd"; exit 1; }
cpu_cmd="${cpu_cmd% -o train_gpt2} -o build/gpu/train_gpt2"
echo "$cpu_cmd"
eval "$cpu_cmd"
make -j"$jobs" "${MAKE_FLAGS[@]}" train_gpt2cu test_gpt2cu train_gpt2fp32cu test_gpt2fp32cu
make -C dev/cuda -j"$jobs" "LDLIBS=-lcublasLt -lcublas -lgomp $RPATH_FLAG"
echo "build: $((SECONDS - start)) s"
# the commit the binaries were built from (the device gets the files without .git): run_on_gpu.sh prints it
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with local changes') built $(date -u '+%F %T UTC')" > build/gpu/commit.txt

echo "== shared libraries (allowed: the C/C++ runtime, libgomp, cuBLAS, cuBLASLt, NCCL)"
bad=0
for b in build/gpu/train_gpt2 "${CUDA_BINARIES[@]}" dev/cuda/bin/*; do
    others=$(ldd "$b" | awk '{print $1}' | sed 's|.*/||' | grep -vE "$ALLOWED_LIBS" || true)
    if [ -n "$others" ]; then echo "prepare: $b links dynamically against: $others"; bad=1; fi
done
[ $bad -eq 0 ] || exit 1
ldd ./test_gpt2cu | sed 's/^/  /'
# the GPU machine's C and C++ runtimes must be at least this new (Ubuntu 24.04: GLIBC 2.39, GLIBCXX 3.4.33)
for v in GLIBC GLIBCXX; do
    echo "  newest $v symbol version needed: $(objdump -T ./test_gpt2cu build/gpu/train_gpt2 | grep -oE "${v}_[0-9.]+" | sort -V | tail -n 1)"
done

echo "== oracle files ($python)"
GPT2_ROOT="$root" GPT2_PYTHON="$python" ./test_gpt2cu --prepare-oracle
GPT2_ROOT="$root" GPT2_PYTHON="$python" ./test_gpt2fp32cu --prepare-oracle

# BASE_REF=<commit>: our trainer as built there too (build/gpu/base/train_gpt2cu), for a change that must
# keep speed: the plan's bench then times it beside ours in the same rounds (mode base-r0)
if [ -n "${BASE_REF:-}" ]; then
    base_tree=$(mktemp -d /tmp/gpu_base.XXXXXX)
    git worktree add --detach "$base_tree" "$BASE_REF" > /dev/null
    echo "== the base trainer at $BASE_REF (make ${MAKE_FLAGS[*]} train_gpt2cu in $base_tree)"
    make -C "$base_tree" -j"$jobs" "${MAKE_FLAGS[@]}" train_gpt2cu
    mkdir -p build/gpu/base
    cp "$base_tree/train_gpt2cu" build/gpu/base/train_gpt2cu
    echo "base: $(git rev-parse --short "$BASE_REF") built $(date -u '+%F %T UTC')" > build/gpu/base/commit.txt
    git worktree remove --force "$base_tree"
else
    rm -rf build/gpu/base  # no stale base from an earlier session's preparation
fi

# llm.c's trainer, the benchmark's peer (dev/peers/build_llmc.sh: from llm.c's source, never committed here)
llmc_src=${LLMC_SRC:-build/peers/llm.c} frontend_src=${CUDNN_FRONTEND_SRC:-build/peers/cudnn-frontend}
if [ -x build/gpu/llmc/train_gpt2cu ]; then
    echo "== llm.c peer: build/gpu/llmc/train_gpt2cu ($(head -n 1 build/gpu/llmc/source.txt))"
elif [ -f "$llmc_src/train_gpt2.cu" ] && [ -d "$frontend_src/include" ]; then
    echo "== llm.c peer (dev/peers/build_llmc.sh $llmc_src $frontend_src)"
    dev/peers/build_llmc.sh "$llmc_src" "$frontend_src"
else
    echo "== llm.c peer: none (no $llmc_src or $frontend_src: dev/peers/build_llmc.sh says how to get them);" \
         "the benchmark's llmc-* modes will say so"
fi

# What changed since the last GPU run: the dev/cuda programs one of whose sources (nvcc -M) differs from
# the commit that run's binaries were built from (its main.log, in the newest commit that added files
# to doc/gpu_runs). The plan's cuda-dev stage (CUDA_DEV_PROGRAMS=changed) runs only these.
echo "== dev/cuda programs changed since the last GPU run"
run_commit=$(git log -1 --format=%h -- doc/gpu_runs)
last_log=$(git show --name-only --format= "$run_commit" -- 'doc/gpu_runs/*main.log' | head -n 1)
base=$(grep -ho "commit: binaries [0-9a-f]*" "$last_log" 2> /dev/null | head -n 1 | awk '{ print $3 }')
if [ -n "$base" ] && git cat-file -e "$base^{commit}" 2> /dev/null; then
    changed=$(git diff --name-only "$base" -- llmc dev/cuda | sed 's|^|./|')
    : > build/gpu/changed_programs.txt
    for cu in dev/cuda/*.cu; do
        deps=$(nvcc -M -std=c++17 -x cu "$cu" 2> /dev/null | tr -d '\\' | tr ' ' '\n' | grep -E '\.(cu|cuh|h)$' |
               xargs -r realpath --relative-to=. | sed 's|^|./|')
        if grep -qxFf <(echo "$deps") <(echo "$changed"); then basename "$cu" .cu >> build/gpu/changed_programs.txt; fi
    done
    echo "since $base (the binaries of $last_log): $(tr '\n' ' ' < build/gpu/changed_programs.txt)"
else
    echo "no earlier GPU run found in doc/gpu_runs; every program counts as changed"
    make -s -C dev/cuda --no-print-directory list | tr ' ' '\n' > build/gpu/changed_programs.txt
fi

# the stage fp8's data (dev/compare_fp8.sh): tinyshakespeare's shards, 1.3 MB, inside build/gpu (carried)
[ -f dev/data/tinyshakespeare/tinyshakespeare_train_000000.bin ] || dev/data/tinyshakespeare.sh > /dev/null
mkdir -p build/gpu/data
cp dev/data/tinyshakespeare/tinyshakespeare_{train,val}_000000.bin build/gpu/data/

mapfile -t CARRY < <(dev/gpu/carry.sh)
echo "== to carry to the GPU machine (8 paths, the tool's most)"
du -sh "${CARRY[@]}"
carry_bytes=$(du -scb "${CARRY[@]}" | tail -n 1 | cut -f1)
tree_bytes=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 du -cb 2> /dev/null |
             awk '$2 == "total" { t += $1 } END { print t + 0 }')
limit=$((64 * 1024 * 1024))
awk -v c="$carry_bytes" -v t="$tree_bytes" -v l="$limit" 'BEGIN {
    printf "carried %.1f MiB + working tree %.1f MiB = %.1f MiB of the 64 MiB the tool takes: %s\n",
           c / 1048576, t / 1048576, (c + t) / 1048576, (c + t <= l) ? "fits" : "TOO LARGE" }'
printf 'carry: ['; printf '"%s", ' "${CARRY[@]}" | sed 's/, $//'; printf ']\n'
echo "then on the GPU machine: dev/gpu/run_on_gpu.sh (or a few stages per call: dev/gpu/run_on_gpu.sh --list)"
[ $((carry_bytes + tree_bytes)) -le $limit ]
