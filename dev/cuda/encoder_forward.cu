// Encoder forward, version by version: out[b,t,:] = wte[inp[b,t],:] + wpe[t,:] for (B, T, C) =
// (8, 1024, 768), token ids drawn with text's Zipf skew. Checked against encoder_forward() of
// llmc/encoder.h and timed.
//
// The two numbers: a gathered row of wte per position (12.6 MB), wpe once (1.6 MB; the B re-reads hit
// L2), the ids (32 KB), out written (12.6 MB): 27 MB, ~9 us at 3 TB/s. Pure data movement.
//
//   make -C dev/cuda bin/encoder_forward && dev/cuda/bin/encoder_forward
#include "harness.cuh"

#include "../../llmc/encoder.cuh"
#include "../../llmc/encoder.h"

// ----------------------------------------------------------------------------
// v1: one thread per output element, 2-byte loads and stores, and a division and a modulo per element
// to find (b, t, c). Coalesced, but 8 times the memory instructions of 16-byte accesses.

__global__ void encoder_forward_v1_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B,
                                          int T, int C) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * T * C) return;
    int bt = idx / C;
    int t = bt % T;
    int c = idx % C;
    out[idx] = (floatX)((float)wte[(size_t)inp[bt] * C + c] + (float)wpe[(size_t)t * C + c]);
}

void encoder_forward_v1(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B, int T, int C,
                        int block_size) {
    encoder_forward_v1_kernel<<<ceil_div_int((long)B * T * C, block_size), block_size>>>(out, inp, wte, wpe, B, T, C);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v2 is llmc's encoder_forward (llmc/encoder.cuh): one thread per 16 bytes of output. Each thread
// still reads the token id and does the index arithmetic for its own 8 elements.

// ----------------------------------------------------------------------------
// v3: one warp per position (b, t). The token id is loaded once per row (one broadcast load), the
// row's 16-byte chunks (C / 256 = 3 per lane at C = 768) are all loaded before the first add, and the
// output is stored with a streaming hint. No division per element.

constexpr int ENC_MAX_CHUNKS = 4;  // 16-byte chunks per lane; C <= 32 * 8 * 4 = 1024

__global__ void encoder_forward_v3_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B,
                                          int T, int C) {
    int bt = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (bt >= B * T) return;
    int lane = threadIdx.x % WARP_SIZE;
    int t = bt % T;
    const floatX* token_row = wte + (size_t)inp[bt] * C;
    const floatX* position_row = wpe + (size_t)t * C;
    x128 a[ENC_MAX_CHUNKS], p[ENC_MAX_CHUNKS];
#pragma unroll
    for (int j = 0; j < ENC_MAX_CHUNKS; j++) {
        int c = (j * WARP_SIZE + lane) * x128::size;
        if (c < C) {
            a[j] = load128(token_row + c);
            p[j] = load128(position_row + c);
        }
    }
#pragma unroll
    for (int j = 0; j < ENC_MAX_CHUNKS; j++) {
        int c = (j * WARP_SIZE + lane) * x128::size;
        if (c >= C) continue;
        x128 r;
#pragma unroll
        for (int k = 0; k < x128::size; k++) r[k] = (floatX)((float)a[j][k] + (float)p[j][k]);
        store128cs(out + (size_t)bt * C + c, r);
    }
}

void encoder_forward_v3(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B, int T, int C,
                        int block_size) {
    if (C % x128::size != 0 || C > ENC_MAX_CHUNKS * WARP_SIZE * x128::size) {
        fatal("encoder_forward_v3 needs C divisible by %d and at most %d, got %d", x128::size,
              ENC_MAX_CHUNKS * WARP_SIZE * x128::size, C);
    }
    int rows_per_block = block_size / WARP_SIZE;
    encoder_forward_v3_kernel<<<ceil_div_int(B * T, rows_per_block), block_size>>>(out, inp, wte, wpe, B, T, C);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    dev::device_init("encoder_forward", argc, argv);
    const int B = dev::B, T = dev::T, C = dev::C, Vp = dev::Vp;

    std::vector<int> inp = dev::random_tokens((size_t)B * T, dev::V);
    std::vector<float> wte = dev::random_floatX((size_t)Vp * C, -1.0f, 1.0f);
    std::vector<float> wpe = dev::random_floatX((size_t)T * C, -1.0f, 1.0f);
    std::vector<float> ref((size_t)B * T * C);
    encoder_forward(ref.data(), inp.data(), wte.data(), wpe.data(), B, T, C);

    dev::DeviceBuffer<int> d_inp((size_t)B * T);
    dev::DeviceBuffer<floatX> d_wte((size_t)Vp * C), d_wpe((size_t)T * C), d_out((size_t)B * T * C);
    dev::upload(d_inp, inp);
    dev::upload(d_wte, wte);
    dev::upload(d_wpe, wpe);

    double bytes = (2.0 * B * T * C + (double)T * C) * sizeof(floatX) + (double)B * T * sizeof(int);
    dev::Report report = dev::make_report("encoder_forward", bytes, 0.0);
    std::vector<dev::Version> versions = {
        {"v1 one thread per element", {128, 256, 512, 1024},
         [&](int bs) { encoder_forward_v1(d_out.ptr, d_inp.ptr, d_wte.ptr, d_wpe.ptr, B, T, C, bs); }},
        {"v2 llmc: 16 bytes per thread", {0},
         [&](int) { encoder_forward(d_out.ptr, d_inp.ptr, d_wte.ptr, d_wpe.ptr, B, T, C, 0); }},
        {"v3 one warp per position", {64, 128, 256, 512, 1024},
         [&](int bs) { encoder_forward_v3(d_out.ptr, d_inp.ptr, d_wte.ptr, d_wpe.ptr, B, T, C, bs); }},
    };
    dev::run_versions(&report, versions, [&] { dev::poison(d_out); },
                      [&] {
                          dev::CheckResult result;
                          dev::check_tensor(&result, "out", dev::download(d_out), ref, dev::TOL_ELEMENTWISE);
                          return result;
                      });
    return dev::finish(report);
}
