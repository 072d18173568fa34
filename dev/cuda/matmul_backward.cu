// A Linear layer's backward, version by version, at the trainer's four shapes with a bias (N = B·T):
//   dinp (N, C) = dout (N, OC)·weight (OC, C),   dweight (OC, C) += doutᵀ·inp,   dbias (OC) += column sums of dout
// qkv 768 -> 2304, attproj 768 -> 768, fc 768 -> 3072, fcproj 3072 -> 768. Checked against
// matmul_backward() of llmc/matmul.h (dweight and dbias start from the same random values on both sides)
// and timed.
//
// The question this program answers is the bias gradient's: read dout a second time in a kernel of
// our own (v1), or let the weight-gradient product, which reads dout as its B operand anyway, sum it in
// its epilogue (cuBLASLt's BGRADB, v2). v2 saves N·OC·2 bytes of reads per layer (fc: 50 MB, ~17 us
// at 3 TB/s against ~100 us of products) if the epilogue costs the product nothing; whether it does
// depends on cuBLASLt's kernels, so only a GPU can say. The BGRADB lines at the end set v2 against v1,
// measured in the same run; the trainer switches to v2 with -bg 1 (off by default until a GPU has said).
//
// The two numbers at fc: two products of 2·N·C·OC = 38.7 GFLOP each, ~100 us at 790 TFLOP/s. Matrix
// bound: the fraction is of a cuBLAS 8192^3 GEMM measured in the same run.
//
//   make -C dev/cuda bin/matmul_backward && dev/cuda/bin/matmul_backward
#include "harness.cuh"

#include "../../llmc/matmul.cuh"
#include "../../llmc/matmul.h"

// ----------------------------------------------------------------------------
// v1 is llmc's matmul_backward as the trainer runs it by default (-bg 0): the dinp product, the
// dweight product (accumulating, C = D), and our two-stage column sum for dbias (v2 of
// dev/cuda/matmul_backward_bias.cu).
//
// v2 is the same function with -bg 1: the dweight product carries the BGRADB epilogue, which writes
// dout's column sums (over the product's k = N) into floatX scratch, and a one-pass kernel adds them
// into dbias (BGRADB writes, it does not add). No read of dout outside the two products.

struct Shape {
    const char* name;
    int N, C, OC;
};

struct ShapeTimes {
    std::string name;
    double own_ms = 0, epilogue_ms = 0;
};

int run_shape(const Shape& shape, std::vector<ShapeTimes>* times) {
    const int N = shape.N, C = shape.C, OC = shape.OC;
    std::vector<float> inp = dev::random_floatX((size_t)N * C, -1.0f, 1.0f);
    std::vector<float> weight = dev::random_floatX((size_t)OC * C, -1.0f, 1.0f);
    std::vector<float> dout = dev::random_floatX((size_t)N * OC, -1.0f, 1.0f);
    std::vector<float> dweight0 = dev::random_floatX((size_t)OC * C, -1.0f, 1.0f);
    std::vector<float> dbias0 = dev::random_floatX(OC, -1.0f, 1.0f);
    std::vector<float> ref_dinp((size_t)N * C, 0.0f), ref_dweight = dweight0, ref_dbias = dbias0;
    matmul_backward(ref_dinp.data(), ref_dweight.data(), ref_dbias.data(), dout.data(), inp.data(), weight.data(), N, C,
                    OC);

    dev::DeviceBuffer<floatX> d_inp((size_t)N * C), d_weight((size_t)OC * C), d_dout((size_t)N * OC);
    dev::DeviceBuffer<floatX> d_dinp((size_t)N * C), d_dweight((size_t)OC * C), d_dbias(OC);
    dev::DeviceBuffer<floatX> d_dweight0((size_t)OC * C), d_dbias0(OC);
    dev::DeviceBuffer<float> d_scratch(matmul_backward_scratch_floats(OC));
    dev::upload(d_inp, inp);
    dev::upload(d_weight, weight);
    dev::upload(d_dout, dout);
    dev::upload(d_dweight0, dweight0);
    dev::upload(d_dbias0, dbias0);

    double flops = 4.0 * N * C * (double)OC;
    // inp, weight, dout read; dinp written; dweight and dbias read and written
    double bytes = ((double)N * C * 2 + (double)OC * C * 3 + (double)N * OC + 2.0 * OC) * sizeof(floatX);
    char op[96];
    snprintf(op, sizeof(op), "matmul_backward %s %dx%d->%d", shape.name, N, C, OC);
    dev::Report report = dev::make_report(op, bytes, flops);
    auto launch = [&](bool epilogue) {
        bool saved = matmul_algorithms.bias_grad_epilogue;
        matmul_algorithms.bias_grad_epilogue = epilogue;
        matmul_backward(d_dinp.ptr, d_dweight.ptr, d_dbias.ptr, d_scratch.ptr, d_dout.ptr, d_inp.ptr, d_weight.ptr,
                        nullptr, N, C, OC, 0);
        matmul_algorithms.bias_grad_epilogue = saved;
    };
    std::vector<dev::Version> versions = {
        {"v1 llmc -bg 0: products + our dbias kernel", {0}, [&](int) { launch(false); }},
        {"v2 llmc -bg 1: dbias in the BGRADB epilogue", {0}, [&](int) { launch(true); }},
    };
    dev::run_versions(&report, versions,
                      [&] {
                          dev::poison(d_dinp);
                          dev::copy(d_dweight, d_dweight0);
                          dev::copy(d_dbias, d_dbias0);
                      },
                      [&] {
                          dev::CheckResult result;
                          dev::check_tensor(&result, "dinp", dev::download(d_dinp), ref_dinp, dev::TOL_REDUCTION);
                          dev::check_tensor(&result, "dweight", dev::download(d_dweight), ref_dweight,
                                            dev::TOL_REDUCTION);
                          dev::check_tensor(&result, "dbias", dev::download(d_dbias), ref_dbias, dev::TOL_REDUCTION);
                          return result;
                      });
    ShapeTimes t;
    t.name = op;
    for (const dev::Row& row : report.rows) {
        if (row.version.rfind("v1", 0) == 0) t.own_ms = row.timing.median_ms;
        if (row.version.rfind("v2", 0) == 0) t.epilogue_ms = row.timing.median_ms;
    }
    times->push_back(t);
    return dev::finish(report);
}

int main(int argc, char** argv) {
    dev::device_init("matmul_backward", argc, argv);
    cublas_setup();
    const int N = dev::B * dev::T, C = dev::C;
    std::vector<Shape> shapes = {
        {"fc", N, C, 4 * C},
        {"qkv", N, C, 3 * C},
        {"attproj", N, C, C},
        {"fcproj", N, 4 * C, C},
    };
    std::vector<ShapeTimes> times;
    int status = 0;
    for (const Shape& shape : shapes) status |= run_shape(shape, &times);
    cublas_teardown();
    if (dev::check_only) return status;
    printf("\nthe bias gradient in the BGRADB epilogue (v2) against our kernel (v1), median us, ratio v2/v1:\n");
    for (const ShapeTimes& t : times) {
        printf("BGRADB|%s|%.1f|%.1f|%.3f\n", t.name.c_str(), t.own_ms * 1e3, t.epilogue_ms * 1e3,
               t.epilogue_ms / t.own_ms);
    }
    return status;
}
