#include "bench/workload.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <utility>

namespace thindisk::bench {

std::string_view WorkloadId(Workload w) {
  static constexpr std::string_view kIds[kWorkloadCount] = {"W1", "W2", "W3", "W4", "W5", "W6", "W9"};
  return kIds[int(w)];
}

std::string_view WorkloadTitle(Workload w) {
  switch (w) {
    case Workload::kW1SeqRead: return "sequential read, 1 MiB blocks, never-written image";
    case Workload::kW2FirstWrite: return "4 KiB random first writes";
    case Workload::kW3Rewrite: return "the same 4 KiB random writes again (allocated)";
    case Workload::kW4SeqWrite: return "sequential write, 1 MiB blocks, then flush";
    case Workload::kW5CloneWrite: return "4 KiB random writes into a clone of a written base";
    case Workload::kW6Compress: return "compressed convert of a text corpus and random data";
    case Workload::kW9RandRead: return "4 KiB random reads of written data";
  }
  return "?";
}

Result<std::vector<Workload>> ParseWorkloads(std::string_view text) {
  bool wanted[kWorkloadCount] = {};
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = std::min(text.find(',', pos), text.size());
    std::string_view item = text.substr(pos, comma - pos);
    int found = -1;
    for (int i = 0; i < kWorkloadCount; ++i) {
      std::string_view id = WorkloadId(Workload(i));
      if (item.size() == id.size() && std::toupper(static_cast<unsigned char>(item[0])) == id[0] &&
          item.substr(1) == id.substr(1)) {
        found = i;
      }
    }
    if (found < 0) {
      return Status::InvalidArgument("unknown workload '" + std::string(item) +
                                     "' (expected W1..W6 or W9, comma-separated)");
    }
    wanted[found] = true;
    pos = comma + 1;
  }
  std::vector<Workload> out;
  for (int i = 0; i < kWorkloadCount; ++i) {
    if (wanted[i]) out.push_back(Workload(i));
  }
  return out;
}

std::vector<Op> SequentialOps(uint64_t start, uint64_t span, uint32_t block) {
  std::vector<Op> ops;
  if (block == 0) return ops;
  ops.reserve(span / block + 1);
  for (uint64_t off = 0; off < span; off += block) {
    ops.push_back({start + off, uint32_t(std::min<uint64_t>(block, span - off))});
  }
  return ops;
}

std::vector<Op> RandomOps(uint64_t span, uint32_t block, uint64_t seed, uint64_t count) {
  std::vector<Op> ops;
  if (block == 0) return ops;
  uint64_t blocks = span / block;
  ops.reserve(blocks);
  for (uint64_t b = 0; b < blocks; ++b) ops.push_back({b * block, block});
  // Fisher-Yates with our own generator, so the order is the same everywhere.
  SplitMix64 rng(seed);
  for (uint64_t i = blocks; i > 1; --i) std::swap(ops[i - 1], ops[rng.Below(i)]);
  if (count != 0 && count < ops.size()) ops.resize(count);
  return ops;
}

uint64_t SplitMix64::Next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void FillRandom(uint64_t seed, std::span<uint8_t> buf) {
  SplitMix64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= buf.size(); i += 8) {
    uint64_t v = rng.Next();
    for (int k = 0; k < 8; ++k) buf[i + k] = uint8_t(v >> (8 * k));
  }
  uint64_t v = rng.Next();
  for (; i < buf.size(); ++i, v >>= 8) buf[i] = uint8_t(v);
}

std::vector<uint8_t> TextCorpus(uint64_t seed, uint64_t bytes) {
  // A vocabulary of pseudo-words; word k is drawn with weight ~ 1/(k+1)
  // (Zipf), which gives prose-like redundancy without shipping a corpus.
  constexpr int kWords = 4096;
  SplitMix64 rng(seed ^ 0x7465787463727573ull);
  std::vector<std::string> vocab(kWords);
  for (std::string& w : vocab) {
    size_t len = 2 + rng.Below(9);
    for (size_t i = 0; i < len; ++i) w.push_back(char('a' + rng.Below(26)));
  }
  std::vector<double> cumulative(kWords);
  double total = 0;
  for (int k = 0; k < kWords; ++k) cumulative[k] = total += 1.0 / (k + 1);

  std::vector<uint8_t> out;
  out.reserve(bytes + 16);
  bool sentence_start = true;
  int words_in_line = 0;
  while (out.size() < bytes) {
    double x = double(rng.Next() >> 11) * 0x1.0p-53 * total;
    size_t k = size_t(std::lower_bound(cumulative.begin(), cumulative.end(), x) - cumulative.begin());
    const std::string& w = vocab[std::min<size_t>(k, kWords - 1)];
    for (size_t i = 0; i < w.size(); ++i) {
      char c = w[i];
      if (i == 0 && sentence_start) c = char(std::toupper(c));
      out.push_back(uint8_t(c));
    }
    sentence_start = false;
    uint64_t r = rng.Below(100);
    if (r < 6) {
      out.push_back('.');
      sentence_start = true;
    } else if (r < 10) {
      out.push_back(',');
    }
    if (++words_in_line >= 12 && rng.Below(4) == 0) {
      out.push_back('\n');
      words_in_line = 0;
    } else {
      out.push_back(' ');
    }
  }
  out.resize(bytes);
  return out;
}

}  // namespace thindisk::bench
