// The text a sample continues (-sp), turned into GPT-2 token ids with our BPE encoder (llmc/tokenizer/bpe.h),
// and where GPT-2's encoder.json and vocab.bpe are found. The trainers decode with gpt2_tokenizer.bin
// alone (llmc/tokenizer/tokenizer_file.h); only a prompt needs the encoder, so it is loaded only then.
#pragma once

#include <unistd.h>

#include <climits>
#include <string>
#include <vector>

#include "../utils.h"
#include "bpe.h"

// The BPE directory: `flag_value` if given, else $GPT2_BPE_DIR, else dev/data/gpt2-bpe under the
// working directory or under the program's directory. `how_to_pass` names the flag in the message.
inline std::string find_bpe_dir(const std::string& flag_value, const char* how_to_pass) {
    if (!flag_value.empty()) return flag_value;
    const char* env = getenv("GPT2_BPE_DIR");
    if (env != nullptr && env[0] != '\0') return env;
    std::vector<std::string> candidates = {"dev/data/gpt2-bpe"};
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        std::string exe_dir(exe, n);
        exe_dir = exe_dir.substr(0, exe_dir.rfind('/'));
        candidates.push_back(exe_dir + "/dev/data/gpt2-bpe");
    }
    for (const std::string& dir : candidates) {
        if (file_exists(dir + "/encoder.json") && file_exists(dir + "/vocab.bpe")) return dir;
    }
    fatal("GPT-2's encoder.json and vocab.bpe were not found: pass %s DIR, set GPT2_BPE_DIR, or run "
          "dev/data/tinyshakespeare.sh once (it fetches them into dev/data/gpt2-bpe)", how_to_pass);
}

// The ids of `text` ("<|endoftext|>" in it is ordinary text), each checked against the model's vocabulary.
inline std::vector<int> encode_prompt(const std::string& text, const std::string& bpe_dir_flag, int vocab_size) {
    BpeTokenizer tok;
    bpe_tokenizer_load(&tok, find_bpe_dir(bpe_dir_flag, "-bp"));
    BpeEncoder enc;
    bpe_encoder_init(&enc, &tok);
    std::vector<int> ids = bpe_encode(&enc, text);
    bpe_encoder_free(&enc);
    bpe_tokenizer_free(&tok);
    for (size_t i = 0; i < ids.size(); i++) {
        if (ids[i] >= vocab_size) {
            fatal("flag -sp: prompt token %zu is id %d, outside the model's vocabulary of %d", i, ids[i], vocab_size);
        }
    }
    return ids;
}
