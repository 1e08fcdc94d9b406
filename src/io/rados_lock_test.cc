// io::RadosLock through RadosStorage, against the test cluster: one writer
// per image, readers beside it, and fencing. Two RADOS clients in one
// process are two connections: the same image named with ?id=a and ?id=b
// (the test cluster has no auth, so any client name connects). The `rados`
// CLI judges what the lock looks like in the cluster.
#include "io/rados_lock.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "io/rados_storage.h"
#include "io/rados_test_util.h"

namespace thindisk::io {
namespace {

using rados_test::Pattern;
using rados_test::Rados;
using rados_test::UniqueImage;
using rados_test::Uri;

class RadosLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TD_REQUIRE_CEPH();
    image_ = UniqueImage();
    uri_ = Uri(image_);
    ASSERT_TRUE(CreateRados(uri_, 1 << 20, 64 * 1024).ok());
  }
  void TearDown() override {
    if (rados_test::ClusterAnswersAfterFailure() && !image_.empty())
      (void)RemoveRados(uri_);
  }

  // The image as client `id` sees it.
  Result<std::unique_ptr<Storage>> Open(const std::string& id, bool read_only = false) {
    OpenOptions o;
    o.read_only = read_only;
    return OpenRados(uri_ + "?id=" + id, o);
  }

  std::string image_, uri_;
};

TEST_F(RadosLockTest, SecondWriterIsRefusedNamingTheHolder) {
  auto a = Open("a");
  ASSERT_TRUE(a) << a.status().ToString();
  auto b = Open("b");
  ASSERT_FALSE(b);
  EXPECT_EQ(b.status().code(), Code::kBusy);
  const std::string m = b.status().message();
  EXPECT_NE(m.find(uri_ + ": in use by client."), std::string::npos) << m;
  EXPECT_NE(m.find("pid " + std::to_string(getpid()) + " on host "), std::string::npos)
      << m;
  // A reader is never refused, and sees what the writer flushed.
  const std::vector<uint8_t> data = Pattern(1, 4096);
  ASSERT_TRUE((*a)->WriteAt(0, data).ok());
  ASSERT_TRUE((*a)->Flush().ok());
  auto reader = Open("b", /*read_only=*/true);
  ASSERT_TRUE(reader) << reader.status().ToString();
  std::vector<uint8_t> got(4096);
  ASSERT_TRUE((*reader)->ReadAt(0, got).ok());
  EXPECT_EQ(got, data);
  // Closing releases: the next writer gets the image.
  a->reset();
  auto again = Open("b");
  ASSERT_TRUE(again) << again.status().ToString();
}

TEST_F(RadosLockTest, ListShowsTheHolderAndItsWatch) {
  auto free = ListRadosLockers(uri_);
  ASSERT_TRUE(free) << free.status().ToString();
  EXPECT_TRUE(free->empty());
  auto a = Open("a");
  ASSERT_TRUE(a) << a.status().ToString();
  auto held = ListRadosLockers(uri_);
  ASSERT_TRUE(held) << held.status().ToString();
  ASSERT_EQ(held->size(), 1u);
  const RadosLocker& l = held->front();
  EXPECT_TRUE(l.watching);
  EXPECT_EQ(l.client.rfind("client.", 0), 0u) << l.client;
  EXPECT_NE(l.cookie.find("pid " + std::to_string(getpid())), std::string::npos)
      << l.cookie;
  // The cluster agrees: an exclusive cls lock "thindisk" with that cookie,
  // and a watch from the same client.
  rados_test::RunResult info = Rados("lock info " + image_ + ".header thindisk");
  ASSERT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("\"exclusive\""), std::string::npos) << info.output;
  EXPECT_NE(info.output.find(l.cookie), std::string::npos) << info.output;
  rados_test::RunResult watchers = Rados("listwatchers " + image_ + ".header");
  EXPECT_NE(watchers.output.find(l.client), std::string::npos) << watchers.output;
  a->reset();
  auto after = ListRadosLockers(uri_);
  ASSERT_TRUE(after);
  EXPECT_TRUE(after->empty());
  EXPECT_EQ(Rados("listwatchers " + image_ + ".header").output.find("watcher"),
            std::string::npos);
}

TEST_F(RadosLockTest, BreakFencesTheHolderWhoseLaterWritesFail) {
  auto a = Open("a");
  ASSERT_TRUE(a) << a.status().ToString();
  const std::vector<uint8_t> before = Pattern(2, 8192), late = Pattern(3, 8192);
  ASSERT_TRUE((*a)->WriteAt(0, before).ok());
  ASSERT_TRUE((*a)->Flush().ok());

  auto refused = BreakRadosLock(uri_ + "?id=c", /*force=*/false);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), Code::kBusy);
  EXPECT_NE(refused.status().message().find("is alive"), std::string::npos);

  auto broken = BreakRadosLock(uri_ + "?id=c", /*force=*/true);
  ASSERT_TRUE(broken) << broken.status().ToString();
  ASSERT_EQ(broken->size(), 1u);
  // The fenced client's writes fail, saying why, and do not land.
  Status w = (*a)->WriteAt(0, late);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.message().find("fenced (blocklisted)"), std::string::npos) << w.ToString();
  auto b = Open("b");
  ASSERT_TRUE(b) << b.status().ToString();
  std::vector<uint8_t> got(8192);
  ASSERT_TRUE((*b)->ReadAt(0, got).ok());
  EXPECT_EQ(got, before);
  a->reset();  // its close writes nothing either (the header stays b's)
  ASSERT_TRUE((*b)->ReadAt(0, got).ok());
  EXPECT_EQ(got, before);
}

TEST_F(RadosLockTest, RemoveIsRefusedWhileAWriterHoldsTheImage) {
  auto a = Open("a");
  ASSERT_TRUE(a) << a.status().ToString();
  Status s = RemoveRados(uri_ + "?id=b");
  EXPECT_EQ(s.code(), Code::kBusy) << s.ToString();
  ASSERT_TRUE((*a)->WriteAt(0, Pattern(4, 4096)).ok());  // still the writer's
  a->reset();
  EXPECT_TRUE(RemoveRados(uri_).ok());
  auto gone = ListRadosLockers(uri_);
  EXPECT_FALSE(gone);
  EXPECT_EQ(gone.status().code(), Code::kNotFound);
  image_.clear();
}

TEST_F(RadosLockTest, LockersOfAMissingImage) {
  auto none = ListRadosLockers(Uri(image_ + "-none"));
  ASSERT_FALSE(none);
  EXPECT_EQ(none.status().code(), Code::kNotFound);
  EXPECT_NE(none.status().message().find("no such image"), std::string::npos);
}

}  // namespace
}  // namespace thindisk::io
