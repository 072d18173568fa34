// Encoder: the input embedding, token embedding plus position embedding.
//   out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
// The backward scatters dout into the rows of dwte that were looked up. Many positions can share a
// token, so rows are summed into; we parallelize over channels so no two threads touch the same
// element and the sum is done in the same order every run (deterministic).
#pragma once

#include <cstddef>

template <typename Real>
void encoder_forward(Real* out,        // (B, T, C)
                     const int* inp,   // (B, T) token ids, each < V (checked by the data loader)
                     const Real* wte,  // (Vp, C)
                     const Real* wpe,  // (maxT, C)
                     int B, int T, int C) {
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            Real* out_bt = out + ((size_t)b * T + t) * C;
            const Real* wte_ix = wte + (size_t)inp[b * T + t] * C;
            const Real* wpe_t = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) out_bt[c] = wte_ix[c] + wpe_t[c];
        }
    }
}

// Accumulates (+=) into dwte and dwpe.
template <typename Real>
void encoder_backward(Real* dwte,        // (Vp, C)
                      Real* dwpe,        // (maxT, C)
                      const Real* dout,  // (B, T, C)
                      const int* inp,    // (B, T)
                      int B, int T, int C) {
#pragma omp parallel for
    for (int c = 0; c < C; c++) {
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                Real d = dout[((size_t)b * T + t) * C + c];
                dwte[(size_t)inp[b * T + t] * C + c] += d;
                dwpe[(size_t)t * C + c] += d;
            }
        }
    }
}
