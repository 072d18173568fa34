// The bias gradient of a Linear layer, version by version: dbias[o] += sum over n of dout[n, o], for
// dout (N, OC) = (8192, 3072) (the fc layer's; the other layers have OC = 2304 and 768). Checked against
// matmul_backward() of llmc/matmul.h called with C = 0: its two products are then empty and it computes
// only the bias gradient, with the same code the CPU trainer runs. Timed.
//
// dbias is added into, so it starts each run from random values instead of poison.
//
// The two numbers: read dout once, 50 MB, ~17 us at 3 TB/s. A column sum: the natural parallelization
// (a thread per column) has only OC threads, so the lesson is how to split the rows across blocks and
// still add the pieces in a fixed order (no atomics on the values: the result is the same every run).
//
//   make -C dev/cuda bin/matmul_backward_bias && dev/cuda/bin/matmul_backward_bias
#include "harness.cuh"

#include "../../llmc/matmul.cuh"
#include "../../llmc/matmul.h"

// ----------------------------------------------------------------------------
// v1: one thread per column, summing all N rows. Coalesced (a warp reads 32 neighbouring columns of a
// row), but 3072 threads is 24 blocks of 128: a fifth of the SMs, each with a few warps, each warp
// with one 2-byte load in flight.

__global__ void matmul_backward_bias_v1_kernel(floatX* dbias, const floatX* dout, int N, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) return;
    float sum = 0.0f;
    for (int n = 0; n < N; n++) sum += (float)dout[(size_t)n * OC + o];
    dbias[o] = (floatX)((float)dbias[o] + sum);
}

void matmul_backward_bias_v1(floatX* dbias, const floatX* dout, int N, int OC, int block_size) {
    matmul_backward_bias_v1_kernel<<<ceil_div_int(OC, block_size), block_size>>>(dbias, dout, N, OC);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v2 is llmc's bias gradient (the first two launches of matmul_backward in llmc/matmul.cuh, launched
// here the way that function does): a fixed grid of MATMUL_DBIAS_ROW_BLOCKS row blocks, each block of
// (32, 8) threads summing 256 columns (16 bytes per thread) over its rows into an fp32 partial row;
// then a second kernel adds the partials in row-block order. Full-width loads and the whole GPU busy.

void matmul_backward_bias_v2(floatX* dbias, float* scratch, const floatX* dout, int N, int OC) {
    dim3 grid(ceil_div_int(OC / x128::size, WARP_SIZE), MATMUL_DBIAS_ROW_BLOCKS);
    dim3 block(WARP_SIZE, MATMUL_DBIAS_ROWS_PER_BLOCK);
    matmul_dbias_partials_kernel<<<grid, block>>>(scratch, dout, N, OC);
    cudaCheckLaunch();
    matmul_dbias_sum_partials_kernel<<<ceil_div_int(OC, 256), 256>>>(dbias, scratch, MATMUL_DBIAS_ROW_BLOCKS, OC);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v3: v2 in one launch. Each block writes its partial row, then takes a ticket from a counter for its
// column group (after a __threadfence, so its partials are visible before the ticket is); the block
// that draws the last ticket adds all the partials of its columns, in row-block order, and resets the
// counter. Which block is last varies; the order of the sum does not, so the result is deterministic.
// Saves the second launch and its tail; the block size (rows of threads) is swept.

constexpr int DBIAS_ROW_BLOCKS = 128;
constexpr int DBIAS_MAX_ROWS = 32;

__global__ void matmul_backward_bias_v3_kernel(floatX* dbias, float* partials,  // (gridDim.y, OC)
                                               unsigned int* tickets,           // (gridDim.x), zero between launches
                                               const floatX* dout, int N, int OC) {
    __shared__ float shared[DBIAS_MAX_ROWS][WARP_SIZE][x128::size];
    __shared__ bool is_last;
    int group_start = blockIdx.x * WARP_SIZE * x128::size;
    int o = group_start + threadIdx.x * x128::size;
    bool active = o < OC;
    float sum[x128::size] = {};
    if (active) {
        for (int n = blockIdx.y * blockDim.y + threadIdx.y; n < N; n += gridDim.y * blockDim.y) {
            x128 d = load128cs(dout + (size_t)n * OC + o);
#pragma unroll
            for (int k = 0; k < x128::size; k++) sum[k] += (float)d[k];
        }
    }
#pragma unroll
    for (int k = 0; k < x128::size; k++) shared[threadIdx.y][threadIdx.x][k] = sum[k];
    __syncthreads();
    if (threadIdx.y == 0 && active) {
        for (int y = 1; y < blockDim.y; y++) {
#pragma unroll
            for (int k = 0; k < x128::size; k++) sum[k] += shared[y][threadIdx.x][k];
        }
#pragma unroll
        for (int k = 0; k < x128::size; k++) partials[(size_t)blockIdx.y * OC + o + k] = sum[k];
        __threadfence();  // the partial row is visible to the whole GPU before this block's ticket is taken
    }
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0) {
        is_last = atomicAdd(&tickets[blockIdx.x], 1u) == gridDim.y - 1;
        __threadfence();  // with the fence before every other block's ticket: their partials are seen
    }
    __syncthreads();
    if (!is_last) return;
    // the last block of this column group: add the group's partials in row-block order
    int threads = blockDim.x * blockDim.y, tid = threadIdx.y * blockDim.x + threadIdx.x;
    for (int col = tid; col < WARP_SIZE * x128::size; col += threads) {
        int column = group_start + col;
        if (column >= OC) break;
        float total = 0.0f;
        for (int r = 0; r < gridDim.y; r++) total += __ldcg(partials + (size_t)r * OC + column);
        dbias[column] = (floatX)((float)dbias[column] + total);
    }
    // atomic: a plain store would race with the other blocks' atomicAdds on the same ticket (the race
    // checker, dev/emu/README.md, reports it; the PTX memory model calls it a data race)
    if (tid == 0) atomicExch(&tickets[blockIdx.x], 0u);
}

void matmul_backward_bias_v3(floatX* dbias, float* scratch, unsigned int* tickets, const floatX* dout, int N, int OC,
                             int block_size) {
    int rows = block_size / WARP_SIZE;
    if (OC % x128::size != 0 || rows < 1 || rows > DBIAS_MAX_ROWS) {
        fatal("matmul_backward_bias_v3: OC %d must be divisible by %d, block size %d at most %d", OC, x128::size,
              block_size, DBIAS_MAX_ROWS * WARP_SIZE);
    }
    dim3 grid(ceil_div_int(OC / x128::size, WARP_SIZE), DBIAS_ROW_BLOCKS);
    dim3 block(WARP_SIZE, rows);
    matmul_backward_bias_v3_kernel<<<grid, block>>>(dbias, scratch, tickets, dout, N, OC);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    dev::device_init("matmul_backward_bias", argc, argv);
    const int N = dev::B * dev::T, OC = 4 * dev::C;

    std::vector<float> dout = dev::random_floatX((size_t)N * OC, -1.0f, 1.0f);
    std::vector<float> dbias0 = dev::random_floatX(OC, -1.0f, 1.0f);
    std::vector<float> ref = dbias0;
    // C = 0: matmul_backward's products are empty, only dbias is computed
    matmul_backward<float>(nullptr, nullptr, ref.data(), dout.data(), nullptr, nullptr, N, 0, OC);

    dev::DeviceBuffer<floatX> d_dout((size_t)N * OC), d_dbias(OC), d_dbias0(OC);
    size_t scratch_floats = std::max(matmul_backward_scratch_floats(OC), (size_t)DBIAS_ROW_BLOCKS * OC);
    dev::DeviceBuffer<float> d_scratch(scratch_floats);
    dev::DeviceBuffer<unsigned int> d_tickets(ceil_div_int(OC / x128::size, WARP_SIZE));
    cudaCheck(cudaMemset(d_tickets.ptr, 0, d_tickets.bytes()));
    dev::upload(d_dout, dout);
    dev::upload(d_dbias0, dbias0);

    double bytes = (double)N * OC * sizeof(floatX) + 2.0 * OC * sizeof(floatX);
    dev::Report report = dev::make_report("matmul_backward_bias", bytes, 0.0);
    std::vector<dev::Version> versions = {
        {"v1 one thread per column", {64, 128, 256, 512},
         [&](int bs) { matmul_backward_bias_v1(d_dbias.ptr, d_dout.ptr, N, OC, bs); }},
        {"v2 llmc: row-block partials + sum kernel", {0},
         [&](int) { matmul_backward_bias_v2(d_dbias.ptr, d_scratch.ptr, d_dout.ptr, N, OC); }},
        {"v3 v2 in one launch: last block sums", {128, 256, 512, 1024},
         [&](int bs) { matmul_backward_bias_v3(d_dbias.ptr, d_scratch.ptr, d_tickets.ptr, d_dout.ptr, N, OC, bs); }},
    };
    dev::run_versions(&report, versions, [&] { dev::copy(d_dbias, d_dbias0); },
                      [&] {
                          dev::CheckResult result;
                          dev::check_tensor(&result, "dbias", dev::download(d_dbias), ref, dev::TOL_REDUCTION);
                          return result;
                      });
    return dev::finish(report);
}
