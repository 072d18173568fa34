# The emulated test suites that `make test` runs (test/run_tests.sh): the emulator's own unit tests
# and seeded bugs, the GPU suite (test/gpu/test_gpt2.cu) in both precisions, the dev/cuda check modes,
# and the emulator's core, seeded-bug and mma tests again under the race checker (EMU_TSAN=1).
# Included by emu.mk; uses its variables and those of cublas.mk, nccl.mk and devcuda.mk.
#
#   make emu-test-binaries            build everything the emulated suites run: the plain build (what CI
#                                     and `make test` use; EMU_ASAN=1 for the AddressSanitizer build)
#                                     and the race checker's test programs in build/emu-tsan/
#   make test_gpt2fp32cu_emu          the GPU suite of the fp32 build (tolerances of test_gpt2.cu's fp32 branch)
#
# Every result of these suites is labelled "emulated": they prove the CUDA code's logic on the CPU,
# never its speed nor the GPU's memory model (dev/emu/README.md).

include $(EMU_DIR)/cublas.mk
include $(EMU_DIR)/nccl.mk

.PHONY: emu-test-binaries emu-tsan-test-binaries

test_gpt2fp32cu_emu: $(EMU_BUILD)/src.stamp $(EMU_LINK) $(EMU_FLAVOR_STAMP)
	$(EMU_CXX) $(EMU_CU_FLAGS) -fopenmp -DENABLE_FP32 -DGPT2_TRAINER='"train_gpt2fp32cu_emu"' $(EMU_SRC)/test/gpu/test_gpt2.cu \
		-x none $(EMU_LINK) -lgtest -lgomp $(EMU_LDLIBS) -o $@

EMU_TEST_BINARIES = train_gpt2cu_emu train_gpt2fp32cu_emu test_gpt2cu_emu test_gpt2fp32cu_emu \
                    $(EMU_BUILD)/test_emu_core $(EMU_BUILD)/test_emu_seeded_bugs \
                    $(EMU_BUILD)/test_cublas_emu $(EMU_BUILD)/test_nccl_emu $(EMU_BUILD)/test_mma_emu $(DEVCUDA_BINS) \
                    train_gpt2fp16cu_emu test_gpt2fp16cu_emu $(EMU_BUILD)/test_emu_fp16 $(EMU_BUILD)/comm_check_nccl

emu-test-binaries: $(EMU_TEST_BINARIES) emu-tsan-test-binaries

# The race checker's test programs, whichever flavour this make builds: a make of its own (the build
# folder and flags are chosen when the makefiles are read), on dev/emu/tsan.mk. The rest of the project
# builds under EMU_TSAN=1 too, but is not part of the suite (README.md: what the race checker covers).
EMU_TSAN_TEST_BINARIES = $(addprefix build/emu-tsan/,test_emu_core test_emu_seeded_bugs test_mma_emu)
emu-tsan-test-binaries:
	$(MAKE) --no-print-directory -f $(EMU_DIR)/tsan.mk $(EMU_TSAN_TEST_BINARIES)
