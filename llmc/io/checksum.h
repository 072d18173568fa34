// Checksums of the model and state files: a CRC-32 per block of the payload and one of the header, all
// stored in the header, so that a flipped bit anywhere is found when the file is read and the message
// names the bytes that changed.
//
// Why blocks: a checkpoint is hundreds of MB, and one checksum could only say "somewhere in this
// file". With one per block the reader names the range [a, b) that a disk, memory or copy error
// changed, and it checks as it reads, with no second pass over the file.
// Why CRC-32 (zlib's, gzip's and PNG's polynomial, 0xEDB88320 reflected): it catches every burst of up
// to 32 flipped bits and all but 2^-32 of other damage, and Python's zlib.crc32 computes the same, so
// dev/hf_gpt2.py checks and writes these files with the standard library. Slicing-by-8 (eight tables
// of 256 words, 8 bytes per step) runs at a few GB/s, small next to the disk.
//
// Header slots (h[0..63] belong to the file's own format; llm.c reads only h[0..7] of a model file, so
// our model files still load there):
//   h[64]  CHECKSUM_TAG, or 0 in a file without checksums (llm.c's, or written before they existed)
//   h[65]  block size in bytes: 1 MiB, or the fewest whole MiB that keep the blocks within 188
//          (GPT-2 124M in fp32, 475 MiB of weights: 3 MiB blocks)
//   h[66]  number of blocks K = ceil(payload bytes / block size), at most 188 (0 for an empty payload)
//   h[67]  CRC-32 of the 1024-byte header with h[67] set to 0
//   h[68 + i], i < K: CRC-32 of payload block i, file bytes [1024 + i*size, 1024 + min((i+1)*size, payload))
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../utils.h"

constexpr int32_t CHECKSUM_TAG = 20261203;
constexpr int CHECKSUM_SLOT_TAG = 64, CHECKSUM_SLOT_BLOCK_BYTES = 65, CHECKSUM_SLOT_BLOCKS = 66;
constexpr int CHECKSUM_SLOT_HEADER = 67, CHECKSUM_SLOT_FIRST_BLOCK = 68;
constexpr int CHECKSUM_MAX_BLOCKS = HEADER_INTS - CHECKSUM_SLOT_FIRST_BLOCK;  // 188
constexpr int64_t CHECKSUM_MIN_BLOCK_BYTES = 1 << 20;

// ----------------------------------------------------------------------------
// CRC-32

// table[k][b]: the CRC of byte b followed by k zero bytes, so eight bytes fold in at once.
struct Crc32Tables {
    uint32_t table[8][256];
    Crc32Tables() {
        for (uint32_t b = 0; b < 256; b++) {
            uint32_t crc = b;
            for (int bit = 0; bit < 8; bit++) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
            table[0][b] = crc;
        }
        for (int k = 1; k < 8; k++) {
            for (int b = 0; b < 256; b++) table[k][b] = (table[k - 1][b] >> 8) ^ table[0][table[k - 1][b] & 0xff];
        }
    }
};

// The CRC-32 of the bytes so far (`crc`, 0 for none) extended by data[n]: crc32_update(0, "123456789", 9)
// is 0xCBF43926, and in Python crc32_update(c, d, n) == zlib.crc32(d, c).
inline uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
    static const Crc32Tables tables;
    const uint32_t(*t)[256] = tables.table;
    const unsigned char* p = (const unsigned char*)data;
    crc = ~crc;
    for (; n >= 8; n -= 8, p += 8) {  // the CRC is little-endian: its low byte meets the first byte
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][p[4]] ^
              t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    }
    for (; n > 0; n--, p++) crc = (crc >> 8) ^ t[0][(crc ^ *p) & 0xff];
    return ~crc;
}

// ----------------------------------------------------------------------------
// block checksums of one file, as it is written or read

struct BlockChecksums {
    std::string path;             // for messages
    const char* what = "";        // "model checkpoint", "optimizer state file"
    int64_t block_bytes = 0;
    int64_t payload_bytes = 0;
    int64_t done = 0;             // payload bytes seen so far
    uint32_t running = 0;         // CRC of the current block's bytes so far
    std::vector<uint32_t> sums;   // writing: one per finished block; reading: the stored ones
    bool verify = false;          // reading: the file has checksums to compare with
};

// The block size for a payload: 1 MiB, or the fewest whole MiB that need at most 188 blocks.
inline int64_t checksum_block_bytes(int64_t payload_bytes) {
    int64_t max_blocks = CHECKSUM_MAX_BLOCKS;
    int64_t mib = (payload_bytes + max_blocks * CHECKSUM_MIN_BLOCK_BYTES - 1) / (max_blocks * CHECKSUM_MIN_BLOCK_BYTES);
    return (mib < 1 ? 1 : mib) * CHECKSUM_MIN_BLOCK_BYTES;
}

inline int32_t checksum_block_count(int64_t payload_bytes, int64_t block_bytes) {
    return (int32_t)((payload_bytes + block_bytes - 1) / block_bytes);
}

// Folds `bytes` bytes into the checksums; at each block's end calls block_done(index, crc).
template <typename BlockDone>
void block_checksums_add(BlockChecksums* c, const void* data, size_t bytes, BlockDone block_done) {
    const unsigned char* p = (const unsigned char*)data;
    while (bytes > 0) {
        int64_t in_block = c->done % c->block_bytes;
        size_t take = (size_t)std::min<int64_t>((int64_t)bytes, c->block_bytes - in_block);
        c->running = crc32_update(c->running, p, take);
        c->done += (int64_t)take;
        p += take;
        bytes -= take;
        if (c->done % c->block_bytes == 0 || c->done == c->payload_bytes) {
            block_done((int)((c->done - 1) / c->block_bytes), c->running);
            c->running = 0;
        }
    }
}

// ----------------------------------------------------------------------------
// writing: the header goes first with its checksum slots empty and is written again at the end

// Fills h[64..66] for a payload of `payload_bytes` and writes the header (to be rewritten by
// checksummed_write_end). `header` holds the file's own fields.
inline BlockChecksums checksummed_write_begin(AtomicFile* f, int32_t* header, int64_t payload_bytes, const char* what) {
    BlockChecksums c;
    c.path = f->path;
    c.what = what;
    c.payload_bytes = payload_bytes;
    c.block_bytes = checksum_block_bytes(payload_bytes);
    if (c.block_bytes > INT32_MAX) fatal("%s '%s': %ld bytes are too many to checksum", what, f->path.c_str(), (long)payload_bytes);
    header[CHECKSUM_SLOT_TAG] = CHECKSUM_TAG;
    header[CHECKSUM_SLOT_BLOCK_BYTES] = (int32_t)c.block_bytes;
    header[CHECKSUM_SLOT_BLOCKS] = checksum_block_count(payload_bytes, c.block_bytes);
    atomic_write(f, header, HEADER_BYTES);
    return c;
}

inline void checksummed_write(AtomicFile* f, BlockChecksums* c, const void* data, size_t bytes) {
    block_checksums_add(c, data, bytes, [&](int, uint32_t crc) { c->sums.push_back(crc); });
    atomic_write(f, data, bytes);
}

// Stores the block checksums and the header's own in `header` and writes it over the first one.
inline void checksummed_write_end(AtomicFile* f, BlockChecksums* c, int32_t* header) {
    if (c->done != c->payload_bytes || (int64_t)c->sums.size() != header[CHECKSUM_SLOT_BLOCKS]) {
        fatal("%s '%s': wrote %ld payload bytes, the header announced %ld", c->what, f->path.c_str(), (long)c->done,
              (long)c->payload_bytes);
    }
    for (size_t i = 0; i < c->sums.size(); i++) header[CHECKSUM_SLOT_FIRST_BLOCK + i] = (int32_t)c->sums[i];
    header[CHECKSUM_SLOT_HEADER] = 0;
    header[CHECKSUM_SLOT_HEADER] = (int32_t)crc32_update(0, header, HEADER_BYTES);
    if (fseek(f->fp, 0, SEEK_SET) != 0) fatal("could not write '%s': %s", f->tmp_path.c_str(), strerror(errno));  // its flush
    atomic_write(f, header, HEADER_BYTES);
}

// ----------------------------------------------------------------------------
// reading

// A checksummed header (h[64] is the tag) must match its own checksum before any of its fields is
// believed: a corrupt size field would otherwise make the file look truncated or too long.
inline void verify_header_checksum(const int32_t* header, const std::string& path, const char* what) {
    if (header[CHECKSUM_SLOT_TAG] != CHECKSUM_TAG) return;
    std::vector<int32_t> copy(header, header + HEADER_INTS);
    copy[CHECKSUM_SLOT_HEADER] = 0;
    uint32_t computed = crc32_update(0, copy.data(), HEADER_BYTES), stored = (uint32_t)header[CHECKSUM_SLOT_HEADER];
    if (computed != stored) {
        fatal("%s '%s' is corrupt: its header (bytes [0, %ld)) does not match its checksum (CRC-32 %08x, stored %08x)",
              what, path.c_str(), HEADER_BYTES, computed, stored);
    }
}

// Checks the checksum slots of a header already read and verified (verify_header_checksum, which the
// readers call before believing any field), for a payload of `payload_bytes` (the size the header
// implies, already checked against the file). A file without checksums is read unverified
// (with a note, unless `quiet`: a header read for its shape alone, whose payload a later read notes)
// unless `required`. Returns the stored block checksums for checksummed_read.
inline BlockChecksums checksums_from_header(const int32_t* header, const std::string& path, const char* what,
                                            int64_t payload_bytes, bool required, bool quiet = false) {
    BlockChecksums c;
    c.path = path;
    c.what = what;
    c.payload_bytes = payload_bytes;
    int32_t tag = header[CHECKSUM_SLOT_TAG];
    if (tag == 0) {
        if (required) fatal("%s '%s' has no checksums, which its version (%d) always has: corrupt header", what, path.c_str(), header[1]);
        if (!quiet) {
            printf("note: %s '%s' carries no checksums (written by llm.c or before checksums existed); read unverified\n",
                   what, path.c_str());
        }
        c.block_bytes = checksum_block_bytes(payload_bytes);  // unused: nothing is compared
        return c;
    }
    c.block_bytes = header[CHECKSUM_SLOT_BLOCK_BYTES];
    int32_t blocks = header[CHECKSUM_SLOT_BLOCKS];
    if (tag != CHECKSUM_TAG || c.block_bytes < CHECKSUM_MIN_BLOCK_BYTES || c.block_bytes % CHECKSUM_MIN_BLOCK_BYTES != 0 ||
        blocks != checksum_block_count(payload_bytes, c.block_bytes) || blocks > CHECKSUM_MAX_BLOCKS) {
        fatal("%s '%s' is corrupt: its checksum fields (header slots 64..66: %d, %d, %d) do not describe its %ld "
              "payload bytes", what, path.c_str(), tag, header[CHECKSUM_SLOT_BLOCK_BYTES], blocks, (long)payload_bytes);
    }
    c.sums.assign((const uint32_t*)header + CHECKSUM_SLOT_FIRST_BLOCK, (const uint32_t*)header + CHECKSUM_SLOT_FIRST_BLOCK + blocks);
    c.verify = true;
    return c;
}

// Reads `bytes` bytes of the payload and checks every block that ends in them.
inline void checksummed_read(FILE* fp, BlockChecksums* c, void* data, size_t bytes) {
    freadCheck(data, 1, bytes, fp);
    if (!c->verify) return;
    block_checksums_add(c, data, bytes, [&](int block, uint32_t crc) {
        if (crc == c->sums[block]) return;
        long begin = HEADER_BYTES + (long)(block * c->block_bytes);
        long end = HEADER_BYTES + (long)std::min(c->payload_bytes, (block + 1) * c->block_bytes);
        fatal("%s '%s' is corrupt: bytes [%ld, %ld) (block %d of %d) do not match their checksum (CRC-32 %08x, "
              "stored %08x): a disk, memory or copy error changed them; restore the file from a copy, or "
              "delete the checkpoint's DONE_ marker to resume from the one before", c->what, c->path.c_str(), begin, end, block + 1, (int)c->sums.size(), crc,
              c->sums[block]);
    });
}
