// Export: one named block device offered by the NBD server.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "block/device.h"
#include "block/dirty_bitmap.h"

namespace thindisk::nbd {

struct Export {
  std::string name;         // as clients ask for it; "" is the default export
  std::string description;  // free text for NBD_OPT_LIST and NBD_INFO_DESCRIPTION
  std::shared_ptr<block::Device> device;  // shared: several connections use it at once
  bool read_only = false;                 // also read-only when device->info().read_only
  // Offered as the metadata contexts "qemu:dirty-bitmap:NAME" (qemu-nbd -B),
  // over the same bytes as `device`.
  std::vector<std::shared_ptr<block::DirtyBitmap>> bitmaps = {};

  bool effective_read_only() const {
    return read_only || (device && device->info().read_only);
  }
};

}  // namespace thindisk::nbd
