// NCCL all-reduce demo: the gradient all-reduce of data-parallel training, on every GPU of this machine
// from one process (one communicator per GPU, ncclCommInitAll). Each rank holds GPT-2 124M's 124,475,904
// bf16 gradients; after ncclAllReduce(sum) every rank holds the elementwise sum. Checked against the
// sum computed on the host, then timed.
//
// With one GPU it still runs: a 1-rank communicator, for which the all-reduce is a device copy (read
// the send buffer, write the receive buffer), so its rate is compared with the measured copy bandwidth.
// With n > 1 GPUs it prints NCCL's two conventional rates: algbw = buffer bytes / time, and
// busbw = algbw * 2(n-1)/n, the bytes each link carries in a ring all-reduce; their ceiling is the
// NVLink (or PCIe) bandwidth, which this program does not measure.
//
// Tolerance: bf16 sums of n values rounded once or a few times on the way (NCCL reduces in steps):
// TOL_REDUCTION; with one rank the copy must be exact.
//
//   make -C dev/cuda bin/nccl_all_reduce && dev/cuda/bin/nccl_all_reduce
#include <chrono>

#include <nccl.h>

#include "harness.cuh"

inline void nccl_check(ncclResult_t result, const char* file, int line) {
    if (result != ncclSuccess) fatal("NCCL: %s  [%s:%d]", ncclGetErrorString(result), file, line);
}
#define ncclCheck(result) nccl_check((result), __FILE__, __LINE__)

struct Rank {
    int device = 0;
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    floatX* send = nullptr;  // (count)
    floatX* recv = nullptr;  // (count)
};

// one all-reduce on every rank, as one NCCL group, then wait for all of them
void all_reduce(std::vector<Rank>& ranks, size_t count) {
    ncclCheck(ncclGroupStart());
    for (Rank& r : ranks) {
        ncclCheck(ncclAllReduce(r.send, r.recv, count, ncclBfloat16, ncclSum, r.comm, r.stream));
    }
    ncclCheck(ncclGroupEnd());
    for (Rank& r : ranks) {
        cudaCheck(cudaSetDevice(r.device));
        cudaCheck(cudaStreamSynchronize(r.stream));
    }
}

void destroy_ranks(std::vector<Rank>& ranks) {
    for (Rank& r : ranks) {
        cudaCheck(cudaSetDevice(r.device));
        cudaCheck(cudaFree(r.send));
        cudaCheck(cudaFree(r.recv));
        cudaCheck(cudaStreamDestroy(r.stream));
        ncclCheck(ncclCommDestroy(r.comm));
    }
}

int main(int argc, char** argv) {
    dev::device_init("nccl_all_reduce", argc, argv);
    int num_devices = 0;
    cudaCheck(cudaGetDeviceCount(&num_devices));
    int version = 0;
    ncclCheck(ncclGetVersion(&version));
    printf("NCCL %d, %d GPU(s), one rank per GPU\n", version, num_devices);
    const size_t count = dev::NUM_PARAMETERS;
    const size_t bytes = count * sizeof(floatX);

    std::vector<Rank> ranks(num_devices);
    std::vector<int> devices(num_devices);
    for (int i = 0; i < num_devices; i++) devices[i] = ranks[i].device = i;
    std::vector<ncclComm_t> comms(num_devices);
    ncclCheck(ncclCommInitAll(comms.data(), num_devices, devices.data()));

    // each rank's gradients, and their sum on the host
    std::vector<float> expected(count, 0.0f);
    for (Rank& r : ranks) {
        r.comm = comms[r.device];
        cudaCheck(cudaSetDevice(r.device));
        cudaCheck(cudaStreamCreate(&r.stream));
        cudaCheck(cudaMalloc(&r.send, bytes));
        cudaCheck(cudaMalloc(&r.recv, bytes));
        std::vector<float> grads = dev::random_floatX(count, -1.0f, 1.0f);
        std::vector<floatX> converted(count);
#pragma omp parallel for
        for (size_t i = 0; i < count; i++) {
            converted[i] = host_to_floatX(grads[i]);
            expected[i] += grads[i];
        }
        cudaCheck(cudaMemcpy(r.send, converted.data(), bytes, cudaMemcpyHostToDevice));
    }

    // check: poison every receive buffer, all-reduce once, compare every rank's result
    for (Rank& r : ranks) {
        cudaCheck(cudaSetDevice(r.device));
        cudaCheck(cudaMemset(r.recv, 0xFF, bytes));
    }
    all_reduce(ranks, count);
    dev::CheckResult result;
    double tolerance = num_devices == 1 ? 0.0 : dev::TOL_REDUCTION;
    for (Rank& r : ranks) {
        cudaCheck(cudaSetDevice(r.device));
        std::vector<floatX> raw(count);
        cudaCheck(cudaMemcpy(raw.data(), r.recv, bytes, cudaMemcpyDeviceToHost));
        std::vector<float> got(count);
#pragma omp parallel for
        for (size_t i = 0; i < count; i++) got[i] = host_from_floatX(raw[i]);
        char name[32];
        snprintf(name, sizeof(name), "rank %d", r.device);
        dev::check_tensor(&result, name, got, expected, tolerance);
    }
    printf("check: err %.2e over %d rank(s): %s%s\n", result.worst, num_devices, result.ok ? "ok" : "FAIL",
           result.failures.c_str());
    if (dev::check_only) {
#if defined(CUDA_EMULATION)
        printf("note: one rank only: this program opens every GPU from one process (ncclCommInitAll) and the "
               "emulator has one device per process, so mpirun would start independent 1-rank copies; the "
               "multi-rank all-reduce is tested under mpirun by dev/emu/test_nccl_emu.cpp\n");
#endif
        printf("\nCHECK|nccl_all_reduce %d rank%s|%s\n", num_devices, num_devices == 1 ? "" : "s",
               result.ok ? "all 1 ok" : "1 of 1 FAILED");
        destroy_ranks(ranks);
        return result.ok ? 0 : 1;
    }

    // time: warm-up, then the median of 20 all-reduces (host clock around the group and the waits)
    for (int i = 0; i < 3; i++) all_reduce(ranks, count);
    std::vector<double> samples;
    for (int i = 0; i < 20; i++) {
        auto start = std::chrono::steady_clock::now();
        all_reduce(ranks, count);
        samples.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(samples.begin(), samples.end());
    double ms = samples[samples.size() / 2];
    double algbw = bytes / (ms * 1e6);
    char op[64];
    snprintf(op, sizeof(op), "nccl_all_reduce %d rank%s", num_devices, num_devices == 1 ? "" : "s");
    printf("\n%-44s %11s %10s %10s\n", "all-reduce of GPT-2 124M's bf16 gradients", "time (us)", "algbw GB/s", "busbw GB/s");
    double busbw = algbw * 2.0 * (num_devices - 1) / num_devices;
    printf("%-44s %11.1f %10.1f %10.1f\n", "ncclAllReduce sum", ms * 1e3, algbw, busbw);
    if (num_devices == 1) {
        // a 1-rank all-reduce is a copy: bytes read + written against the copy ceiling
        double copy_gbps = dev::measure_copy_gbps();
        double rate = 2.0 * bytes / (ms * 1e6);
        printf("one rank: %.1f GB/s read + written; ceiling: device-to-device copy %.0f GB/s\n", rate, copy_gbps);
        printf("\nRESULT|%s|ncclAllReduce (a local copy)|fixed|%.1f|%.1f|GB/s|%.1f|copy|%s\n", op, ms * 1e3, rate,
               100.0 * rate / copy_gbps, result.ok ? "all 1 ok" : "1 of 1 FAILED");
    } else {
        printf("\nRESULT|%s|ncclAllReduce, busbw|fixed|%.1f|%.1f|GB/s|-|NVLink (not measured)|%s\n", op, ms * 1e3,
               busbw, result.ok ? "all 1 ok" : "1 of 1 FAILED");
    }

    destroy_ranks(ranks);
    return result.ok ? 0 : 1;
}
