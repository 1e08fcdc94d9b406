// The qcow2 engine on io::RadosStorage: create, write, flush, close,
// reopen, read back, check -- and the bytes fetched with `rados get` are a
// qcow2 file that qemu-img checks and compares clean.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "io/rados_storage.h"
#include "io/rados_test_util.h"
#include "qcow2/check.h"
#include "qcow2/image.h"

namespace thindisk::io {
namespace {

using rados_test::ObjectBytes;
using rados_test::ObjectsWithPrefix;
using rados_test::Pattern;
using rados_test::Shell;
using rados_test::UniqueImage;
using rados_test::Uri;

constexpr uint64_t kObjectSize = 1 << 20;  // 1 MiB objects under 64 KiB clusters
constexpr uint64_t kGuestSize = 64 << 20;

// Guest writes: (offset, length, seed), across clusters and objects.
struct GuestWrite {
  uint64_t offset;
  size_t length;
  uint64_t seed;
};
const GuestWrite kWrites[] = {
    {0, 4096, 1},
    {65536 - 512, 8192, 2},         // across two clusters
    {(3 << 20) - 1000, 300000, 3},  // across guest MiBs (host objects too)
    {40 << 20, 1 << 20, 4},
    {kGuestSize - 4096, 4096, 5},  // the last 4 KiB
};

class RadosQcow2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    TD_REQUIRE_CEPH();
    uri_ = Uri(UniqueImage());
  }
  void TearDown() override {
    if (rados_test::ClusterAnswersAfterFailure() && !uri_.empty())
      (void)RemoveRados(uri_);
  }

  std::unique_ptr<Storage> OpenStorage(bool read_only) {
    OpenOptions o;
    o.read_only = read_only;
    auto s = OpenRados(uri_, o);
    EXPECT_TRUE(s) << s.status().ToString();
    return s ? std::move(*s) : nullptr;
  }

  // Creates the qcow2 image in RADOS, writes kWrites through the engine,
  // flushes and closes it. Returns the guest content expected.
  std::vector<uint8_t> CreateAndWrite() {
    std::vector<uint8_t> model(kGuestSize, 0);
    Status st = CreateRados(uri_, 0, kObjectSize);
    EXPECT_TRUE(st.ok()) << st.ToString();
    auto storage = OpenStorage(false);
    if (!storage) return {};
    qcow2::CreateOptions co;
    co.size = kGuestSize;
    co.cluster_size = 64 * 1024;
    st = qcow2::Create(*storage, co);
    EXPECT_TRUE(st.ok()) << st.ToString();
    auto image = qcow2::Image::Open(std::move(storage), {});
    EXPECT_TRUE(image) << image.status().ToString();
    if (!image) return {};
    for (const GuestWrite& w : kWrites) {
      const std::vector<uint8_t> d = Pattern(w.seed, w.length);
      st = (*image)->Write(w.offset, d);
      EXPECT_TRUE(st.ok()) << st.ToString();
      std::copy(d.begin(), d.end(), model.begin() + w.offset);
    }
    st = (*image)->Flush();
    EXPECT_TRUE(st.ok()) << st.ToString();
    st = (*image)->Close();
    EXPECT_TRUE(st.ok()) << st.ToString();
    return model;
  }

  std::string uri_;
};

TEST_F(RadosQcow2Test, WriteCloseReopenReadCheck) {
  const std::vector<uint8_t> model = CreateAndWrite();
  ASSERT_EQ(model.size(), kGuestSize);

  auto storage = OpenStorage(false);
  ASSERT_TRUE(storage);
  auto image = qcow2::Image::Open(std::move(storage), {});
  ASSERT_TRUE(image) << image.status().ToString();
  EXPECT_EQ((*image)->size(), kGuestSize);
  std::vector<uint8_t> back(kGuestSize);
  ASSERT_TRUE((*image)->Read(0, back).ok());
  EXPECT_TRUE(back == model) << "guest content differs after reopen";
  // A rewrite of allocated clusters, then close again.
  const std::vector<uint8_t> d = Pattern(77, 5000);
  ASSERT_TRUE((*image)->Write(100, d).ok());
  ASSERT_TRUE((*image)->Close().ok());
  image->reset();

  // The engine's check (what `thindisk check` runs): clean, no leaks.
  auto ro = OpenStorage(true);
  ASSERT_TRUE(ro);
  auto report = qcow2::Check(*ro, qcow2::RepairMode::kNone);
  ASSERT_TRUE(report) << report.status().ToString();
  EXPECT_EQ(report->corruptions, 0u);
  EXPECT_EQ(report->leaks, 0u);
  EXPECT_EQ(report->check_errors, 0u);
  for (const std::string& m : report->messages) ADD_FAILURE() << m;
  // Only the clusters written took space: far fewer objects than the guest
  // size in objects (64).
  const std::string name = uri_.substr(uri_.rfind('/') + 1);
  EXPECT_LT(ObjectsWithPrefix(name + ".").size(), size_t(16));
}

// The objects as `rados get` returns them, laid side by side in a local
// file, are a qcow2 image: qemu-img check finds it clean and qemu-img
// compare finds the guest content written.
TEST_F(RadosQcow2Test, QemuImgChecksTheObjects) {
  TD_REQUIRE_TOOL("qemu-img", Shell("qemu-img --version").exit_code == 0);
  const std::vector<uint8_t> model = CreateAndWrite();
  ASSERT_EQ(model.size(), kGuestSize);
  char tmpl[] = "/tmp/td_rados_qcow2_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string qcow2 = dir + "/image.qcow2", raw = dir + "/model.raw";

  const std::string image = uri_.substr(uri_.rfind('/') + 1);
  const int fd = open(qcow2.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  for (const std::string& oid : ObjectsWithPrefix(image + ".")) {
    if (oid == image + ".header") continue;
    const uint64_t index = std::strtoull(oid.c_str() + image.size() + 1, nullptr, 16);
    const std::vector<uint8_t> bytes = ObjectBytes(oid);
    ASSERT_EQ(pwrite(fd, bytes.data(), bytes.size(), off_t(index * kObjectSize)),
              ssize_t(bytes.size()));
  }
  close(fd);
  {
    std::ofstream f(raw, std::ios::binary);
    f.write(reinterpret_cast<const char*>(model.data()), std::streamsize(model.size()));
  }
  auto check = Shell("qemu-img check -f qcow2 " + qcow2);
  EXPECT_EQ(check.exit_code, 0) << check.output;
  auto compare = Shell("qemu-img compare -f qcow2 -F raw " + qcow2 + " " + raw);
  EXPECT_EQ(compare.exit_code, 0) << compare.output;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace thindisk::io
