// PosixStorage's cold reads: a large aligned read none of whose pages the
// page cache holds goes around it (O_DIRECT, through the second
// descriptor), and leaves it as it was; a read with any page cached (dirty
// ones too), a small or misaligned one, and one on a file opened without
// the second descriptor go through the page cache. Every read returns the
// file's bytes, the file's end as zeros.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "io/direct_io_test_util.h"
#include "io/posix_storage.h"
#include "util/capability_test_util.h"

namespace thindisk::io {
namespace {

using test_util::CachedPages;
using test_util::DirectIoDir;
using test_util::kPage;
using test_util::NoDirectIoReason;
using test_util::PageCached;
using test_util::TempDir;

constexpr size_t kRead = 1 << 20;

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// A page-aligned buffer (direct reads need aligned memory).
struct AlignedBuf {
  explicit AlignedBuf(size_t n) : size(n) {
    void* p = nullptr;
    EXPECT_EQ(posix_memalign(&p, kPage, n + kPage), 0);
    data.reset(static_cast<uint8_t*>(p));
    std::fill_n(data.get(), n + kPage, 0xee);
  }
  std::span<uint8_t> span(size_t skew = 0) { return {data.get() + skew, size}; }
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  size_t size;
  std::unique_ptr<uint8_t[], Free> data;
};

class ColdReads : public ::testing::Test {
 protected:
  void SetUp() override {
    TD_REQUIRE_CAPABILITY(!direct_dir_.empty(), NoDirectIoReason());
    ASSERT_TRUE(dir_.ok());
    s_ = Open(/*read_only=*/false);
    ASSERT_TRUE(s_);
    TD_REQUIRE_CAPABILITY(posix(*s_)->rewrites_direct(),
                          "the kernel does not report direct I/O alignment (statx "
                          "STATX_DIOALIGN, Linux 6.1)");
    ASSERT_TRUE(s_->WriteAt(0, data_).ok());
    ASSERT_TRUE(Evict(*s_));
    // A kernel without cachestat(2) (before 6.5) reads everything cached.
    AlignedBuf probe(kRead);
    TD_REQUIRE_CAPABILITY(s_->ReadFdFor(0, probe.span()) != s_->ReadFd(),
                          "the kernel cannot say what the page cache holds "
                          "(cachestat(2), Linux 6.5)");
  }
  std::unique_ptr<Storage> Open(bool read_only) {
    OpenOptions o;
    o.create = !read_only;
    o.read_only = read_only;
    o.cache = CacheMode::kWriteback;
    auto r = OpenFile(dir_.File("image"), o);
    EXPECT_TRUE(r.has_value()) << r.status().ToString();
    return r ? std::move(*r) : nullptr;
  }
  static PosixStorage* posix(Storage& s) { return static_cast<PosixStorage*>(&s); }
  // Syncs the file and drops every page of it from the page cache.
  static bool Evict(Storage& s) {
    if (!s.Flush().ok()) return false;
    for (int i = 0; i < 3; ++i) {
      if (posix_fadvise(s.ReadFd(), 0, 0, POSIX_FADV_DONTNEED) != 0) return false;
      if (CachedPages(s.ReadFd(), 0, kFile) == 0) return true;
    }
    return false;
  }

  static constexpr size_t kFile = 4 * kRead;
  const std::string direct_dir_ = DirectIoDir();
  TempDir dir_{direct_dir_};
  std::unique_ptr<Storage> s_;
  std::vector<uint8_t> data_ = Pattern(kFile, 3);
};

TEST_F(ColdReads, AColdLargeReadGoesAroundThePageCache) {
  AlignedBuf buf(kRead);
  const uint64_t before = posix(*s_)->cold_direct_reads();
  ASSERT_TRUE(s_->ReadAt(kRead, buf.span()).ok());
  EXPECT_TRUE(std::equal(buf.data.get(), buf.data.get() + kRead, data_.begin() + kRead));
  EXPECT_EQ(posix(*s_)->cold_direct_reads(), before + 1);
  // Read around the page cache: none of its pages, and no readahead
  // beyond them, were cached by it.
  EXPECT_EQ(CachedPages(s_->ReadFd(), 0, kFile), 0u);

  // The descriptor ReadFdFor hands out for it reads the same bytes.
  AlignedBuf other(kRead);
  const int fd = s_->ReadFdFor(2 * kRead, other.span());
  ASSERT_NE(fd, s_->ReadFd());
  ASSERT_EQ(pread(fd, other.data.get(), kRead, 2 * kRead), ssize_t(kRead));
  EXPECT_TRUE(
      std::equal(other.data.get(), other.data.get() + kRead, data_.begin() + 2 * kRead));
}

TEST_F(ColdReads, ARangeWithAnyPageCachedIsReadThroughIt) {
  // One clean page cached, in the middle of the range.
  std::vector<uint8_t> page(kPage);
  ASSERT_TRUE(s_->ReadAt(kRead + 5 * kPage, page).ok());
  ASSERT_TRUE(PageCached(s_->ReadFd(), kRead + 5 * kPage));
  // One dirty page: written and not synced, the disk still has the old bytes.
  std::vector<uint8_t> fresh = Pattern(kPage, 9);
  ASSERT_TRUE(s_->WriteAt(3 * kRead + 7 * kPage, fresh).ok());
  std::copy(fresh.begin(), fresh.end(), data_.begin() + 3 * kRead + 7 * kPage);

  const uint64_t before = posix(*s_)->cold_direct_reads();
  AlignedBuf buf(kRead);
  for (uint64_t at : {kRead, 3 * kRead}) {
    ASSERT_TRUE(s_->ReadAt(at, buf.span()).ok());
    EXPECT_TRUE(
        std::equal(buf.data.get(), buf.data.get() + kRead, data_.begin() + long(at)))
        << "at " << at;
    EXPECT_EQ(s_->ReadFdFor(at, buf.span()), s_->ReadFd()) << "at " << at;
  }
  EXPECT_EQ(posix(*s_)->cold_direct_reads(), before);
}

TEST_F(ColdReads, SmallAndMisalignedReadsGoThroughThePageCache) {
  const uint64_t before = posix(*s_)->cold_direct_reads();
  AlignedBuf small(PosixStorage::kColdDirectMin - kPage);
  AlignedBuf big(kRead);
  EXPECT_EQ(s_->ReadFdFor(0, small.span()), s_->ReadFd()) << "below the threshold";
  EXPECT_EQ(s_->ReadFdFor(1000, big.span()), s_->ReadFd()) << "misaligned offset";
  EXPECT_EQ(s_->ReadFdFor(0, big.span(8)), s_->ReadFd()) << "misaligned memory";
  // Read through the page cache, they return the file's bytes all the same.
  ASSERT_TRUE(s_->ReadAt(kRead + 8, big.span(8)).ok());
  EXPECT_TRUE(std::equal(big.data.get() + 8, big.data.get() + 8 + kRead,
                         data_.begin() + kRead + 8));
  ASSERT_TRUE(s_->ReadAt(2 * kRead, small.span()).ok());
  EXPECT_TRUE(std::equal(small.data.get(), small.data.get() + small.size,
                         data_.begin() + 2 * kRead));
  EXPECT_EQ(posix(*s_)->cold_direct_reads(), before);
}

TEST_F(ColdReads, TheFilesEndInsideAColdReadReadsAsZeros) {
  // The file ends 1000 bytes into its last MiB's second block.
  ASSERT_TRUE(s_->Resize(3 * kRead + kPage + 1000).ok());
  ASSERT_TRUE(Evict(*s_));
  AlignedBuf buf(kRead);
  const uint64_t before = posix(*s_)->cold_direct_reads();
  ASSERT_TRUE(s_->ReadAt(3 * kRead, buf.span()).ok());
  EXPECT_EQ(posix(*s_)->cold_direct_reads(), before + 1);
  const size_t kept = kPage + 1000;
  EXPECT_TRUE(
      std::equal(buf.data.get(), buf.data.get() + kept, data_.begin() + 3 * kRead));
  EXPECT_EQ(std::count(buf.data.get() + kept, buf.data.get() + kRead, 0),
            long(kRead - kept));
}

TEST_F(ColdReads, AReadOnlyOpenReadsColdRangesAroundThePageCacheToo) {
  s_.reset();
  auto ro = Open(/*read_only=*/true);
  ASSERT_TRUE(ro);
  EXPECT_FALSE(posix(*ro)->rewrites_direct()) << "a read-only file is never written";
  AlignedBuf buf(kRead);
  ASSERT_TRUE(ro->ReadAt(0, buf.span()).ok());
  EXPECT_TRUE(std::equal(buf.data.get(), buf.data.get() + kRead, data_.begin()));
  EXPECT_EQ(posix(*ro)->cold_direct_reads(), 1u);
}

TEST_F(ColdReads, OtherCacheModesReadThroughThePageCacheOrAroundItAlways) {
  s_.reset();
  OpenOptions o;
  o.cache = CacheMode::kUnsafe;
  auto unsafe = OpenFile(dir_.File("image"), o);
  ASSERT_TRUE(unsafe.has_value()) << unsafe.status().ToString();
  AlignedBuf buf(kRead);
  EXPECT_EQ((*unsafe)->ReadFdFor(0, buf.span()), (*unsafe)->ReadFd());
  ASSERT_TRUE((*unsafe)->ReadAt(0, buf.span()).ok());
  EXPECT_TRUE(std::equal(buf.data.get(), buf.data.get() + kRead, data_.begin()));
  EXPECT_EQ(posix(**unsafe)->cold_direct_reads(), 0u);
  unsafe->reset();
  // cache=none reads everything directly already, and hands out no
  // descriptor (a ring would need its alignment).
  o.cache = CacheMode::kNone;
  auto none = OpenFile(dir_.File("image"), o);
  ASSERT_TRUE(none.has_value()) << none.status().ToString();
  EXPECT_EQ((*none)->ReadFdFor(0, buf.span()), -1);
}

}  // namespace
}  // namespace thindisk::io
