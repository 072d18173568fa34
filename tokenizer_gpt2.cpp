// tokenizer_gpt2: GPT-2's BPE tokenizer on the command line, and the data preparation that turns text
// into the token shards the trainers read. The library is llmc/tokenizer/bpe.h; doc/tokenizer.md has the story.
//
//   tokenizer_gpt2 encode FILE|-          token ids of FILE (- = stdin), separated by spaces
//   tokenizer_gpt2 decode                 ids from stdin -> bytes on stdout
//   tokenizer_gpt2 prepro --input FILE_OR_DIR --output-dir DIR --name NAME [...]
//   tokenizer_gpt2 bench FILE             encoding throughput (dev/bench_tokenizer.sh)
//
// GPT-2's encoder.json and vocab.bpe are found through --bpe-dir DIR, else $GPT2_BPE_DIR, else
// dev/data/gpt2-bpe under the current directory or under this program's directory.
#include <chrono>
#include <climits>
#include <string>
#include <thread>
#include <vector>

#include "llmc/tokenizer/bpe.h"
#include "llmc/tokenizer/bpe_prepro.h"
#include "llmc/tokenizer/prompt.h"
#include "llmc/tokenizer/tokenizer_file.h"
#include "llmc/utils.h"

// Prints the usage to stdout for --help (exit 0), to stderr after a mistake (exit 1).
[[noreturn]] static void usage(int status) {
    fprintf(status == EXIT_SUCCESS ? stdout : stderr,
            "usage:\n"
            "  tokenizer_gpt2 encode [--special] [--bpe-dir DIR] FILE|-\n"
            "      prints the GPT-2 token ids of FILE (- reads stdin), separated by spaces.\n"
            "      --special: \"<|endoftext|>\" in the text becomes token 50256 (default: ordinary text)\n"
            "  tokenizer_gpt2 decode [--bpe-dir DIR | --tokenizer gpt2_tokenizer.bin]\n"
            "      reads whitespace-separated token ids from stdin and writes their bytes to stdout\n"
            "  tokenizer_gpt2 prepro --input FILE_OR_DIR --output-dir DIR --name NAME [options]\n"
            "      writes NAME_val_000000.bin, NAME_train_000000.bin, ... and gpt2_tokenizer.bin into DIR;\n"
            "      each document is preceded by end-of-text (50256). A directory: every file under it, in\n"
            "      sorted order, is one document. A file: one document, unless split by:\n"
            "      --split-blank-lines   a document ends after each blank line (\"\\n\\n\")\n"
            "      --jsonl FIELD         each line is a JSON object whose string FIELD is a document\n"
            "      --val-tokens N        tokens in the val shard (default 32768; 0 for none)\n"
            "      --shard-tokens N      tokens per train shard (default 100000000)\n"
            "      --threads N           encoding threads (default: all cores)\n"
            "  tokenizer_gpt2 bench [--repeat N] [--threads N] FILE\n"
            "      encoding throughput on FILE in MB/s (dev/bench_tokenizer.sh runs it against a peer)\n"
            "  --bpe-dir DIR: where encoder.json and vocab.bpe are (default $GPT2_BPE_DIR, else\n"
            "      dev/data/gpt2-bpe; dev/data/tinyshakespeare.sh fetches them there)\n");
    exit(status);
}

// ----------------------------------------------------------------------------
// arguments

struct Args {
    std::vector<std::string> positional;
    std::string bpe_dir, tokenizer_bin, input, output_dir, name, jsonl_field;
    bool special = false, split_blank_lines = false;
    long val_tokens = 32768, shard_tokens = 100000000, threads = 0, repeat = 5;
};

static long parse_count(const char* flag, const char* text, long min, long max) {
    char* end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < min || value > max) {
        fatal("%s expects a whole number in %ld..%ld, got '%s'", flag, min, max, text);
    }
    return value;
}

static Args parse_args(int argc, char** argv, int first) {
    Args args;
    for (int i = first; i < argc; i++) {
        std::string flag = argv[i];
        bool has_value = i + 1 < argc;
        auto value = [&]() -> const char* {
            if (!has_value) fatal("%s needs a value", flag.c_str());
            return argv[++i];
        };
        if (flag == "--bpe-dir") args.bpe_dir = value();
        else if (flag == "--tokenizer") args.tokenizer_bin = value();
        else if (flag == "--input") args.input = value();
        else if (flag == "--output-dir") args.output_dir = value();
        else if (flag == "--name") args.name = value();
        else if (flag == "--jsonl") args.jsonl_field = value();
        else if (flag == "--val-tokens") args.val_tokens = parse_count("--val-tokens", value(), 0, INT32_MAX);
        else if (flag == "--shard-tokens") args.shard_tokens = parse_count("--shard-tokens", value(), 1, INT32_MAX);
        else if (flag == "--threads") args.threads = parse_count("--threads", value(), 1, 1024);
        else if (flag == "--repeat") args.repeat = parse_count("--repeat", value(), 1, 1000);
        else if (flag == "--special") args.special = true;
        else if (flag == "--split-blank-lines") args.split_blank_lines = true;
        else if (flag == "-h" || flag == "--help") usage(EXIT_SUCCESS);
        else if (flag.size() > 1 && flag[0] == '-') fatal("unknown option '%s' (tokenizer_gpt2 --help lists them)", flag.c_str());
        else args.positional.push_back(flag);
    }
    return args;
}

static std::string read_input(const std::string& path) {
    if (path != "-") return bpe_read_file(path, "input");
    std::string data;
    char buffer[1 << 16];
    size_t got;
    while ((got = fread(buffer, 1, sizeof(buffer), stdin)) > 0) data.append(buffer, got);
    if (ferror(stdin)) fatal("error reading stdin: %s", strerror(errno));
    return data;
}

static void write_stdout(const std::string& data) {
    fwriteCheck(data.data(), 1, data.size(), stdout);
    if (fflush(stdout) != 0) fatal("could not write to stdout: %s", strerror(errno));
}

// ----------------------------------------------------------------------------
// subcommands

static int cmd_encode(const Args& args) {
    if (args.positional.size() != 1) fatal("encode takes one FILE (or - for stdin); see tokenizer_gpt2 --help");
    std::string text = read_input(args.positional[0]);
    BpeTokenizer tok;
    bpe_tokenizer_load(&tok, find_bpe_dir(args.bpe_dir, "--bpe-dir"));
    BpeEncoder enc;
    bpe_encoder_init(&enc, &tok);
    std::vector<int> ids;
    if (args.special) {
        bpe_encode_allow_special(&enc, text.data(), text.size(), &ids);
    } else {
        bpe_encode(&enc, text.data(), text.size(), &ids);
    }
    std::string out;
    for (size_t i = 0; i < ids.size(); i++) {
        if (i > 0) out += ' ';
        out += std::to_string(ids[i]);
    }
    out += '\n';
    write_stdout(out);
    bpe_encoder_free(&enc);
    bpe_tokenizer_free(&tok);
    return 0;
}

static int cmd_decode(const Args& args) {
    if (!args.positional.empty()) fatal("decode reads token ids from stdin and takes no file argument");
    TokenizerFile table;
    if (!args.tokenizer_bin.empty()) {
        if (!tokenizer_file_read(args.tokenizer_bin, &table)) {
            fatal("tokenizer file '%s' does not exist", args.tokenizer_bin.c_str());
        }
    } else {
        BpeTokenizer tok;
        bpe_tokenizer_load(&tok, find_bpe_dir(args.bpe_dir, "--bpe-dir"));
        table = bpe_tokenizer_file(tok);
        bpe_tokenizer_free(&tok);
    }
    std::string input = read_input("-");
    long vocab_size = (long)table.token_bytes.size();
    std::string out;
    size_t count = 0;
    for (size_t i = 0; i < input.size();) {
        if (isspace((unsigned char)input[i])) {
            i++;
            continue;
        }
        size_t start = i;
        while (i < input.size() && !isspace((unsigned char)input[i])) i++;
        std::string word = input.substr(start, i - start);
        char* end;
        errno = 0;
        long id = strtol(word.c_str(), &end, 10);
        if (*end != '\0' || errno != 0 || word[0] == '+') {
            fatal("decode: '%s' (token %zu of the input) is not a token id", word.c_str(), count);
        }
        if (id < 0 || id >= vocab_size) {
            fatal("decode: token id %s (token %zu of the input) is outside GPT-2's vocabulary 0..%ld", word.c_str(),
                  count, vocab_size - 1);
        }
        out += table.token_bytes[id];
        count++;
    }
    write_stdout(out);
    return 0;
}

static void make_dirs(const std::string& path) {
    for (size_t slash = path.find('/', 1); slash != std::string::npos; slash = path.find('/', slash + 1)) {
        make_dir_check(path.substr(0, slash));
    }
    make_dir_check(path);
}

// Encoding throughput on FILE, for dev/bench_tokenizer.sh. Times encoding only (the vocabulary is
// loaded first): one thread with an empty cache, one thread warm (best of --repeat), and the file's
// blank-line documents, copied --repeat times, through prepro's batch encoder on 1 thread and on
// --threads (default: all cores).
static int cmd_bench(const Args& args) {
    if (args.positional.size() != 1) fatal("bench takes one FILE");
    std::string text = read_input(args.positional[0]);
    if (text.empty()) fatal("bench: '%s' is empty", args.positional[0].c_str());
    int repeat = args.repeat;
    BpeTokenizer tok;
    bpe_tokenizer_load(&tok, find_bpe_dir(args.bpe_dir, "--bpe-dir"));
    auto seconds_since = [](std::chrono::steady_clock::time_point start) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    double mb = text.size() / 1e6;
    std::vector<int> ids;

    BpeEncoder enc;
    bpe_encoder_init(&enc, &tok);
    auto start = std::chrono::steady_clock::now();
    bpe_encode(&enc, text.data(), text.size(), &ids);
    double cold = seconds_since(start);
    double warm = 1e30;
    for (int r = 0; r < repeat; r++) {
        ids.clear();
        start = std::chrono::steady_clock::now();
        bpe_encode(&enc, text.data(), text.size(), &ids);
        warm = std::min(warm, seconds_since(start));
    }
    bpe_encoder_free(&enc);

    std::vector<std::string> docs;
    for (int r = 0; r < repeat; r++) {
        for (size_t pos = 0; pos < text.size();) {
            size_t at = text.find("\n\n", pos);
            size_t stop = at == std::string::npos ? text.size() : at + 2;
            docs.push_back(text.substr(pos, stop - pos));
            pos = stop;
        }
    }
    printf("ours  %-40s %8.2f MB/s  (%zu tokens)\n", "1 thread, empty cache, whole text", mb / cold, ids.size());
    printf("ours  %-40s %8.2f MB/s  (best of %d)\n", "1 thread, warm cache, whole text", mb / warm, repeat);
    int max_threads = args.threads > 0 ? (int)args.threads : std::max(1, (int)std::thread::hardware_concurrency());
    std::vector<int> thread_counts = {1};
    if (max_threads > 1) thread_counts.push_back(max_threads);
    for (int threads : thread_counts) {
        std::vector<BpeEncoder> encoders(threads);
        for (BpeEncoder& e : encoders) bpe_encoder_init(&e, &tok);
        std::vector<std::vector<int>> doc_ids;
        start = std::chrono::steady_clock::now();
        prepro_encode_batch(&encoders, docs, &doc_ids);
        double batch = seconds_since(start);
        for (BpeEncoder& e : encoders) bpe_encoder_free(&e);
        char label[64];
        snprintf(label, sizeof(label), "prepro batch, %d thread(s), documents", threads);
        printf("ours  %-40s %8.2f MB/s  (%zu documents = the text x %d)\n", label, mb * repeat / batch, docs.size(),
               repeat);
    }
    bpe_tokenizer_free(&tok);
    return 0;
}

static int cmd_prepro(const Args& args) {
    if (!args.positional.empty()) fatal("prepro takes only options (unexpected '%s')", args.positional[0].c_str());
    if (args.input.empty() || args.output_dir.empty() || args.name.empty()) {
        fatal("prepro needs --input FILE_OR_DIR, --output-dir DIR and --name NAME");
    }
    if (args.name.find('/') != std::string::npos) fatal("--name '%s' must not contain '/'", args.name.c_str());
    if (args.split_blank_lines && !args.jsonl_field.empty()) {
        fatal("--split-blank-lines and --jsonl are two ways to split; give one");
    }
    PreproSplit split = args.split_blank_lines ? PREPRO_BLANK_LINES
                      : !args.jsonl_field.empty() ? PREPRO_JSONL : PREPRO_ONE_DOC_PER_FILE;
    BpeTokenizer tok;
    bpe_tokenizer_load(&tok, find_bpe_dir(args.bpe_dir, "--bpe-dir"));
    auto t_start = std::chrono::steady_clock::now();  // read, encode, write; not the vocabulary load
    PreproSource source;
    prepro_source_init(&source, args.input, split, args.jsonl_field);
    make_dirs(args.output_dir);
    std::string tokenizer_path = args.output_dir + "/gpt2_tokenizer.bin";
    prepro_write_tokenizer_file(tokenizer_path, tok);

    int threads = args.threads > 0 ? (int)args.threads : std::max(1, (int)std::thread::hardware_concurrency());
    std::vector<BpeEncoder> encoders(threads);
    for (BpeEncoder& enc : encoders) bpe_encoder_init(&enc, &tok);
    PreproShardWriter writer;
    prepro_shard_writer_init(&writer, args.output_dir, args.name, args.val_tokens, args.shard_tokens);
    std::vector<std::string> docs;
    std::vector<std::vector<int>> ids;
    while (prepro_next_batch(&source, &docs)) {
        prepro_encode_batch(&encoders, docs, &ids);
        for (const std::vector<int>& doc_ids : ids) prepro_shard_writer_add(&writer, doc_ids.data(), doc_ids.size());
    }
    prepro_shard_writer_finish(&writer);

    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    for (const std::string& path : writer.written) printf("wrote %s\n", path.c_str());
    printf("wrote %s\n", tokenizer_path.c_str());
    printf("%ld documents, %ld bytes -> %ld tokens (val %ld, train %ld in %d shard(s)) in %.2f s: %.1f MB/s on "
           "%d thread(s)\n",
           source.documents, source.bytes, writer.total_tokens, std::min(writer.total_tokens, writer.val_tokens),
           writer.total_tokens - std::min(writer.total_tokens, writer.val_tokens), writer.train_shards, seconds,
           source.bytes / seconds / 1e6, threads);
    // shards of an earlier, larger run under the same name would be read as part of this dataset
    std::string stale = prepro_shard_path(args.output_dir, args.name, "train", writer.train_shards);
    if (file_exists(stale)) {
        fprintf(stderr, "warning: '%s' and any later train shards are from an earlier run; delete them\n", stale.c_str());
    }
    std::string stale_val = prepro_shard_path(args.output_dir, args.name, "val", 0);
    if (args.val_tokens == 0 && file_exists(stale_val)) {
        fprintf(stderr, "warning: '%s' is from an earlier run (this one has no val split)\n", stale_val.c_str());
    }
    for (BpeEncoder& enc : encoders) bpe_encoder_free(&enc);
    bpe_tokenizer_free(&tok);
    return 0;
}

int main(int argc, char** argv) {
    if (argc < 2) usage(EXIT_FAILURE);
    std::string command = argv[1];
    if (command == "-h" || command == "--help") usage(EXIT_SUCCESS);
    Args args = parse_args(argc, argv, 2);
    if (command == "encode") return cmd_encode(args);
    if (command == "decode") return cmd_decode(args);
    if (command == "prepro") return cmd_prepro(args);
    if (command == "bench") return cmd_bench(args);
    fprintf(stderr, "Error: unknown command '%s'\n", command.c_str());
    usage(EXIT_FAILURE);
}
