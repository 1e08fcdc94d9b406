// --fork's pipe protocol (serve_fork.h) with real processes: the parent
// returns success once the child reports Ready, the child's message when it
// reports Failed, and how it ended when it exits without a word.
#include "cli/serve_fork.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <optional>

namespace thindisk::cli {
namespace {

// Forks; the child runs `child` and exits 0 without returning into gtest.
template <typename F>
Result<std::optional<ForkReport>> ForkAndRun(F child) {
  auto r = ForkServer();
  if (r.has_value() && r->has_value()) {
    child(**r);
    ::_exit(0);
  }
  return r;
}

TEST(ServeForkTest, ParentReturnsOnceTheChildIsReady) {
  auto r = ForkAndRun([](ForkReport& report) {
    report.Ready();
    ::usleep(200 * 1000);  // still running when the parent returns
  });
  ASSERT_TRUE(r.has_value()) << r.status().ToString();
  EXPECT_FALSE(r->has_value());
}

TEST(ServeForkTest, ParentGetsTheChildsError) {
  auto r = ForkAndRun([](ForkReport& report) {
    report.Failed(Status::NotFound("disk.qcow2: No such file or directory"));
    report.Ready();  // ignored: the report was made
  });
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message(), "disk.qcow2: No such file or directory");
}

TEST(ServeForkTest, ParentSeesAChildThatDiedSilently) {
  auto r = ForkAndRun([](ForkReport&) { ::_exit(3); });
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("exited with status 3 before it was ready"),
            std::string::npos)
      << r.error().message();
}

}  // namespace
}  // namespace thindisk::cli
