# The AddressSanitizer and initcheck build's test programs (build/emu-asan/: test_emu_core,
# test_emu_seeded_bugs, test_gpt2cu_emu, the dev/cuda programs), built by `make emu-sanitizer-test-binaries`
# (tests.mk) as a make of its own that reads only the emulator's makefiles, as tsan.mk does and for the
# same reason: the plain build's configuration stamp stays as it is.
#   make -f dev/emu/asan.mk build/emu-asan/test_gpt2cu_emu
override EMU_ASAN := 1
override EMU_TSAN := 0
include dev/emu/emu.mk
