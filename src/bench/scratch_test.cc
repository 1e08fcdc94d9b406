#include "bench/scratch.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

namespace thindisk::bench {
namespace {

namespace fs = std::filesystem;

qcow2::CreateOptions Small() {
  qcow2::CreateOptions layout;
  layout.size = 1 << 20;
  return layout;
}

// What is in `parent` (the scratch directories made there).
std::vector<fs::path> ScratchDirsIn(const fs::path& parent) {
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(parent)) found.push_back(e.path());
  return found;
}

class DirScratchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    parent_ =
        fs::path(::testing::TempDir()) / ("scratch-test-" + std::to_string(::getpid()));
    fs::remove_all(parent_);
    fs::create_directories(parent_);
  }
  void TearDown() override { fs::remove_all(parent_); }
  fs::path parent_;
};

TEST_F(DirScratchTest, ImagesAreFilesThatCountTheirHostWritesAndGoOnRemove) {
  auto scratch = OpenScratch(parent_.string());
  ASSERT_TRUE(scratch.has_value()) << scratch.error().message();
  Scratch& s = **scratch;
  EXPECT_EQ(s.BackingName("w2"), "w2.qcow2");
  ASSERT_TRUE(s.CreateImage("w2", Small()).ok());
  const std::string name = s.Name("w2");
  EXPECT_TRUE(fs::exists(name)) << name;
  EXPECT_EQ(fs::path(name).parent_path().parent_path(), parent_);

  auto counters = std::make_shared<HostCounters>();
  auto device = s.Open("w2", counters, {});
  ASSERT_TRUE(device.has_value()) << device.error().message();
  auto host = HostStorage(**device);
  ASSERT_TRUE(host.has_value()) << host.error().message();
  const uint64_t before = (*host)->bytes_written();
  std::vector<uint8_t> data(4096, 0x5a);
  ASSERT_TRUE((*device)->Write(0, data).ok());
  ASSERT_TRUE((*device)->Flush().ok());
  // The counters the wrapper fills are the top storage's figure.
  EXPECT_GE((*host)->bytes_written() - before, data.size());
  EXPECT_EQ((*host)->bytes_written(), counters->bytes_written.load());
  auto allocated = (*host)->AllocatedBytes();
  ASSERT_TRUE(allocated.has_value());
  EXPECT_GE(*allocated, data.size());
  ASSERT_TRUE((*device)->Close().ok());
  device->reset();

  s.Remove("w2");
  EXPECT_FALSE(fs::exists(name));
}

TEST_F(DirScratchTest, TheDirectoryGoesWithTheScratchUnlessKept) {
  {
    auto scratch = NewScratchDir(parent_.string());
    ASSERT_TRUE(scratch.has_value());
    ASSERT_TRUE((*scratch)->CreateImage("a", Small()).ok());
  }
  EXPECT_TRUE(ScratchDirsIn(parent_).empty());
  std::string kept;
  {
    auto scratch = NewScratchDir(parent_.string());
    ASSERT_TRUE(scratch.has_value());
    (*scratch)->set_keep(true);
    ASSERT_TRUE((*scratch)->CreateImage("a", Small()).ok());
    (*scratch)->Remove("a");  // kept: a no-op
    kept = (*scratch)->Name("a");
  }
  EXPECT_TRUE(fs::exists(kept)) << kept;
}

TEST(OpenScratchTest, RefusesRbdNamesAndImageNames) {
  auto rbd = OpenScratch("rbd:pool");
  ASSERT_FALSE(rbd.has_value());
  EXPECT_EQ(rbd.error().code(), Code::kInvalidArgument);
  EXPECT_NE(rbd.error().message().find("rados://POOL"), std::string::npos)
      << rbd.error().message();
  auto image = OpenScratch("rados://pool/image");
  ASSERT_FALSE(image.has_value());
  EXPECT_EQ(image.error().code(), Code::kInvalidArgument);
}

// No cluster here: naming and the latency check come before any connection.
TEST(PoolScratchTest, NamesHoldThePidAndKeepTheQuery) {
  auto scratch = OpenScratch("rados://pool?conf=/etc/x.conf&id=bench");
  ASSERT_TRUE(scratch.has_value()) << scratch.error().message();
  const std::string image = "td-bench-" + std::to_string(::getpid()) + "-w5-base";
  EXPECT_EQ((*scratch)->BackingName("w5-base"), image);
  EXPECT_EQ((*scratch)->Name("w5-base"),
            "rados://pool/" + image + "?conf=/etc/x.conf&id=bench");
  auto device = (*scratch)->Open("w5-base", nullptr, std::chrono::milliseconds(1));
  ASSERT_FALSE(device.has_value());
  EXPECT_EQ(device.error().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace thindisk::bench
