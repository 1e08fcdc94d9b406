// The interface between thindisk and its TLS module, thindisk-tls.so
// (nbd/tls.h): one table of functions, returned by the module's only
// exported symbol. Both sides are compiled from this header in one build;
// the module refuses a caller whose ABI number or exchanged types' sizes
// differ from its own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "nbd/tls.h"
#include "nbd/transport.h"
#include "util/result.h"

namespace thindisk::nbd::tls_module {

// The module's file name.
inline constexpr const char* kModuleFile = "thindisk-tls.so";

// Raised whenever the table or what passes through it changes meaning.
inline constexpr uint32_t kModuleAbi = 1;

struct ModuleTable {
  Result<std::shared_ptr<TlsServer>> (*create_server)(TlsSettings settings);
};

// What both sides must agree on beyond the ABI number: the sizes of the
// types passed through the table. A default-made layout is this build's.
// The first two fields are every module's (util::OtherBuildError).
struct ModuleLayout {
  uint32_t abi = kModuleAbi;
  uint32_t table = sizeof(ModuleTable);
  uint32_t status = sizeof(Status);
  uint32_t settings = sizeof(TlsSettings);
  uint32_t string = sizeof(std::string);

  bool operator==(const ModuleLayout&) const = default;
};

// The exported symbol: the table when `caller` equals the module's own
// layout, else nullptr (and `*own`, when given, gets the module's).
inline constexpr const char* kModuleEntry = "thindisk_tls_module";
using ModuleEntry = const ModuleTable* (*)(const ModuleLayout& caller, ModuleLayout* own);

}  // namespace thindisk::nbd::tls_module
