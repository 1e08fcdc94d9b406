#include "cli/writeback.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <vector>

#include "util/temp_dir_test_util.h"

namespace thindisk::cli {
namespace {

// /dev/null cannot be synced (EINVAL): the error of the sync that a full
// `every` asked for reaches Finish, naming the file, so the syncs run.
TEST(BackgroundWritebackTest, ASyncAskedForRunsAndItsErrorIsReported) {
  BackgroundWriteback writeback("/dev/null", 4096);
  writeback.Wrote(4095);
  writeback.Wrote(1);
  Status s = writeback.Finish();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/dev/null: writing back"), std::string::npos) << s.message();
}

TEST(BackgroundWritebackTest, NoSyncBeforeEveryBytes) {
  BackgroundWriteback writeback("/dev/null", 4096);
  writeback.Wrote(4095);
  EXPECT_TRUE(writeback.Finish().ok());
}

TEST(BackgroundWritebackTest, ExportsAndMissingFilesAreLeftAlone) {
  for (const char* name : {"nbd+unix:///?socket=/nonexistent.sock", "/nonexistent/dir/file"}) {
    BackgroundWriteback writeback(name, 1);
    writeback.Wrote(1 << 20);
    EXPECT_TRUE(writeback.Finish().ok()) << name;
  }
}

TEST(BackgroundWritebackTest, SyncsAFileBeingWrittenWithoutError) {
  test_env::TempDir dir("/tmp", "td_writeback");
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.File("out.raw");
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  BackgroundWriteback writeback(path, 64 << 10);
  std::vector<uint8_t> buf(64 << 10, 0x5a);
  for (int i = 0; i < 16; ++i) {
    ASSERT_EQ(::pwrite(fd, buf.data(), buf.size(), off_t(i) * off_t(buf.size())),
              ssize_t(buf.size()));
    writeback.Wrote(buf.size());
  }
  EXPECT_TRUE(writeback.Finish().ok());
  EXPECT_TRUE(writeback.Finish().ok());  // again: nothing left to do
  ::close(fd);
}

}  // namespace
}  // namespace thindisk::cli
