// Compression codecs for qcow2 compressed clusters: zlib and zstd.
//
// Formats (what qemu-img writes and reads, per the qcow2 spec):
//  - kZlib: a RAW deflate stream (no zlib header or checksum) with a 4 KiB
//    window (windowBits -12).
//  - kZstd: zstd frames; Compress writes exactly one. Decompress also reads
//    a cluster split over several consecutive frames.
// Compressed data is stored sector-rounded, so Decompress ignores whatever
// follows the stream once the cluster is full.
//
// Thread safety: all functions may be called concurrently. Each thread keeps
// its own reusable codec contexts (thread_local), because convert compresses
// many clusters per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "util/result.h"
#include "util/status.h"

namespace thindisk {

enum class Codec { kZlib, kZstd };

std::string_view CodecName(Codec codec);  // "zlib", "zstd"

// Level 0 picks the codec's default: zlib 6, zstd 3. Otherwise zlib takes
// 1..9 and zstd 1..ZSTD_maxCLevel() or its negative "fast" levels.
inline constexpr int kDefaultCompressionLevel = 0;

// Compresses all of `src` into `dst`; returns the compressed size.
// Errors: kNotSupported ("does not fit") when the output would exceed
// dst.size() -- callers pass dst smaller than a cluster so that a stored
// compressed cluster saves space, and on this error store it uncompressed;
// kInvalidArgument for a bad level or spans over 1 GiB.
Result<size_t> Compress(Codec codec, int level, std::span<const uint8_t> src,
                        std::span<uint8_t> dst);

// Decompresses `src` to fill `dst` exactly (one cluster). Bytes after the
// compressed stream(s) are ignored. `src` is untrusted: any malformed,
// truncated or oversized stream gives kCorrupt, never a crash; a stream that
// ends before `dst` is full is kCorrupt too.
Status Decompress(Codec codec, std::span<const uint8_t> src, std::span<uint8_t> dst);

// Cheap guess that compressing `data` would gain nothing, so a caller can
// skip trying. Samples up to 4 KiB (eight 512-byte slices spread over the
// buffer) and estimates the Shannon entropy of its byte histogram with the
// Miller-Madow small-sample correction. Returns true when the estimate is at
// least kIncompressibleBitsPerByte. Uniformly random or already-compressed
// data measures ~7.9-8.0 bits/byte, text and code ~4-6, zeros 0. Buffers
// under 512 bytes always return false (too small to judge). Byte entropy
// misses long-range repeats (a random 4 KiB block repeated), so a false
// "true" is possible for such data; the cost is storing it uncompressed.
inline constexpr double kIncompressibleBitsPerByte = 7.8;
bool LooksIncompressible(std::span<const uint8_t> data);

}  // namespace thindisk
