// Target (a): the workloads run in this process against fresh qcow2 images
// created in a scratch directory or RADOS pool (bench/scratch.h), through
// the real engine (block::Open), with host write amplification and this
// process's CPU time per op. Local images have a CountingStorage under each
// layer and (with `latency`) a LatencyStorage under that, so every host
// request of every image waits the latency; pool images count their own
// writes and take no latency.
//
// Per workload (DESIGN.md), each on a fresh image of max(4 GiB, size):
//   W1 read [0, size) in 1 MiB requests, never written.
//   W2 4 KiB writes to every block of [0, size) in seeded random order, at
//      QD 1 (own image) and at QD qd; flush at the end (timed).
//   W3 the ops W2 (QD qd) executed, again, on W2's image.
//   W4 write [0, size) in 1 MiB requests, flush (timed).
//   W5 a base written in full, an overlay on it, W2's pattern on the overlay.
//   W6 min(size, 256 MiB) of text-like corpus and of random bytes written
//      with Image::WriteCompressed, per codec (zlib, zstd).
//   W9 set-up (untimed): [0, size) written in 1 MiB requests and flushed;
//      then 4 KiB reads of every block of [0, size) in seeded random order,
//      at QD 1 and at QD qd, on the same image. Each phase is bounded by
//      the limits on its own.
//
// Thread safety: RunInProcess is reentrant (separate scratch directories).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/report.h"
#include "bench/runner.h"
#include "bench/workload.h"
#include "qcow2/image.h"
#include "util/result.h"

namespace thindisk::bench {

// Progress of the current phase, labelled ("W2 qd16"), from the calling thread.
using LabelledProgressFn =
    std::function<void(const std::string& label, uint64_t done, uint64_t total)>;

// What every target runs: the workloads, their size, depth, seed and limits.
struct WorkloadOptions {
  uint64_t size = 1ull << 30;  // guest bytes each workload covers
  uint32_t qd = 16;
  uint64_t seed = 1;
  RunLimits limits;
  std::vector<Workload> workloads;
  LabelledProgressFn progress;  // may be null
};

struct InProcessOptions : WorkloadOptions {
  std::string dir;  // parent of the scratch directory, or rados://POOL
  // Per host request (io::LatencyStorage); 0: none. Local images only.
  std::chrono::microseconds latency{0};
  qcow2::CreateOptions layout;  // everything but size (set per image)
  bool keep_images = false;     // leave the scratch directory (or pool images) behind
};

// The smallest virtual size the workloads use: DESIGN.md's 4 GiB, or more
// when `size` asks for more.
uint64_t VirtualSizeFor(uint64_t size);

Result<Report> RunInProcess(const InProcessOptions& options);

}  // namespace thindisk::bench
