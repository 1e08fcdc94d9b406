// The interface between thindisk and its NBD client module
// (nbdclient/nbd_module.h): one table of functions, returned by the
// module's only exported symbol. Both sides are compiled from this header
// in one build; the module refuses a caller whose ABI number or exchanged
// types' sizes differ from its own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "io/storage.h"
#include "nbdclient/dirty_map.h"
#include "nbdclient/list_exports.h"
#include "nbdclient/pipeline.h"
#include "util/result.h"

namespace thindisk::nbdclient::nbd_module {

// Raised whenever the table or what passes through it changes meaning.
inline constexpr uint32_t kModuleAbi = 1;

struct ModuleTable {
  Result<std::unique_ptr<io::Storage>> (*open_nbd)(const std::string& uri, bool read_only);
  Result<DirtyMap> (*read_dirty_map)(const std::string& uri, const std::string& bitmap);
  Status (*list_exports)(const ListTarget& target);
  Result<std::unique_ptr<Pipeline>> (*open_pipeline)(const std::string& uri);
};

// What both sides must agree on beyond the ABI number: the sizes of the
// types passed through the table. A default-made layout is this build's.
// The first two fields are every module's (util::OtherBuildError).
struct ModuleLayout {
  uint32_t abi = kModuleAbi;
  uint32_t table = sizeof(ModuleTable);
  uint32_t status = sizeof(Status);
  uint32_t dirty_map = sizeof(DirtyMap);
  uint32_t list_target = sizeof(ListTarget);
  uint32_t pipeline_calls = sizeof(Pipeline::Calls);
  uint32_t string = sizeof(std::string);

  bool operator==(const ModuleLayout&) const = default;
};

// The exported symbol: the table when `caller` equals the module's own
// layout, else nullptr (and `*own`, when given, gets the module's).
inline constexpr const char* kModuleEntry = "thindisk_nbd_module";
using ModuleEntry = const ModuleTable* (*)(const ModuleLayout& caller, ModuleLayout* own);

}  // namespace thindisk::nbdclient::nbd_module
