// The benchmark workloads (DESIGN.md W1-W6, and W9) as plain data: which ones to run
// and the operation lists they issue, generated deterministically from a
// seed so two runs (or a run and its replay) issue the same offsets.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "util/result.h"

namespace thindisk::bench {

enum class Workload {
  kW1SeqRead,       // sequential 1 MiB reads of a never-written image
  kW2FirstWrite,    // 4 KiB random first writes
  kW3Rewrite,       // the same 4 KiB random writes again
  kW4SeqWrite,      // sequential 1 MiB writes, then flush
  kW5CloneWrite,    // 4 KiB random writes into a clone of a written base
  kW6Compress,      // compressed convert of a text corpus and random data
  kW9RandRead,      // 4 KiB random reads of written data (W7, W8 are bench/compare rows)
};
inline constexpr int kWorkloadCount = 7;

// "W1".."W6", "W9".
std::string_view WorkloadId(Workload w);
// One line: what the workload does.
std::string_view WorkloadTitle(Workload w);

// Parses "W1,W3,w9" (case-insensitive, any order, duplicates allowed) into
// the workloads in W1..W6, W9 order. Errors (kInvalidArgument) name the bad item.
Result<std::vector<Workload>> ParseWorkloads(std::string_view text);

// One request of a phase; the phase says whether it reads or writes.
struct Op {
  uint64_t offset = 0;
  uint32_t length = 0;
};

// [start, start + span) in `block`-sized requests, in order; a shorter last
// request covers a span that is not a multiple of block.
std::vector<Op> SequentialOps(uint64_t start, uint64_t span, uint32_t block);

// Every `block`-aligned block of [0, span) exactly once, in an order
// shuffled by `seed` (so every write is a first write), truncated to `count`
// when count is non-zero and smaller. Deterministic across platforms: it
// uses its own generator, not the library's distributions.
std::vector<Op> RandomOps(uint64_t span, uint32_t block, uint64_t seed, uint64_t count = 0);

// A small deterministic generator (splitmix64) for offsets and data.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, n) (n > 0); the modulo bias is below 2^-40 for the sizes used here.
  uint64_t Below(uint64_t n) { return Next() % n; }

 private:
  uint64_t state_;
};

// Fills `buf` with incompressible bytes from `seed`.
void FillRandom(uint64_t seed, std::span<uint8_t> buf);

// `bytes` of text-like data (words of a seeded vocabulary, Zipf-like word
// frequencies, punctuation and line breaks): compresses like prose or logs,
// about 2:1 with zlib. Same seed, same bytes.
std::vector<uint8_t> TextCorpus(uint64_t seed, uint64_t bytes);

}  // namespace thindisk::bench
