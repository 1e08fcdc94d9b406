// What a flush after a first write costs: one sector of the L2 table, no
// refcount block while the cluster reserve lasts, and the ordering rules
// still hold; a crash leaks at most the reserve, a close leaks nothing.
#include <gtest/gtest.h>

#include <array>
#include <mutex>
#include <vector>

#include "io/forwarding_storage.h"
#include "qcow2/allocator.h"
#include "qcow2/check.h"
#include "qcow2/image_test_util.h"

namespace thindisk::qcow2 {
namespace {

using testing::Pattern;

// Counts announced steps and the bytes of the write after each, and syncs.
class StepCounter : public io::ForwardingStorage {
 public:
  explicit StepCounter(std::unique_ptr<io::Storage> inner)
      : ForwardingStorage(std::move(inner)) {}
  void Announce(io::Event e) override {
    std::lock_guard lock(mu_);
    last_ = e;
    ++count_[size_t(e)];
  }
  Status WriteAt(uint64_t o, std::span<const uint8_t> b) override {
    {
      std::lock_guard lock(mu_);
      bytes_[size_t(last_)] += b.size();
    }
    return inner().WriteAt(o, b);
  }
  Status Flush() override {
    {
      std::lock_guard lock(mu_);
      ++syncs_;
    }
    return inner().Flush();
  }
  void Reset() {
    std::lock_guard lock(mu_);
    count_.fill(0);
    bytes_.fill(0);
    syncs_ = 0;
  }
  uint64_t count(io::Event e) {
    std::lock_guard lock(mu_);
    return count_[size_t(e)];
  }
  uint64_t bytes(io::Event e) {
    std::lock_guard lock(mu_);
    return bytes_[size_t(e)];
  }
  uint64_t syncs() {
    std::lock_guard lock(mu_);
    return syncs_;
  }

 private:
  static constexpr size_t kEvents = 64;
  std::mutex mu_;
  io::Event last_ = io::Event::kDataWrite;
  std::array<uint64_t, kEvents> count_{};
  std::array<uint64_t, kEvents> bytes_{};
  uint64_t syncs_ = 0;
};

using Opened = testing::WrappedImage<StepCounter>;

Opened OpenCounted(uint32_t cluster_size, bool extended) {
  CreateOptions co;
  co.size = 1ull << 30;
  co.cluster_size = cluster_size;
  co.extended_l2 = extended;
  return testing::CreateWrapped<StepCounter>(co);
}

class SyncWriteTest : public ::testing::TestWithParam<std::tuple<uint32_t, bool>> {};

// A database on a fresh disk: 4 KiB first writes into new clusters, a flush
// after each. Past the first (which makes the L2 table and fills the
// reserve), a flush writes one 512-byte sector of the L2 table and, while
// the reserve lasts, no refcount block: about 4.6 KiB per 4 KiB written,
// where whole tables made it 64x.
TEST_P(SyncWriteTest, FlushAfterAFirstWriteWritesASectorOfMetadata) {
  auto [cs, extended] = GetParam();
  Opened o = OpenCounted(cs, extended);
  ASSERT_TRUE(o.image);
  const auto data = Pattern(1, 4096);
  ASSERT_TRUE(o.image->Write(0, data).ok());
  ASSERT_TRUE(o.image->Flush().ok());
  o.wrapper->Reset();
  constexpr int kWrites = 24;  // fewer than the reserve of 64 (8 MiB / cs)
  for (int i = 1; i <= kWrites; ++i) {
    ASSERT_TRUE(o.image->Write(uint64_t(i) * 7 * cs + 8192, data).ok());
    ASSERT_TRUE(o.image->Flush().ok());
  }
  EXPECT_EQ(o.wrapper->count(io::Event::kRefblockUpdate), 0u);
  EXPECT_EQ(o.wrapper->count(io::Event::kRefblockAlloc), 0u);
  EXPECT_EQ(o.wrapper->count(io::Event::kL2Update), uint64_t(kWrites));
  EXPECT_EQ(o.wrapper->bytes(io::Event::kL2Update), uint64_t(kWrites) * 512);
  EXPECT_EQ(o.wrapper->bytes(io::Event::kDataWrite), uint64_t(kWrites) * 4096);
  // The ordering rule's two syncs: data durable, then the mapping.
  EXPECT_EQ(o.wrapper->syncs(), uint64_t(kWrites) * 2);
  std::vector<uint8_t> back(4096);
  for (int i = 1; i <= kWrites; ++i) {
    ASSERT_TRUE(o.image->Read(uint64_t(i) * 7 * cs + 8192, back).ok());
    EXPECT_TRUE(back == data) << i;
  }
  ASSERT_TRUE(o.image->Close().ok());
  auto check = Check(*o.mem, RepairMode::kNone);
  ASSERT_TRUE(check.has_value()) << check.status().ToString();
  EXPECT_EQ(check->corruptions, 0u);
  EXPECT_EQ(check->leaks, 0u) << "the unused reserve is given back on close";
}

// Power lost with the reserve's refcounts on disk: the unused reserved
// clusters are leaks, nothing worse, every flushed write reads back, and
// `check -r leaks` gives them back.
TEST_P(SyncWriteTest, CrashLeaksAtMostTheReserve) {
  auto [cs, extended] = GetParam();
  Opened o = OpenCounted(cs, extended);
  ASSERT_TRUE(o.image);
  const auto data = Pattern(2, 4096);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(o.image->Write(uint64_t(i) * 5 * cs, data).ok());
    ASSERT_TRUE(o.image->Flush().ok());
  }
  // No Close(): the image is dropped as a crash would leave it.
  std::vector<uint8_t> disk(*o.mem->Size());
  ASSERT_TRUE(o.mem->ReadAt(0, disk).ok());
  auto crashed = io::NewMemoryStorage("crashed.qcow2");
  ASSERT_TRUE(crashed->WriteAt(0, disk).ok());
  auto check = Check(*crashed, RepairMode::kNone);
  ASSERT_TRUE(check.has_value()) << check.status().ToString();
  EXPECT_EQ(check->corruptions, 0u);
  const uint64_t reserve = Allocator::DefaultReserve(cs);
  EXPECT_GT(check->leaks, 0u);
  EXPECT_LE(check->leaks, reserve);
  auto repaired = Check(*crashed, RepairMode::kLeaks);
  ASSERT_TRUE(repaired.has_value()) << repaired.status().ToString();
  EXPECT_EQ(repaired->leaks_fixed, check->leaks);
  auto image = Image::Open(std::move(crashed), {});
  ASSERT_TRUE(image.has_value()) << image.status().ToString();
  std::vector<uint8_t> back(4096);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*image)->Read(uint64_t(i) * 5 * cs, back).ok());
    EXPECT_TRUE(back == data) << i;
  }
  ASSERT_TRUE(o.image->Close().ok());
}

INSTANTIATE_TEST_SUITE_P(Layouts, SyncWriteTest,
                         ::testing::Values(std::make_tuple(65536u, false),
                                           std::make_tuple(131072u, true)));

}  // namespace
}  // namespace thindisk::qcow2
