# Build everything with `make`; `make test` builds and runs the CPU test suite and the emulated CUDA
# suites (test/run_tests.sh; what CI runs).
#
#   make train_gpt2            fp32 CPU trainer (OpenMP)
#   make tokenizer_gpt2        GPT-2 BPE tokenizer and data preparation tool
#   make test                  googletest suites + PyTorch oracle (scripts/install_deps.sh makes .venv)
#   make bench-cpu             step time of train_gpt2 vs PyTorch eager and torch.compile, same machine
#   make bench-gemm            llmc/gemm.h's GEMM vs OpenBLAS and the FMA peak (needs libopenblas-dev)
#   make bench-offload         -oo 1's AdamW on the CPU vs the CPU trainer's AdamW (nvcc, no GPU needed)
#   make train_gpt2cu test_gpt2cu   CUDA trainer and its test (PRECISION=BF16|FP32|FP16)
#   make cuda-all              compile every CUDA target for sm_80 and sm_90 (CI does this)

CXX ?= g++
# -march=native: the binary runs where it is built (`make` on the training machine); override with
# `make CPU_ARCH=-march=x86-64-v3` to build for another machine.
CPU_ARCH ?= -march=native
# -fno-math-errno -fno-trapping-math: no code here reads errno or floating-point exception flags;
# without them the compiler keeps sqrt() and conditional float code (e.g. gelu.h's exp) scalar.
# Results are unchanged: IEEE arithmetic and rounding stay exactly as they are.
CXXFLAGS ?= -O3 $(CPU_ARCH) -std=c++17 -fopenmp -fno-math-errno -fno-trapping-math -Wall -Wextra -Wno-unused-parameter
LDLIBS_CPU = -lm
# The interpreter of the oracle and the benchmarks: the first that imports torch of the project's
# .venv, python3 on PATH (a GPU machine's has torch) and /usr/bin/python3 (scripts/find_python.sh).
PYTHON ?= $(shell scripts/find_python.sh)
BUILD = build

LLMC_HEADERS = $(wildcard llmc/*.h llmc/*/*.h)

.PHONY: all test bench-cpu bench-gemm clean cuda-all

all: train_gpt2 tokenizer_gpt2 check_gpt2

# With MPI installed (mpicxx on PATH) the trainer is built for data-parallel runs under mpirun;
# `make NO_MPI=1` builds it single-process. The test binary is always single-process.
ifeq ($(NO_MPI),)
  MPICXX := $(shell command -v mpicxx 2>/dev/null)
endif
ifneq ($(MPICXX),)
  TRAIN_CXX = OMPI_CXX=$(CXX) $(MPICXX) -DUSE_MPI -DOMPI_SKIP_MPICXX
else
  TRAIN_CXX = $(CXX)
endif

# Build configuration stamps: one file per target under build/config/ whose content is the command
# that builds it (compiler, MPI or not, flags, precision, NCCL and MPI libraries). The file is
# rewritten only when that content changes, so a change of configuration (Open MPI installed after a
# first build, another PRECISION, NO_MPI=1) makes the target out of date and it is rebuilt; an
# unchanged configuration leaves it alone. Usage: $(call config_stamp,NAME,CONTENT) names the file.
config_stamp = $(shell mkdir -p $(BUILD)/config && f='$(BUILD)/config/$(1)' && c='$(subst ','',$(2))' && \
  { [ "$$(cat "$$f" 2>/dev/null)" = "$$c" ] || printf '%s' "$$c" > "$$f"; } && echo "$$f")

TRAIN_CONFIG := $(call config_stamp,train_gpt2,$(TRAIN_CXX) $(CXXFLAGS) $(LDLIBS_CPU))

# PCRE2 (TOKENIZER_LIBS): the sampling prompt (-sp) is tokenized with llmc/tokenizer/bpe.h
train_gpt2: train_gpt2.cpp $(LLMC_HEADERS) $(TRAIN_CONFIG)
	$(TRAIN_CXX) $(CXXFLAGS) $< $(TOKENIZER_LIBS) $(LDLIBS_CPU) -o $@

# ---------------------------------------------------------------------------
# tokenizer (see doc/tokenizer.md)
TOKENIZER_LIBS = $(shell pkg-config --libs libpcre2-8 2>/dev/null || echo -lpcre2-8)

tokenizer_gpt2: tokenizer_gpt2.cpp $(LLMC_HEADERS)
	$(CXX) $(CXXFLAGS) $< $(TOKENIZER_LIBS) -lpthread -o $@

# a model file against a debug state, as llm.c's test_gpt2 checks one (check_gpt2.cpp; doc/reliability.md)
check_gpt2: check_gpt2.cpp train_gpt2.cpp $(LLMC_HEADERS)
	$(CXX) $(CXXFLAGS) $< $(TOKENIZER_LIBS) $(LDLIBS_CPU) -o $@

# ---------------------------------------------------------------------------
# tests: one googletest binary for all CPU suites, so CI reads one summary

TEST_SOURCES = $(wildcard test/test_*.cpp)
GTEST_LIBS = -lgtest -lpthread

# one object per test file, so `make -j2` compiles them side by side (test_model.cpp, which includes
# train_gpt2.cpp, is the long one); every object depends on every header, which is simple and safe
TEST_CONFIG := $(call config_stamp,test_cpu,$(CXX) $(CXXFLAGS))
TEST_OBJECTS = $(patsubst test/%.cpp,$(BUILD)/test_obj/%.o,$(TEST_SOURCES))
$(BUILD)/test_obj/%.o: test/%.cpp test/test_helpers.h train_gpt2.cpp $(LLMC_HEADERS) $(TEST_CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -Itest -c $< -o $@

$(BUILD)/test_cpu: $(TEST_OBJECTS) | $(BUILD)
	$(CXX) $(CXXFLAGS) $(TEST_OBJECTS) $(GTEST_LIBS) $(TOKENIZER_LIBS) $(LDLIBS_CPU) -o $@

$(BUILD):
	mkdir -p $(BUILD)

# The test binaries find the trainers, the tokenizer tool and the oracle through these variables.
# test/run_tests.sh runs the CPU suite, then the CUDA code's suites under the CPU emulator (dev/emu,
# dev/emu/tests.mk; built here with -j2), and ends with one line "tests: N passed, N failed, N skipped".
# Everything is built first, two compilers at a time (the CI machine has 2 cores), then run.
test:
	$(MAKE) -j2 --no-print-directory $(BUILD)/test_cpu train_gpt2 tokenizer_gpt2 check_gpt2 $(if $(MPICXX),$(BUILD)/comm_check) emu-test-binaries
	GPT2_ROOT=$(CURDIR) GPT2_PYTHON=$(PYTHON) OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} EMU_BUILD=$(EMU_BUILD) MAKE="$(MAKE)" \
		TEST_ARGS="$(TEST_ARGS)" test/run_tests.sh

# llmc/parallel/comm.h's checks on its MPI backend (test/comm_check.cpp; test/run_tests.sh runs it under mpirun)
COMM_CHECK_CONFIG := $(call config_stamp,comm_check,$(TRAIN_CXX) $(CXXFLAGS))
$(BUILD)/comm_check: test/comm_check.cpp $(LLMC_HEADERS) $(COMM_CHECK_CONFIG) | $(BUILD)
	@if [ -z "$(MPICXX)" ]; then echo "comm_check: needs MPI (mpicxx; scripts/install_deps.sh)" >&2; exit 1; fi
	$(TRAIN_CXX) $(CXXFLAGS) $< -o $@

# the FMA peak (llmc/run/cpu_peak.h) that bench-cpu divides our FLOP/s by
$(BUILD)/cpu_peak: dev/cpu_peak.cpp llmc/run/cpu_peak.h | $(BUILD)
	$(CXX) $(CXXFLAGS) $< -o $@

bench-cpu: train_gpt2 $(BUILD)/cpu_peak
	$(PYTHON) dev/bench_cpu.py

# OpenBLAS is linked by this benchmark only; the trainer never depends on it.
$(BUILD)/bench_gemm: dev/bench_gemm.cpp llmc/gemm.h llmc/run/cpu_peak.h | $(BUILD)
	@pkg-config --exists openblas || { echo "bench-gemm: OpenBLAS is not installed" \
		"(scripts/install_deps.sh --bench, or apt-get install libopenblas-dev)" >&2; exit 1; }
	$(CXX) $(CXXFLAGS) $$(pkg-config --cflags openblas 2>/dev/null) $< $$(pkg-config --libs openblas 2>/dev/null || echo -lopenblas) -o $@

bench-gemm: $(BUILD)/bench_gemm
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BUILD)/bench_gemm

clean:
	rm -rf $(BUILD) train_gpt2 tokenizer_gpt2 check_gpt2 train_gpt2cu train_gpt2fp32cu test_gpt2cu test_gpt2fp32cu \
		train_gpt2cu_emu train_gpt2fp32cu_emu test_gpt2cu_emu test_gpt2fp32cu_emu

# ---------------------------------------------------------------------------
# CUDA (see doc/cuda.md). The device code is built for Ampere (sm_80) and Hopper (sm_90).
#   make train_gpt2cu test_gpt2cu       PRECISION=BF16 (default), FP32 or FP16 (dynamic loss scaling)
#   make train_gpt2fp32cu test_gpt2fp32cu   always fp32 (tight checks against the oracle)
#   make test-gpu                       the GPU suite, then compute-sanitizer memcheck, racecheck and synccheck
#   make gpu-prepare                    build and make oracle files here for a GPU machine (dev/gpu/prepare_gpu_run.sh)
#   make cuda-all                       every CUDA target in both precisions (CI; needs nvcc, no GPU)

CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(CUDA_HOME)/bin/nvcc
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
NVCC_FLAGS ?= -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler "-Wall -Wno-unknown-pragmas" -diag-suppress 1675
# the host code with OpenMP and the machine's vector instructions, as CXXFLAGS: -oo 1's AdamW runs on
# the CPU (llmc/optimizer_offload.cuh), and without -fno-math-errno its loop (sqrtf) stays scalar
NVCC_HOST_FLAGS = -Xcompiler "-fopenmp $(CPU_ARCH) -fno-math-errno -fno-trapping-math"
NVCC_LDLIBS = -lcublasLt -lcublas -lnccl -lgomp $(TOKENIZER_LIBS)
# Multi-GPU (llmc/parallel/comm_nccl.cuh, doc/data_parallel.md): NCCL always; MPI too when Open MPI's mpicxx is
# found (as for train_gpt2), so `mpirun -np 8 ./train_gpt2cu` works. Without it the processes are
# started with -pi tcp or -pi file. `make NO_MPI=1` leaves MPI out.
# Only the flags nvcc takes as they are (-I -D -L -l), and -Wl,... turned into -Xlinker ...
comma := ,
ifneq ($(MPICXX),)
  CUDA_MPI_CFLAGS := $(filter -I% -D%,$(shell $(MPICXX) --showme:compile 2>/dev/null))
  CUDA_MPI_LIBS := $(foreach f,$(shell $(MPICXX) --showme:link 2>/dev/null),\
    $(if $(filter -Wl$(comma)%,$f),-Xlinker $(patsubst -Wl$(comma)%,%,$f),$(filter -L% -l%,$f)))
endif
ifneq ($(CUDA_MPI_LIBS),)
  NVCC_MPI_FLAGS = -DUSE_MPI -DOMPI_SKIP_MPICXX $(CUDA_MPI_CFLAGS)
  NVCC_LDLIBS += $(CUDA_MPI_LIBS)
endif
PRECISION ?= BF16
ifeq ($(PRECISION),BF16)
PRECISION_FLAG =
else ifeq ($(PRECISION),FP32)
PRECISION_FLAG = -DENABLE_FP32
else ifeq ($(PRECISION),FP16)
PRECISION_FLAG = -DENABLE_FP16
else
$(error PRECISION must be BF16, FP32 or FP16, not '$(PRECISION)')
endif
CUDA_HEADERS = $(wildcard llmc/*.cuh llmc/*/*.cuh) $(LLMC_HEADERS)
GPU_TEST_SOURCES = test/gpu/test_gpt2.cu test/gpu/test_kernels.cuh test/gpu/test_multi_gpu.cuh test/test_helpers.h train_gpt2.cu
# the tests build in the CPU reference ops (OpenMP) to check each kernel against
GPU_TEST_FLAGS = $(NVCC_HOST_FLAGS)

.PHONY: test-gpu test-gpu-oracle cuda-all

# configuration stamps (see config_stamp): switching PRECISION, MPI or the NCCL/MPI libraries rebuilds
CUDA_CONFIG = $(NVCC) $(NVCC_FLAGS) $(NVCC_HOST_FLAGS) $(NVCC_MPI_FLAGS) $(NVCC_LDLIBS)
train_gpt2cu: train_gpt2.cu $(CUDA_HEADERS) $(call config_stamp,train_gpt2cu,$(CUDA_CONFIG) $(PRECISION_FLAG))
	$(NVCC) $(NVCC_FLAGS) $(NVCC_HOST_FLAGS) $(NVCC_MPI_FLAGS) $(PRECISION_FLAG) $< $(NVCC_LDLIBS) -o $@

train_gpt2fp32cu: train_gpt2.cu $(CUDA_HEADERS) $(call config_stamp,train_gpt2fp32cu,$(CUDA_CONFIG))
	$(NVCC) $(NVCC_FLAGS) $(NVCC_HOST_FLAGS) $(NVCC_MPI_FLAGS) -DENABLE_FP32 $< $(NVCC_LDLIBS) -o $@

test_gpt2cu: $(GPU_TEST_SOURCES) $(CUDA_HEADERS) $(call config_stamp,test_gpt2cu,$(CUDA_CONFIG) $(PRECISION_FLAG))
	$(NVCC) $(NVCC_FLAGS) $(NVCC_MPI_FLAGS) $(GPU_TEST_FLAGS) $(PRECISION_FLAG) -DGPT2_TRAINER='"train_gpt2cu"' $< \
		$(GTEST_LIBS) $(NVCC_LDLIBS) -o $@

test_gpt2fp32cu: $(GPU_TEST_SOURCES) $(CUDA_HEADERS) $(call config_stamp,test_gpt2fp32cu,$(CUDA_CONFIG))
	$(NVCC) $(NVCC_FLAGS) $(NVCC_MPI_FLAGS) $(GPU_TEST_FLAGS) -DENABLE_FP32 -DGPT2_TRAINER='"train_gpt2fp32cu"' $< \
		$(GTEST_LIBS) $(NVCC_LDLIBS) -o $@

# Oracle files for the GPU suite, made with PyTorch on any machine (no GPU needed).
test-gpu-oracle: test_gpt2cu
	GPT2_ROOT=$(CURDIR) GPT2_PYTHON=$(PYTHON) ./test_gpt2cu --prepare-oracle

# Without a GPU the suite reports every test skipped and the sanitizer runs are skipped too.
test-gpu: train_gpt2cu test_gpt2cu train_gpt2
	GPT2_ROOT=$(CURDIR) GPT2_PYTHON=$(PYTHON) ./test_gpt2cu $(TEST_ARGS)
	@if ./test_gpt2cu --has-gpu; then CUDA_HOME=$(CUDA_HOME) dev/gpu/sanitize.sh ./train_gpt2cu ./test_gpt2cu; \
	else echo "test-gpu: no CUDA GPU visible, compute-sanitizer runs skipped"; fi

# the CPU side of -oo 1 (AdamW on the host) against the CPU trainer's AdamW; host code only, no GPU needed
.PHONY: bench-offload
$(BUILD)/bench_offload_adamw: dev/bench_offload_adamw.cu $(CUDA_HEADERS)
	@mkdir -p $(BUILD)
	$(NVCC) $(NVCC_FLAGS) $(NVCC_HOST_FLAGS) $< $(NVCC_LDLIBS) -o $@
bench-offload: $(BUILD)/bench_offload_adamw
	$(BUILD)/bench_offload_adamw

.PHONY: gpu-prepare
gpu-prepare:
	dev/gpu/prepare_gpu_run.sh

cuda-all:
	$(MAKE) -j2 PRECISION=BF16 train_gpt2cu test_gpt2cu train_gpt2fp32cu test_gpt2fp32cu

include dev/emu/emu.mk
# the emulated builds link MPI when mpicxx is there: a change of that rebuilds them too
EMU_CONFIG := $(call config_stamp,emu,$(EMU_CXX) $(EMU_CU_FLAGS) $(EMU_LDLIBS))
train_gpt2cu_emu train_gpt2fp32cu_emu test_gpt2cu_emu $(EMU_LIB_OBJECTS): $(EMU_CONFIG)
include dev/emu/fp16.mk
include dev/emu/fp8.mk
include dev/emu/tests.mk
