// Error-checked wrappers around the C library, and the file helpers every reader and writer uses.
//
// Design: the trainers are programs, not libraries, so a failure prints what went wrong (which call,
// which file, where in our source) and exits non-zero. Nothing is clamped or silently skipped.
// Every reader of an external file goes through read_file_header() and expect_file_size(), so the
// magic, the version and the exact size are checked before a single payload byte is trusted.
#pragma once

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

// ----------------------------------------------------------------------------
// Files that an error exit removes
//
// A write that fails half way (a full disk: ENOSPC) must not leave its partial bytes behind, or they
// keep the disk full and the next run fails too. So every file being written is registered here until
// it is complete: the .tmp of each AtomicFile until its rename, and the files of a checkpoint until its
// DONE marker (llmc/io/checkpoint.h). fatal() and the communicators' aborts remove them before the
// process exits. A crash (a signal, a power cut) removes nothing; a resumed run clears what it left.
// The list is never destroyed, so it is still there however late an error comes.

inline std::vector<std::string>& files_removed_on_error() {
    static std::vector<std::string>* paths = new std::vector<std::string>();
    return *paths;
}

inline void remove_on_error(const std::string& path) { files_removed_on_error().push_back(path); }

inline void keep_on_error(const std::string& path) {
    std::vector<std::string>& paths = files_removed_on_error();
    for (size_t i = paths.size(); i-- > 0;) {
        if (paths[i] == path) paths.erase(paths.begin() + i);
    }
}

// Held while a checkpoint is committed (its DONE marker written and its files taken off the list), and
// taken for good by an error exit's removal: an exit decided on another thread (the collective
// watchdog) while this one goes on cannot remove files that a DONE marker then vouches for; the
// committing thread waits instead until the process ends. Recursive: an error inside the commit
// removes on the same thread.
inline std::recursive_mutex& files_commit_mutex() {
    static std::recursive_mutex* m = new std::recursive_mutex;
    return *m;
}

// Called first on the way out of an error (fatal, the watchdog, a communicator's abort) with what ended
// the run: the flight recorder's dump (llmc/parallel/flight_recorder.h), once it knows where to write.
inline void (*error_exit_hook)(const char* reason) = nullptr;

// Called on the way out of an error: removes (and names on stderr) each registered file that exists.
inline void remove_files_on_error() {
    if (error_exit_hook) error_exit_hook("an error exit");  // a dump with a better reason came first, if any
    files_commit_mutex().lock();  // never unlocked: the process is ending
    std::vector<std::string> paths;
    paths.swap(files_removed_on_error());  // an error in here cannot come back to the same list
    for (size_t i = paths.size(); i-- > 0;) {  // newest first
        if (unlink(paths[i].c_str()) == 0) fprintf(stderr, "removed the incomplete file '%s'\n", paths[i].c_str());
    }
}


// The process this is, for error messages, when it is one of several (fatal_set_process); -1: alone.
inline int fatal_process = -1;
inline void fatal_set_process(int rank, int size) { fatal_process = size > 1 ? rank : -1; }

// Prints "Error: <message>" (one of several processes: "Error (process R): <message>") and a newline
// to stderr as one write, so that processes failing together do not interleave their lines. What
// every error exit prints through: fatal() below, and the communicators' aborts.
inline void error_vprint(const char* fmt, va_list args) {
    char message[4096];
    int n = fatal_process >= 0 ? snprintf(message, sizeof(message), "Error (process %d): ", fatal_process)
                               : snprintf(message, sizeof(message), "Error: ");
    vsnprintf(message + n, sizeof(message) - n - 1, fmt, args);
    strcat(message, "\n");
    if (write(STDERR_FILENO, message, strlen(message)) < 0) {}  // nothing more to do if stderr is gone
}

__attribute__((format(printf, 1, 2))) inline void error_print(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    error_vprint(fmt, args);
    va_end(args);
}

// Prints the error (error_vprint), removes the incomplete files (above) and exits with status 1.
[[noreturn]] __attribute__((format(printf, 1, 2))) inline void fatal(const char* fmt, ...) {
    fflush(stdout);
    char message[4000];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof(message), fmt, args);
    va_end(args);
    error_print("%s", message);
    if (error_exit_hook) error_exit_hook(message);
    remove_files_on_error();
    exit(EXIT_FAILURE);
}

// ----------------------------------------------------------------------------
// stdio with checks

inline FILE* fopen_check(const char* path, const char* mode, const char* file, int line) {
    FILE* fp = fopen(path, mode);
    if (fp == nullptr) {
        fatal("could not open '%s' (mode %s): %s  [%s:%d]", path, mode, strerror(errno), file, line);
    }
    return fp;
}
#define fopenCheck(path, mode) fopen_check(path, mode, __FILE__, __LINE__)

inline void fread_check(void* ptr, size_t size, size_t count, FILE* fp, const char* file, int line) {
    size_t got = fread(ptr, size, count, fp);
    if (got != count) {
        fatal("short read: wanted %zu items of %zu bytes, got %zu (%s)  [%s:%d]", count, size, got,
              feof(fp) ? "unexpected end of file" : strerror(errno), file, line);
    }
}
#define freadCheck(ptr, size, count, fp) fread_check(ptr, size, count, fp, __FILE__, __LINE__)

inline void fwrite_check(const void* ptr, size_t size, size_t count, FILE* fp, const char* file, int line) {
    size_t put = fwrite(ptr, size, count, fp);
    if (put != count) {
        fatal("short write: wanted %zu items of %zu bytes, wrote %zu (%s)  [%s:%d]", count, size, put,
              strerror(errno), file, line);
    }
}
#define fwriteCheck(ptr, size, count, fp) fwrite_check(ptr, size, count, fp, __FILE__, __LINE__)

inline void fseek_check(FILE* fp, long offset, int whence, const char* file, int line) {
    if (fseek(fp, offset, whence) != 0) {
        fatal("fseek to %ld failed: %s  [%s:%d]", offset, strerror(errno), file, line);
    }
}
#define fseekCheck(fp, offset, whence) fseek_check(fp, offset, whence, __FILE__, __LINE__)

inline void fclose_check(FILE* fp, const char* file, int line) {
    if (fclose(fp) != 0) {
        fatal("fclose failed: %s  [%s:%d]", strerror(errno), file, line);
    }
}
#define fcloseCheck(fp) fclose_check(fp, __FILE__, __LINE__)

inline void* malloc_check(size_t size, const char* file, int line) {
    void* ptr = malloc(size);
    if (ptr == nullptr && size > 0) {
        fatal("out of memory allocating %zu bytes  [%s:%d]", size, file, line);
    }
    return ptr;
}
#define mallocCheck(size) malloc_check(size, __FILE__, __LINE__)

inline void* calloc_check(size_t count, size_t size, const char* file, int line) {
    void* ptr = calloc(count, size);
    if (ptr == nullptr && count > 0 && size > 0) {
        fatal("out of memory allocating %zu x %zu bytes  [%s:%d]", count, size, file, line);
    }
    return ptr;
}
#define callocCheck(count, size) calloc_check(count, size, __FILE__, __LINE__)

// ----------------------------------------------------------------------------
// Files with a 256 x int32 header (../shared/FORMATS.md)

constexpr int HEADER_INTS = 256;
constexpr long HEADER_BYTES = HEADER_INTS * sizeof(int32_t);

inline bool file_exists(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

inline bool dir_exists(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Size of an open file in bytes; leaves the position at the start.
inline long file_size_of(FILE* fp) {
    fseekCheck(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseekCheck(fp, 0, SEEK_SET);
    return size;
}

// Reads the header of `path` into header[256] and checks its magic and version.
// `what` names the kind of file in messages ("model checkpoint", "data shard", ...).
// `versions` lists the accepted versions (count of them in num_versions).
inline void read_file_header(FILE* fp, const char* path, const char* what, int32_t magic,
                             const int32_t* versions, int num_versions, int32_t* header) {
    long size = file_size_of(fp);
    if (size < HEADER_BYTES) {
        fatal("%s '%s' is %ld bytes, shorter than its %ld-byte header (truncated or not a %s)", what, path,
              size, HEADER_BYTES, what);
    }
    freadCheck(header, sizeof(int32_t), HEADER_INTS, fp);
    if (header[0] != magic) {
        fatal("%s '%s' has magic %d, expected %d (not a %s, or a file of another kind)", what, path, header[0],
              magic, what);
    }
    for (int i = 0; i < num_versions; i++) {
        if (header[1] == versions[i]) return;
    }
    std::string accepted;
    for (int i = 0; i < num_versions; i++) {
        accepted += (i ? " or " : "") + std::to_string(versions[i]);
    }
    fatal("%s '%s' has version %d, this program reads version %s", what, path, header[1], accepted.c_str());
}

// Checks that an open file is exactly the size its header implies.
inline void expect_file_size(FILE* fp, const char* path, const char* what, long expected) {
    long pos = ftell(fp);
    long size = file_size_of(fp);
    fseekCheck(fp, pos, SEEK_SET);
    if (size != expected) {
        fatal("%s '%s' is %ld bytes but its header implies %ld bytes (%s)", what, path, size, expected,
              size < expected ? "truncated" : "trailing bytes: corrupt or not the format its header claims");
    }
}

// ----------------------------------------------------------------------------
// Writing a file so that a crash never leaves a complete-looking one: we write to PATH.tmp, flush it
// to disk, then rename() it over PATH, which POSIX makes atomic on one file system. Until the rename
// an error exit removes PATH.tmp (remove_files_on_error).

struct AtomicFile {
    FILE* fp;
    std::string path;
    std::string tmp_path;
};

inline AtomicFile atomic_open(const std::string& path) {
    AtomicFile f;
    f.path = path;
    f.tmp_path = path + ".tmp";
    f.fp = fopenCheck(f.tmp_path.c_str(), "wb");
    remove_on_error(f.tmp_path);
    return f;
}

// fwrite with a message that names the file (a full disk shows here, or at the commit's flush).
inline void atomic_write(AtomicFile* f, const void* data, size_t bytes) {
    size_t put = fwrite(data, 1, bytes, f->fp);
    if (put != bytes) {
        fatal("could not write '%s' (%zu of %zu bytes written): %s", f->tmp_path.c_str(), put, bytes, strerror(errno));
    }
}

inline void atomic_commit(AtomicFile* f) {
    if (fflush(f->fp) != 0 || fsync(fileno(f->fp)) != 0) {
        fatal("could not write '%s' to disk: %s", f->tmp_path.c_str(), strerror(errno));
    }
    if (fclose(f->fp) != 0) fatal("could not write '%s' to disk: %s", f->tmp_path.c_str(), strerror(errno));
    f->fp = nullptr;
    if (rename(f->tmp_path.c_str(), f->path.c_str()) != 0) {
        fatal("could not rename '%s' to '%s': %s", f->tmp_path.c_str(), f->path.c_str(), strerror(errno));
    }
    keep_on_error(f->tmp_path);  // gone: renamed
}

// Creates DIR (one level) if it does not exist; an existing non-directory is an error.
inline void make_dir_check(const std::string& dir) {
    if (dir_exists(dir)) return;
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
        fatal("could not create directory '%s': %s", dir.c_str(), strerror(errno));
    }
    if (!dir_exists(dir)) fatal("'%s' exists and is not a directory", dir.c_str());
}

// ceil(a / b) for positive integers
inline long ceil_div(long a, long b) { return (a + b - 1) / b; }
