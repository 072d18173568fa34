// Checks the calls of llmc/parallel/comm.h against their definitions, on each backend, with one program:
//   MPI on host buffers     build/comm_check (mpicxx), as the CPU trainer uses it
//   NCCL on device buffers  build/emu/comm_check_nccl (compiled as CUDA for the emulator, dev/emu/nccl.mk),
//                           the collectives queued on a stream behind a compute stream, as train_gpt2.cu
// Run under mpirun with 2 or 3 processes (`mpirun -np 3 build/comm_check`). Process r contributes values
// that name r and the element, small integers that every float type holds exactly, so each result
// follows from the collective's definition (e.g. reduce-scatter leaves block r of the sum on process r)
// and is compared exactly. Every process runs every check; a check passes when it passed on all of
// them. Process 0 ends with "N passed, M failed"; the exit status is non-zero when one failed.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#ifdef COMM_CHECK_NCCL
#include "../llmc/cuda_common.cuh"
#include "../llmc/parallel/comm_nccl.cuh"
#else
#include "../llmc/parallel/comm_mpi.h"
#endif
#include "../llmc/parallel/grad_buckets.h"
#include "../llmc/parallel/pipeline.h"

#ifndef USE_MPI
#error "comm_check runs under mpirun: build it with mpicxx -DUSE_MPI (make build/comm_check)"
#endif

namespace {

ProcessGroup g_world;
bool g_ok = true;
const char* g_check = "";
int g_passed = 0, g_failed = 0;

#define CHECK(cond, ...)                                                                    \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "process %d: %s: line %d: ", g_world.rank, g_check, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fprintf(stderr, "\n");                                                          \
            g_ok = false;                                                                   \
        }                                                                                   \
    } while (0)

// Buffers in the backend's memory: host vectors for MPI, device copies for NCCL (uploaded before a
// collective, downloaded after comm_join).
#ifdef COMM_CHECK_NCCL
cudaStream_t g_compute = nullptr;
template <typename T>
struct Buffer {
    std::vector<T> host;
    T* device = nullptr;
    explicit Buffer(std::vector<T> values) : host(std::move(values)) {
        cudaCheck(cudaMalloc(&device, host.size() * sizeof(T)));
        cudaCheck(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    ~Buffer() { cudaFree(device); }
    T* data() { return device; }
    const std::vector<T>& result(const ProcessGroup& g) {
        comm_join(g);
        cudaCheck(cudaMemcpyAsync(host.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost, g_compute));
        cudaCheck(cudaStreamSynchronize(g_compute));
        return host;
    }
};
#else
template <typename T>
struct Buffer {
    std::vector<T> host;
    explicit Buffer(std::vector<T> values) : host(std::move(values)) {}
    T* data() { return host.data(); }
    const std::vector<T>& result(const ProcessGroup& g) {
        comm_join(g);
        return host;
    }
};
#endif

void run_check(const char* name, const std::function<void()>& check) {
    g_check = name;
    g_ok = true;
    check();
    double failures = all_reduce_sum(g_world, g_ok ? 0.0 : 1.0, name);
    if (failures == 0.0) {
        g_passed++;
    } else {
        g_failed++;
        if (g_world.rank == 0) printf("FAILED: %s (on %g process(es))\n", name, failures);
    }
}

void check_all_reduce() {
    const ProcessGroup& g = g_world;
    int P = g.size, r = g.rank;
    size_t n = 7;
    std::vector<float> values(n);
    for (size_t i = 0; i < n; i++) values[i] = (float)(r + 2 * i);  // sum over r: P(P-1)/2 + 2iP
    Buffer<float> sum(values), max(values);
    all_reduce(g, sum.data(), n, COMM_FLOAT32, COMM_SUM);
    all_reduce(g, max.data(), n, COMM_FLOAT32, COMM_MAX);
    const std::vector<float>& s = sum.result(g);
    const std::vector<float>& m = max.result(g);
    for (size_t i = 0; i < n; i++) {
        CHECK(s[i] == (float)(P * (P - 1) / 2 + 2 * i * P), "sum[%zu] = %g", i, s[i]);
        CHECK(m[i] == (float)(P - 1 + 2 * i), "max[%zu] = %g", i, m[i]);
    }
}

void check_reduce_and_broadcast() {
    const ProcessGroup& g = g_world;
    int P = g.size, r = g.rank, root = P - 1;
    Buffer<float> data({(float)r, (float)(10 * r), 1.0f});
    reduce_sum(g, data.data(), 3, COMM_FLOAT32, root);
    const std::vector<float>& d = data.result(g);
    if (r == root) {
        CHECK(d[0] == (float)(P * (P - 1) / 2) && d[1] == (float)(10 * P * (P - 1) / 2) && d[2] == (float)P,
              "root has %g %g %g", d[0], d[1], d[2]);
    }
    Buffer<float> b({(float)(r + 1), (float)(-r)});
    std::vector<float> root_values = {(float)(root + 1), (float)(-root)};
    broadcast(g, b.data(), 2, root);
    const std::vector<float>& bb = b.result(g);
    CHECK(bb == root_values, "broadcast gave %g %g", bb[0], bb[1]);
}

// data holds P blocks of `count`: element (b, j) on process r is 100r + 10b + j
void check_reduce_scatter_and_all_gather() {
    const ProcessGroup& g = g_world;
    int P = g.size, r = g.rank;
    size_t count = 5;
    std::vector<float> values(P * count);
    for (int b = 0; b < P; b++) {
        for (size_t j = 0; j < count; j++) values[b * count + j] = (float)(100 * r + 10 * b + j);
    }
    Buffer<float> rs(values);
    reduce_scatter_sum(g, rs.data(), count, COMM_FLOAT32);
    const std::vector<float>& got = rs.result(g);
    for (size_t j = 0; j < count; j++) {
        float expected = (float)(100 * P * (P - 1) / 2 + P * (10 * r + j));
        CHECK(got[r * count + j] == expected, "block %d [%zu] = %g, expected %g", r, j, got[r * count + j], expected);
    }
    std::vector<float> mine(P * count, -1.0f);  // only this process's block is filled
    for (size_t j = 0; j < count; j++) mine[r * count + j] = (float)(10 * r + j);
    Buffer<float> ag(mine);
    all_gather(g, ag.data(), count, COMM_FLOAT32);
    const std::vector<float>& all = ag.result(g);
    for (int b = 0; b < P; b++) {
        for (size_t j = 0; j < count; j++) CHECK(all[b * count + j] == (float)(10 * b + j), "block %d [%zu] = %g", b, j, all[b * count + j]);
    }
}

// different counts per process: 3, 5, 2, ...
void check_v_collectives() {
    const ProcessGroup& g = g_world;
    int P = g.size, r = g.rank;
    std::vector<int> counts(P), displs(P);
    int total = 0;
    for (int q = 0; q < P; q++) {
        counts[q] = 3 + (2 * q) % 5;
        displs[q] = total;
        total += counts[q];
    }
    std::vector<float> full(total, -1.0f);
    for (int j = 0; j < counts[r]; j++) full[displs[r] + j] = (float)(1000 * r + j);
    Buffer<float> ag(full);
    GatherRequest request;
    all_gather_v_start(g, ag.data(), counts, displs, &request);
    CHECK(request.pending, "the request is not pending");
    all_gather_v_wait(&request);
    const std::vector<float>& all = ag.result(g);
    for (int q = 0; q < P; q++) {
        for (int j = 0; j < counts[q]; j++) {
            CHECK(all[displs[q] + j] == (float)(1000 * q + j), "part %d [%d] = %g", q, j, all[displs[q] + j]);
        }
    }
    std::vector<float> contribution(total);
    for (int i = 0; i < total; i++) contribution[i] = (float)(r + i);  // sum over r: P(P-1)/2 + P i
    Buffer<float> in(contribution), out(std::vector<float>(counts[r], -1.0f));
    reduce_scatter_v_sum(g, in.data(), out.data(), counts);
    const std::vector<float>& part = out.result(g);
    for (int j = 0; j < counts[r]; j++) {
        float expected = (float)(P * (P - 1) / 2 + P * (displs[r] + j));
        CHECK(part[j] == expected, "my part [%d] = %g, expected %g", j, part[j], expected);
    }
}

// A group of collectives issued at once (the gradient buckets of llmc/parallel/grad_buckets.h): slices
// all-reduced (owner -1) and reduced to their owner.
void check_gradient_bucket() {
    const ProcessGroup& g = g_world;
    int P = g.size, r = g.rank;
    std::vector<float> grads(12);
    for (int i = 0; i < 12; i++) grads[i] = (float)(r + i);
    std::vector<GradSlice> bucket = {{0, 4, -1, 0}, {4, 5, P - 1, 4}, {9, 3, 0, 9}};
    Buffer<float> b(grads);
    reduce_gradient_bucket(g, b.data(), COMM_FLOAT32, bucket);
    const std::vector<float>& got = b.result(g);
    auto sum = [&](int i) { return (float)(P * (P - 1) / 2 + P * i); };
    for (int i = 0; i < 4; i++) CHECK(got[i] == sum(i), "all-reduced [%d] = %g", i, got[i]);
    if (r == P - 1) {
        for (int i = 4; i < 9; i++) CHECK(got[i] == sum(i), "reduced to %d [%d] = %g", P - 1, i, got[i]);
    }
    if (r == 0) {
        for (int i = 9; i < 12; i++) CHECK(got[i] == sum(i), "reduced to 0 [%d] = %g", i, got[i]);
    }
}

void check_host_values() {
    const ProcessGroup& g = g_world;
    int P = g.size, r = g.rank;
    double s = all_reduce_sum(g, r + 0.25, "the check's sum");
    CHECK(s == P * (P - 1) / 2.0 + 0.25 * P, "sum of r + 0.25 = %g", s);
    std::vector<uint64_t> all(P);
    g.backend->all_gather_host_u64(g, 1000u + r, all.data(), "the check's gather");
    for (int q = 0; q < P; q++) CHECK(all[q] == 1000u + q, "value of %d = %llu", q, (unsigned long long)all[q]);
    check_same_config(g, "the same description everywhere");  // returns: no process differs
    barrier(g, "the check's barrier");
}

// Bytes counted as a ring moves them (llmc/parallel/comm.h): an all-reduce of n elements sends and receives
// 2 (P-1) n / P of them in its reduce-scatter and as many in its all-gather; a reduce-scatter or an
// all-gather of P blocks of c, 2 (P-1) c.
void check_byte_count() {
    const ProcessGroup& g = g_world;
    uint64_t P = g.size, n = 6 * P, c = 4;
    std::vector<float> values(n, 1.0f);
    Buffer<float> b(values);
    uint64_t before = comm_bytes_moved;
    all_reduce(g, b.data(), n, COMM_FLOAT32, COMM_SUM);
    CHECK(comm_bytes_moved - before == 4 * (P - 1) * (n / P) * 4, "all-reduce counted %llu bytes",
          (unsigned long long)(comm_bytes_moved - before));
    before = comm_bytes_moved;
    reduce_scatter_sum(g, b.data(), c, COMM_FLOAT32);
    all_gather(g, b.data(), c, COMM_FLOAT32);
    CHECK(comm_bytes_moved - before == 2 * 2 * (P - 1) * c * 4, "reduce-scatter + all-gather counted %llu bytes",
          (unsigned long long)(comm_bytes_moved - before));
    b.result(g);
}

#ifdef COMM_CHECK_NCCL
// bf16 on the device: the gradients' type
void check_bf16_sum() {
    const ProcessGroup& g = g_world;
    int P = g.size, r = g.rank;
    std::vector<__nv_bfloat16> values(4);
    for (int i = 0; i < 4; i++) values[i] = __float2bfloat16((float)(r + i));
    Buffer<__nv_bfloat16> b(values);
    all_reduce(g, b.data(), 4, COMM_BFLOAT16, COMM_SUM);
    const std::vector<__nv_bfloat16>& got = b.result(g);
    for (int i = 0; i < 4; i++) {
        float v = __bfloat162float(got[i]);
        CHECK(v == (float)(P * (P - 1) / 2 + P * i), "bf16 sum [%d] = %g", i, v);
    }
}
#endif

// point to point (in one group: under NCCL a send waits for its receive) and sub-groups (the
// pipeline's and the layout's)
void check_send_recv_and_split() {
    const ProcessGroup& g = g_world;
    int P = g.size, r = g.rank;
    Buffer<float> out({(float)r, (float)(r * r)}), in({-1.0f, -1.0f});
    int from = (r + P - 1) % P;
    comm_group_start(g);
    comm_send(g, out.data(), 2, COMM_FLOAT32, (r + 1) % P, 7);
    comm_recv(g, in.data(), 2, COMM_FLOAT32, from, 7);
    comm_group_end(g);
    comm_finish_sends(g);
    const std::vector<float>& got = in.result(g);
    CHECK(got[0] == (float)from && got[1] == (float)(from * from), "received %g %g from %d", got[0], got[1], from);

    ProcessGroup sub = process_group_split(g, r % 2, -r);  // key -r: ranks in reverse order
    int members = (P + 1 - r % 2) / 2;
    CHECK(sub.size == members, "sub-group of %d processes, expected %d", sub.size, members);
    double s = all_reduce_sum(sub, (double)r);
    double expected = 0;
    for (int q = r % 2; q < P; q += 2) expected += q;
    CHECK(s == expected, "sum over the sub-group %g, expected %g", s, expected);
    std::vector<int> members_descending;  // keys -q: the highest rank of the color is the sub-group's 0
    for (int q = P - 1; q >= 0; q--) {
        if (q % 2 == r % 2) members_descending.push_back(q);
    }
    CHECK(members_descending[sub.rank] == r, "process %d is %d in its sub-group", r, sub.rank);
    if (sub.size > 1) {
        Buffer<float> mine({(float)r}), all(std::vector<float>(sub.size, -1.0f));
        gather(sub, mine.data(), 1, all.data(), COMM_FLOAT32);
        const std::vector<float>& a = all.result(sub);
        for (int q = 0; sub.rank == 0 && q < sub.size; q++) {
            CHECK(a[q] == (float)members_descending[q], "gathered %g", a[q]);
        }
    }
}

// pipeline_run (llmc/parallel/pipeline.h) with a model of sums, every process a stage: stage s's forward adds
// s + 1 to its input (micro-batch i enters stage 0 as 100 i) and the last stage's loss is its output;
// the backward starts from i + 1 on the last stage and each stage doubles what it receives. So the
// loss sum, the gradient that reaches stage 0, and the order of each stage's calls (its schedule)
// follow from the definitions, for both schedules.
void check_pipeline_schedules() {
    const ProcessGroup& g = g_world;
    int p = g.size, s = g.rank, m = 5;
    // the boundary buffers in the backend's memory: act_in, act_out, grad_in, grad_out, m each
    Buffer<float> buffers(std::vector<float>(4 * m, 0.0f));
    float* act_in = buffers.data();
    float* act_out = act_in + m;
    float* grad_in = act_in + 2 * m;
    float* grad_out = act_in + 3 * m;
#ifdef COMM_CHECK_NCCL
    auto get = [](const float* at) {
        float v = 0.0f;
        cudaCheck(cudaMemcpyAsync(&v, at, sizeof(float), cudaMemcpyDeviceToHost, g_compute));
        cudaCheck(cudaStreamSynchronize(g_compute));
        return v;
    };
    auto put = [](float* at, float v) {
        cudaCheck(cudaMemcpyAsync(at, &v, sizeof(float), cudaMemcpyHostToDevice, g_compute));
        cudaCheck(cudaStreamSynchronize(g_compute));
    };
#else
    auto get = [](const float* at) { return *at; };
    auto put = [](float* at, float v) { *at = v; };
#endif
    for (const char* kind : {"gpipe", "1f1b"}) {
        std::vector<PipelineOp> calls;
        int current = -1;
        PipelineStageHooks h;
        h.boundary_elements = 1;
        h.select = [&](int micro) { current = micro; };
        h.forward = [&](int micro) {
            calls.push_back({true, micro});
            if (s == 0) put(&act_in[micro], 100.0f * micro);
            put(&act_out[micro], get(&act_in[micro]) + (s + 1));
            return s == p - 1 ? (double)get(&act_out[micro]) : 0.0;
        };
        h.backward = [&](int micro) {
            calls.push_back({false, micro});
            if (s == p - 1) put(&grad_in[micro], micro + 1.0f);
            put(&grad_out[micro], 2.0f * get(&grad_in[micro]));
        };
        h.activation_in = [&] { return (void*)&act_in[current]; };
        h.activation_out = [&] { return (void*)&act_out[current]; };
        h.gradient_in = [&] { return (void*)&grad_in[current]; };
        h.gradient_out = [&] { return (void*)&grad_out[current]; };
        PipelineComm comm;
        comm.pp = g;
#ifdef COMM_CHECK_NCCL
        // NCCL queues: the runner waits for the stream around each exchange (a send blocks the stream until
        // its peer receives, so a schedule whose exchanges do not pair up hangs here, as on GPUs)
        comm.drain = [] { cudaCheck(cudaStreamSynchronize(g_compute)); };
#endif
        PipelineStepResult r = pipeline_run(&comm, kind, m, h);
        std::vector<PipelineOp> expected = pp_schedule(kind, p, s, m);
        CHECK(calls.size() == expected.size(), "%s: %zu calls, schedule has %zu", kind, calls.size(), expected.size());
        for (size_t k = 0; k < calls.size() && k < expected.size(); k++) {
            CHECK(calls[k].forward == expected[k].forward && calls[k].micro == expected[k].micro,
                  "%s: call %zu is %c%d, schedule says %c%d", kind, k, calls[k].forward ? 'F' : 'B', calls[k].micro,
                  expected[k].forward ? 'F' : 'B', expected[k].micro);
        }
        double loss = 0;
        for (int i = 0; i < m; i++) loss += 100.0 * i + p * (p + 1) / 2;
        CHECK(r.loss_sum == (s == p - 1 ? loss : 0.0), "%s: loss sum %g", kind, r.loss_sum);
        for (int i = 0; s == 0 && i < m; i++) {
            float got = get(&grad_out[i]);
            CHECK(got == (float)((i + 1) << p), "%s: gradient of micro-batch %d at stage 0: %g", kind, i, got);
        }
        CHECK((int)r.idle.size() == p, "%s: %zu bubble entries", kind, r.idle.size());
        for (float idle : r.idle) CHECK(idle >= 0.0f && idle <= 1.0f, "%s: idle share %g", kind, idle);
    }
}

// all-to-all: process r puts 100 r + 10 j + i in element i of its block j (for process j); afterwards
// block j of its receive buffer holds process j's block r, 100 j + 10 r + i. 2 bytes counted per element
// of the P - 1 blocks sent and of the P - 1 received (4-byte floats: 8 each way).
void check_all_to_all() {
    const ProcessGroup& g = g_world;
    int P = g.size, r = g.rank;
    const size_t count = 3;
    std::vector<float> mine(P * count);
    for (int j = 0; j < P; j++) {
        for (size_t i = 0; i < count; i++) mine[j * count + i] = (float)(100 * r + 10 * j + i);
    }
    Buffer<float> send(mine), recv(std::vector<float>(P * count, -1.0f));
    uint64_t before = comm_bytes_moved;
    all_to_all(g, send.data(), recv.data(), count, COMM_FLOAT32);
    CHECK(comm_bytes_moved - before == 2 * (uint64_t)(P - 1) * count * 4, "counted %llu bytes",
          (unsigned long long)(comm_bytes_moved - before));
    const std::vector<float>& got = recv.result(g);
    for (int j = 0; j < P; j++) {
        for (size_t i = 0; i < count; i++) {
            CHECK(got[j * count + i] == (float)(100 * j + 10 * r + i), "block %d element %zu = %g", j, i, got[j * count + i]);
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
#ifdef COMM_CHECK_NCCL
    LaunchSettings launch;
    launch.timeout_s = 120;
    DataParallel dp = dp_init(launch, &argc, &argv);
    cudaCheck(cudaStreamCreate(&g_compute));
    g_world = nccl_group(&dp, g_compute);
#else
    g_world = process_group_init(&argc, &argv);
#endif
    if (g_world.size < 2) fatal("comm_check: run it under mpirun with 2 or more processes");
    run_check("all-reduce (sum, max)", check_all_reduce);
    run_check("reduce to a root, broadcast", check_reduce_and_broadcast);
    run_check("reduce-scatter, all-gather", check_reduce_scatter_and_all_gather);
    run_check("all-gather-v, reduce-scatter-v", check_v_collectives);
    run_check("a gradient bucket (grouped all-reduce and reduces)", check_gradient_bucket);
    run_check("host values: sum, 64-bit gather, configuration check, barrier", check_host_values);
    run_check("bytes counted as a ring moves them", check_byte_count);
    run_check("send/recv, sub-groups, gather", check_send_recv_and_split);
    run_check("all-to-all", check_all_to_all);
#ifdef COMM_CHECK_NCCL
    run_check("bf16 sums", check_bf16_sum);
#endif
    run_check("pipeline_run: both schedules with a model of sums", check_pipeline_schedules);
    if (g_world.rank == 0) {
        printf("comm_check (%s backend, %d processes)\n", g_world.backend->name, g_world.size);
        printf("%d passed, %d failed\n", g_passed, g_failed);
    }
#ifdef COMM_CHECK_NCCL
    dp_finalize(&dp);
#else
    process_group_finalize(g_world);
#endif
    return g_failed == 0 ? 0 : 1;
}
