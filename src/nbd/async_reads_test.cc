// AsyncReads (async_reads.h) on real files: many READs in one batch read
// their bytes, the file's end reads as zeros, a failing host read fails its
// READ alone, a storage without a descriptor is read at once, a READ of
// zeros only is done at once, and the ring's descriptor wakes a poll when
// completions wait.
#include "nbd/async_reads.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "io/direct_io_test_util.h"
#include "io/forwarding_storage.h"
#include "io/memory_storage.h"
#include "io/posix_storage.h"
#include "util/capability_test_util.h"
#include "util/temp_dir_test_util.h"

namespace thindisk::nbd {
namespace {

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = uint8_t(rng());
  return v;
}

class AsyncReadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    data_ = Pattern(1 << 20, 5);
    io::OpenOptions o;
    o.create = true;
    auto file = io::OpenFile(dir_.File("data"), o);
    ASSERT_TRUE(file.has_value()) << file.status().ToString();
    file_ = std::move(*file);
    ASSERT_TRUE(file_->WriteAt(0, data_).ok());
    ASSERT_GE(file_->ReadFd(), 0);
    ring_ = AsyncReads::Create(8);  // small: Add must submit when it fills
    TD_REQUIRE_CAPABILITY(ring_ != nullptr, "io_uring cannot be set up here");
  }

  // Reaps until nothing is pending (bounded).
  void Drain() {
    ASSERT_TRUE(ring_->Submit().ok());
    for (int i = 0; i < 1000 && ring_->pending() > 0; ++i) ring_->Reap(10);
    ASSERT_EQ(ring_->pending(), 0u);
  }

  test_env::TempDir dir_;
  std::vector<uint8_t> data_;
  std::unique_ptr<io::Storage> file_;
  std::unique_ptr<AsyncReads> ring_;
};

TEST_F(AsyncReadsTest, ManyReadsInOneBatchReadTheirBytes) {
  constexpr int kOps = 40;  // more pieces than the ring has slots
  std::vector<std::vector<uint8_t>> bufs(kOps);
  std::vector<int> done(kOps, 0);
  std::mt19937 rng(1);
  std::vector<std::pair<uint64_t, uint64_t>> where(kOps);  // two pieces each
  for (int i = 0; i < kOps; ++i) {
    const uint64_t a = rng() % (data_.size() - 8192), b = rng() % (data_.size() - 8192);
    where[i] = {a, b};
    bufs[i].assign(8192, 0xee);
    const AsyncReads::HostRead reads[] = {
        {file_.get(), a, std::span<uint8_t>(bufs[i]).first(4096)},
        {file_.get(), b, std::span<uint8_t>(bufs[i]).subspan(4096)}};
    ring_->Add(reads, [&done, i](Status s) {
      EXPECT_TRUE(s.ok()) << s.ToString();
      ++done[i];
    });
  }
  EXPECT_EQ(ring_->pending(),
            size_t(kOps) - size_t(std::count(done.begin(), done.end(), 1)));
  Drain();
  for (int i = 0; i < kOps; ++i) {
    ASSERT_EQ(done[i], 1) << "READ " << i << " finished " << done[i] << " times";
    const auto [a, b] = where[i];
    EXPECT_TRUE(std::equal(bufs[i].begin(), bufs[i].begin() + 4096, data_.begin() + a));
    EXPECT_TRUE(std::equal(bufs[i].begin() + 4096, bufs[i].end(), data_.begin() + b));
  }
}

TEST_F(AsyncReadsTest, TheFilesEndReadsAsZerosAndAFailedReadFailsItsReadAlone) {
  // Past the end: the last 1000 bytes, then zeros.
  std::vector<uint8_t> tail(5000, 0xee);
  Status tail_status = Status::Internal("not done");
  const AsyncReads::HostRead tail_read[] = {{file_.get(), data_.size() - 1000, tail}};
  ring_->Add(tail_read, [&](Status s) { tail_status = s; });
  // A directory cannot be read (EISDIR): that READ fails, naming the storage.
  int dir_fd = ::open(dir_.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  struct DirFd final : io::ForwardingStorage {
    DirFd(std::unique_ptr<io::Storage> inner, int fd)
        : ForwardingStorage(std::move(inner)), fd(fd) {}
    int ReadFd() const override { return fd; }
    int fd;
  } dir(io::NewMemoryStorage("dir"), dir_fd);
  std::vector<uint8_t> bad(8192), good(4096);
  Status bad_status, good_status = Status::Internal("not done");
  const AsyncReads::HostRead bad_reads[] = {
      {file_.get(), 0, std::span<uint8_t>(bad).first(4096)},
      {&dir, 0, std::span<uint8_t>(bad).subspan(4096)}};
  ring_->Add(bad_reads, [&](Status s) { bad_status = s; });
  const AsyncReads::HostRead good_read[] = {{file_.get(), 4096, good}};
  ring_->Add(good_read, [&](Status s) { good_status = s; });
  Drain();
  ::close(dir_fd);
  ASSERT_TRUE(tail_status.ok()) << tail_status.ToString();
  EXPECT_TRUE(std::equal(tail.begin(), tail.begin() + 1000, data_.end() - 1000));
  EXPECT_EQ(std::count(tail.begin() + 1000, tail.end(), 0), 4000);
  EXPECT_FALSE(bad_status.ok());
  EXPECT_EQ(bad_status.error_number(), EISDIR) << bad_status.ToString();
  EXPECT_NE(bad_status.message().find("dir: read"), std::string::npos)
      << bad_status.ToString();
  ASSERT_TRUE(good_status.ok()) << good_status.ToString();
  EXPECT_TRUE(std::equal(good.begin(), good.end(), data_.begin() + 4096));
}

TEST_F(AsyncReadsTest, AStorageWithoutADescriptorIsReadAtOnce) {
  auto mem = io::NewMemoryStorage("mem");
  ASSERT_TRUE(mem->WriteAt(0, data_).ok());
  ASSERT_EQ(mem->ReadFd(), -1);
  std::vector<uint8_t> buf(3000);
  bool done = false;
  const AsyncReads::HostRead read[] = {{mem.get(), 777, buf}};
  ring_->Add(read, [&](Status s) {
    EXPECT_TRUE(s.ok()) << s.ToString();
    done = true;
  });
  EXPECT_TRUE(done) << "nothing went to the ring: the READ is done when added";
  EXPECT_EQ(ring_->pending(), 0u);
  EXPECT_TRUE(std::equal(buf.begin(), buf.end(), data_.begin() + 777));
}

TEST_F(AsyncReadsTest, NothingToReadIsDoneAtOnceAndTheRingFdWakesPoll) {
  bool zeros_done = false;
  ring_->Add({}, [&](Status s) {
    EXPECT_TRUE(s.ok());
    zeros_done = true;
  });
  EXPECT_TRUE(zeros_done);
  EXPECT_EQ(ring_->pending(), 0u);

  std::vector<uint8_t> buf(4096);
  bool done = false;
  const AsyncReads::HostRead read[] = {{file_.get(), 8192, buf}};
  ring_->Add(read, [&](Status) { done = true; });
  ASSERT_TRUE(ring_->Submit().ok());
  pollfd p{ring_->fd(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1) << "no completion within 10 s";
  EXPECT_FALSE(done) << "callbacks run only in Reap";
  ring_->Reap(0);
  EXPECT_TRUE(done);
  EXPECT_TRUE(std::equal(buf.begin(), buf.end(), data_.begin() + 8192));
}

// A cold read of 1 MiB on a file open with the page cache goes through the
// storage's O_DIRECT descriptor (PosixStorage::ReadFdFor) and reads the
// file's bytes; a direct read the kernel refuses (EINVAL) is read again by
// ReadAt, so the READ still succeeds.
TEST_F(AsyncReadsTest, AColdLargeReadGoesDirectAndARefusedOneIsReadAgain) {
  const std::string direct_dir = io::test_util::DirectIoDir();
  TD_REQUIRE_CAPABILITY(!direct_dir.empty(), io::test_util::NoDirectIoReason());
  io::test_util::TempDir dir(direct_dir);
  ASSERT_TRUE(dir.ok());
  io::OpenOptions o;
  o.create = true;
  auto opened = io::OpenFile(dir.File("cold"), o);
  ASSERT_TRUE(opened.has_value()) << opened.status().ToString();
  auto* file = static_cast<io::PosixStorage*>(opened->get());
  ASSERT_TRUE(file->WriteAt(0, data_).ok());
  ASSERT_TRUE(file->Flush().ok());
  ASSERT_EQ(posix_fadvise(file->ReadFd(), 0, 0, POSIX_FADV_DONTNEED), 0);
  void* mem = nullptr;
  ASSERT_EQ(posix_memalign(&mem, 4096, data_.size() + 4096), 0);
  std::unique_ptr<uint8_t, decltype(&std::free)> owned(static_cast<uint8_t*>(mem),
                                                       &std::free);
  std::span<uint8_t> buf(owned.get(), data_.size());
  TD_REQUIRE_CAPABILITY(file->ReadFdFor(0, buf) != file->ReadFd(),
                        "no cold reads here (statx STATX_DIOALIGN, Linux 6.1; "
                        "cachestat(2), Linux 6.5)");
  const uint64_t before = file->cold_direct_reads();
  Status status = Status::Internal("not done");
  const AsyncReads::HostRead cold[] = {{file, 0, buf}};
  ring_->Add(cold, [&](Status s) { status = s; });
  Drain();
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_TRUE(std::equal(buf.begin(), buf.end(), data_.begin()));
  EXPECT_EQ(file->cold_direct_reads(), before + 1);

  // A storage whose direct descriptor the kernel refuses for this read:
  // offset and memory one byte off the alignment O_DIRECT needs.
  struct Refused final : io::ForwardingStorage {
    Refused(std::unique_ptr<io::Storage> inner, int fd)
        : ForwardingStorage(std::move(inner)), fd(fd) {}
    int ReadFd() const override { return -2; }  // never used: not -1, not fd
    int ReadFdFor(uint64_t, std::span<const uint8_t>) const override { return fd; }
    int fd;
  };
  const int direct_fd = ::open(dir.File("cold").c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  ASSERT_GE(direct_fd, 0);
  auto mem_copy = io::NewMemoryStorage("copy");
  ASSERT_TRUE(mem_copy->WriteAt(0, data_).ok());
  Refused refused(std::move(mem_copy), direct_fd);
  std::span<uint8_t> skewed(owned.get() + 1, data_.size() - 4097);
  std::fill(skewed.begin(), skewed.end(), 0xee);
  status = Status::Internal("not done");
  const AsyncReads::HostRead again[] = {{&refused, 4097, skewed}};
  ring_->Add(again, [&](Status s) { status = s; });
  Drain();
  ::close(direct_fd);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_TRUE(std::equal(skewed.begin(), skewed.end(), data_.begin() + 4097));
}

}  // namespace
}  // namespace thindisk::nbd
