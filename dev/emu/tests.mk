# The emulated test suites that `make test` runs (test/run_tests.sh): the emulator's own unit tests
# and seeded bugs, the GPU suite (test/gpu/test_gpt2.cu) in both precisions, the dev/cuda check modes;
# and under the sanitizers (dev/emu/README.md), a subset sized for CI: with AddressSanitizer and
# initcheck (build/emu-asan/) the core and seeded-bug tests, the GPU suite's kernel tests and every
# dev/cuda check; with the race checker (build/emu-tsan/) the core, seeded-bug and mma tests, the
# kernel tests (flash attention at a few shapes) and the dev/cuda checks but the three slowest.
# Included by emu.mk; uses its variables and those of cublas.mk, nccl.mk and devcuda.mk.
#
#   make emu-test-binaries            build everything the emulated suites run: the plain build (what
#                                     `make test` runs the suites on; EMU_ASAN=1 for the AddressSanitizer
#                                     build) and the sanitizer builds' programs
#   make test_gpt2fp32cu_emu          the GPU suite of the fp32 build (tolerances of test_gpt2.cu's fp32 branch)
#
# Every result of these suites is labelled "emulated": they prove the CUDA code's logic on the CPU,
# never its speed nor the GPU's memory model (dev/emu/README.md).

include $(EMU_DIR)/cublas.mk
include $(EMU_DIR)/nccl.mk

.PHONY: emu-test-binaries emu-sanitizer-test-binaries

test_gpt2fp32cu_emu: $(EMU_BUILD)/src.stamp $(EMU_LINK) $(EMU_FLAVOR_STAMP)
	$(EMU_CXX) $(EMU_CU_FLAGS) -fopenmp -DENABLE_FP32 -DGPT2_TRAINER='"train_gpt2fp32cu_emu"' $(EMU_SRC)/test/gpu/test_gpt2.cu \
		-x none $(EMU_LINK) -lgtest -lgomp $(EMU_LDLIBS) -o $@

EMU_TEST_BINARIES = train_gpt2cu_emu train_gpt2fp32cu_emu test_gpt2cu_emu test_gpt2fp32cu_emu \
                    $(EMU_BUILD)/test_emu_core $(EMU_BUILD)/test_emu_seeded_bugs \
                    $(EMU_BUILD)/test_cublas_emu $(EMU_BUILD)/test_nccl_emu $(EMU_BUILD)/test_mma_emu $(DEVCUDA_BINS) \
                    train_gpt2fp16cu_emu test_gpt2fp16cu_emu $(EMU_BUILD)/test_emu_fp16 $(EMU_BUILD)/test_emu_fp8 $(EMU_BUILD)/comm_check_nccl

emu-test-binaries: $(EMU_TEST_BINARIES) emu-sanitizer-test-binaries

# The sanitizer builds' test programs: a make of their own each (the build folder and flags are chosen
# when the makefiles are read), on dev/emu/asan.mk and tsan.mk, after the plain build (with EMU_ASAN=1
# both would build build/emu-asan/). The rest of the project builds under the sanitizers too, but is
# not part of the suites (README.md: what they cover).
# Of dev/cuda, the programs test/run_tests.sh runs under each (its lists, read from there: one place).
devcuda_list = $(shell sed -n 's/^$(1)="\(.*\)"$$/\1/p' test/run_tests.sh)
EMU_ASAN_TEST_TARGETS = $(addprefix build/emu-asan/,test_emu_core test_emu_seeded_bugs test_gpt2cu_emu) \
                        $(addprefix build/emu-asan/devcuda/,$(call devcuda_list,devcuda_asan_programs))
EMU_TSAN_TEST_TARGETS = $(addprefix build/emu-tsan/,test_emu_core test_emu_seeded_bugs test_mma_emu test_gpt2cu_emu) \
                        $(addprefix build/emu-tsan/devcuda/,$(call devcuda_list,devcuda_tsan_programs))
emu-sanitizer-test-binaries: | $(EMU_TEST_BINARIES)
	$(MAKE) --no-print-directory -f $(EMU_DIR)/asan.mk $(EMU_ASAN_TEST_TARGETS)
	$(MAKE) --no-print-directory -f $(EMU_DIR)/tsan.mk $(EMU_TSAN_TEST_TARGETS)
