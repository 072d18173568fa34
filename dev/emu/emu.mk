# The CUDA emulator (dev/emu/README.md): the unchanged CUDA sources built with g++ and run on the CPU.
# Included by the top-level Makefile.
#
#   make emu              train_gpt2cu_emu (bf16), train_gpt2fp32cu_emu (fp32), test_gpt2cu_emu
#   make emu-test-core    build and run the emulator's own unit tests (dev/emu/test_emu_core.cpp)
#   make emu-test-seeded-bugs   the seeded bugs and the checks that catch them (test_emu_seeded_bugs.cpp)
#   make EMU_ASAN=1 ...   the same with AddressSanitizer and initcheck (objects under build/emu-asan/):
#                         out-of-bounds accesses, uses after free, reads of never-written device memory
#   make EMU_TSAN=1 ...   the same with the race checker, ThreadSanitizer (build/emu-tsan/): the CUDA
#                         sources are instrumented, the emulator's own files only annotate (README.md)
#
# Every source is first copied by dev/emu/cu2cpp.sh into $(EMU_BUILD)/src/ with `<<< >>>` rewritten.
# Kernels' register counts come from ptxas for sm_90 (dev/emu/kernel_table.sh; needs nvcc, not a GPU).

EMU_DIR := dev/emu
# EMU_SAN: every file; EMU_CU_SAN: the CUDA sources only (and the link)
ifeq ($(EMU_TSAN),1)
  EMU_BUILD := build/emu-tsan
  EMU_FLAVOR := tsan
  EMU_SAN := -DEMU_TSAN=1 -g1
  EMU_CU_SAN := -fsanitize=thread
else ifeq ($(EMU_ASAN),1)
  EMU_BUILD := build/emu-asan
  EMU_FLAVOR := asan
  EMU_SAN := -fsanitize=address -fno-omit-frame-pointer -g1 -DEMU_INITCHECK=1
  # initcheck (device_memory.cpp): every load and store of the CUDA sources through a call it sees
  EMU_CU_SAN := --param asan-instrumentation-with-call-threshold=0
else
  EMU_BUILD := build/emu
  EMU_FLAVOR := plain
  EMU_SAN :=
  EMU_CU_SAN :=
endif
# The kernels' registers come from nvcc's sm_90 build (kernel_table.sh). The sanitizer builds have an
# empty table: they look for memory errors and races, and the plain build checks launches already.
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(CUDA_HOME)/bin/nvcc
EMU_TABLE_NVCC = $(if $(filter plain,$(EMU_FLAVOR)),$(NVCC),none)
# switching EMU_ASAN or EMU_TSAN rebuilds the binaries in the repository root (one stamp per flavour)
EMU_FLAVOR_STAMP := build/emu-flavor-$(EMU_FLAVOR)
EMU_OPT ?= -O2
EMU_BASE_FLAGS = -std=c++17 $(EMU_OPT) $(EMU_SAN) -I$(EMU_DIR)/include -DCUDA_EMULATION
# for the CUDA sources: read as C++, with the prelude's __global__, __shared__ ... first
# -I$(EMU_DIR): sources that include the emulator's own headers; prelude.h brings mma_emu.h (the emulated
# mma.sync, ldmatrix, cp.async behind llmc/mma.cuh's wrappers)
EMU_CU_FLAGS = $(EMU_BASE_FLAGS) $(EMU_CU_SAN) -I$(EMU_DIR) -x c++ -include $(EMU_DIR)/prelude.h
# Boost.Context: the fiber switch off x86-64 only (fiber_switch.h has its own for x86-64); the compiler's
# target decides, as __x86_64__ does in fiber_switch.h, not the machine's
EMU_BOOST_CONTEXT := $(if $(filter x86_64-%,$(shell $(CXX) -dumpmachine)),,-lboost_context)
EMU_LDLIBS = -rdynamic $(EMU_BOOST_CONTEXT) -lpthread -ldl $(TOKENIZER_LIBS)
# trainers and their test link the NCCL emulation, which runs over MPI when mpicxx is there
EMU_CXX = $(if $(TRAIN_CXX),$(TRAIN_CXX),$(CXX))

EMU_CORE_SOURCES := $(EMU_DIR)/exec.cpp $(EMU_DIR)/runtime.cpp $(EMU_DIR)/device_memory.cpp $(EMU_DIR)/memcpy2d.cpp
EMU_CORE_HEADERS := $(wildcard $(EMU_DIR)/include/*.h $(EMU_DIR)/include/emu/*.h $(EMU_DIR)/include/cooperative_groups/*.h) $(EMU_DIR)/prelude.h $(EMU_DIR)/internal.h $(EMU_DIR)/fiber_switch.h
EMU_CORE_OBJECTS := $(patsubst $(EMU_DIR)/%.cpp,$(EMU_BUILD)/obj/%.o,$(EMU_CORE_SOURCES))
# the other parts of the emulator (dev/emu/CONTRACT.md): linked when they are there
EMU_LIB_SOURCES := $(wildcard $(EMU_DIR)/cublas*.cpp $(EMU_DIR)/nccl*.cpp)
EMU_LIB_OBJECTS := $(patsubst $(EMU_DIR)/%.cpp,$(EMU_BUILD)/obj/%.o,$(EMU_LIB_SOURCES))

# the CUDA sources the emulated targets are built from (and dev/cuda, for its programs)
EMU_CU_SOURCES := train_gpt2.cu $(wildcard llmc/*.h llmc/*.cuh llmc/*/*.h llmc/*/*.cuh test/gpu/*.cu test/gpu/*.cuh test/*.h dev/cuda/*.cu dev/cuda/*.cuh) \
                  $(EMU_DIR)/test_emu_core.cpp $(EMU_DIR)/test_emu_seeded_bugs.cpp
EMU_SRC := $(EMU_BUILD)/src

.PHONY: emu emu-test-core emu-test-seeded-bugs

emu: train_gpt2cu_emu train_gpt2fp32cu_emu test_gpt2cu_emu

$(EMU_FLAVOR_STAMP):
	@mkdir -p build
	rm -f build/emu-flavor-* && touch $@

$(EMU_BUILD)/src.stamp: $(EMU_CU_SOURCES) $(EMU_DIR)/cu2cpp.sh $(EMU_DIR)/mma_emu.h $(EMU_DIR)/wgmma_emu.h
	@mkdir -p $(EMU_BUILD)
	$(EMU_DIR)/cu2cpp.sh $(EMU_SRC) $(EMU_CU_SOURCES)
	touch $@

$(EMU_CORE_OBJECTS): $(EMU_BUILD)/obj/%.o: $(EMU_DIR)/%.cpp $(EMU_CORE_HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_BASE_FLAGS) -c $< -o $@
# initcheck's own loads and stores are not instrumented: it defines the functions instrumented code calls
$(EMU_BUILD)/obj/device_memory.o: EMU_BASE_FLAGS += -fno-sanitize=address

$(EMU_LIB_OBJECTS): $(EMU_BUILD)/obj/%.o: $(EMU_DIR)/%.cpp $(EMU_CORE_HEADERS) $(wildcard $(EMU_DIR)/*.h)
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_BASE_FLAGS) -c $< -o $@

# registers and static shared memory per kernel, both precisions (the test includes the trainer)
$(EMU_BUILD)/kernel_table.cpp: $(EMU_DIR)/kernel_table.sh train_gpt2.cu $(wildcard llmc/*.cuh llmc/*/*.cuh test/gpu/*)
	@mkdir -p $(dir $@)
	$(EMU_DIR)/kernel_table.sh $@ $(EMU_TABLE_NVCC) "test/gpu/test_gpt2.cu" "test/gpu/test_gpt2.cu -DENABLE_FP32"

$(EMU_BUILD)/obj/kernel_table.o: $(EMU_BUILD)/kernel_table.cpp $(EMU_CORE_HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_BASE_FLAGS) -c $< -o $@

EMU_LINK = $(EMU_CORE_OBJECTS) $(EMU_LIB_OBJECTS) $(EMU_BUILD)/obj/kernel_table.o

train_gpt2cu_emu: $(EMU_BUILD)/src.stamp $(EMU_LINK) $(EMU_FLAVOR_STAMP)
	$(EMU_CXX) $(EMU_CU_FLAGS) $(EMU_SRC)/train_gpt2.cu -x none $(EMU_LINK) $(EMU_LDLIBS) -o $@

train_gpt2fp32cu_emu: $(EMU_BUILD)/src.stamp $(EMU_LINK) $(EMU_FLAVOR_STAMP)
	$(EMU_CXX) $(EMU_CU_FLAGS) -DENABLE_FP32 $(EMU_SRC)/train_gpt2.cu -x none $(EMU_LINK) $(EMU_LDLIBS) -o $@

BUILD_TEST_GPT2CU_EMU = $(EMU_CXX) $(EMU_CU_FLAGS) -fopenmp -DGPT2_TRAINER='"train_gpt2cu_emu"' \
	$(EMU_SRC)/test/gpu/test_gpt2.cu -x none $(EMU_LINK) -lgtest -lgomp $(EMU_LDLIBS) -o $@
test_gpt2cu_emu: $(EMU_BUILD)/src.stamp $(EMU_LINK) $(EMU_FLAVOR_STAMP)
	$(BUILD_TEST_GPT2CU_EMU)
# the same in the build folder, for the sanitizer builds' suites (dev/emu/asan.mk, tsan.mk): the
# repository root keeps the plain build
$(EMU_BUILD)/test_gpt2cu_emu: $(EMU_BUILD)/src.stamp $(EMU_LINK)
	$(BUILD_TEST_GPT2CU_EMU)

# the seeded bugs take the emulated cuBLAS too (its objects need no MPI)
EMU_CUBLAS_OBJECTS = $(filter $(EMU_BUILD)/obj/cublas%,$(EMU_LIB_OBJECTS))
$(EMU_BUILD)/test_emu_core $(EMU_BUILD)/test_emu_seeded_bugs: $(EMU_BUILD)/%: $(EMU_BUILD)/src.stamp $(EMU_CORE_OBJECTS) $(EMU_CUBLAS_OBJECTS)
	$(CXX) $(EMU_CU_FLAGS) $(EMU_SRC)/$(EMU_DIR)/$*.cpp -x none $(EMU_CORE_OBJECTS) $(EMU_CUBLAS_OBJECTS) -lgtest $(EMU_LDLIBS) -o $@

emu-test-core: $(EMU_BUILD)/test_emu_core
	$(EMU_BUILD)/test_emu_core $(TEST_ARGS)

# the seeded bugs and the checks that catch them (the race tests need EMU_TSAN=1, else skipped)
emu-test-seeded-bugs: $(EMU_BUILD)/test_emu_seeded_bugs
	$(EMU_BUILD)/test_emu_seeded_bugs $(TEST_ARGS)
include dev/emu/devcuda.mk
