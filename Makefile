# Build everything with `make`; `make test` builds and runs the CPU test suite (what CI runs).
#
#   make train_gpt2            fp32 CPU trainer (OpenMP)
#   make tokenizer_gpt2        GPT-2 BPE tokenizer and data preparation tool
#   make test                  googletest suites + PyTorch oracle (needs /usr/bin/python3 with torch)
#   make bench-cpu             step time of train_gpt2 vs the oracle's PyTorch model, same machine
#   make train_gpt2cu test_gpt2cu   CUDA trainer and its test (PRECISION=BF16|FP32)
#   make cuda-all              compile every CUDA target for sm_80 and sm_90 (CI does this)

CXX ?= g++
# -march=native: the binary runs where it is built (`make` on the training machine); override with
# `make CPU_ARCH=-march=x86-64-v3` to build for another machine.
CPU_ARCH ?= -march=native
CXXFLAGS ?= -O3 $(CPU_ARCH) -std=c++17 -fopenmp -Wall -Wextra -Wno-unused-parameter
LDLIBS_CPU = -lm
PYTHON ?= /usr/bin/python3
BUILD = build

LLMC_HEADERS = $(wildcard llmc/*.h)

.PHONY: all test bench-cpu clean cuda-all

all: train_gpt2 tokenizer_gpt2

train_gpt2: train_gpt2.cpp $(LLMC_HEADERS)
	$(CXX) $(CXXFLAGS) $< $(LDLIBS_CPU) -o $@

# ---------------------------------------------------------------------------
# tokenizer (see doc/tokenizer.md)
TOKENIZER_LIBS = $(shell pkg-config --libs libpcre2-8 2>/dev/null || echo -lpcre2-8)

tokenizer_gpt2: tokenizer_gpt2.cpp $(LLMC_HEADERS)
	$(CXX) $(CXXFLAGS) $< $(TOKENIZER_LIBS) -lpthread -o $@

# ---------------------------------------------------------------------------
# tests: one googletest binary for all CPU suites, so CI reads one summary

TEST_SOURCES = $(wildcard test/test_*.cpp)
GTEST_LIBS = -lgtest -lpthread

$(BUILD)/test_cpu: $(TEST_SOURCES) train_gpt2.cpp $(LLMC_HEADERS) | $(BUILD)
	$(CXX) $(CXXFLAGS) -Itest $(TEST_SOURCES) $(GTEST_LIBS) $(TOKENIZER_LIBS) $(LDLIBS_CPU) -o $@

$(BUILD):
	mkdir -p $(BUILD)

# The test binary finds the trainer, the tokenizer tool and the oracle through these variables.
test: $(BUILD)/test_cpu train_gpt2 tokenizer_gpt2
	GPT2_ROOT=$(CURDIR) GPT2_PYTHON=$(PYTHON) OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BUILD)/test_cpu $(TEST_ARGS)

bench-cpu: train_gpt2
	$(PYTHON) dev/bench_cpu.py

clean:
	rm -rf $(BUILD) train_gpt2 tokenizer_gpt2 train_gpt2cu train_gpt2fp32cu test_gpt2cu test_gpt2fp32cu
