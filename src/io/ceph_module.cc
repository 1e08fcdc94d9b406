// The Ceph module's loader and the functions that forward to it (io/ceph_module.h).
#include "io/ceph_module.h"

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "io/ceph_module_abi.h"
#include "util/module_loader.h"

namespace thindisk::io::ceph_module {
namespace {

const util::ModuleSpec& Spec() {
  static const util::ModuleSpec spec{
      .file = kModuleFile,
      .entry = kModuleEntry,
      .kind = "Ceph",
      .libraries = {"librados", "librbd", "libceph"},
      .install = "apt-get install librados2 librbd1",
  };
  return spec;
}

// The release handler, kept so a module loaded later gets it.
struct Shared {
  std::mutex mu;
  const ModuleTable* table = nullptr;  // once loaded; guarded by mu
  RadosReleaseHandler handler;         // guarded by mu
};

Shared& State() {
  static Shared shared;
  return shared;
}

Result<const ModuleTable*> Module() {
  static const Result<const ModuleTable*> loaded = [] {
    Result<const ModuleTable*> opened = util::LoadModuleTable<ModuleTable, ModuleLayout>(Spec());
    if (opened) {
      Shared& s = State();
      std::lock_guard<std::mutex> lock(s.mu);
      s.table = *opened;
      if (s.handler) s.table->set_rados_release_handler(s.handler);
    }
    return opened;
  }();
  return loaded;
}

// Module(), its error naming the image (or pool) `name` that needed it.
Result<const ModuleTable*> ModuleFor(const std::string& name) {
  Result<const ModuleTable*> m = Module();
  if (!m) return m.error().WithContext(name);
  return m;
}

}  // namespace

Status Load() { return Module().status(); }

Result<std::unique_ptr<Storage>> OpenRados(const std::string& name,
                                           const OpenOptions& options) {
  TD_ASSIGN_OR_RETURN(const ModuleTable* m, ModuleFor(name));
  return m->open_rados(name, options);
}

Result<std::unique_ptr<Storage>> OpenRbd(const std::string& name,
                                         const OpenOptions& options) {
  TD_ASSIGN_OR_RETURN(const ModuleTable* m, ModuleFor(name));
  return m->open_rbd(name, options);
}

Status CreateRadosFormatted(const std::string& name, uint64_t object_size,
                            const std::function<Status(Storage&)>& format) {
  TD_ASSIGN_OR_RETURN(const ModuleTable* m, ModuleFor(name));
  return m->create_rados_formatted(name, object_size, format);
}

Status RemoveRados(const std::string& name, const RemoveProgress& progress) {
  TD_ASSIGN_OR_RETURN(const ModuleTable* m, ModuleFor(name));
  return m->remove_rados(name, progress);
}

Result<std::vector<RadosImageEntry>> ListRados(const std::string& pool) {
  TD_ASSIGN_OR_RETURN(const ModuleTable* m, ModuleFor(pool));
  return m->list_rados(pool);
}

Result<std::vector<RadosLocker>> ListRadosLockers(const std::string& name) {
  TD_ASSIGN_OR_RETURN(const ModuleTable* m, ModuleFor(name));
  return m->list_rados_lockers(name);
}

Result<std::vector<RadosLocker>> BreakRadosLock(const std::string& name, bool force) {
  TD_ASSIGN_OR_RETURN(const ModuleTable* m, ModuleFor(name));
  return m->break_rados_lock(name, force);
}

Result<std::shared_ptr<void>> HoldCluster(const std::string& pool) {
  TD_ASSIGN_OR_RETURN(const ModuleTable* m, ModuleFor(pool));
  return m->hold_cluster(pool);
}

void SetRadosReleaseHandler(RadosReleaseHandler handler) {
  Shared& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  s.handler = std::move(handler);
  if (s.table) s.table->set_rados_release_handler(s.handler);
}

}  // namespace thindisk::io::ceph_module
