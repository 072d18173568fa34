// check_gpt2: checks a model file against a debug state (llmc/io/debug_state.h), the way llm.c's test_gpt2
// checks gpt2_124M.bin against gpt2_124M_debug_state.bin: one forward and backward of the state's batch on
// the fp32 CPU model (train_gpt2.cpp's), compared with the reference's logits, loss and the gradients of
// all 16 tensors; then, with -s or -l, training steps on that same batch with llm.c's test recipe (AdamW
// lr 1e-4, betas 0.9 and 0.999, eps 1e-8, weight decay 0.01 on every tensor, no clipping), each step's
// loss compared with -l's. Prints one line per check and exits 0 when all pass, 1 when one does not (or
// a file is wrong: a foreign, truncated or mismatched file is named in an error).
//
//   ./check_gpt2 gpt2_124M.bin gpt2_124M_debug_state.bin
//   ./check_gpt2 model.bin state.bin -l 5.270007,4.059707,3.375123   (expected losses of the first steps)
//
// Tolerances, relative to the largest |value| of each tensor (the logits: of all of them): fp32 against a
// reference computed in fp32 or float64 differs by rounding grown through sums of up to 4C or Vp terms
// and L layers: measured 1e-6 for logits and 1.5e-6 for gradients against float64 (test/test_model.cpp),
// and llm.c's debug state (PyTorch fp32) within 3e-6 for the logits. Defaults: logits and loss 1e-4,
// gradients 1e-3, step losses 2e-3 (llm.c's test_gpt2 allows 1e-2 absolute on losses near 5); a wrong
// formula or layout misses them by orders of magnitude.
#define TESTING
#include "train_gpt2.cpp"

#include <sstream>

#include "llmc/io/debug_state.h"

namespace {

void usage(const char* why) {
    fprintf(stderr,
            "check_gpt2: %s\n"
            "usage: check_gpt2 MODEL.bin DEBUG_STATE.bin [-s STEPS] [-l LOSS,LOSS,...] [-tl TOL] [-tg TOL] [-ts TOL]\n"
            "  -s   training steps on the state's batch (llm.c's test_gpt2 recipe; default: as many as -l gives)\n"
            "  -l   the expected loss of each step, compared within -ts\n"
            "  -tl  relative tolerance of the logits and the loss (1e-4)\n"
            "  -tg  relative tolerance of each gradient tensor (1e-3)\n"
            "  -ts  relative tolerance of each step's loss (2e-3)\n",
            why);
    exit(2);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) usage("a model file and a debug state are needed");
    std::string model_path = argv[1], state_path = argv[2];
    int steps = -1;
    std::vector<double> expected;
    double tol_logits = 1e-4, tol_grads = 1e-3, tol_steps = 2e-3;
    for (int i = 3; i < argc; i += 2) {
        std::string flag = argv[i];
        if (i + 1 >= argc) usage(("flag " + flag + " needs a value").c_str());
        const char* value = argv[i + 1];
        if (flag == "-s") {
            steps = (int)parse_number("-s", value, true, 0, 1000000);
        } else if (flag == "-l") {
            std::stringstream items(value);
            std::string item;
            while (std::getline(items, item, ',')) expected.push_back(parse_number("-l", item.c_str(), false, 0, 1e6));
        } else if (flag == "-tl") {
            tol_logits = parse_number("-tl", value, false, 0, 1);
        } else if (flag == "-tg") {
            tol_grads = parse_number("-tg", value, false, 0, 1);
        } else if (flag == "-ts") {
            tol_steps = parse_number("-ts", value, false, 0, 1);
        } else {
            usage(("unknown flag " + flag).c_str());
        }
    }
    if (steps < 0) steps = (int)expected.size();
    if ((int)expected.size() > steps) usage("-l gives more losses than -s steps");

    GPT2 model;
    gpt2_load_checkpoint(&model, model_path);
    const GPT2Config& cfg = model.config;
    DebugState state = debug_state_read(state_path, cfg.vocab_size, model.num_parameters);
    int B = state.B, T = state.T, V = cfg.vocab_size, Vp = cfg.padded_vocab_size;
    if (T > cfg.max_seq_len) fatal("debug state '%s' has T=%d, longer than the model's %d", state_path.c_str(), T, cfg.max_seq_len);
    printf("model %s: L=%d C=%d NH=%d maxT=%d V=%d (padded %d), %zu parameters\n", model_path.c_str(), cfg.num_layers,
           cfg.channels, cfg.num_heads, cfg.max_seq_len, V, Vp, model.num_parameters);
    printf("debug state %s: B=%d T=%d, reference loss %.6f\n", state_path.c_str(), B, T, state.loss);

    bool all_ok = true;
    auto verdict = [&](bool ok) {
        all_ok = all_ok && ok;
        return ok ? "OK" : "NOT OK";
    };
    std::vector<float> m(model.num_parameters, 0.0f), v(model.num_parameters, 0.0f);
    AdamWHyper hyper;
    hyper.beta2 = 0.999f;  // llm.c's test_gpt2 recipe
    int passed_grads = 0;
    int loops = std::max(steps, 1);
    for (int step = 0; step < loops; step++) {
        float loss = gpt2_forward(&model, state.inputs.data(), state.targets.data(), B, T);
        gpt2_zero_grad(&model);
        gpt2_backward(&model, state.inputs.data(), state.targets.data(), B, T, 1.0f / (B * T));
        if (step == 0) {
            std::vector<float> logits((size_t)B * T * V);
            for (int i = 0; i < B * T; i++) {
                std::copy(model.acts.logits + (size_t)i * Vp, model.acts.logits + (size_t)i * Vp + V,
                          logits.begin() + (size_t)i * V);
            }
            double e = max_rel_error(logits.data(), state.logits.data(), logits.size());
            printf("logits: max difference %.2e of the largest (tolerance %.0e): %s\n", e, tol_logits, verdict(e <= tol_logits));
            double le = std::fabs((double)loss - state.loss) / std::fabs(state.loss);
            printf("loss: %.6f, reference %.6f, relative difference %.2e (tolerance %.0e): %s\n", loss, state.loss, le,
                   tol_logits, verdict(le <= tol_logits));
            for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
                size_t off = model.param_offsets[i], n = model.param_sizes[i];
                double g = max_rel_error(model.grads_memory.data() + off, state.grads.data() + off, n);
                bool ok = g <= tol_grads;
                passed_grads += ok;
                printf("gradient %-9s max difference %.2e of the largest (tolerance %.0e): %s\n", param_tensor_name(i), g,
                       tol_grads, verdict(ok));
            }
        }
        if (step >= steps) break;
        adamw_update(model.params_memory.data(), model.grads_memory.data(), m.data(), v.data(), model.num_parameters,
                     hyper, 1e-4f, 0.01f, 1.0f, step + 1);
        if (step < (int)expected.size()) {
            double se = std::fabs((double)loss - expected[step]) / std::fabs(expected[step]);
            printf("step %d: loss %.6f, expected %.6f, relative difference %.2e (tolerance %.0e): %s\n", step, loss,
                   expected[step], se, tol_steps, verdict(se <= tol_steps));
        } else {
            printf("step %d: loss %.6f\n", step, loss);
        }
    }
    printf("overall: %s (%d/%d gradients)\n", all_ok ? "OK" : "NOT OK", passed_grads, NUM_PARAMETER_TENSORS);
    return all_ok ? 0 : 1;
}
