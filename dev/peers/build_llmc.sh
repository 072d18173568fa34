#!/usr/bin/env bash
# Builds llm.c's train_gpt2cu, the peer dev/bench_gpu.py times our trainer against (modes llmc-r0,
# llmc-r1), from llm.c's own source, here on the CPU machine (nvcc 13.0, the GPU machines' CUDA), for
# sm_90, with cuDNN's flash attention (USE_CUDNN=1) and without MPI or NCCL (one GPU). None of llm.c's
# code is in this repository: the sources come from outside (the session's `fetch` tool, or a clone),
# go into an ignored folder, and only the binary travels to the GPU machine.
#
#   dev/peers/build_llmc.sh LLMC_SRC CUDNN_FRONTEND_SRC [OUT_DIR]
#       LLMC_SRC            a tree of github.com/karpathy/llm.c (its Makefile, train_gpt2.cu, llmc/)
#       CUDNN_FRONTEND_SRC  a tree of github.com/NVIDIA/cudnn-frontend (its include/ is all llm.c needs)
#       OUT_DIR             default build/gpu/llmc (carried with build/gpu): train_gpt2cu, source.txt
#
# For example, from the mirrors the fetch tool makes:
#   git --git-dir=/work/.mirror/karpathy+llm.c/repo archive HEAD | (mkdir -p build/peers/llm.c && tar -C build/peers/llm.c -x)
#   git --git-dir=/work/.mirror/NVIDIA+cudnn-frontend/repo archive v1.16.0 include | (mkdir -p build/peers/cudnn-frontend && tar -C build/peers/cudnn-frontend -x)
#   LLMC_COMMIT=$(git --git-dir=/work/.mirror/karpathy+llm.c/repo rev-parse --short HEAD) \
#       dev/peers/build_llmc.sh build/peers/llm.c build/peers/cudnn-frontend
#
# One change to llm.c's source is needed for CUDA 13, made with sed in a copy of the tree: CUDA 13's
# cudaMemAdvise takes a cudaMemLocation where CUDA 12's took a device number (cudaCpuDeviceId, the host), in the
# fallback to managed memory that llm.c uses only when cudaMalloc fails. Linking: cuBLAS, cuBLASLt, cuDNN
# and NVML dynamically (the GPU machine's CUDA, PyTorch's nvidia-cudnn wheel, the driver), rpath
# /usr/local/cuda/lib64; dev/gpu/run_on_gpu.sh finds cuDNN in Python's site-packages when the loader does not.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
src=$1 frontend=$2
out=${3:-build/gpu/llmc}
[ -f "$src/train_gpt2.cu" ] && [ -f "$src/Makefile" ] || { echo "build_llmc.sh: $src is not an llm.c tree (no train_gpt2.cu, Makefile)"; exit 1; }
[ -f "$frontend/include/cudnn_frontend.h" ] || { echo "build_llmc.sh: $frontend has no include/cudnn_frontend.h"; exit 1; }
command -v nvcc > /dev/null || export PATH=/usr/local/cuda/bin:$PATH
frontend=$(cd "$frontend" && pwd)
mkdir -p "$out" build/peers
out=$(cd "$out" && pwd)
work=build/peers/llmc-build
rm -rf "$work" && cp -r "$src" "$work"
ln -sfn "$frontend" "$work/cudnn-frontend"  # llm.c's Makefile looks for ./cudnn-frontend/include
grep -q 'cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)' "$work/llmc/cuda_utils.cuh" &&
    sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
        "$work/llmc/cuda_utils.cuh"
# llm.c's Makefile links NVML (-lnvidia-ml: the driver's libnvidia-ml.so.1, for its GPU-utilization
# line), which a machine with no driver lacks: link against a stub of the functions llm.c calls, under
# their names after nvml.h's renaming (nvmlInit is nvmlInit_v2), or an empty one where there is no
# nvml.h (llm.c then leaves NVML out: `__has_include(<nvml.h>)`); the GPU machine's driver has the real one.
stubs="$work/nvml_stub"
mkdir -p "$stubs"
: > "$stubs/nvml_stub.c"
if echo '#include <nvml.h>' | gcc -E -I/usr/local/cuda/include -x c - > /dev/null 2>&1; then
    { echo '#include <nvml.h>'; grep -ohE '\bnvml[A-Z][A-Za-z0-9_]*\s*\(' "$work"/llmc/*.h "$work"/llmc/*.cuh | tr -d '( ' | sort -u | sed 's/^/SYMBOL /'; } |
        gcc -E -P -I/usr/local/cuda/include -x c - | awk '$1 == "SYMBOL" { printf "int %s(void) { return 0; }\n", $2 }' > "$stubs/nvml_stub.c"
fi
gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o "$stubs/libnvidia-ml.so" "$stubs/nvml_stub.c"
start=$SECONDS
make -C "$work" train_gpt2cu USE_CUDNN=1 NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY=90 \
    NVCC_LDLIBS="-L$(cd "$stubs" && pwd) -Xlinker -rpath=/usr/local/cuda/lib64"
cp "$work/train_gpt2cu" "$out/train_gpt2cu"
commit=${LLMC_COMMIT:-$([ -e "$src/.git" ] && git -C "$src" rev-parse --short HEAD || echo "commit unknown (LLMC_COMMIT names it)")}
{
    echo "llm.c: $commit ($src)"
    echo "cudnn-frontend: $(awk '/define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION/ { v = v (v == "" ? "" : ".") $3 } END { print v }' \
        "$frontend/include/cudnn_frontend_version.h") ($frontend)"
    echo "built $(date -u '+%F %T UTC') with $(nvcc --version | tail -n 1), USE_CUDNN=1 NO_MULTI_GPU=1 NO_USE_MPI=1, sm_90"
} > "$out/source.txt"
echo "build_llmc.sh: $out/train_gpt2cu in $((SECONDS - start)) s"
ldd "$out/train_gpt2cu" | grep -E "cudnn|cublas|nvidia-ml|not found" || true
