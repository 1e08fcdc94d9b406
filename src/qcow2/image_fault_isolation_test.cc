// A storage error in one of many requests in flight fails that request
// alone: the others, running at the same time on other clusters, complete
// with their data, and the image keeps working once the storage does.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <thread>
#include <vector>

#include "io/forwarding_storage.h"
#include "qcow2/check.h"
#include "qcow2/image_test_util.h"

namespace thindisk::qcow2 {
namespace {

using testing::Pattern;

// Fails every read or write that touches [offset, offset + length) with
// EIO while poisoned; everything else passes through.
class PoisonedRange final : public io::ForwardingStorage {
 public:
  explicit PoisonedRange(std::unique_ptr<io::Storage> inner)
      : ForwardingStorage(std::move(inner)) {}
  void Poison(uint64_t offset, uint64_t length) {
    std::lock_guard lock(mu_);
    from_ = offset;
    to_ = offset + length;
  }
  void Cure() { Poison(0, 0); }
  uint64_t failures() const { return failures_.load(); }

  Status ReadAt(uint64_t o, std::span<uint8_t> b) override {
    if (Hits(o, b.size())) return Status(Code::kIoError, "poisoned read", EIO);
    return inner().ReadAt(o, b);
  }
  Status WriteAt(uint64_t o, std::span<const uint8_t> b) override {
    if (Hits(o, b.size())) return Status(Code::kIoError, "poisoned write", EIO);
    return inner().WriteAt(o, b);
  }

 private:
  bool Hits(uint64_t o, uint64_t n) {
    std::lock_guard lock(mu_);
    const bool hit = o < to_ && from_ < o + n;
    if (hit) ++failures_;
    return hit;
  }
  std::mutex mu_;
  uint64_t from_ = 0, to_ = 0;
  std::atomic<uint64_t> failures_{0};
};

using Poisoned = testing::WrappedImage<PoisonedRange>;

Poisoned Open(uint32_t cluster_size, bool extended) {
  CreateOptions co;
  co.size = 64 << 20;
  co.cluster_size = cluster_size;
  co.extended_l2 = extended;
  return testing::CreateWrapped<PoisonedRange>(co);
}

class FaultIsolationTest : public ::testing::TestWithParam<std::tuple<uint32_t, bool>> {
 protected:
  static constexpr int kThreads = 8;
  static constexpr int kRounds = 20;
  static constexpr uint64_t kBlock = 64 << 10;  // one request per thread and round
};

// Threads read their own 64 KiB blocks over and over while one block's host
// cluster fails: only the reads of that block fail, every other read
// returns its data, and the poisoned block reads back once cured.
TEST_P(FaultIsolationTest, AFailedReadFailsOnlyItself) {
  auto [cs, extended] = GetParam();
  Poisoned p = Open(cs, extended);
  ASSERT_TRUE(p.image);
  std::vector<std::vector<uint8_t>> data;
  for (int t = 0; t < kThreads; ++t) {
    data.push_back(Pattern(10 + t, kBlock));
    ASSERT_TRUE(p.image->Write(uint64_t(t) * kBlock * 3, data.back()).ok());
  }
  ASSERT_TRUE(p.image->Flush().ok());
  constexpr int kBad = 5;
  auto st = p.image->GetStatus(uint64_t(kBad) * kBlock * 3, kBlock);
  ASSERT_TRUE(st.has_value() && st->has_host_offset);
  p.wrapper->Poison(st->host_offset, 512);

  std::atomic<int> wrong_data{0}, unexpected{0}, bad_failed{0};
  auto worker = [&](int t) {
    std::vector<uint8_t> got(kBlock);
    for (int r = 0; r < kRounds; ++r) {
      Status s = p.image->Read(uint64_t(t) * kBlock * 3, got);
      if (t == kBad) {
        ++(s.code() == Code::kIoError ? bad_failed : unexpected);
      } else if (!s.ok()) {
        ++unexpected;
      } else if (got != data[t]) {
        ++wrong_data;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  EXPECT_EQ(unexpected.load(), 0)
      << "a read other than the poisoned one failed, or it did not";
  EXPECT_EQ(wrong_data.load(), 0);
  EXPECT_EQ(bad_failed.load(), kRounds);
  p.wrapper->Cure();
  std::vector<uint8_t> got(kBlock);
  ASSERT_TRUE(p.image->Read(uint64_t(kBad) * kBlock * 3, got).ok());
  EXPECT_TRUE(got == data[kBad]);
  ASSERT_TRUE(p.image->Close().ok());
}

// Threads write first writes into fresh clusters while the host space one
// of them is given fails: that write fails, every other lands, a flush
// succeeds, and the image is consistent with every acknowledged write.
TEST_P(FaultIsolationTest, AFailedWriteFailsOnlyItself) {
  auto [cs, extended] = GetParam();
  Poisoned p = Open(cs, extended);
  ASSERT_TRUE(p.image);
  // One write first, so the L2 table exists: every allocation below is then
  // a data cluster, taken in order past the file's end.
  ASSERT_TRUE(p.image->Write(60 << 20, Pattern(39, 4096)).ok());
  ASSERT_TRUE(p.image->Flush().ok());
  const uint64_t file_end = (*p.mem->Size() + cs - 1) / cs * cs;
  std::atomic<int> failed{0}, unexpected{0};
  std::vector<std::vector<uint8_t>> data(kThreads);
  std::vector<std::vector<bool>> acked(kThreads, std::vector<bool>(kRounds, false));
  for (int t = 0; t < kThreads; ++t) data[t] = Pattern(40 + t, kBlock);
  // Poison the host cluster the fifth of those first writes is given.
  p.wrapper->Poison(file_end + 4 * cs, 512);
  auto guest = [&](int t, int r) { return (uint64_t(r) * kThreads + t) * kBlock * 2; };
  auto worker = [&](int t) {
    for (int r = 0; r < kRounds; ++r) {
      Status s = p.image->Write(guest(t, r), data[t]);
      if (s.ok()) {
        acked[t][r] = true;
      } else if (s.code() == Code::kIoError) {
        ++failed;
      } else {
        ++unexpected;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_GE(failed.load(), 1) << "no write was placed on the poisoned range";
  EXPECT_LE(uint64_t(failed.load()), p.wrapper->failures());
  EXPECT_LT(failed.load(), kThreads * kRounds / 4) << "one bad range failed many writes";
  p.wrapper->Cure();
  ASSERT_TRUE(p.image->Flush().ok());
  std::vector<uint8_t> got(kBlock);
  for (int t = 0; t < kThreads; ++t) {
    for (int r = 0; r < kRounds; ++r) {
      if (!acked[t][r]) continue;
      ASSERT_TRUE(p.image->Read(guest(t, r), got).ok());
      EXPECT_TRUE(got == data[t]) << "thread " << t << " round " << r;
    }
  }
  ASSERT_TRUE(p.image->Close().ok());
  auto check = Check(*p.mem, RepairMode::kNone);
  ASSERT_TRUE(check.has_value()) << check.status().ToString();
  EXPECT_EQ(check->corruptions, 0u);
}

INSTANTIATE_TEST_SUITE_P(Layouts, FaultIsolationTest,
                         ::testing::Values(std::make_tuple(65536u, false),
                                           std::make_tuple(131072u, true)));

}  // namespace
}  // namespace thindisk::qcow2
