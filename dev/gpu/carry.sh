#!/usr/bin/env bash
# The paths a GPU session's device call carries beside the working tree (the device tool takes 8 at
# most, 64 MiB with the tree), one per line: what dev/gpu/prepare_gpu_run.sh builds and
# dev/gpu/run_on_gpu.sh runs. With "emu": the emulated counterparts dev/gpu/rehearse.sh carries
# into its copy of the tree, so the rehearsal fails where a path is missing from the list.
#
#   dev/gpu/carry.sh          build/gpu (the CPU trainer, the commit built) train_gpt2cu ... (the GPU run)
#   dev/gpu/carry.sh emu      train_gpt2cu_emu ... (the rehearsal)
case "${1:-gpu}" in
    gpu) printf '%s\n' build/gpu train_gpt2cu train_gpt2fp32cu test_gpt2cu test_gpt2fp32cu dev/cuda/bin \
             build/oracle/tiny build/oracle/tiny_cosine ;;
    emu) printf '%s\n' train_gpt2cu_emu train_gpt2fp32cu_emu test_gpt2cu_emu test_gpt2fp32cu_emu build/emu/devcuda/gelu_forward \
             build/oracle/tiny build/oracle/tiny_cosine build/gpu/data ;;
    *) echo "carry.sh: gpu or emu" >&2; exit 2 ;;
esac
