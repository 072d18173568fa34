// CUDA's min and max in the global namespace (included by cuda_runtime.h, as the toolkit's headers bring
// them): kernels and host code call min(a, b) unqualified. The overloads are the CUDA Math API's list
// ("Integer Mathematical Functions", and the float and double ones), no more, so a call resolves here
// as it does under nvcc, ambiguities included:
//   same type: int, unsigned, long, unsigned long, long long, unsigned long long, float, double;
//   mixed signedness of one width: the unsigned type, both operands converted to it as C does
//     (min(-1, 1u) is min(0xffffffffu, 1u) = 1u);
//   float with double: double.
// The float and double ones are fminf/fmaxf and fmin/fmax (a NaN operand yields the other operand).
// They are plain functions, not templates, so with `using namespace std` a call with two operands of one
// type prefers them to std::min/std::max (a non-template wins a tie), and std::min and std::max
// themselves are untouched. umin, umax, llmin, llmax, ullmin, ullmax are the named forms.
#pragma once

#include <cmath>

#define EMU_INTEGER_MIN_MAX(R, A, B)                             \
    inline R min(const A a, const B b) { return (R)a < (R)b ? (R)a : (R)b; } \
    inline R max(const A a, const B b) { return (R)a < (R)b ? (R)b : (R)a; }

EMU_INTEGER_MIN_MAX(int, int, int)
EMU_INTEGER_MIN_MAX(unsigned int, unsigned int, unsigned int)
EMU_INTEGER_MIN_MAX(unsigned int, int, unsigned int)
EMU_INTEGER_MIN_MAX(unsigned int, unsigned int, int)
EMU_INTEGER_MIN_MAX(long int, long int, long int)
EMU_INTEGER_MIN_MAX(unsigned long int, unsigned long int, unsigned long int)
EMU_INTEGER_MIN_MAX(unsigned long int, long int, unsigned long int)
EMU_INTEGER_MIN_MAX(unsigned long int, unsigned long int, long int)
EMU_INTEGER_MIN_MAX(long long int, long long int, long long int)
EMU_INTEGER_MIN_MAX(unsigned long long int, unsigned long long int, unsigned long long int)
EMU_INTEGER_MIN_MAX(unsigned long long int, long long int, unsigned long long int)
EMU_INTEGER_MIN_MAX(unsigned long long int, unsigned long long int, long long int)

#undef EMU_INTEGER_MIN_MAX

inline float min(const float a, const float b) { return fminf(a, b); }
inline float max(const float a, const float b) { return fmaxf(a, b); }
inline double min(const double a, const double b) { return fmin(a, b); }
inline double max(const double a, const double b) { return fmax(a, b); }
inline double min(const float a, const double b) { return fmin((double)a, b); }
inline double max(const float a, const double b) { return fmax((double)a, b); }
inline double min(const double a, const float b) { return fmin(a, (double)b); }
inline double max(const double a, const float b) { return fmax(a, (double)b); }

inline unsigned int umin(const unsigned int a, const unsigned int b) { return min(a, b); }
inline unsigned int umax(const unsigned int a, const unsigned int b) { return max(a, b); }
inline long long int llmin(const long long int a, const long long int b) { return min(a, b); }
inline long long int llmax(const long long int a, const long long int b) { return max(a, b); }
inline unsigned long long int ullmin(const unsigned long long int a, const unsigned long long int b) { return min(a, b); }
inline unsigned long long int ullmax(const unsigned long long int a, const unsigned long long int b) { return max(a, b); }
