# The race checker's test programs (build/emu-tsan/: test_emu_core, test_emu_seeded_bugs, test_mma_emu,
# test_gpt2cu_emu, the dev/cuda programs), built by `make emu-sanitizer-test-binaries` (tests.mk) as a
# make of their own that reads only the emulator's makefiles: the top-level Makefile would record the
# race checker's compiler flags in the plain build's configuration stamp (build/config/emu), and the
# next plain make would rebuild the emulated trainers and tests for nothing.
#   make -f dev/emu/tsan.mk build/emu-tsan/test_emu_core
# override: a make run with EMU_ASAN=1 on its command line passes that on to this one
override EMU_TSAN := 1
override EMU_ASAN := 0
include dev/emu/emu.mk
