// Export: one named block device offered by the NBD server.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "block/device.h"
#include "block/dirty_bitmap.h"

namespace thindisk::nbd {

// Changes to an export's data (WRITE, WRITE_ZEROES, TRIM from any of its
// connections), counted when each begins and when it ends. A read made
// ahead of its request (a prefetch) is good only while `begun` has not
// moved since before the read began, when `ended` equalled it: then no
// change ran while it read, nor has one run since.
struct DataChanges {
  std::atomic<uint64_t> begun{0};
  std::atomic<uint64_t> ended{0};
};

struct Export {
  std::string name;         // as clients ask for it; "" is the default export
  std::string description;  // free text for NBD_OPT_LIST and NBD_INFO_DESCRIPTION
  std::shared_ptr<block::Device> device;  // shared: several connections use it at once
  bool read_only = false;                 // also read-only when device->info().read_only
  // Offered as the metadata contexts "qemu:dirty-bitmap:NAME" (qemu-nbd -B),
  // over the same bytes as `device`.
  std::vector<std::shared_ptr<block::DirtyBitmap>> bitmaps = {};
  // Shared by copies of this Export: the server's connections to it.
  std::shared_ptr<DataChanges> changes = std::make_shared<DataChanges>();

  bool effective_read_only() const {
    return read_only || (device && device->info().read_only);
  }
};

}  // namespace thindisk::nbd
