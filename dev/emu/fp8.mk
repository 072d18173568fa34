# FP8 in the CUDA emulator (issue 48, item 2): the cuda_fp8.h unit test, against PyTorch's float8 casts
# recorded in dev/emu/fp8_reference.txt (dev/emu/fp8_reference.py remakes it). Included by the top-level
# Makefile after emu.mk.
#
#   make emu-test-fp8        the conversions of dev/emu/include/cuda_fp8.h

.PHONY: emu-test-fp8

$(EMU_BUILD)/test_emu_fp8: $(EMU_DIR)/test_emu_fp8.cpp $(EMU_DIR)/include/cuda_fp8.h $(EMU_DIR)/include/cuda_fp16.h
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 $(EMU_OPT) -I$(EMU_DIR)/include -DCUDA_EMULATION -include $(EMU_DIR)/prelude.h $< -lgtest -lgtest_main -lpthread -o $@

emu-test-fp8: $(EMU_BUILD)/test_emu_fp8
	GPT2_ROOT=$(CURDIR) $(EMU_BUILD)/test_emu_fp8 $(TEST_ARGS)
