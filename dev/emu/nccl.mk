# The emulated NCCL's tests (dev/emu/test_nccl_emu.cpp): 2 and 3 ranks under mpirun, and one process
# without MPI. Included after emu.mk (it uses emu.mk's objects and flags); on its own:
#
#   make -j2 -f dev/emu/emu.mk -f dev/emu/nccl.mk TRAIN_CXX="OMPI_CXX=g++ mpicxx -DUSE_MPI -DOMPI_SKIP_MPICXX" emu-test-nccl
#
# (the top-level Makefile sets TRAIN_CXX to mpicxx when it finds it; emu.mk compiles nccl*.cpp with it)
#
# Needs Open MPI (mpicxx, mpirun): the emulation runs NCCL over MPI. mpirun runs as CI runs it: as
# root, more processes than cores.

NCCL_EMU_OBJECTS := $(patsubst $(EMU_DIR)/%.cpp,$(EMU_BUILD)/obj/%.o,$(wildcard $(EMU_DIR)/nccl*.cpp))
NCCL_EMU_MPIRUN = timeout 300 mpirun --allow-run-as-root --oversubscribe

.PHONY: emu-test-nccl

$(EMU_BUILD)/test_nccl_emu: $(EMU_DIR)/test_nccl_emu.cpp $(EMU_CORE_OBJECTS) $(NCCL_EMU_OBJECTS) llmc/parallel/comm.h llmc/parallel/comm_mpi.h
	$(EMU_CXX) $(EMU_BASE_FLAGS) -I. $< $(EMU_CORE_OBJECTS) $(NCCL_EMU_OBJECTS) $(EMU_LDLIBS) -o $@

ifneq ($(findstring USE_MPI,$(EMU_CXX)),)
emu-test-nccl: $(EMU_BUILD)/test_nccl_emu
	$(NCCL_EMU_MPIRUN) -np 2 $(EMU_BUILD)/test_nccl_emu
	$(NCCL_EMU_MPIRUN) -np 3 $(EMU_BUILD)/test_nccl_emu
	timeout 300 $(EMU_BUILD)/test_nccl_emu --no-mpi
else
emu-test-nccl:
	@echo "emu-test-nccl: needs Open MPI's mpicxx and mpirun (the NCCL emulation runs over MPI); skipped"
endif

# llmc/parallel/comm.h's checks on its NCCL backend: test/comm_check.cpp compiled as CUDA for the emulator
# (the MPI backend's build is the top-level Makefile's build/comm_check); run under mpirun -np 2 or 3
# with EMU_DEVICE_COUNT set to the process count.
$(EMU_BUILD)/src/test/comm_check.cpp: test/comm_check.cpp $(EMU_DIR)/cu2cpp.sh
	$(EMU_DIR)/cu2cpp.sh $(EMU_SRC) test/comm_check.cpp

$(EMU_BUILD)/comm_check_nccl: $(EMU_BUILD)/src/test/comm_check.cpp $(EMU_BUILD)/src.stamp $(EMU_LINK) $(EMU_FLAVOR_STAMP)
	$(EMU_CXX) $(EMU_CU_FLAGS) -DCOMM_CHECK_NCCL $< -x none $(EMU_LINK) $(EMU_LDLIBS) -o $@
