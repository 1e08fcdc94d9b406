// Helpers of the RADOS suites (io_rados_test): is there a cluster, unique
// image names, and the `rados` CLI (a tool we did not write) to look at what
// RadosStorage left in the pool.
//
// The cluster is the ctest fixture's (src/io/CMakeLists.txt): CEPH_CONF
// names its ceph.conf, the pool is "thindisk" (scripts/ceph-cluster.sh).
// Without it (no ceph tools, CEPH_CONF unset, THINDISK_TEST_DENY=ceph) a
// test skips locally and fails in CI (util/capability_test_util.h).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "util/capability_test_util.h"
#include "util/shell_test_util.h"

namespace thindisk::io::rados_test {

inline constexpr const char* kPool = "thindisk";

using test_env::RunResult;
using test_env::Shell;

inline std::string CephConf() {
  const char* c = std::getenv("CEPH_CONF");
  return c ? c : "";
}

inline bool HaveRadosCli() { return Shell("rados --version").exit_code == 0; }

// The cluster every test of RadosStorage/RadosQcow2 needs: `ceph` is the
// THINDISK_TEST_DENY name.
#define TD_REQUIRE_CEPH()                                                                \
  do {                                                                                   \
    TD_REQUIRE_TOOL("ceph", ::thindisk::io::rados_test::HaveRadosCli());                 \
    const std::string td_conf_ = ::thindisk::io::rados_test::CephConf();                 \
    if (td_conf_.empty() || access(td_conf_.c_str(), R_OK) != 0) {                       \
      TD_SKIP_OR_FAIL(                                                                   \
          "no test cluster: CEPH_CONF='"                                                 \
          << td_conf_                                                                    \
          << "' (ctest starts one: ctest -R 'Rados', or "                                \
             "scripts/ceph-cluster.sh start DIR and CEPH_CONF=DIR/ceph.conf)");          \
    }                                                                                    \
    const std::string td_stalled_ = ::thindisk::io::rados_test::StalledMark();           \
    if (access(td_stalled_.c_str(), F_OK) == 0) {                                        \
      FAIL() << "the test cluster stopped answering in an earlier test (" << td_stalled_ \
             << "): not waiting on it again";                                            \
    }                                                                                    \
  } while (0)

// "rados://thindisk/<test>-<pid>-<n>": a name no other test or run uses.
inline std::string UniqueImage(const std::string& tag = "img") {
  static std::atomic<int> counter{0};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info ? info->name() : "test") + "-" + tag + "-" +
                     std::to_string(getpid()) + "-" + std::to_string(counter++);
  return name;
}

// (Strings are built with append: g++ 12 -O2 warns falsely, -Warray-bounds,
// on std::string("literal") + const char*.)
inline std::string Uri(const std::string& image) {
  std::string uri = "rados://";
  uri.append(kPool).append("/").append(image);
  return uri;
}

// The test cluster's directory (CEPH_CONF's), "" without one.
inline std::string ClusterDir() {
  const std::string conf = CephConf();
  const size_t slash = conf.rfind('/');
  return slash == std::string::npos ? "" : conf.substr(0, slash);
}

// A file that says the cluster stopped answering: once a test saw that
// (ClusterAnswersAfterFailure), the later ones fail at once
// (TD_REQUIRE_CEPH) instead of each waiting out the client's request
// timeout (scripts/ceph-cluster.sh's conf). The next start of the cluster
// wipes its directory.
inline std::string StalledMark() { return ClusterDir() + "/stalled"; }

// What scripts/ceph-cluster.sh says of the test cluster's state (health,
// full flags, blocked requests, the daemons' warnings): for the message of
// a test that saw the cluster stop answering.
inline std::string ClusterReport() {
  if (ClusterDir().empty()) return "(no CEPH_CONF: no cluster report)";
  std::string cmd = "bash " TD_CEPH_CLUSTER_SCRIPT " report '";
  cmd.append(ClusterDir()).append("'");
  return Shell(cmd).output;
}

// `rados -p thindisk ARGS` with a bounded wait.
inline RunResult Rados(const std::string& args) {
  std::string cmd = "timeout 60 rados -p ";
  cmd.append(kPool).append(" --rados-osd-op-timeout 30 ").append(args);
  return Shell(cmd);
}

// For a fixture's TearDown: after a failed test, is the cluster still
// answering (a write and a read, 10 s each)? If not, the test also fails
// with the cluster's report, and StalledMark() makes the later tests fail
// at once. Returns false then (the TearDown leaves its image alone).
inline bool ClusterAnswersAfterFailure() {
  if (!::testing::Test::HasFailure() || ClusterDir().empty()) return true;
  if (access(StalledMark().c_str(), F_OK) == 0) return false;
  std::string probe = "timeout 20 rados -p ";
  probe.append(kPool).append(" --rados-osd-op-timeout 10 ");
  const std::string object = "td-probe-" + std::to_string(getpid());
  RunResult r = Shell(probe + "put " + object + " '" + CephConf() + "' && " + probe +
                      "stat " + object + " && " + probe + "rm " + object);
  if (r.exit_code == 0) return true;
  const std::string report = r.output + "\n" + ClusterReport();
  std::ofstream(StalledMark()) << report;
  ADD_FAILURE() << "the test cluster stopped answering (a write and a read of " << object
                << " within 10 s each failed):\n"
                << report;
  return false;
}

// The pool's objects whose names start with `prefix` (sorted).
inline std::vector<std::string> ObjectsWithPrefix(const std::string& prefix) {
  RunResult r = Rados("ls");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> out;
  std::istringstream in(r.output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, prefix.size(), prefix) == 0) out.push_back(line);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// An object's size by `rados stat` ("... mtime ..., size N"), -1 if missing.
inline int64_t ObjectSize(const std::string& oid) {
  RunResult r = Rados("stat " + oid);
  if (r.exit_code != 0) return -1;
  const size_t at = r.output.rfind("size ");
  if (at == std::string::npos) return -2;
  return std::strtoll(r.output.c_str() + at + 5, nullptr, 10);
}

// An object's bytes by `rados get` (empty if missing: check ObjectSize).
inline std::vector<uint8_t> ObjectBytes(const std::string& oid) {
  char tmpl[] = "/tmp/td_rados_get_XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) return {};
  close(fd);
  RunResult r = Rados("get " + oid + " " + tmpl);
  std::vector<uint8_t> bytes;
  if (r.exit_code == 0) {
    std::ifstream f(tmpl, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  unlink(tmpl);
  return bytes;
}

// Puts `bytes` as object `oid` with `rados put`.
inline void PutObject(const std::string& oid, const std::vector<uint8_t>& bytes) {
  char tmpl[] = "/tmp/td_rados_put_XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), ssize_t(bytes.size()));
  close(fd);
  RunResult r = Rados("put " + oid + " " + tmpl);
  unlink(tmpl);
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

// Deterministic bytes, different for every (seed, offset).
inline std::vector<uint8_t> Pattern(uint64_t seed, size_t n) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 1);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t x = rng();
    std::memcpy(&v[i], &x, std::min<size_t>(8, n - i));
  }
  return v;
}

inline bool AllZero(const std::vector<uint8_t>& v) {
  for (uint8_t b : v) {
    if (b != 0) return false;
  }
  return true;
}

}  // namespace thindisk::io::rados_test
