// What a test needs from the machine (a tool such as qemu-img, a Ceph cluster,
// O_DIRECT, a tmpfs) and what happens when the machine lacks it: the rule
// of STYLE.md habit 8 and docs/testing.md, in one place for every gtest.
//
//   - Locally a missing capability skips the test (GTEST_SKIP).
//   - With CI or THINDISK_REQUIRE_TOOLS set (scripts/test.sh exports both)
//     it fails the test and says what was missing: CI runs everything it
//     claims to, or says why not.
//   - THINDISK_TEST_DENY=name[,name...] makes CapabilityDenied(name) true,
//     and every probe that consults it reports the capability unavailable.
//     That is how the rule itself is tested: run a suite with the switch,
//     once without CI (it must skip) and once with CI=1 (it must fail); see
//     tests/skip_rule.sh. Names in use: o_direct, ceph, and tool names
//     (qemu-img, qemu-io, nbdinfo, nbdcopy, ...).
//
// Header-only and dependency-free (getenv and gtest), so tests of any layer
// may include it.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string_view>

namespace thindisk::test_env {

// True when a missing capability must fail the test instead of skipping it.
inline bool CapabilitiesRequired() {
  auto set = [](const char* var) {
    const char* v = std::getenv(var);
    return v != nullptr && *v != '\0';
  };
  return set("CI") || set("THINDISK_REQUIRE_TOOLS");
}

// True when THINDISK_TEST_DENY lists `name` (comma-separated, exact match).
inline bool CapabilityDenied(std::string_view name) {
  const char* env = std::getenv("THINDISK_TEST_DENY");
  if (env == nullptr) return false;
  std::string_view list(env);
  while (!list.empty()) {
    const size_t comma = list.find(',');
    if (list.substr(0, comma) == name) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace thindisk::test_env

// TD_SKIP_OR_FAIL(reason): the capability the test needs is missing. Skips
// the test locally, fails it when CapabilitiesRequired(). `reason` is
// streamed, so `TD_SKIP_OR_FAIL(tool << " not installed")` works. Like
// GTEST_SKIP and FAIL it returns from the enclosing void function (test
// body or SetUp).
#define TD_SKIP_OR_FAIL(reason)                                               \
  do {                                                                        \
    if (::thindisk::test_env::CapabilitiesRequired()) {                       \
      FAIL() << reason << " (CI or THINDISK_REQUIRE_TOOLS is set: a missing " \
             << "capability is a failure)";                                   \
    }                                                                         \
    GTEST_SKIP() << reason;                                                   \
  } while (0)

// TD_REQUIRE_CAPABILITY(available, reason): TD_SKIP_OR_FAIL(reason) unless
// `available` is true.
#define TD_REQUIRE_CAPABILITY(available, reason) \
  do {                                           \
    if (!(available)) TD_SKIP_OR_FAIL(reason);   \
  } while (0)

// TD_REQUIRE_TOOL(name, installed): the tool `name` (a string, also its
// THINDISK_TEST_DENY name) must be installed, as `installed` says (that
// probe runs only when the tool is not denied).
#define TD_REQUIRE_TOOL(name, installed)                         \
  do {                                                           \
    if (::thindisk::test_env::CapabilityDenied(name))            \
      TD_SKIP_OR_FAIL(name << " denied by THINDISK_TEST_DENY");  \
    if (!(installed)) TD_SKIP_OR_FAIL(name << " not installed"); \
  } while (0)
