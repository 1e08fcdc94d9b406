// The interface between thindisk and its Ceph module (io/ceph_module.h): one table
// of functions, returned by the module's only exported symbol. Both sides
// are compiled from this header in one build; the module refuses a caller
// whose ABI number or exchanged types' sizes differ from its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/ceph_module.h"
#include "io/storage.h"
#include "util/result.h"

namespace thindisk::io::ceph_module {

// Raised whenever the table or what passes through it changes meaning.
inline constexpr uint32_t kModuleAbi = 2;

struct ModuleTable {
  Result<std::unique_ptr<Storage>> (*open_rados)(const std::string& name,
                                                 const OpenOptions& options);
  Result<std::unique_ptr<Storage>> (*open_rbd)(const std::string& name,
                                               const OpenOptions& options);
  Status (*create_rados_formatted)(const std::string& name, uint64_t object_size,
                                   const std::function<Status(Storage&)>& format);
  Status (*remove_rados)(const std::string& name, const RemoveProgress& progress);
  Result<std::vector<RadosImageEntry>> (*list_rados)(const std::string& pool);
  Result<std::vector<RadosLocker>> (*list_rados_lockers)(const std::string& name);
  Result<std::vector<RadosLocker>> (*break_rados_lock)(const std::string& name,
                                                       bool force);
  Result<std::shared_ptr<void>> (*hold_cluster)(const std::string& pool);
  void (*set_rados_release_handler)(RadosReleaseHandler handler);
};

// What both sides must agree on beyond the ABI number: the sizes of the
// types passed by reference or value through the table. A default-made
// layout is this build's.
struct ModuleLayout {
  uint32_t abi = kModuleAbi;
  uint32_t table = sizeof(ModuleTable);
  uint32_t status = sizeof(Status);
  uint32_t open_options = sizeof(OpenOptions);
  uint32_t image_entry = sizeof(RadosImageEntry);
  uint32_t locker = sizeof(RadosLocker);
  uint32_t handler = sizeof(RadosReleaseHandler);
  uint32_t string = sizeof(std::string);

  bool operator==(const ModuleLayout&) const = default;
};

// The exported symbol: the table when `caller` equals the module's own
// layout, else nullptr (and `*own`, when given, gets the module's).
inline constexpr const char* kModuleEntry = "thindisk_ceph_module";
using ModuleEntry = const ModuleTable* (*)(const ModuleLayout& caller, ModuleLayout* own);

}  // namespace thindisk::io::ceph_module
