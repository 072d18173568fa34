// A sample as the run prints it: the tokenizer for printing, the settings from the flags, and the loop
// that draws each token (llmc/run/sampler.h) from the logits a trainer supplies.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../gpt2_config.h"
#include "../rand.h"
#include "../tokenizer/prompt.h"
#include "../tokenizer/tokenizer_file.h"
#include "args.h"
#include "sampler.h"

// Writes a token's bytes to stdout (its id without a tokenizer), with control characters other than
// newline and tab shown as '?' so a sample cannot disturb the terminal.
inline void print_token(const TokenizerFile* tok, int id) {
    if (tok == nullptr) {
        printf("%d ", id);
        return;
    }
    for (unsigned char c : tokenizer_file_decode(*tok, id)) putchar(c < 32 && c != '\n' && c != '\t' ? '?' : c);
}

// The tokenizer for printing samples (if its file exists) and the token a sample starts from.
inline bool load_sample_tokenizer(const TrainArgs& args, const GPT2Config& cfg, TokenizerFile* tok, int* eot) {
    bool have = tokenizer_file_read(args.tokenizer_path, tok);
    *eot = have ? tok->eot_token : 50256;
    if (*eot >= cfg.vocab_size) *eot = cfg.vocab_size - 1;  // a small test vocabulary has no GPT-2 end-of-text
    if (args.sample_every > 0 && !have) {
        printf("samples print as token ids: no tokenizer file at %s (-tk)\n", args.tokenizer_path.c_str());
    }
    return have;
}

// What a sample is: `count` tokens after end-of-text and the prompt's tokens (-sp), each drawn with
// temperature and top-k (llmc/run/sampler.h) from the model's distribution given the tokens so far (at
// most the last T of them).
struct SampleSettings {
    int count = 0, T = 0, eot = 0, top_k = 0;
    float temperature = 1.0f;
    std::vector<int> prompt;
};

inline SampleSettings sample_settings_from_args(const TrainArgs& args, const GPT2Config& cfg, int eot) {
    SampleSettings s;
    s.count = args.gen_tokens;
    s.T = args.T;
    s.eot = eot;
    s.top_k = args.top_k;
    s.temperature = args.temperature;
    if (!args.prompt.empty()) {
        s.prompt = encode_prompt(args.prompt, args.bpe_dir, cfg.vocab_size);
        printf("sample prompt: %zu tokens\n", s.prompt.size());
    }
    return s;
}

// Prints one sample: the prompt, then the generated tokens as they come. last_logits(window, length)
// runs the model on tokens window[0..length) and returns the logits (V or more) of the last position;
// each trainer supplies its own. One coin is drawn per token whatever the settings, so the random
// stream (saved in checkpoints) advances the same way.
template <typename LastLogits>
void generate_sample(const SampleSettings& s, int V, uint64_t* rng, const TokenizerFile* tok, LastLogits last_logits) {
    std::vector<int> tokens = {s.eot};
    tokens.insert(tokens.end(), s.prompt.begin(), s.prompt.end());
    printf("--- sample ---\n");
    for (int id : s.prompt) print_token(tok, id);
    for (int i = 0; i < s.count; i++) {
        int context = std::min((int)tokens.size(), s.T);
        const float* logits = last_logits(tokens.data() + tokens.size() - context, context);
        float coin = xorshift_uniform(rng);
        int next = sample_token(logits, V, s.temperature, s.top_k, coin);
        tokens.push_back(next);
        print_token(tok, next);
        fflush(stdout);
    }
    printf("\n--------------\n");
}
