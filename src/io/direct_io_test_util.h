// Test helpers for the io tests: their temp dir, and where to put it when a
// test needs O_DIRECT.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "io/storage.h"
#include "util/capability_test_util.h"
#include "util/temp_dir_test_util.h"

namespace thindisk::io::test_util {

using ::thindisk::test_env::TempDir;

// Whether a file created in `dir` can be opened with O_DIRECT (tmpfs before
// Linux 6.6 and some overlay or FUSE filesystems refuse it). The probe file
// is removed again.
inline bool AcceptsODirect(const std::string& dir) {
  std::string tmpl = dir + "/.td_odirect_probe.XXXXXX";
  const int fd = mkstemp(tmpl.data());
  if (fd < 0) return false;
  // The way PosixStorage switches it on (fcntl, not open), so they agree.
  const int fl = fcntl(fd, F_GETFL);
  const bool ok = fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
  ::close(fd);
  ::unlink(tmpl.c_str());
  return ok;
}

// The directories tried for O_DIRECT tests, in order: $THINDISK_ODIRECT_DIR
// (when set), /var/tmp, the working directory (under ctest: the build
// tree), then $TMPDIR or /tmp.
inline std::vector<std::string> DirectIoCandidates() {
  std::vector<std::string> dirs;
  if (const char* d = std::getenv("THINDISK_ODIRECT_DIR"); d != nullptr && *d != '\0') {
    dirs.push_back(d);
  }
  dirs.push_back("/var/tmp");
  std::error_code ec;
  if (auto cwd = std::filesystem::current_path(ec); !ec) dirs.push_back(cwd.string());
  const char* tmp = std::getenv("TMPDIR");
  dirs.push_back(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
  return dirs;
}

// The first candidate whose filesystem accepts O_DIRECT, or "" when none
// does or THINDISK_TEST_DENY lists o_direct. Tests needing O_DIRECT create
// their TempDir there and TD_SKIP_OR_FAIL when it is "".
inline std::string DirectIoDir() {
  if (::thindisk::test_env::CapabilityDenied("o_direct")) return "";
  for (const std::string& dir : DirectIoCandidates()) {
    if (AcceptsODirect(dir)) return dir;
  }
  return "";
}

// The reason to give when DirectIoDir() is "".
inline std::string NoDirectIoReason() {
  if (::thindisk::test_env::CapabilityDenied("o_direct")) {
    return "O_DIRECT denied by THINDISK_TEST_DENY";
  }
  std::string tried;
  for (const std::string& dir : DirectIoCandidates())
    tried += (tried.empty() ? "" : ", ") + dir;
  return "no directory accepts O_DIRECT (tried " + tried +
         "; set THINDISK_ODIRECT_DIR to one that does)";
}

constexpr size_t kPage = 4096;

// How many pages of [offset, offset + len) the page cache holds, per
// mincore(2) on a mapping of them (which, unlike a read, starts no
// readahead).
inline size_t CachedPages(int fd, uint64_t offset, size_t len) {
  void* p = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(offset));
  EXPECT_NE(p, MAP_FAILED) << "mmap: " << errno;
  if (p == MAP_FAILED) return 0;
  std::vector<unsigned char> vec((len + kPage - 1) / kPage);
  EXPECT_EQ(mincore(p, len, vec.data()), 0) << "mincore: " << errno;
  munmap(p, len);
  size_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n;
}

// Whether the page at `offset` is in the page cache.
inline bool PageCached(int fd, uint64_t offset) {
  return CachedPages(fd, offset, kPage) != 0;
}

// Drops the file's pages from the page cache; false if some stay.
inline bool DropCache(Storage& s) {
  if (!s.Flush().ok()) return false;
  for (int i = 0; i < 3; ++i) {
    if (posix_fadvise(s.ReadFd(), 0, 0, POSIX_FADV_DONTNEED) != 0) return false;
    if (!PageCached(s.ReadFd(), kPage)) return true;
  }
  return false;
}

}  // namespace thindisk::io::test_util
