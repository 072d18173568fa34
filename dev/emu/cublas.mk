# The emulated cuBLAS/cuBLASLt's unit tests (dev/emu/test_cublas_emu.cpp). Included after emu.mk (it
# uses emu.mk's objects and flags); on its own:
#
#   make -j2 -f dev/emu/emu.mk -f dev/emu/cublas.mk emu-test-cublas

CUBLAS_EMU_OBJECTS := $(patsubst $(EMU_DIR)/%.cpp,$(EMU_BUILD)/obj/%.o,$(wildcard $(EMU_DIR)/cublas*.cpp))

.PHONY: emu-test-cublas

$(EMU_BUILD)/test_cublas_emu: $(EMU_DIR)/test_cublas_emu.cpp $(EMU_CORE_OBJECTS) $(CUBLAS_EMU_OBJECTS)
	$(CXX) $(EMU_BASE_FLAGS) $< $(EMU_CORE_OBJECTS) $(CUBLAS_EMU_OBJECTS) -lgtest -lgtest_main $(EMU_LDLIBS) -o $@

emu-test-cublas: $(EMU_BUILD)/test_cublas_emu
	$(EMU_BUILD)/test_cublas_emu $(TEST_ARGS)
