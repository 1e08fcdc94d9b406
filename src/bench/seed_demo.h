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

// The sentences printed under each figure: why the figure is what it is,
// from the layout and what was measured. `pass` is 0, 1 or 2 as above.
std::string ExplainSpeed(int pass, double kb_per_s);
// Built from the pass's measured split of host bytes (data, fill,
// metadata), so the sentence says where the extra bytes went.
std::string ExplainAmplification(int pass, uint32_t cluster_size, bool extended_l2, const SeedPass& p);

}  // namespace thindisk::bench
