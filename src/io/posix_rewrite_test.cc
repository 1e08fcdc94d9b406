// PosixStorage::RewriteAt: aligned runs of a file in the page cache go
// around it (O_DIRECT through a second descriptor), everything else is
// WriteAt, and reads through the page cache see the new bytes either way.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <random>
#include <vector>

#include "io/direct_io_test_util.h"
#include "io/posix_storage.h"
#include "util/capability_test_util.h"

namespace thindisk::io {
namespace {

using test_util::DirectIoDir;
using test_util::DropCache;
using test_util::NoDirectIoReason;
using test_util::PageCached;
using test_util::TempDir;

constexpr size_t kPage = test_util::kPage;

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

class Rewrites : public ::testing::Test {
 protected:
  void SetUp() override {
    TD_REQUIRE_CAPABILITY(!direct_dir_.empty(), NoDirectIoReason());
    ASSERT_TRUE(dir_.ok()) << "cannot make a temp dir in " << direct_dir_;
    s_ = Open(CacheMode::kWriteback);
    ASSERT_TRUE(s_);
    // The filesystem takes O_DIRECT (the probe said so): only a kernel
    // that cannot tell the alignment (before 6.1) leaves RewriteAt plain.
    TD_REQUIRE_CAPABILITY(posix()->rewrites_direct(),
                          "the kernel does not report direct I/O alignment (statx "
                          "STATX_DIOALIGN, Linux 6.1)");
    ASSERT_TRUE(s_->WriteAt(0, shadow_).ok());
    ASSERT_TRUE(s_->Flush().ok());
  }
  std::unique_ptr<Storage> Open(CacheMode cache, bool read_only = false) {
    OpenOptions o;
    o.create = !read_only;
    o.read_only = read_only;
    o.cache = cache;
    auto r = OpenFile(dir_.File("image"), o);
    EXPECT_TRUE(r.has_value()) << r.status().ToString();
    return r ? std::move(*r) : nullptr;
  }
  PosixStorage* posix() const { return static_cast<PosixStorage*>(s_.get()); }
  // Rewrites `len` bytes at `offset` with fresh pattern bytes, in the shadow too.
  Status Rewrite(uint64_t offset, size_t len) {
    std::vector<uint8_t> bytes = Pattern(len, uint32_t(offset + len));
    std::copy(bytes.begin(), bytes.end(), shadow_.begin() + long(offset));
    return s_->RewriteAt(offset, bytes);
  }
  void ExpectContent() {
    std::vector<uint8_t> got(shadow_.size());
    ASSERT_TRUE(s_->ReadAt(0, got).ok());
    EXPECT_EQ(got, shadow_);
    // Another open of the file (another open file description) reads the same.
    auto other = Open(CacheMode::kWriteback, /*read_only=*/true);
    ASSERT_TRUE(other);
    ASSERT_TRUE(other->ReadAt(0, got).ok());
    EXPECT_EQ(got, shadow_);
  }

  const std::string direct_dir_ = DirectIoDir();
  TempDir dir_{direct_dir_};
  std::unique_ptr<Storage> s_;
  std::vector<uint8_t> shadow_ = Pattern(16 * kPage, 7);
};

TEST_F(Rewrites, AlignedSectorsGoAroundThePageCacheAndReadsSeeThem) {
  // Nothing of the file cached: a write through the page cache would leave
  // its page there. (Not a page read first: the kernel drops a cached page
  // under a direct write only when nothing else holds it for the moment,
  // and falls back to a buffered write when it cannot.)
  if (!DropCache(*s_)) GTEST_SKIP() << "the file's pages stay in the page cache";
  const uint64_t before = s_->bytes_written();
  ASSERT_TRUE(Rewrite(kPage + 512, 512).ok());
  EXPECT_EQ(s_->bytes_written(), before + 512);
  // No page, so none dirty for the flush to write again.
  EXPECT_FALSE(PageCached(s_->ReadFd(), kPage));
  ExpectContent();
  // A rewrite of a page just read: reads see the new bytes.
  ASSERT_TRUE(PageCached(s_->ReadFd(), kPage)) << "a page just read is cached";
  ASSERT_TRUE(Rewrite(kPage + 1024, 512).ok());
  ExpectContent();
  ASSERT_TRUE(s_->Flush().ok());
}

TEST_F(Rewrites, ADirtyPageUnderARewriteIsWrittenFirst) {
  // A buffered write leaves a dirty page; a rewrite of another sector of it
  // must not lose that write, nor be lost under it.
  std::vector<uint8_t> bytes = Pattern(100, 99);
  std::copy(bytes.begin(), bytes.end(), shadow_.begin() + 3 * kPage + 10);
  ASSERT_TRUE(s_->WriteAt(3 * kPage + 10, bytes).ok());
  ASSERT_TRUE(Rewrite(3 * kPage + 1024, 1024).ok());
  ASSERT_TRUE(Rewrite(5 * kPage, 2 * kPage).ok());
  ExpectContent();
}

TEST_F(Rewrites, UnalignedRunsAreWritesThroughThePageCache) {
  ASSERT_TRUE(Rewrite(kPage + 100, 7).ok());  // unaligned offset
  ASSERT_TRUE(Rewrite(6 * kPage, 700).ok());  // unaligned length
  EXPECT_TRUE(PageCached(s_->ReadFd(), kPage)) << "written through the page cache";
  EXPECT_TRUE(PageCached(s_->ReadFd(), 6 * kPage));
  ExpectContent();
}

TEST_F(Rewrites, OnlyWritableFilesInThePageCacheRewriteAroundIt) {
  s_.reset();
  for (CacheMode mode : {CacheMode::kNone, CacheMode::kUnsafe}) {
    auto s = Open(mode);
    ASSERT_TRUE(s);
    EXPECT_FALSE(static_cast<PosixStorage*>(s.get())->rewrites_direct()) << int(mode);
  }
  auto ro = Open(CacheMode::kWriteback, /*read_only=*/true);
  ASSERT_TRUE(ro);
  EXPECT_FALSE(static_cast<PosixStorage*>(ro.get())->rewrites_direct());
  std::vector<uint8_t> sector(512, 1);
  EXPECT_EQ(ro->RewriteAt(0, sector).code(), Code::kReadOnly);
  // cache=none rewrites are its ordinary direct writes, cache=unsafe's its
  // page cache writes: both land.
  for (CacheMode mode : {CacheMode::kNone, CacheMode::kUnsafe}) {
    s_ = Open(mode);
    ASSERT_TRUE(s_);
    ASSERT_TRUE(Rewrite(2 * kPage, 512).ok());
    ExpectContent();
  }
}

}  // namespace
}  // namespace thindisk::io
