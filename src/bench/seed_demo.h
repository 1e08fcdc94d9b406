// --seed-demo: the project's seed experiment in one command. For thindisk's
// default layout (128 KiB clusters, extended L2: 4 KiB subclusters) and for
// a large-cluster layout without subclusters (2 MiB, extended_l2=off), on a
// fresh image each:
//   1. 1 KiB sequential writes, one at a time, nothing after each (dd bs=1k
//      without oflag), over `size` bytes;
//   2. the same writes again (now allocated);
//   3. 1 MiB writes over the next `size` bytes (fresh), then a flush (dd
//      bs=1M conv=fdatasync).
// Speed is timed as dd times it (passes 1-2 without a flush, pass 3 with
// it); write amplification counts every host byte the pass caused,
// metadata written by a flush after the pass included.
//
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <string>

#include "bench/in_process.h"
#include "bench/report.h"
#include "util/result.h"

namespace thindisk::bench {

struct SeedDemoOptions {
  std::string dir;             // parent of the scratch directory
  uint64_t size = 64ull << 20;  // bytes per pass
  LabelledProgressFn progress;
};

Result<SeedDemo> RunSeedDemo(const SeedDemoOptions& options);

// The seed's observation that the demo answers: `dd bs=1k` into a fresh
// disk ran at 421 kB/s (2.4 ms per 1 KiB write).
inline constexpr double kSeedKbPerS = 421;

// Above this average time per request a buffered write waited on the disk
// (page-cache writeback, a fill): a copy into the page cache plus the
// engine's lookup costs a few microseconds, a device write tens to
// thousands.
inline constexpr double kNoDiskWaitUs = 50;
// From this ratio of in-request host bytes (data and fill) to guest bytes
// on, the extra bytes are the likely cost of a slow request (each 1 KiB
// write then writes at least 2 KiB).
inline constexpr double kCostlyAmplification = 2;

// The sentences printed under each figure, computed from the figures alone
// (pure functions: the same figures give the same sentences, different
// figures different ones). `pass` is 0, 1 or 2 as above.
//
// ExplainSpeed turns p.kb_per_s into the time per request, sets it against
// kSeedKbPerS, and says what the time went to: a request quicker than
// kNoDiskWaitUs waited on no disk; a slower one either paid for the host
// bytes written inside it (p.data_bytes + p.fill_bytes, when that is at
// least kCostlyAmplification times the guest's) or waited on the host. For pass 2 it reads
// the rate as the disk's bandwidth and says whether that bandwidth, or the
// cost per request, explains the seed's figure.
std::string ExplainSpeed(int pass, const SeedPass& p);
// Built from the pass's measured split of host bytes (data, fill,
// metadata), so the sentence says where the extra bytes went.
std::string ExplainAmplification(int pass, uint32_t cluster_size, bool extended_l2, const SeedPass& p);

}  // namespace thindisk::bench
