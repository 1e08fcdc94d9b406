// The bench report: one WorkloadResult per workload run (a workload may
// run in variants: W2 and W9 at QD 1 and QD N, W6 per codec and corpus), the
// seed-demo rows, and their JSON and human renderings.
//
// JSON shape (stable; tests/bench_smoke.sh checks it):
//   {"target": "in-process" | URI, "size": N, "qd": N, "seed": N,
//    "layout": {"cluster_size": N, "extended_l2": bool},       (in-process)
//    "latency_us": N,        (in-process: added to every host request, 0: none)
//    "results": [{"id": "W2", "title": "...", "variant": "qd16", "qd": 16,
//                 "ops": N, "bytes": N, "seconds": x, "flush_seconds": x,
//                 "mb_per_s": x, "iops": x, "p50_us": x, "p99_us": x,
//                 "space_amplification": x | null, "allocated_bytes": N | null,
//                 "write_amplification": x | null, "host_bytes_written": N | null,
//                 "cpu_us_per_op": x | null, "cpu_source": "self" | "server" | null,
//                 "output_ratio": x | null, "output_bytes": N | null}, ...]}
// Seed demo: {"seed_demo": {"size": N, "layouts": [{"name": "...",
//   "cluster_size": N, "extended_l2": bool, "passes": [{"name": "...",
//   "block_size": N, "bytes": N, "seconds": x, "kb_per_s": x,
//   "write_amplification": x, "host_bytes_written": N, "data_bytes": N,
//   "fill_bytes": N, "metadata_bytes": N,
//   "speed_explanation": "...", "amplification_explanation": "..."}]}]}}
//
// Thread safety: plain data and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/stats.h"

namespace thindisk::bench {

struct WorkloadResult {
  std::string id;       // "W1".."W6", "W9"
  std::string title;
  std::string variant;  // "qd16", "zstd text", ...
  uint32_t qd = 1;
  PhaseFigures figures;
  double flush_seconds = 0;
  std::optional<double> space_amplification;  // allocated file bytes / guest bytes
  std::optional<uint64_t> allocated_bytes;
  std::optional<double> write_amplification;  // host bytes written / guest bytes
  std::optional<uint64_t> host_bytes_written;
  std::optional<double> cpu_us_per_op;
  std::string cpu_source;                     // "self", "server" or ""
  std::optional<double> output_ratio;         // W6: output / input bytes
  std::optional<uint64_t> output_bytes;
};

struct Report {
  std::string target = "in-process";
  uint64_t size = 0;
  uint32_t qd = 0;
  uint64_t seed = 0;
  bool has_layout = false;
  uint32_t cluster_size = 0;
  bool extended_l2 = false;
  std::optional<uint64_t> latency_us;  // in-process: io::LatencyStorage's latency
  std::vector<WorkloadResult> results;
};

struct SeedPass {
  std::string name;
  uint32_t block_size = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  double kb_per_s = 0;  // 1000-byte kB per second, as dd prints it
  double write_amplification = 0;
  uint64_t host_bytes_written = 0;
  uint64_t data_bytes = 0;      // host bytes that were the guest's data
  uint64_t fill_bytes = 0;      // whole-unit writes: new bytes with zeros/copies around them
  uint64_t metadata_bytes = 0;  // L2 tables, refcount blocks, header
  std::string speed_explanation;
  std::string amplification_explanation;
};

struct SeedLayout {
  std::string name;
  uint32_t cluster_size = 0;
  bool extended_l2 = false;
  std::vector<SeedPass> passes;
};

struct SeedDemo {
  uint64_t size = 0;
  std::vector<SeedLayout> layouts;
};

nlohmann::json ToJson(const Report& report);
nlohmann::json ToJson(const SeedDemo& demo);

// Aligned table, one row per result, then a legend line.
std::string ToHuman(const Report& report);
// Per layout, per pass: "kB/s and amplification", each followed by its
// explanation on its own indented line.
std::string ToHuman(const SeedDemo& demo);

}  // namespace thindisk::bench
