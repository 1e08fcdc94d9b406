// Finding and opening thindisk's modules (util/module_loader.h).
#include "util/module_loader.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace thindisk::util {
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

// Where `file` may be, in the order of util/module_loader.h.
std::vector<std::string> Candidates(const std::string& file) {
  if (const char* dir = std::getenv("THINDISK_MODULE_DIR"); dir && *dir) {
    return {std::string(dir) + "/" + file};
  }
  std::vector<std::string> where;
  const std::string exe = ExecutableDir();
  if (!exe.empty()) {
    where.push_back(std::filesystem::path(exe + "/" THINDISK_MODULE_RELDIR "/" + file)
                        .lexically_normal()
                        .string());
    where.push_back(exe + "/" + file);
  }
  const std::string build = THINDISK_MODULE_BUILD_TREE;
  if (exe == build || exe.starts_with(build + "/")) where.push_back(build + "/" + file);
  return where;
}

}  // namespace

Result<LoadedModule> LoadModule(const ModuleSpec& spec) {
  const std::vector<std::string> where = Candidates(spec.file);
  for (const std::string& path : where) {
    if (::access(path.c_str(), F_OK) != 0) continue;
    // Never closed once loaded: its threads and its libraries' may outlive
    // any one use.
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* error = ::dlerror();
      const std::string why = error ? error : path;
      // One of its libraries missing, rather than a broken module: say
      // which package brings it.
      bool library = false;
      for (const std::string& l : spec.libraries) library |= why.find(l) != std::string::npos;
      return Status::NotSupported(spec.kind + " support cannot be loaded: " + why +
                                  (library ? " (" + spec.install + ")" : ""));
    }
    void* entry = ::dlsym(handle, spec.entry.c_str());
    if (!entry) {
      ::dlclose(handle);
      return Status::NotSupported(path + ": not a thindisk " + spec.kind + " module (no " +
                                  spec.entry + ")");
    }
    return LoadedModule{path, entry};
  }
  std::string tried;
  for (const std::string& path : where) tried += (tried.empty() ? "" : ", ") + path;
  return Status::NotSupported(spec.kind + " support is not installed: no " + spec.file +
                              " (looked for " + tried + ")");
}

Status OtherBuildError(const ModuleSpec& spec, const std::string& path, uint32_t their_abi,
                       uint32_t their_table, uint32_t our_abi, uint32_t our_table) {
  const auto describe = [](uint32_t abi, uint32_t table) {
    return "ABI " + std::to_string(abi) + ", table " + std::to_string(table) + " bytes";
  };
  return Status::NotSupported(path + ": the " + spec.kind + " module of another thindisk build (" +
                              describe(their_abi, their_table) + "; this one needs " +
                              describe(our_abi, our_table) + ")");
}

}  // namespace thindisk::util
