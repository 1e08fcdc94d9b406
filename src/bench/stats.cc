#include "bench/stats.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace thindisk::bench {

uint64_t Percentile(std::vector<uint64_t> samples, double p) {
  if (samples.empty()) return 0;
  p = std::clamp(p, 0.0, 100.0);
  // Nearest rank: ceil(p/100 * n), 1-based; rank 1 at least.
  size_t rank = size_t(std::ceil(p / 100.0 * double(samples.size())));
  rank = std::clamp<size_t>(rank, 1, samples.size());
  auto nth = samples.begin() + std::ptrdiff_t(rank - 1);
  std::nth_element(samples.begin(), nth, samples.end());
  return *nth;
}

PhaseFigures Summarize(uint64_t ops, uint64_t bytes, double seconds, const LatencyLog& latencies) {
  PhaseFigures f;
  f.ops = ops;
  f.bytes = bytes;
  f.seconds = seconds;
  if (seconds > 0) {
    f.mb_per_s = double(bytes) / seconds / 1e6;
    f.iops = double(ops) / seconds;
  }
  f.p50_us = double(Percentile(latencies.samples(), 50)) / 1e3;
  f.p99_us = double(Percentile(latencies.samples(), 99)) / 1e3;
  return f;
}

}  // namespace thindisk::bench
