// Emulated cooperative_groups/reduce.h (dev/emu): cg::reduce over a thread_block_tile, and the operators
// the toolkit provides for it. Semantics from the CUDA C++ Programming Guide ("Cooperative Groups",
// reduce): every thread of the tile passes a value and every thread gets op applied across all of them.
//
// The reduction is a butterfly over the tile: for offset = N/2, N/4, ..., 1 each thread combines its value
// with shfl_xor(value, offset). After the step with offset o, thread r holds op over the 2o threads whose
// ranks agree with r above bit log2(2o); after offset 1, op over the whole tile. For a commutative op
// (all of the operators below) the two threads of a pair compute op(a, b) and op(b, a), the same value
// (IEEE addition is commutative), so every thread ends with the same bits. The GPU's order of the
// float additions is not documented: sums agree with it only to rounding.
//   N = 4, values a b c d: offset 2 gives a+c b+d a+c b+d; offset 1 gives (a+c)+(b+d) on every thread.
#pragma once

#include <utility>

#include "../cooperative_groups.h"

namespace cooperative_groups {

// The toolkit's operator objects: each combines two values into one (less and greater return the lesser
// or greater value itself, not a comparison).
template <typename T>
struct plus {
    T operator()(const T& a, const T& b) const { return a + b; }
};
template <typename T>
struct less {
    T operator()(const T& a, const T& b) const { return b < a ? b : a; }
};
template <typename T>
struct greater {
    T operator()(const T& a, const T& b) const { return a < b ? b : a; }
};
template <typename T>
struct bit_and {
    T operator()(const T& a, const T& b) const { return a & b; }
};
template <typename T>
struct bit_or {
    T operator()(const T& a, const T& b) const { return a | b; }
};
template <typename T>
struct bit_xor {
    T operator()(const T& a, const T& b) const { return a ^ b; }
};

// op over the values of every thread of the tile, returned to all of them
template <unsigned N, typename ParentT, typename TyArg, typename TyOp>
auto reduce(const thread_block_tile<N, ParentT>& group, TyArg&& value, TyOp&& op) -> decltype(op(value, value)) {
    using T = decltype(op(value, value));
    T acc = value;
    for (unsigned offset = N / 2; offset > 0; offset /= 2) acc = op(acc, group.shfl_xor(acc, offset));
    return acc;
}

}  // namespace cooperative_groups
