// nbdclient::nbd_module: how the rest of thindisk reaches NBD servers as a
// client: exports as image storage (nbdclient/nbd_storage.h), the dirty
// bitmaps a backup reads (nbdclient/dirty_map.h), `serve -L`'s listing
// (nbdclient/list_exports.h) and `bench --uri`'s requests in flight
// (nbdclient/pipeline.h).
//
// The code behind these functions lives in a module, thindisk-nbd.so,
// loaded the first time one of them needs it (util/module_loader.h says
// where it is looked for). libnbd brings libxml2 and ICU: mapping them
// costs a cold start about 12 ms, a quarter of thindisk's start-up, which
// every command would pay for images that are no NBD export. Loaded on
// demand, only a process that names an NBD URI pays it, and thindisk runs
// on a host without libnbd: every other image works, an NBD URI fails with
// the reason. Telling an NBD URI from a file name (nbdclient/nbd_uri.h)
// and the export views (nbdclient/export_file.h) stay in the binary.
//
// The module and the binary must come from one build: they exchange C++
// objects (Status, Storage, std::function). The module's entry checks an
// ABI number and the exchanged types' sizes, so a stray module is refused
// with a message rather than trusted.
//
// Thread safety: every function may be called from any thread; the module
// is loaded once (the first caller waits) and never unloaded.
#pragma once

#include <memory>
#include <string>

#include "io/storage.h"
#include "nbdclient/dirty_map.h"
#include "nbdclient/list_exports.h"
#include "nbdclient/pipeline.h"
#include "util/result.h"

namespace thindisk::nbdclient::nbd_module {

// The module's file name.
inline constexpr const char* kModuleFile = "thindisk-nbd.so";

// Loads the module if it is not loaded yet. kNotSupported saying why when
// it cannot be: none found (naming where it was looked for), or dlopen's
// reason (libnbd missing: which package to install).
Status Load();

// Each forwards to the function of the same name in nbdclient/, after
// Load(); its error when that fails, with the URI (or server) as context.
Result<std::unique_ptr<io::Storage>> OpenNbd(const std::string& uri, bool read_only);
Result<DirtyMap> ReadDirtyMap(const std::string& uri, const std::string& bitmap);
Status ListExports(const ListTarget& target);
Result<std::unique_ptr<Pipeline>> OpenPipeline(const std::string& uri);

}  // namespace thindisk::nbdclient::nbd_module
