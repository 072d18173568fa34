# FP16 in the CUDA emulator (issue 13): the cuda_fp16.h unit test and the fp16 trainer, built like
# emu.mk's targets. Included by the top-level Makefile after emu.mk.
#
#   make emu-test-fp16        conversions of dev/emu/include/cuda_fp16.h against hand-worked bit patterns
#   make train_gpt2fp16cu_emu test_gpt2fp16cu_emu   the FP16 build (dynamic loss scaling) under the emulator

.PHONY: emu-test-fp16

$(EMU_BUILD)/test_emu_fp16: $(EMU_DIR)/test_emu_fp16.cpp $(EMU_DIR)/include/cuda_fp16.h
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 $(EMU_OPT) -I$(EMU_DIR)/include -DCUDA_EMULATION -include $(EMU_DIR)/prelude.h $< -lgtest -lgtest_main -lpthread -o $@

emu-test-fp16: $(EMU_BUILD)/test_emu_fp16
	$(EMU_BUILD)/test_emu_fp16 $(TEST_ARGS)

train_gpt2fp16cu_emu: $(EMU_BUILD)/src.stamp $(EMU_LINK) $(EMU_FLAVOR_STAMP)
	$(EMU_CXX) $(EMU_CU_FLAGS) -DENABLE_FP16 $(EMU_SRC)/train_gpt2.cu -x none $(EMU_LINK) $(EMU_LDLIBS) -o $@

test_gpt2fp16cu_emu: $(EMU_BUILD)/src.stamp $(EMU_LINK) $(EMU_FLAVOR_STAMP)
	$(EMU_CXX) $(EMU_CU_FLAGS) -fopenmp -DENABLE_FP16 -DGPT2_TRAINER='"train_gpt2fp16cu_emu"' $(EMU_SRC)/test/gpu/test_gpt2.cu -x none \
		$(EMU_LINK) -lgtest -lgomp $(EMU_LDLIBS) -o $@
