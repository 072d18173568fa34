// Launching a kernel named by an overload set or a template (included at the end of emu/kernel.h).
//
// A kernel's name may be an overload set, as in `__global__ void gelu_forward(float*, const float*, int)`
// next to a host `void gelu_forward(float*, const float*, int, int)` that launches it: CUDA picks the
// overload the launch's arguments fit. kernel.h's `operator*(void (*)(P...), PendingLaunch)` cannot be
// deduced from an overload set whose members all return void (each would match). The operators below
// take a pointer to a function of exactly n parameters, for n = 1 .. 32, and are viable only when the
// launch passes n arguments: deduction against an overload set then considers only its members of n
// parameters, so the kernel is found when it is the one overload with as many parameters as the launch
// has arguments. (Overloads with the same count, or kernels of over 32 parameters that share their name,
// are not resolved: a compile error, "no match for operator*".) Where the name is not overloaded the
// n-parameter operator is chosen over kernel.h's (it is more specialized); both call emu::launch.
//   gelu_forward *emu::LaunchConfig{g, b}(out, inp, N)   // 3 arguments: only the 3-parameter overload
//                                                         // is tried, the __global__ one
#pragma once

#include <type_traits>
#include <utility>

// EMU_PARAMS_n(m): m(1), m(2), ..., m(n)
#define EMU_PARAMS_1(m) m(1)
#define EMU_PARAMS_2(m) EMU_PARAMS_1(m), m(2)
#define EMU_PARAMS_3(m) EMU_PARAMS_2(m), m(3)
#define EMU_PARAMS_4(m) EMU_PARAMS_3(m), m(4)
#define EMU_PARAMS_5(m) EMU_PARAMS_4(m), m(5)
#define EMU_PARAMS_6(m) EMU_PARAMS_5(m), m(6)
#define EMU_PARAMS_7(m) EMU_PARAMS_6(m), m(7)
#define EMU_PARAMS_8(m) EMU_PARAMS_7(m), m(8)
#define EMU_PARAMS_9(m) EMU_PARAMS_8(m), m(9)
#define EMU_PARAMS_10(m) EMU_PARAMS_9(m), m(10)
#define EMU_PARAMS_11(m) EMU_PARAMS_10(m), m(11)
#define EMU_PARAMS_12(m) EMU_PARAMS_11(m), m(12)
#define EMU_PARAMS_13(m) EMU_PARAMS_12(m), m(13)
#define EMU_PARAMS_14(m) EMU_PARAMS_13(m), m(14)
#define EMU_PARAMS_15(m) EMU_PARAMS_14(m), m(15)
#define EMU_PARAMS_16(m) EMU_PARAMS_15(m), m(16)
#define EMU_PARAMS_17(m) EMU_PARAMS_16(m), m(17)
#define EMU_PARAMS_18(m) EMU_PARAMS_17(m), m(18)
#define EMU_PARAMS_19(m) EMU_PARAMS_18(m), m(19)
#define EMU_PARAMS_20(m) EMU_PARAMS_19(m), m(20)
#define EMU_PARAMS_21(m) EMU_PARAMS_20(m), m(21)
#define EMU_PARAMS_22(m) EMU_PARAMS_21(m), m(22)
#define EMU_PARAMS_23(m) EMU_PARAMS_22(m), m(23)
#define EMU_PARAMS_24(m) EMU_PARAMS_23(m), m(24)
#define EMU_PARAMS_25(m) EMU_PARAMS_24(m), m(25)
#define EMU_PARAMS_26(m) EMU_PARAMS_25(m), m(26)
#define EMU_PARAMS_27(m) EMU_PARAMS_26(m), m(27)
#define EMU_PARAMS_28(m) EMU_PARAMS_27(m), m(28)
#define EMU_PARAMS_29(m) EMU_PARAMS_28(m), m(29)
#define EMU_PARAMS_30(m) EMU_PARAMS_29(m), m(30)
#define EMU_PARAMS_31(m) EMU_PARAMS_30(m), m(31)
#define EMU_PARAMS_32(m) EMU_PARAMS_31(m), m(32)

#define EMU_TYPENAME_P(i) typename P##i
#define EMU_P(i) P##i
#define EMU_LAUNCH_OF_ARITY(n)                                                               \
    namespace emu {                                                                          \
    template <EMU_PARAMS_##n(EMU_TYPENAME_P), typename... A, std::enable_if_t<sizeof...(A) == n, int> = 0> \
    void operator*(void (*kernel)(EMU_PARAMS_##n(EMU_P)), PendingLaunch<A...>&& pending) {   \
        launch(kernel, std::move(pending));                                                  \
    }                                                                                        \
    }
EMU_LAUNCH_OF_ARITY(1)
EMU_LAUNCH_OF_ARITY(2)
EMU_LAUNCH_OF_ARITY(3)
EMU_LAUNCH_OF_ARITY(4)
EMU_LAUNCH_OF_ARITY(5)
EMU_LAUNCH_OF_ARITY(6)
EMU_LAUNCH_OF_ARITY(7)
EMU_LAUNCH_OF_ARITY(8)
EMU_LAUNCH_OF_ARITY(9)
EMU_LAUNCH_OF_ARITY(10)
EMU_LAUNCH_OF_ARITY(11)
EMU_LAUNCH_OF_ARITY(12)
EMU_LAUNCH_OF_ARITY(13)
EMU_LAUNCH_OF_ARITY(14)
EMU_LAUNCH_OF_ARITY(15)
EMU_LAUNCH_OF_ARITY(16)
EMU_LAUNCH_OF_ARITY(17)
EMU_LAUNCH_OF_ARITY(18)
EMU_LAUNCH_OF_ARITY(19)
EMU_LAUNCH_OF_ARITY(20)
EMU_LAUNCH_OF_ARITY(21)
EMU_LAUNCH_OF_ARITY(22)
EMU_LAUNCH_OF_ARITY(23)
EMU_LAUNCH_OF_ARITY(24)
EMU_LAUNCH_OF_ARITY(25)
EMU_LAUNCH_OF_ARITY(26)
EMU_LAUNCH_OF_ARITY(27)
EMU_LAUNCH_OF_ARITY(28)
EMU_LAUNCH_OF_ARITY(29)
EMU_LAUNCH_OF_ARITY(30)
EMU_LAUNCH_OF_ARITY(31)
EMU_LAUNCH_OF_ARITY(32)

#undef EMU_LAUNCH_OF_ARITY

// A kernel template launched without its template arguments, as CUDA allows (they are deduced from the
// launch's arguments: `norm_kernel<<<g, b>>>(out, values, n)` for `template <class T> __global__ void
// norm_kernel(float*, const T*, size_t)`): a template name cannot be deduced against `void (*)(P...)`
// either. This operator's kernel parameter is `void (*)(A...)` with A the launch's own argument types
// (deduced from the PendingLaunch alone, decay_t making the first operand a non-deduced context), so
// the template name converts to that pointer type and its arguments are deduced from it. That needs
// each argument to have the parameter's exact type (float* for const T* does not deduce: a compile
// error, "no match for operator*"; write the template arguments then, kernel<float><<<...>>>).
namespace emu {
template <typename... A>
void operator*(void (*kernel)(std::decay_t<A>...), PendingLaunch<A...>&& pending) {
    launch(kernel, std::move(pending));
}
}  // namespace emu
#undef EMU_P
#undef EMU_TYPENAME_P
