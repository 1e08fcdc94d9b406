// block::Open with NBD URIs as image names: URIs are never joined onto an
// overlay's directory, a loop through an export is caught by its URI, an
// unknown scheme says so, and a qcow2 laid on an export (through
// nbdclient::ExportFile, as `convert` does) opens on the export itself and
// takes writes there. Served by a real `nbdkit memory`.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "block/open.h"
#include "nbdclient/export_file.h"
#include "nbdclient/nbd_module.h"
#include "nbdclient/nbdkit_test_util.h"
#include "qcow2/image.h"
#include "util/temp_dir_test_util.h"

namespace thindisk::block {
namespace {

TEST(OpenNbdTest, UrisAreNeverJoinedOntoADirectory) {
  const std::string uri = "nbd+unix:///?socket=/run/x.sock";
  EXPECT_EQ(ResolveBackingName("dir/clone.qcow2", uri), uri);
  EXPECT_EQ(ResolveBackingName("nbd://host/top", "base.qcow2"), "base.qcow2");
  EXPECT_EQ(ResolveBackingName("dir/clone.qcow2", "base.qcow2"), "dir/base.qcow2");
}

TEST(OpenNbdTest, UnknownSchemeIsAnUnknownProtocol) {
  auto dev = Open("nbdx://host/x", OpenOptions{});
  ASSERT_FALSE(dev.has_value());
  EXPECT_EQ(dev.error().code(), Code::kNotFound);
  EXPECT_NE(dev.error().message().find("unknown protocol 'nbdx'"), std::string::npos)
      << dev.error().message();
}

class OpenNbdServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test_env::HaveTool("nbdkit")) TD_SKIP_OR_FAIL("nbdkit not installed");
    ASSERT_TRUE(dir_.ok());
    server_ = std::make_unique<test_env::Nbdkit>(dir_.path(),
                                                 std::vector<std::string>{"memory", "32M"});
    ASSERT_TRUE(server_->ready()) << "nbdkit did not start";
  }

  // Lays an empty qcow2 of `size` (backed by `backing`, if any) on the export.
  void CreateOnExport(uint64_t size, const std::string& backing) {
    auto store = nbdclient::nbd_module::OpenNbd(server_->uri(), false);
    ASSERT_TRUE(store.has_value()) << store.error().message();
    auto view = nbdclient::ExportFile::Make(**store);
    ASSERT_TRUE(view.has_value());
    qcow2::CreateOptions q;
    q.size = size;
    q.backing_file = backing;
    q.backing_format = backing.empty() ? "" : "qcow2";
    Status s = qcow2::Create(**view, q, nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
  }

  test_env::TempDir dir_{"/tmp", "td_open_nbd"};
  std::unique_ptr<test_env::Nbdkit> server_;
};

TEST_F(OpenNbdServerTest, Qcow2OnAnExportProbesOpensAndTakesWrites) {
  // Old bytes everywhere first: creation must not let them show through.
  {
    auto store = nbdclient::nbd_module::OpenNbd(server_->uri(), false);
    ASSERT_TRUE(store.has_value());
    std::vector<uint8_t> junk(1 << 20, 0xee);
    for (uint64_t off = 0; off < (32u << 20); off += junk.size()) {
      ASSERT_TRUE((*store)->WriteAt(off, junk).ok());
    }
  }
  CreateOnExport(64u << 20, "");
  auto format = ProbeFormat(server_->uri());
  ASSERT_TRUE(format.has_value()) << format.error().message();
  EXPECT_EQ(*format, "qcow2");
  std::vector<uint8_t> data(65536, 0x42), back(65536);
  {
    auto dev = Open(server_->uri(), OpenOptions{});
    ASSERT_TRUE(dev.has_value()) << dev.error().message();
    EXPECT_EQ((*dev)->size(), 64u << 20);
    ASSERT_TRUE((*dev)->Read(0, back).ok());
    EXPECT_EQ(std::count(back.begin(), back.end(), 0), ptrdiff_t(back.size()));
    ASSERT_TRUE((*dev)->Write(5 << 20, data).ok());
    ASSERT_TRUE((*dev)->Close().ok());
  }
  OpenOptions ro;
  ro.read_only = true;
  auto dev = Open(server_->uri(), ro);
  ASSERT_TRUE(dev.has_value()) << dev.error().message();
  ASSERT_TRUE((*dev)->Read(5 << 20, back).ok());
  EXPECT_EQ(back, data);
}

TEST_F(OpenNbdServerTest, ABackingLoopThroughAnExportIsCaughtByItsUri) {
  CreateOnExport(16u << 20, server_->uri());  // its own backing file
  auto dev = Open(server_->uri(), OpenOptions{});
  ASSERT_FALSE(dev.has_value());
  EXPECT_NE(dev.error().message().find("backing file loop"), std::string::npos)
      << dev.error().message();
}

}  // namespace
}  // namespace thindisk::block
