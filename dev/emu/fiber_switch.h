// Switching between fibers (the CUDA threads of a block, and the block's scheduler), for exec.cpp.
//
//   Context c = fiber_make(top, bytes, fn);  a fiber that will run fn(Transfer) on the stack below top
//   Transfer t = fiber_jump(c, data);       save this fiber's registers, resume c; returns when some fiber
//                                            jumps back here: t.fctx is where that fiber can be resumed,
//                                            t.data what it passed
//
// The x86-64 functions are defined here, in assembly: include this header in one source file only.
//
// On x86-64 (System V) the switch is the few lines of assembly below: push the six callee-saved
// registers, swap stack pointers, pop the other fiber's six, return on its stack. The caller-saved
// registers need no saving (the compiler assumes a call clobbers them). What it leaves out, on purpose,
// is the floating-point control state (the SSE MXCSR and the x87 control word), which Boost.Context's
// jump_fcontext saves and loads on every switch. Nothing in the emulator or the code it runs changes
// the rounding mode or flush-to-zero, so every fiber's control state is the host thread's, and carrying
// it over would be a no-op. Measured on a 40-step emulated training run of the tiny test model (one
// thread), with fiber-to-fiber switching: 3.7 s with this switch against 4.2 s with jump_fcontext.
// Other architectures keep Boost.Context.
//
// A new fiber's stack holds the six registers' starting values and, as its "return address",
// emu_fiber_start, which passes the two values the jump left in rax and rdx (the Transfer) to fn, kept
// in r12's slot. fn must never return (exec.cpp's fiber_main loops for ever).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__x86_64__)

extern "C" {
struct EmuFiberTransfer {  // as Boost's transfer_t
    void* fctx;  // where the fiber that jumped here resumes
    void* data;
};
EmuFiberTransfer emu_fiber_jump(void* to, void* data);
void emu_fiber_start();
}

// the pops in the order of the frame fiber_make lays out below
asm(R"(
    .text
    .p2align 4
    .globl emu_fiber_jump
    .hidden emu_fiber_jump
    .type emu_fiber_jump, @function
emu_fiber_jump:
    pushq %rbp
    pushq %rbx
    pushq %r15
    pushq %r14
    pushq %r13
    pushq %r12
    movq %rsp, %rax
    movq %rdi, %rsp
    popq %r12
    popq %r13
    popq %r14
    popq %r15
    popq %rbx
    popq %rbp
    movq %rsi, %rdx
    ret
    .size emu_fiber_jump, .-emu_fiber_jump

    .p2align 4
    .globl emu_fiber_start
    .hidden emu_fiber_start
    .type emu_fiber_start, @function
emu_fiber_start:
    movq %rax, %rdi
    movq %rdx, %rsi
    callq *%r12
    ud2
    .size emu_fiber_start, .-emu_fiber_start
)");

namespace emu_fiber {

using Context = void*;
using Transfer = EmuFiberTransfer;

inline Transfer fiber_jump(Context to, void* data) { return emu_fiber_jump(to, data); }

inline Context fiber_make(char* stack_top, size_t /*stack_bytes*/, void (*fn)(Transfer)) {
    // 16-byte aligned top; below it the frame emu_fiber_jump pops: r12 (= fn), r13, r14, r15, rbx, rbp,
    // the return address (emu_fiber_start), and 16 bytes so that emu_fiber_start's call finds rsp
    // 16-byte aligned, as the ABI wants at a call
    uintptr_t top = (uintptr_t)stack_top & ~(uintptr_t)15;
    uint64_t* frame = (uint64_t*)(top - 9 * sizeof(uint64_t));
    frame[0] = (uint64_t)(uintptr_t)fn;
    for (int i = 1; i < 6; i++) frame[i] = 0;
    frame[6] = (uint64_t)(uintptr_t)&emu_fiber_start;
    frame[7] = frame[8] = 0;
    return frame;
}

}  // namespace emu_fiber

#else  // other architectures: Boost.Context

#include <boost/context/detail/fcontext.hpp>

namespace emu_fiber {

using Context = boost::context::detail::fcontext_t;
using Transfer = boost::context::detail::transfer_t;

inline Transfer fiber_jump(Context to, void* data) { return boost::context::detail::jump_fcontext(to, data); }

inline Context fiber_make(char* stack_top, size_t stack_bytes, void (*fn)(Transfer)) {
    return boost::context::detail::make_fcontext(stack_top, stack_bytes, fn);
}

}  // namespace emu_fiber

#endif
