// A run's memory, predicted before anything is allocated: named rows of bytes, printed as a table whose
// last line scripts read (`plan: total N bytes per process`, N a plain integer). The CUDA trainer fills
// it (train_gpt2.cu, gpt2_memory_plan) for -P 1 and compares it with cudaMemGetInfo at start-up; the
// host rows (pinned memory, -oo 1) are printed below the total, which is the device's. The CPU trainer
// fills the same table with its arrays (train_gpt2.cpp, gpt2_memory_plan), against the host's memory.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

struct MemoryPlanRow {
    std::string what;  // "parameters (bf16)"
    size_t bytes;
    std::string note;  // how it was counted, or what would change it
};

struct MemoryPlan {
    std::vector<MemoryPlanRow> rows;
    std::vector<MemoryPlanRow> host_rows;  // host memory the run pins (-oo 1's optimizer), not in the total
    size_t capacity = 0;  // the device's memory, bytes (0: unknown)
    std::string place = "the device";  // whose memory capacity is
    size_t headroom = 0;  // kept free beside the rows for lazy allocations

    void add(const std::string& what, size_t bytes, const std::string& note = "") { rows.push_back({what, bytes, note}); }
    void add_host(const std::string& what, size_t bytes, const std::string& note = "") { host_rows.push_back({what, bytes, note}); }
    size_t total() const {
        size_t sum = 0;
        for (const MemoryPlanRow& r : rows) sum += r.bytes;
        return sum;
    }
    bool fits() const { return capacity == 0 || total() + headroom <= capacity; }
};

// An amount of memory as a person reads it: MiB below a GiB (so a small model's "0.0 GiB" never hides
// what is in use), GiB from there, one decimal.
inline std::string memory_text(size_t bytes) {
    char text[32];
    if (bytes < (1ull << 30)) snprintf(text, sizeof(text), "%.1f MiB", bytes / 1048576.0);
    else snprintf(text, sizeof(text), "%.1f GiB", bytes / 1073741824.0);
    return text;
}

inline void print_memory_plan(const MemoryPlan& plan) {
    const double MiB = 1048576.0;
    printf("memory plan, per process:\n");
    for (const MemoryPlanRow& r : plan.rows) {
        printf("  %-38s %10.1f MiB%s%s\n", r.what.c_str(), r.bytes / MiB, r.note.empty() ? "" : "  ", r.note.c_str());
    }
    printf("  %-38s %10.1f MiB\n", "total", plan.total() / MiB);
    if (plan.capacity > 0) {
        char kept[96] = "";
        if (plan.headroom > 0) snprintf(kept, sizeof(kept), "; with %.1f MiB kept free for later allocations", plan.headroom / MiB);
        printf("  %s has %.1f MiB%s: this %s\n", plan.place.c_str(), plan.capacity / MiB, kept,
               plan.fits() ? "fits" : "DOES NOT FIT");
    }
    for (const MemoryPlanRow& r : plan.host_rows) {
        printf("  host: %-32s %10.1f MiB%s%s\n", r.what.c_str(), r.bytes / MiB, r.note.empty() ? "" : "  ", r.note.c_str());
    }
    printf("plan: total %zu bytes per process\n", plan.total());
}

// The host memory available for new allocations (MemAvailable of /proc/meminfo), bytes; 0 if unknown.
inline size_t host_available_bytes() {
    FILE* f = fopen("/proc/meminfo", "r");
    if (f == nullptr) return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    }
    fclose(f);
    return (size_t)kib * 1024;
}
