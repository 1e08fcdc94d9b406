#include "io/qemu_lock.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace thindisk::io {
namespace {

constexpr QemuLockMode kModes[] = {QemuLockMode::kShared, QemuLockMode::kExclusive};

std::string Name(QemuLockMode m) {
  return m == QemuLockMode::kShared ? "shared" : "exclusive";
}

class QemuLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/td_qemu_lock_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/disk.img";
    std::ofstream(path_) << std::string(4096, 'x');
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The lock type another open file description sees on [start, start+len)
  // when it asks for `want` (F_UNLCK: nobody holds a conflicting lock).
  short Probe(short want, off_t start, off_t len) {
    int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_GE(fd, 0);
    struct flock fl {};
    fl.l_type = want;
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = len;
    EXPECT_EQ(::fcntl(fd, F_OFD_GETLK, &fl), 0);
    ::close(fd);
    return fl.l_type;
  }

  std::string dir_, path_;
};

TEST_F(QemuLockTest, AnySecondHolderIsBusyWhateverTheModes) {
  for (QemuLockMode first : kModes) {
    for (QemuLockMode second : kModes) {
      SCOPED_TRACE(Name(first) + " then " + Name(second));
      auto held = QemuImageLock::Acquire(path_, first);
      ASSERT_TRUE(held.has_value()) << held.error().ToString();
      auto other = QemuImageLock::Acquire(path_, second);
      ASSERT_FALSE(other.has_value());
      EXPECT_EQ(other.error().code(), Code::kBusy) << other.error().ToString();
      EXPECT_NE(other.error().message().find(path_ + ": the image is in use"),
                std::string::npos)
          << other.error().message();
    }
  }
}

TEST_F(QemuLockTest, SharedHoldsQemusPermissionBytes) {
  auto held = QemuImageLock::Acquire(path_, QemuLockMode::kShared);
  ASSERT_TRUE(held.has_value()) << held.error().ToString();
  for (off_t base : {kQemuLockPermBase, kQemuLockSharedBase}) {
    for (off_t p = 0; p < kQemuLockPermissions; ++p) {
      // Shared: another reader may lock the byte too, a writer may not.
      EXPECT_EQ(Probe(F_RDLCK, base + p, 1), F_UNLCK) << base + p;
      EXPECT_EQ(Probe(F_WRLCK, base + p, 1), F_RDLCK) << base + p;
    }
    EXPECT_EQ(Probe(F_WRLCK, base + kQemuLockPermissions, 1), F_UNLCK)
        << "no lock beyond the four permissions at " << base;
  }
}

TEST_F(QemuLockTest, ExclusiveCoversTheWholeRange) {
  auto held = QemuImageLock::Acquire(path_, QemuLockMode::kExclusive);
  ASSERT_TRUE(held.has_value()) << held.error().ToString();
  EXPECT_EQ(Probe(F_RDLCK, kQemuLockPermBase, 1), F_WRLCK);
  EXPECT_EQ(Probe(F_RDLCK, kQemuLockPermBase + kQemuLockSpan - 1, 1), F_WRLCK);
  EXPECT_EQ(Probe(F_RDLCK, kQemuLockPermBase - 1, 1), F_UNLCK);
  EXPECT_EQ(Probe(F_RDLCK, kQemuLockPermBase + kQemuLockSpan, 1), F_UNLCK);
}

TEST_F(QemuLockTest, LocksGoAwayWithTheFd) {
  for (QemuLockMode mode : kModes) {
    SCOPED_TRACE(Name(mode));
    std::optional<QemuImageLock> held;
    {
      auto first = QemuImageLock::Acquire(path_, mode);
      ASSERT_TRUE(first.has_value()) << first.error().ToString();
      held = std::move(*first);  // the moved-from object must not release it
    }
    EXPECT_FALSE(QemuImageLock::Acquire(path_, QemuLockMode::kExclusive).has_value());
    held.reset();
    auto again = QemuImageLock::Acquire(path_, QemuLockMode::kExclusive);
    EXPECT_TRUE(again.has_value()) << again.error().ToString();
  }
}

TEST_F(QemuLockTest, LocksGoAwayWhenTheHolderExits) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto held = QemuImageLock::Acquire(path_, QemuLockMode::kExclusive);
    char c = held.has_value() ? 'y' : 'n';
    (void)!::write(ready[1], &c, 1);
    ::pause();  // until the parent kills us, holding the lock
    ::_exit(0);
  }
  ::close(ready[1]);
  char c = 0;
  ssize_t n = ::read(ready[0], &c, 1);
  ::close(ready[0]);
  auto busy = QemuImageLock::Acquire(path_, QemuLockMode::kShared);
  ::kill(pid, SIGKILL);  // before any assertion can return early
  ASSERT_EQ(::waitpid(pid, nullptr, 0), pid);
  ASSERT_EQ(n, 1);
  ASSERT_EQ(c, 'y') << "the child could not take the lock";
  ASSERT_FALSE(busy.has_value()) << "the child's lock was not seen";
  EXPECT_EQ(busy.error().code(), Code::kBusy);
  auto after = QemuImageLock::Acquire(path_, QemuLockMode::kShared);
  EXPECT_TRUE(after.has_value()) << after.error().ToString();
}

// The bytes qemu 7.2 holds, read from /proc/locks while qemu-io and
// qemu-nbd held images: a writer 100, 101, 103 + 201, 203; a reader (and a
// backing file) 100 + 201, 203; a -U reader 100 alone.
TEST_F(QemuLockTest, PermissionModesHoldTheBytesQemuHolds) {
  const struct {
    QemuLockMode mode;
    std::vector<off_t> held;
  } kCases[] = {
      {QemuLockMode::kWrite, {100, 101, 103, 201, 203}},
      {QemuLockMode::kRead, {100, 201, 203}},
      {QemuLockMode::kForceShare, {100}},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(QemuLockModeName(c.mode));
    auto held = QemuImageLock::Acquire(path_, c.mode);
    ASSERT_TRUE(held.has_value()) << held.error().ToString();
    for (off_t at = kQemuLockPermBase; at < kQemuLockPermBase + kQemuLockSpan; ++at) {
      const bool want = std::find(c.held.begin(), c.held.end(), at) != c.held.end();
      // Held bytes are shared locks: another reader may join, a writer not.
      EXPECT_EQ(Probe(F_WRLCK, at, 1), want ? F_RDLCK : F_UNLCK) << at;
      EXPECT_EQ(Probe(F_RDLCK, at, 1), F_UNLCK) << at;
    }
  }
}

TEST_F(QemuLockTest, PermissionModesShareAsQemuDoes) {
  using M = QemuLockMode;
  const struct {
    M first, second;
    bool second_gets_it;
  } kCases[] = {
      {M::kWrite, M::kWrite, false},      {M::kWrite, M::kRead, false},
      {M::kRead, M::kWrite, false},       {M::kRead, M::kRead, true},
      {M::kWrite, M::kForceShare, true},  {M::kForceShare, M::kWrite, true},
      {M::kRead, M::kForceShare, true},   {M::kForceShare, M::kForceShare, true},
      {M::kShared, M::kForceShare, false}, {M::kForceShare, M::kShared, false},
      {M::kExclusive, M::kForceShare, false}, {M::kWrite, M::kExclusive, false},
      {M::kRead, M::kShared, false},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(std::string(QemuLockModeName(c.first)) + " then " +
                 QemuLockModeName(c.second));
    auto first = QemuImageLock::Acquire(path_, c.first);
    ASSERT_TRUE(first.has_value()) << first.error().ToString();
    auto second = QemuImageLock::Acquire(path_, c.second);
    EXPECT_EQ(second.has_value(), c.second_gets_it);
    if (!second.has_value()) {
      EXPECT_EQ(second.error().code(), Code::kBusy) << second.error().ToString();
      EXPECT_NE(second.error().message().find(path_ + ": the image is in use by another process"),
                std::string::npos)
          << second.error().message();
      // A refused open leaves the first holder's locks as they were.
      auto again = QemuImageLock::Acquire(path_, c.second);
      EXPECT_FALSE(again.has_value());
    }
  }
}

TEST_F(QemuLockTest, RefusedLockLeavesTheDescriptorHoldingNothing) {
  std::optional<QemuImageLock> writer;
  {
    auto w = QemuImageLock::Acquire(path_, QemuLockMode::kWrite);
    ASSERT_TRUE(w.has_value()) << w.error().ToString();
    writer = std::move(*w);
  }
  // A descriptor that stays open after its lock was refused (a Storage's
  // fd is closed at once, but LockImageFd promises this).
  int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  Status refused = LockImageFd(fd, path_, QemuLockMode::kWrite);
  EXPECT_EQ(refused.code(), Code::kBusy) << refused.ToString();
  EXPECT_NE(refused.message().find("\"write\" lock"), std::string::npos) << refused.message();
  writer.reset();
  for (off_t at = kQemuLockPermBase; at < kQemuLockPermBase + kQemuLockSpan; ++at) {
    EXPECT_EQ(Probe(F_WRLCK, at, 1), F_UNLCK) << at;
  }
  ::close(fd);
}

TEST_F(QemuLockTest, MissingFileIsNotFound) {
  for (QemuLockMode mode : kModes) {
    auto r = QemuImageLock::Acquire(dir_ + "/missing.img", mode);
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code(), Code::kNotFound) << r.error().ToString();
  }
}

// ---- against qemu itself ----

struct ToolRun {
  int exit_code = -1;
  std::string output;
};

class QemuLockInteropTest : public QemuLockTest {
 protected:
  void SetUp() override {
    QemuLockTest::SetUp();
    if (std::system(
            "qemu-img --version >/dev/null 2>&1 && qemu-io --version >/dev/null 2>&1") !=
        0) {
      if (std::getenv("CI") || std::getenv("THINDISK_REQUIRE_TOOLS")) {
        FAIL() << "qemu-img and qemu-io are required";
      }
      GTEST_SKIP() << "qemu-img or qemu-io not installed";
    }
    path_ = dir_ + "/disk.qcow2";
    ASSERT_EQ(Sh("qemu-img create -q -f qcow2 " + path_ + " 1M").exit_code, 0);
  }

  ToolRun Sh(const std::string& cmd) {
    const std::string log = dir_ + "/cmd.log";
    int status = std::system((cmd + " >" + log + " 2>&1").c_str());
    ToolRun r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream f(log);
    std::stringstream s;
    s << f.rdbuf();
    r.output = s.str();
    return r;
  }
  ToolRun Info() { return Sh("qemu-img info " + path_); }
  ToolRun Write() { return Sh("qemu-io -f qcow2 -c 'write 0 512' " + path_); }
};

TEST_F(QemuLockInteropTest, QemuIsRefusedInEitherModeAndWelcomeAfter) {
  for (QemuLockMode mode : kModes) {
    SCOPED_TRACE(Name(mode));
    {
      auto held = QemuImageLock::Acquire(path_, mode);
      ASSERT_TRUE(held.has_value()) << held.error().ToString();
      ToolRun info = Info();
      EXPECT_NE(info.exit_code, 0) << info.output;
      EXPECT_NE(info.output.find("lock"), std::string::npos) << info.output;
      ToolRun write = Write();
      EXPECT_NE(write.exit_code, 0) << write.output;
      EXPECT_NE(write.output.find("lock"), std::string::npos) << write.output;
      // -U shares everything but still needs consistent read to read data:
      // refused; info -U needs no permission at all: let through.
      ToolRun shared_read = Sh("qemu-io -r -U -f qcow2 -c 'read 0 512' " + path_);
      EXPECT_NE(shared_read.exit_code, 0) << shared_read.output;
      ToolRun shared_info = Sh("qemu-img info -U " + path_);
      EXPECT_EQ(shared_info.exit_code, 0) << shared_info.output;
    }
    ToolRun info = Info();
    EXPECT_EQ(info.exit_code, 0) << info.output;
    ToolRun write = Write();
    EXPECT_EQ(write.exit_code, 0) << write.output;
    EXPECT_NE(write.output.find("wrote 512/512"), std::string::npos) << write.output;
  }
}

// qemu's own checks against the permission modes: what qemu-io may do
// beside each, as it would beside another qemu process holding the same.
TEST_F(QemuLockInteropTest, QemuSharesWithPermissionModesAsWithItself) {
  const std::string read = "qemu-io -r -f qcow2 -c 'read 0 512' " + path_;
  const std::string read_u = "qemu-io -r -U -f qcow2 -c 'read 0 512' " + path_;
  const struct {
    QemuLockMode mode;
    bool write, read, read_force_share;
  } kCases[] = {
      {QemuLockMode::kWrite, false, false, true},
      {QemuLockMode::kRead, false, true, true},
      {QemuLockMode::kForceShare, true, true, true},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(QemuLockModeName(c.mode));
    auto held = QemuImageLock::Acquire(path_, c.mode);
    ASSERT_TRUE(held.has_value()) << held.error().ToString();
    ToolRun w = Write();
    EXPECT_EQ(w.exit_code == 0, c.write) << w.output;
    if (!c.write) {
      EXPECT_NE(w.output.find("Failed to get"), std::string::npos) << w.output;
    }
    ToolRun r = Sh(read);
    EXPECT_EQ(r.exit_code == 0, c.read) << r.output;
    ToolRun u = Sh(read_u);
    EXPECT_EQ(u.exit_code == 0, c.read_force_share) << u.output;
  }
}

}  // namespace
}  // namespace thindisk::io
