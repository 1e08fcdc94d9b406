// Latency and throughput figures of one benchmark phase.
//
// A phase records one latency per operation (nanoseconds); Summarize turns
// them into the figures the report prints: ops, bytes, MB/s, IOPS and the
// p50/p99 latencies (nearest-rank percentiles, as fio reports them).
//
// Thread safety: a LatencyLog is used by one thread; runners keep one per
// worker and Merge them after the workers have joined.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace thindisk::bench {

class LatencyLog {
 public:
  void Reserve(size_t n) { ns_.reserve(n); }
  void Add(uint64_t ns) { ns_.push_back(ns); }
  void Merge(const LatencyLog& other) { ns_.insert(ns_.end(), other.ns_.begin(), other.ns_.end()); }
  size_t count() const { return ns_.size(); }
  const std::vector<uint64_t>& samples() const { return ns_; }

 private:
  std::vector<uint64_t> ns_;
};

// The nearest-rank percentile `p` (0 < p <= 100) of `samples`: the smallest
// sample with at least p% of the samples <= it. 0 for no samples. Sorts a copy.
uint64_t Percentile(std::vector<uint64_t> samples, double p);

struct PhaseFigures {
  uint64_t ops = 0;
  uint64_t bytes = 0;  // guest bytes moved
  double seconds = 0;  // wall time of the phase, final flush included
  double mb_per_s = 0;  // bytes / seconds / 1e6
  double iops = 0;
  double p50_us = 0;
  double p99_us = 0;
};

// Figures for `ops` operations moving `bytes` in `seconds` with `latencies`.
// Rates are 0 when seconds is 0.
PhaseFigures Summarize(uint64_t ops, uint64_t bytes, double seconds, const LatencyLog& latencies);

}  // namespace thindisk::bench
