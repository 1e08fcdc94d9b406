// TempDir: a fresh directory for a test, removed with its contents when the
// object goes. Header-only and dependency-free, for the tests of any layer.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace thindisk::test_env {

// Makes `base`/`prefix`.XXXXXX (mkdtemp); the destructor removes it
// recursively. ok() is false (and path() empty) when it could not be made.
class TempDir {
 public:
  explicit TempDir(const std::string& base = "/var/tmp", const char* prefix = "td_test") {
    std::string tmpl = base + "/" + prefix + ".XXXXXX";
    if (!base.empty() && mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace thindisk::test_env
