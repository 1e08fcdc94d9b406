#include "io/uring_storage.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <barrier>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "io/direct_io_test_util.h"
#include "util/capability_test_util.h"

namespace thindisk::io {
namespace {

using test_util::DirectIoDir;
using test_util::NoDirectIoReason;

// Temp dirs for these tests: in /var/tmp, or where O_DIRECT works.
class TempDir : public test_util::TempDir {
 public:
  explicit TempDir(const std::string& base = "/var/tmp")
      : test_util::TempDir(base, "td_uring_test") {}
};

// UringAvailable(), or unavailable when THINDISK_TEST_DENY lists io_uring
// (the mutation check of the skip rule: tests/skip_rule.sh).
Status UringUsable() {
  if (test_env::CapabilityDenied("io_uring")) {
    return Status::NotSupported("io_uring denied by THINDISK_TEST_DENY");
  }
  return UringAvailable();
}

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Opens a UringStorage as `var`. Where io_uring is unavailable (seccomp, old
// kernel) the test skips locally and fails in CI. Tests with
// CacheMode::kNone make their TempDir in DirectIoDir() first, so O_DIRECT
// is known to work there and a refusal fails the test.
#define OPEN_URING(var, path, mode)                                \
  if (Status avail = UringUsable(); !avail.ok())                   \
    TD_SKIP_OR_FAIL("io_uring unavailable: " << avail.ToString()); \
  OpenOptions opts_##var;                                          \
  opts_##var.create = true;                                        \
  opts_##var.cache = (mode);                                       \
  auto r_##var = OpenUringFile((path), opts_##var);                \
  ASSERT_TRUE(r_##var.has_value()) << r_##var.status().ToString(); \
  auto* var = static_cast<UringStorage*>(r_##var->get())

// The temp dir of an O_DIRECT test: where O_DIRECT works, or the test skips
// locally and fails in CI.
#define DIRECT_TEMP_DIR(var)                                      \
  const std::string base_##var = DirectIoDir();                   \
  TD_REQUIRE_CAPABILITY(!base_##var.empty(), NoDirectIoReason()); \
  TempDir var(base_##var)

TEST(UringStorage, RoundTripAndZerosPastEof) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  OPEN_URING(s, dir.File("a"), CacheMode::kWriteback);
  auto data = Pattern(10000, 1);
  ASSERT_TRUE(s->WriteAt(123, data).ok());
  EXPECT_EQ(*s->Size(), 10123u);
  std::vector<uint8_t> back(10000);
  ASSERT_TRUE(s->ReadAt(123, back).ok());
  EXPECT_EQ(back, data);
  // A read that crosses the end of the file: the tail reads as zeros.
  std::vector<uint8_t> tail(4096, 0xff);
  ASSERT_TRUE(s->ReadAt(10123 - 100, tail).ok());
  EXPECT_TRUE(std::equal(tail.begin(), tail.begin() + 100, data.end() - 100));
  EXPECT_TRUE(std::all_of(tail.begin() + 100, tail.end(), [](uint8_t b) { return b == 0; }));
  EXPECT_GE(s->ring_ops(), 3u);
  EXPECT_GE(s->bytes_written(), 10000u);
  ASSERT_TRUE(s->Flush().ok());
  // Space operations go through the fallback and are visible to ring reads.
  ASSERT_TRUE(s->ZeroRange(123, 4096).ok());
  ASSERT_TRUE(s->ReadAt(123, back).ok());
  EXPECT_TRUE(std::all_of(back.begin(), back.begin() + 4096, [](uint8_t b) { return b == 0; }));
  EXPECT_TRUE(std::equal(back.begin() + 4096, back.end(), data.begin() + 4096));
}

TEST(UringStorage, DirectAlignedAndUnalignedRequests) {
  DIRECT_TEMP_DIR(dir);
  ASSERT_TRUE(dir.ok());
  OPEN_URING(s, dir.File("d"), CacheMode::kNone);
  // Aligned buffer, offset and length: through the ring.
  auto* aligned = static_cast<uint8_t*>(std::aligned_alloc(4096, 8192));
  ASSERT_NE(aligned, nullptr);
  auto data = Pattern(8192, 2);
  std::copy(data.begin(), data.end(), aligned);
  uint64_t before = s->ring_ops();
  ASSERT_TRUE(s->WriteAt(4096, std::span<const uint8_t>(aligned, 8192)).ok());
  EXPECT_GT(s->ring_ops(), before);
  // Unaligned: the fallback's bounce path, same file.
  auto odd = Pattern(1000, 3);
  ASSERT_TRUE(s->WriteAt(5000, odd).ok());
  std::fill(aligned, aligned + 8192, 0);
  ASSERT_TRUE(s->ReadAt(4096, std::span<uint8_t>(aligned, 8192)).ok());
  std::copy(odd.begin(), odd.end(), data.begin() + (5000 - 4096));
  EXPECT_TRUE(std::equal(data.begin(), data.end(), aligned));
  std::free(aligned);
  ASSERT_TRUE(s->Flush().ok());
}

// Regression (tests/serve/kill.sh, --aio=io_uring --cache=none): a ring
// write extending the file while the fallback trimmed a block-rounded tail
// past EOF was cut off by that trim.
TEST(UringStorage, DirectTailTrimDoesNotCutConcurrentRingWrite) {
  DIRECT_TEMP_DIR(dir);
  ASSERT_TRUE(dir.ok());
  OPEN_URING(s, dir.File("t"), CacheMode::kNone);
  constexpr uint64_t kSlot = 64 << 10;
  constexpr int kRounds = 300;
  const auto tail = Pattern(5000, 1);  // slot 2i: fallback, unaligned end past EOF
  auto* whole = static_cast<uint8_t*>(std::aligned_alloc(4096, kSlot));  // slot 2i+1: ring
  ASSERT_NE(whole, nullptr);
  const auto data = Pattern(kSlot, 2);
  std::copy(data.begin(), data.end(), whole);
  std::barrier sync(2);
  std::thread trimmer([&] {
    for (int i = 0; i < kRounds; ++i) {
      sync.arrive_and_wait();
      EXPECT_TRUE(s->WriteAt(2 * i * kSlot + 100, tail).ok());
    }
  });
  for (int i = 0; i < kRounds; ++i) {
    sync.arrive_and_wait();
    EXPECT_TRUE(s->WriteAt((2 * i + 1) * kSlot, std::span<const uint8_t>(whole, kSlot)).ok());
  }
  trimmer.join();
  std::free(whole);
  std::vector<uint8_t> got(kSlot);
  for (int i = 0; i < kRounds; ++i) {
    ASSERT_TRUE(s->ReadAt((2 * i + 1) * kSlot, got).ok());
    ASSERT_EQ(got, data) << "ring write " << i << " was cut";
  }
}

TEST(UringStorage, ConcurrentThreadsEachUseTheirRing) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  OPEN_URING(s, dir.File("c"), CacheMode::kWriteback);
  constexpr int kThreads = 4;
  constexpr int kBlocks = 64;
  constexpr size_t kBlock = 4096;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int b = 0; b < kBlocks; ++b) {
        auto p = Pattern(kBlock, uint32_t(t * 1000 + b));
        EXPECT_TRUE(s->WriteAt(uint64_t(b * kThreads + t) * kBlock, p).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    for (int b = 0; b < kBlocks; ++b) {
      std::vector<uint8_t> back(kBlock);
      ASSERT_TRUE(s->ReadAt(uint64_t(b * kThreads + t) * kBlock, back).ok());
      EXPECT_EQ(back, Pattern(kBlock, uint32_t(t * 1000 + b)));
    }
  }
}

TEST(UringStorage, ReadOnlyRefusesWrites) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  {
    OPEN_URING(w, dir.File("r"), CacheMode::kWriteback);
    ASSERT_TRUE(w->WriteAt(0, Pattern(4096, 5)).ok());
  }
  OpenOptions o;
  o.read_only = true;
  auto r = OpenUringFile(dir.File("r"), o);
  ASSERT_TRUE(r.has_value()) << r.status().ToString();
  std::vector<uint8_t> back(4096);
  ASSERT_TRUE((*r)->ReadAt(0, back).ok());
  EXPECT_EQ(back, Pattern(4096, 5));
  EXPECT_FALSE((*r)->WriteAt(0, back).ok());
}

}  // namespace
}  // namespace thindisk::io
