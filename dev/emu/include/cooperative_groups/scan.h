// Emulated cooperative_groups/scan.h (dev/emu): cg::inclusive_scan over a thread_block_tile (Programming
// Guide, "Cooperative Groups"): the tile's thread r gets op(v_0, op(v_1, ... v_r)), in rank order.
//
// Hillis-Steele over the tile: for d = 1, 2, 4, ... < N, each thread takes the running value of the
// thread d ranks before it (shfl_up) and puts it in front of its own: x_r <- op(x_{r-d}, x_r) for r >= d.
// After the step with d, x_r covers ranks max(0, r - 2d + 1) .. r, so after log2(N) steps, 0 .. r.
//   N = 4, values a b c d: d = 1 gives a, a+b, b+c, c+d; d = 2 gives a, a+b, a+b+c, a+b+c+d.
// exclusive_scan is not emulated (what the first thread of the tile receives is not pinned down here):
// a kernel that calls it does not compile, rather than get a guessed value.
#pragma once

#include "../cooperative_groups.h"
#include "reduce.h"  // the operator objects (plus, less, ...)

namespace cooperative_groups {

template <unsigned N, typename ParentT, typename TyVal, typename TyOp>
auto inclusive_scan(const thread_block_tile<N, ParentT>& group, TyVal&& value, TyOp&& op) -> decltype(op(value, value)) {
    using T = decltype(op(value, value));
    T acc = value;
    unsigned rank = group.thread_rank();
    for (unsigned d = 1; d < N; d *= 2) {
        T earlier = group.shfl_up(acc, d);
        if (rank >= d) acc = op(earlier, acc);
    }
    return acc;
}

template <unsigned N, typename ParentT, typename TyVal>
auto inclusive_scan(const thread_block_tile<N, ParentT>& group, TyVal&& value) {
    using T = std::remove_cv_t<std::remove_reference_t<TyVal>>;
    return inclusive_scan(group, value, plus<T>());
}

}  // namespace cooperative_groups
