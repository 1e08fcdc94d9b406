// Consistency check and repair of a qcow2 image, offline (the image must not
// be open for writing elsewhere). Walks every L1/L2 table (active and
// snapshot), rebuilds the refcounts metadata implies, and compares them with
// the refcount blocks on disk, as `qemu-img check` does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/storage.h"
#include "util/result.h"

namespace thindisk::qcow2 {

enum class RepairMode { kNone, kLeaks, kAll };

struct CheckReport {
  uint64_t corruptions = 0;        // refcount too low, bad offsets, overlaps
  uint64_t leaks = 0;              // clusters with refcount > references
  uint64_t check_errors = 0;       // errors reading the image during the check
  uint64_t corruptions_fixed = 0;
  uint64_t leaks_fixed = 0;
  uint64_t image_end_offset = 0;   // end of the last used cluster
  uint64_t total_clusters = 0;     // guest clusters (virtual size / cluster size)
  uint64_t allocated_clusters = 0; // guest clusters allocated in this layer
  uint64_t fragmented_clusters = 0;
  uint64_t compressed_clusters = 0;
  std::vector<std::string> messages;  // one line per problem found
};

// Errors (not findings) are returned only when the image cannot be checked at
// all (unreadable header). With repair, fixes what `mode` allows and reports
// counts after repair in *_fixed.
Result<CheckReport> Check(io::Storage& storage, RepairMode mode);

}  // namespace thindisk::qcow2
