#include "block/open.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "qcow2/image.h"
#include "util/capability_test_util.h"

namespace thindisk::block {
namespace {

namespace fs = std::filesystem;

bool HaveQemuImg() {
  return std::system("qemu-img --version >/dev/null 2>&1") == 0;
}

// A missing tool skips locally but fails in CI (STYLE.md habit 8;
// util/capability_test_util.h).
#define REQUIRE_QEMU_IMG() TD_REQUIRE_TOOL("qemu-img", HaveQemuImg())


OpenOptions Opts(std::string format, bool read_only, bool no_backing = false,
                 uint32_t max_chain_depth = kDefaultMaxChainDepth) {
  OpenOptions o;
  o.format = std::move(format);
  o.read_only = read_only;
  o.no_backing = no_backing;
  o.max_chain_depth = max_chain_depth;
  return o;
}

class OpenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "td_open_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // Runs a shell command in dir_, quietly; true on exit status 0.
  bool Run(const std::string& cmd) const {
    return std::system(("cd '" + dir_ + "' && " + cmd + " >/dev/null 2>&1").c_str()) == 0;
  }

  void WriteFile(const std::string& name, const std::vector<uint8_t>& bytes) const {
    std::ofstream f(Path(name), std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }

  std::string dir_;
};

TEST(ResolveBackingNameTest, RelativeNamesFollowTheOverlay) {
  EXPECT_EQ(ResolveBackingName("dir/o.qcow2", "b.qcow2"), "dir/b.qcow2");
  EXPECT_EQ(ResolveBackingName("/a/b/o.qcow2", "../c/b.raw"), "/a/b/../c/b.raw");
  EXPECT_EQ(ResolveBackingName("o.qcow2", "b.qcow2"), "b.qcow2");
  EXPECT_EQ(ResolveBackingName("dir/o.qcow2", "/abs/b.qcow2"), "/abs/b.qcow2");
}

TEST(ResolveBackingNameTest, RadosOverlaysResolveInTheirPoolAndCluster) {
  // A relative name: the image of that name in the overlay's pool, reached
  // the way the overlay was.
  EXPECT_EQ(ResolveBackingName("rados://p/clone", "base"), "rados://p/base");
  EXPECT_EQ(ResolveBackingName("rados://p/clone?id=vm&conf=/c", "base"),
            "rados://p/base?conf=/c&id=vm");
  // A rados:// name without conf and id inherits both; with either, it is
  // used as stored.
  EXPECT_EQ(ResolveBackingName("rados://p/clone?conf=/c", "rados://q/gold"),
            "rados://q/gold?conf=/c");
  EXPECT_EQ(ResolveBackingName("rados://p/clone?conf=/c", "rados://q/gold?id=x"),
            "rados://q/gold?id=x");
  // Absolute paths and NBD URIs are what they say, from any overlay.
  EXPECT_EQ(ResolveBackingName("rados://p/clone", "/var/lib/b.qcow2"), "/var/lib/b.qcow2");
  EXPECT_EQ(ResolveBackingName("rados://p/clone", "nbd://h/x"), "nbd://h/x");
  // A rados:// base of a local overlay is never joined onto its directory.
  EXPECT_EQ(ResolveBackingName("dir/o.qcow2", "rados://p/base"), "rados://p/base");
  // A relative name that is no image name is left for the open to refuse.
  EXPECT_EQ(ResolveBackingName("rados://p/clone", "../b"), "rados://p/../b");
  // An RBD base of a RADOS clone: the clone's cluster, unless it names one.
  EXPECT_EQ(ResolveBackingName("rados://p/clone?conf=/a:b&id=vm", "rbd:q/gold"),
            "rbd:q/gold:conf=/a\\:b:id=vm");
  EXPECT_EQ(ResolveBackingName("rados://p/clone?conf=/c", "rbd:q/gold:id=x"), "rbd:q/gold:id=x");
  EXPECT_EQ(ResolveBackingName("rados://p/clone", "rbd:q/gold"), "rbd:q/gold");
  // An rbd: overlay's names are never joined onto its "directory".
  EXPECT_EQ(ResolveBackingName("rbd:p/img:conf=/etc/ceph/c.conf", "base"), "base");
  EXPECT_TRUE(IsUriName("rbd:p/i"));
  EXPECT_TRUE(IsUriName("rados://p/i"));
  EXPECT_TRUE(IsUriName("nbd+unix:///?socket=/s"));
  EXPECT_FALSE(IsUriName("radosfile"));
}

TEST_F(OpenTest, ProbesRawAndOpensIt) {
  WriteFile("plain.img", std::vector<uint8_t>(8192, 0x42));
  auto fmt = ProbeFormat(Path("plain.img"));
  ASSERT_TRUE(fmt.has_value()) << fmt.error().message();
  EXPECT_EQ(*fmt, "raw");

  auto dev = Open(Path("plain.img"), Opts("", true));
  ASSERT_TRUE(dev.has_value()) << dev.error().message();
  EXPECT_EQ((*dev)->info().format, "raw");
  EXPECT_EQ((*dev)->size(), 8192u);
  std::vector<uint8_t> buf(16);
  ASSERT_TRUE((*dev)->Read(100, buf).ok());
  EXPECT_EQ(buf, std::vector<uint8_t>(16, 0x42));
}

TEST_F(OpenTest, TinyFileProbesAsRaw) {
  WriteFile("tiny", {0x51, 0x46});
  auto fmt = ProbeFormat(Path("tiny"));
  ASSERT_TRUE(fmt.has_value());
  EXPECT_EQ(*fmt, "raw");
}

TEST_F(OpenTest, MagicProbesAsQcow2ButGivenFormatWins) {
  // A raw disk whose guest wrote the qcow2 magic at offset 0.
  std::vector<uint8_t> bytes(4096, 0);
  bytes[0] = 0x51; bytes[1] = 0x46; bytes[2] = 0x49; bytes[3] = 0xfb;
  WriteFile("tricky.raw", bytes);
  auto fmt = ProbeFormat(Path("tricky.raw"));
  ASSERT_TRUE(fmt.has_value());
  EXPECT_EQ(*fmt, "qcow2");

  auto dev = Open(Path("tricky.raw"), Opts("raw", true));
  ASSERT_TRUE(dev.has_value()) << dev.error().message();
  EXPECT_EQ((*dev)->info().format, "raw");
  EXPECT_EQ((*dev)->size(), 4096u);
}

TEST_F(OpenTest, MissingFileIsNotFound) {
  auto dev = Open(Path("nope.qcow2"), OpenOptions{});
  ASSERT_FALSE(dev.has_value());
  EXPECT_EQ(dev.error().code(), Code::kNotFound);
  EXPECT_NE(dev.error().message().find("nope.qcow2"), std::string::npos);
}

// A test program of the build tree has no Ceph module beside it; it finds
// the one the build wrote (io/ceph_module.h, place 4). The error about the
// missing ceph.conf comes from inside the module, so the module ran.
TEST_F(OpenTest, CephNamesReachTheModuleFromTheBuildTree) {
  if (std::getenv("THINDISK_MODULE_DIR")) GTEST_SKIP() << "THINDISK_MODULE_DIR is set";
  const std::string conf = Path("none.conf");
  auto dev = Open("rados://pool/image?conf=" + conf, OpenOptions{});
  ASSERT_FALSE(dev.has_value());
  EXPECT_NE(dev.error().message().find("read ceph.conf (" + conf), std::string::npos)
      << dev.error().message();
}

TEST_F(OpenTest, UnknownFormatIsRefused) {
  WriteFile("x.img", std::vector<uint8_t>(512, 0));
  auto dev = Open(Path("x.img"), Opts("vmdk", false));
  ASSERT_FALSE(dev.has_value());
  EXPECT_NE(dev.error().message().find("vmdk"), std::string::npos);
}

TEST_F(OpenTest, ProbesQcow2MadeByQemuImg) {
  REQUIRE_QEMU_IMG();
  ASSERT_TRUE(Run("qemu-img create -f qcow2 q.qcow2 1M"));
  auto fmt = ProbeFormat(Path("q.qcow2"));
  ASSERT_TRUE(fmt.has_value());
  EXPECT_EQ(*fmt, "qcow2");
}

TEST_F(OpenTest, ResolvesBackingRelativeToOverlayAndOpensItReadOnly) {
  REQUIRE_QEMU_IMG();
  ASSERT_TRUE(Run("mkdir sub && qemu-img create -f raw sub/base.raw 1M && "
                  "qemu-io -f raw -c 'write -P 0x3c 0 64k' sub/base.raw && "
                  "qemu-img create -f qcow2 -b base.raw -F raw sub/top.qcow2"));
  // Opened from another directory: "base.raw" must resolve next to top.qcow2.
  auto dev = Open(Path("sub/top.qcow2"), OpenOptions{});
  ASSERT_TRUE(dev.has_value()) << dev.error().message();
  EXPECT_EQ((*dev)->info().format, "qcow2");
  std::vector<uint8_t> buf(4096);
  ASSERT_TRUE((*dev)->Read(4096, buf).ok());
  EXPECT_EQ(buf, std::vector<uint8_t>(4096, 0x3c));
  auto* image = dynamic_cast<qcow2::Image*>(dev->get());
  ASSERT_NE(image, nullptr);
  ASSERT_NE(image->backing(), nullptr);
  EXPECT_TRUE(image->backing()->info().read_only);
  EXPECT_FALSE(image->info().read_only);
  // Closed first: its write lock would refuse the read-only open below.
  ASSERT_TRUE((*dev)->Close().ok());
  dev->reset();
  // no_backing leaves the chain unopened: reads fall through to zeros.
  auto bare = Open(Path("sub/top.qcow2"), Opts("", true, true));
  ASSERT_TRUE(bare.has_value()) << bare.error().message();
  ASSERT_TRUE((*bare)->Read(4096, buf).ok());
  EXPECT_EQ(buf, std::vector<uint8_t>(4096, 0));
}

TEST_F(OpenTest, RefusesBackingLoop) {
  REQUIRE_QEMU_IMG();
  // -u: qemu-img does not open the (not yet existing) backing file.
  ASSERT_TRUE(Run("qemu-img create -f qcow2 -u -b b.qcow2 -F qcow2 a.qcow2 1M && "
                  "qemu-img create -f qcow2 -u -b a.qcow2 -F qcow2 b.qcow2 1M"));
  auto dev = Open(Path("a.qcow2"), Opts("", true));
  ASSERT_FALSE(dev.has_value());
  EXPECT_NE(dev.error().message().find("backing file loop: "), std::string::npos)
      << dev.error().message();
  EXPECT_NE(dev.error().message().find("a.qcow2 -> "), std::string::npos)
      << dev.error().message();
}

TEST_F(OpenTest, RefusesChainDeeperThanTheLimit) {
  REQUIRE_QEMU_IMG();
  // l0 <- l1 <- l2 <- l3: the top has a chain of 3 backing files.
  std::string cmd = "qemu-img create -f qcow2 l0.qcow2 1M";
  for (int i = 1; i <= 3; ++i) {
    cmd += " && qemu-img create -f qcow2 -b l" + std::to_string(i - 1) + ".qcow2 -F qcow2 l" +
           std::to_string(i) + ".qcow2";
  }
  ASSERT_TRUE(Run(cmd));
  auto ok = Open(Path("l3.qcow2"), Opts("", true, false, 3));
  EXPECT_TRUE(ok.has_value()) << ok.error().message();
  auto deep = Open(Path("l3.qcow2"), Opts("", true, false, 2));
  ASSERT_FALSE(deep.has_value());
  EXPECT_NE(deep.error().message().find("backing chain too deep (> 2)"), std::string::npos)
      << deep.error().message();
}

TEST_F(OpenTest, DefaultLimitIsSixteenBackingFiles) {
  REQUIRE_QEMU_IMG();
  // l17 has 17 backing files below it; l16 has exactly the limit.
  std::string cmd = "qemu-img create -f qcow2 l0.qcow2 1M";
  for (int i = 1; i <= 17; ++i) {
    cmd += " && qemu-img create -f qcow2 -b l" + std::to_string(i - 1) + ".qcow2 -F qcow2 l" +
           std::to_string(i) + ".qcow2";
  }
  ASSERT_TRUE(Run(cmd));
  auto ok = Open(Path("l16.qcow2"), Opts("", true));
  EXPECT_TRUE(ok.has_value()) << ok.error().message();
  auto deep = Open(Path("l17.qcow2"), Opts("", true));
  ASSERT_FALSE(deep.has_value());
  EXPECT_NE(deep.error().message().find("backing chain too deep (> 16)"), std::string::npos)
      << deep.error().message();
}

}  // namespace
}  // namespace thindisk::block
