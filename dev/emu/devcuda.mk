# The dev/cuda programs under the CPU emulator (dev/cuda/README.md, "Emulated runs"), and the unit
# tests of the emulated tensor-core primitives. Included by dev/emu/emu.mk; uses its variables.
#
#   make emu-devcuda          build/emu/devcuda/<program> for every program dev/cuda/*.cu
#   make emu-devcuda-check    build them, run each (check-only mode: small shapes, no timing), then
#                             print "N passed, N failed"; exits 1 if any failed. Logs: build/emu/devcuda/logs
#   make emu-test-mma         the one-warp tests of mma.sync, ldmatrix and cp.async (dev/emu/test_mma_emu.cpp)
#
#   make emu-devcuda-check EMU_DEVCUDA_ENV="EMU_CP_ASYNC=issue EMU_THREAD_ORDER=reverse EMU_THREADS=2"
#                             the same under the emulator's other legal schedules (a correct kernel
#                             passes under all of them)
#   make -f dev/emu/asan.mk emu-devcuda-check    with AddressSanitizer and initcheck (build/emu-asan/);
#   make -f dev/emu/tsan.mk emu-devcuda-check    with the race checker (build/emu-tsan/)
#   EMU_DEVCUDA_PROGRAMS="adamw gelu_forward"    checks only these programs
#
# Emulated runs prove the kernels' logic, never their speed. Each program also gets a table of its
# kernels' registers and static shared memory from ptxas (sm_90), so the emulator refuses a launch the
# GPU would refuse; without nvcc the table is empty and the emulator warns instead.

DEVCUDA_PROGRAMS := $(sort $(basename $(notdir $(wildcard dev/cuda/*.cu))))
EMU_DEVCUDA_PROGRAMS ?= $(DEVCUDA_PROGRAMS)
DEVCUDA_BUILD := $(EMU_BUILD)/devcuda
DEVCUDA_BINS := $(addprefix $(DEVCUDA_BUILD)/,$(DEVCUDA_PROGRAMS))
# prelude.h brings dev/emu/mma_emu.h: the wrappers llmc/mma.cuh leaves to the emulator
DEVCUDA_FLAGS = $(EMU_CU_FLAGS) -I$(EMU_DIR) -fopenmp -Wno-unknown-pragmas
DEVCUDA_LINK = $(EMU_CORE_OBJECTS) $(EMU_LIB_OBJECTS) -lgomp $(EMU_LDLIBS)

.PHONY: emu-devcuda emu-devcuda-check emu-test-mma

emu-devcuda: $(DEVCUDA_BINS)

$(DEVCUDA_BUILD)/%_kernels.cpp: dev/cuda/%.cu $(wildcard dev/cuda/*.cuh llmc/*.cuh llmc/*.h llmc/*/*.cuh llmc/*/*.h) $(EMU_DIR)/kernel_table.sh
	@mkdir -p $(dir $@)
	$(EMU_DIR)/kernel_table.sh $@ $(EMU_TABLE_NVCC) "dev/cuda/$*.cu"

$(DEVCUDA_BUILD)/%_kernels.o: $(DEVCUDA_BUILD)/%_kernels.cpp $(EMU_CORE_HEADERS)
	$(CXX) $(EMU_BASE_FLAGS) -c $< -o $@

$(DEVCUDA_BINS): $(DEVCUDA_BUILD)/%: $(EMU_BUILD)/src.stamp $(EMU_DIR)/mma_emu.h $(EMU_DIR)/wgmma_emu.h $(DEVCUDA_BUILD)/%_kernels.o $(EMU_CORE_OBJECTS) $(EMU_LIB_OBJECTS)
	$(EMU_CXX) $(DEVCUDA_FLAGS) $(EMU_SRC)/dev/cuda/$*.cu -x none $(DEVCUDA_BUILD)/$*_kernels.o $(DEVCUDA_LINK) -o $@

# Each program alone; a program passes when it exits 0 (all its checks
# passed). nccl_all_reduce runs as one rank: it opens every GPU of one process (ncclCommInitAll), and the
# emulator has one device per process, so mpirun would only start independent copies of it; the
# multi-rank all-reduce is tested by dev/emu/test_nccl_emu.cpp.
emu-devcuda-check: $(addprefix $(DEVCUDA_BUILD)/,$(EMU_DEVCUDA_PROGRAMS))
	@mkdir -p $(DEVCUDA_BUILD)/logs; passed=0; failed=0; failures=""; \
	for p in $(EMU_DEVCUDA_PROGRAMS); do \
	    start=$$(date +%s%N); \
	    env EMU_REGISTER_WARNINGS=0 $(EMU_DEVCUDA_ENV) $(DEVCUDA_BUILD)/$$p > $(DEVCUDA_BUILD)/logs/$$p.log 2>&1; rc=$$?; \
	    ms=$$((($$(date +%s%N) - start) / 1000000)); \
	    if [ $$rc -eq 0 ]; then passed=$$((passed + 1)); verdict=passed; \
	    else failed=$$((failed + 1)); verdict="FAILED (exit $$rc)"; failures="$$failures $$p"; fi; \
	    printf "%-24s %s, %d.%d s (emulated; log: %s)\n" $$p "$$verdict" $$((ms / 1000)) $$((ms % 1000 / 100)) $(DEVCUDA_BUILD)/logs/$$p.log; \
	    grep -h "FAIL\|cuda-emu:\|^note:" $(DEVCUDA_BUILD)/logs/$$p.log | head -5 | sed 's/^/    /'; \
	done; \
	echo "$$passed passed, $$failed failed"; \
	[ $$failed -eq 0 ]

$(EMU_BUILD)/src/dev/emu/test_mma_emu.cpp: $(EMU_DIR)/test_mma_emu.cpp $(EMU_DIR)/cu2cpp.sh
	$(EMU_DIR)/cu2cpp.sh $(EMU_SRC) $(EMU_DIR)/test_mma_emu.cpp

$(EMU_BUILD)/test_mma_emu: $(EMU_BUILD)/src/dev/emu/test_mma_emu.cpp $(EMU_BUILD)/src.stamp $(EMU_DIR)/mma_emu.h $(EMU_CORE_OBJECTS)
	$(CXX) $(EMU_CU_FLAGS) -I$(EMU_DIR) $< -x none $(EMU_CORE_OBJECTS) -lgtest_main -lgtest $(EMU_LDLIBS) -o $@

emu-test-mma: $(EMU_BUILD)/test_mma_emu
	$(EMU_BUILD)/test_mma_emu $(TEST_ARGS)

# For dev/emu/try_llmc_devcuda.sh (CUDA programs from outside the repository, built as ours are): builds
# the emulator's objects, then prints the compiler, flags and link line of a dev/cuda program as shell
# assignments.
.PHONY: emu-devcuda-build-settings
emu-devcuda-build-settings: $(EMU_CORE_OBJECTS) $(EMU_LIB_OBJECTS)
	@printf "emu_cxx='%s'\ndevcuda_flags='%s'\ndevcuda_link='%s'\nnvcc='%s'\n" "$(EMU_CXX)" "$(DEVCUDA_FLAGS)" "$(DEVCUDA_LINK)" "$(NVCC)"
