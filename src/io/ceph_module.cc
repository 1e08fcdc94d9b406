// The Ceph module's loader and the functions that forward to it (io/ceph_module.h).
#include "io/ceph_module.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "io/ceph_module_abi.h"

namespace thindisk::io::ceph_module {
namespace {

// The directory of the running executable, "" when /proc cannot say.
std::string ExecutableDir() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string path(buf, size_t(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// Where the module may be, in the order of io/ceph_module.h.
std::vector<std::string> Candidates() {
  if (const char* dir = std::getenv("THINDISK_MODULE_DIR"); dir && *dir) {
    return {std::string(dir) + "/" + kModuleFile};
  }
  std::vector<std::string> where;
  const std::string exe = ExecutableDir();
  if (!exe.empty()) {
    where.push_back(
        std::filesystem::path(exe + "/" THINDISK_MODULE_RELDIR "/" + kModuleFile)
            .lexically_normal()
            .string());
    where.push_back(exe + "/" + kModuleFile);
  }
  // Only for programs inside the build tree: an installed binary must never
  // load code from where it was built (a build under /tmp would let anyone
  // plant a module there).
  const std::string build = THINDISK_MODULE_BUILD_TREE;
  if (exe == build || exe.starts_with(build + "/")) {
    where.push_back(THINDISK_MODULE_BUILD_PATH);
  }
  return where;
}

std::string Describe(const ModuleLayout& l) {
  return "ABI " + std::to_string(l.abi) + ", table " + std::to_string(l.table) + " bytes";
}

Result<const ModuleTable*> Open() {
  const std::vector<std::string> where = Candidates();
  for (const std::string& path : where) {
    if (::access(path.c_str(), F_OK) != 0) continue;
    // RTLD_LOCAL: librados' symbols stay the module's; it is never closed
    // (its threads and librados' may outlive any one image).
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* error = ::dlerror();
      const std::string why = error ? error : path;
      // A Ceph library missing, rather than a broken module: say which package.
      const bool ceph = why.find("librados") != std::string::npos ||
                        why.find("librbd") != std::string::npos ||
                        why.find("libceph") != std::string::npos;
      return Status::NotSupported("Ceph support cannot be loaded: " + why +
                                  (ceph ? " (apt-get install librados2 librbd1)" : ""));
    }
    auto entry = reinterpret_cast<ModuleEntry>(::dlsym(handle, kModuleEntry));
    if (!entry) {
      ::dlclose(handle);
      return Status::NotSupported(path + ": not a thindisk Ceph module (no " +
                                  std::string(kModuleEntry) + ")");
    }
    ModuleLayout theirs;
    const ModuleTable* table = entry(ModuleLayout{}, &theirs);
    if (!table) {
      return Status::NotSupported(path + ": a Ceph module of another thindisk build (" +
                                  Describe(theirs) + "; this one needs " +
                                  Describe(ModuleLayout{}) + ")");
    }
    return table;
  }
  std::string tried;
  for (const std::string& path : where) tried += (tried.empty() ? "" : ", ") + path;
  return Status::NotSupported("Ceph support is not installed: no " +
                              std::string(kModuleFile) + " (looked for " + tried + ")");
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
    Result<const ModuleTable*> opened = Open();
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
