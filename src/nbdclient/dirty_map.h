// nbdclient::ReadDirtyMap: the dirty ranges of a bitmap an NBD server
// exports as the metadata context "qemu:dirty-bitmap:NAME" (qemu-nbd -B,
// thindisk serve -B; docs/interop/nbd.rst in QEMU), through libnbd's block
// status, as a backup reads them to copy only what changed.
//
// A server that does not offer the context is no error: `offered` says so
// (and `dirty` stays empty); NotExportedMessage says it to a user. Errors
// name the URI: the server not reachable, a reply that does not cover the
// export. Thread safety: stateless (one libnbd handle per call).
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
  std::string export_name;  // as the URI names it ("" for the default export)
  uint64_t export_size = 0;
  bool offered = false;           // the server exports the bitmap's context
  std::vector<DirtyRange> dirty;  // ascending, merged
};

// In the NBD client module: the binary calls nbd_module::ReadDirtyMap.
Result<DirtyMap> ReadDirtyMap(const std::string& uri, const std::string& bitmap);

inline std::string NotExportedMessage(const std::string& uri, const std::string& bitmap) {
  return uri + " does not export bitmap '" + bitmap +
         "' (thindisk serve and qemu-nbd export one with -B " + bitmap + ")";
}

}  // namespace thindisk::nbdclient
