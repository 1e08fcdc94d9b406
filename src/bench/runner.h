// Running one phase of a workload: a list of operations issued with a
// queue depth, timed per operation, bounded by an op count and a runtime.
//
// In-process, queue depth N is N worker threads calling into the engine
// (block::Device is thread-safe); the NBD client (nbd_client.h) keeps N
// requests in flight on one connection instead. Both fill a PhaseRun.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "bench/stats.h"
#include "bench/workload.h"
#include "util/result.h"

namespace thindisk::bench {

struct RunLimits {
  double max_seconds = 0;  // 0: no limit; stops issuing new ops after this long
  uint64_t max_ops = 0;    // 0: no limit; issues at most this many ops
};

// Called from the thread that started the phase, every ~100 ms and at the end.
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

struct PhaseRun {
  // Ops executed: always the prefix ops[0, executed) of the list, so a
  // follow-up phase (W3 after W2) can replay exactly what was written.
  uint64_t executed = 0;
  uint64_t bytes = 0;
  double seconds = 0;        // wall time, `finish` included
  double finish_seconds = 0;  // the part spent in `finish` (the flush)
  LatencyLog latencies;

  PhaseFigures Figures() const { return Summarize(executed, bytes, seconds, latencies); }
};

// Performs one op; `scratch` is the worker's own buffer of at least
// op.length bytes, filled with seeded random bytes once (write data) or
// overwritten (read target).
using OpFn = std::function<Status(const Op& op, std::span<uint8_t> scratch)>;

// Runs `ops` on `qd` threads (qd >= 1), then `finish` (may be null) inside
// the timed region. Stops at the first error and returns it (after all
// workers have stopped), naming the op's offset.
Result<PhaseRun> RunThreaded(const std::vector<Op>& ops, uint32_t qd, uint64_t seed,
                             const RunLimits& limits, const ProgressFn& progress, const OpFn& fn,
                             const std::function<Status()>& finish);

// Seconds since an arbitrary epoch (steady clock), for phases timed by hand.
double NowSeconds();

}  // namespace thindisk::bench
