// The NBD client module's loader and the functions that forward to it
// (nbdclient/nbd_module.h).
#include "nbdclient/nbd_module.h"

#include <memory>
#include <string>

#include "nbdclient/nbd_module_abi.h"
#include "util/module_loader.h"

namespace thindisk::nbdclient::nbd_module {
namespace {

const util::ModuleSpec& Spec() {
  static const util::ModuleSpec spec{
      .file = kModuleFile,
      .entry = kModuleEntry,
      .kind = "NBD client",
      .libraries = {"libnbd"},
      .install = "apt-get install libnbd0",
  };
  return spec;
}

// The module, loaded by the first caller.
const Result<const ModuleTable*>& Module() {
  static const Result<const ModuleTable*> loaded =
      util::LoadModuleTable<ModuleTable, ModuleLayout>(Spec());
  return loaded;
}

// Module(), its error naming `name`, the URI or server that needed it.
Result<const ModuleTable*> ModuleFor(const std::string& name) {
  const Result<const ModuleTable*>& m = Module();
  if (!m) return m.error().WithContext(name);
  return m;
}

}  // namespace

Status Load() { return Module().status(); }

Result<std::unique_ptr<io::Storage>> OpenNbd(const std::string& uri, bool read_only) {
  TD_ASSIGN_OR_RETURN(const ModuleTable* m, ModuleFor(uri));
  return m->open_nbd(uri, read_only);
}

Result<DirtyMap> ReadDirtyMap(const std::string& uri, const std::string& bitmap) {
  TD_ASSIGN_OR_RETURN(const ModuleTable* m, ModuleFor(uri));
  return m->read_dirty_map(uri, bitmap);
}

Status ListExports(const ListTarget& target) {
  TD_ASSIGN_OR_RETURN(const ModuleTable* m, ModuleFor("-L/--list " + target.Server()));
  return m->list_exports(target);
}

Result<std::unique_ptr<Pipeline>> OpenPipeline(const std::string& uri) {
  TD_ASSIGN_OR_RETURN(const ModuleTable* m, ModuleFor(uri));
  return m->open_pipeline(uri);
}

}  // namespace thindisk::nbdclient::nbd_module
