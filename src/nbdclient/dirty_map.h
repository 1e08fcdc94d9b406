// nbdclient::ReadDirtyMap: the dirty ranges of a bitmap an NBD server
// exports as the metadata context "qemu:dirty-bitmap:NAME" (qemu-nbd -B,
// thindisk serve -B; docs/interop/nbd.rst in QEMU), through libnbd's block
// status, as a backup reads them to copy only what changed.
//
// Errors name the URI: the server not reachable, the context not offered
// ("... does not export bitmap NAME: serve it with -B NAME"), a reply that
// does not cover the export. Thread safety: stateless (one libnbd handle
// per call).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/result.h"

namespace thindisk::nbdclient {

struct DirtyRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct DirtyMap {
  uint64_t export_size = 0;
  std::vector<DirtyRange> dirty;  // ascending, merged
};

Result<DirtyMap> ReadDirtyMap(const std::string& uri, const std::string& bitmap);

}  // namespace thindisk::nbdclient
