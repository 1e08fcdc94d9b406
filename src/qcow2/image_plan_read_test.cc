// PlanRead (block::ReadPlan): the plan of a range, carried out by reading
// its pieces' host ranges, gives what Read gives, on every layout (plain
// clusters, subclusters in each state, zero clusters, a raw backing file
// and the zeros past its end); what only Read can do is refused; and a
// live plan holds off the freeing of the clusters it names.
#include <atomic>
#include <chrono>
#include <future>
#include <random>
#include <thread>
#include <tuple>

#include "block/forwarding_device.h"
#include "qcow2/image_test_util.h"
#include "qcow2/reader_epochs.h"
#include "raw/raw_image.h"

namespace thindisk::qcow2 {
namespace {

using testing::Pattern;

// Carries out `plan` for a buffer of `length` bytes, as the NBD server
// does: each piece read from its storage (ReadAt, which ReadFd's pread
// equals) or zeroed. Checks the pieces cover the buffer in order.
std::vector<uint8_t> CarryOut(const block::ReadPlan& plan, uint64_t length) {
  std::vector<uint8_t> out(length, 0xee);
  uint64_t next = 0;
  for (const block::ReadPiece& p : plan.pieces) {
    EXPECT_EQ(p.buf_offset, next) << "pieces leave a gap or overlap";
    EXPECT_GT(p.length, 0u);
    std::span<uint8_t> dst(out.data() + p.buf_offset, p.length);
    if (p.storage == nullptr) {
      std::fill(dst.begin(), dst.end(), 0);
    } else {
      Status s = p.storage->ReadAt(p.host_offset, dst);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    next = p.buf_offset + p.length;
  }
  EXPECT_EQ(next, length) << "the pieces do not cover the range";
  return out;
}

constexpr uint64_t kSize = 8 << 20;
constexpr uint64_t kBackingSize = 6 << 20;  // shorter: the rest reads as zeros

// A qcow2 image over a raw backing file of kBackingSize bytes, written at
// random: data, zeroes (with and without unmap) and discards, in pieces
// that split clusters into subclusters.
class PlanReadTest : public ::testing::TestWithParam<std::tuple<uint32_t, bool>> {
 protected:
  void SetUp() override {
    auto base = io::NewMemoryStorage("base.raw");
    ASSERT_TRUE(base->WriteAt(0, Pattern(7, kBackingSize)).ok());
    base_storage_ = base.get();
    auto raw = raw::OpenRaw(std::move(base), /*read_only=*/true, "base.raw");
    ASSERT_TRUE(raw.has_value());
    std::shared_ptr<block::Device> backing = std::move(*raw);
    CreateOptions co;
    co.size = kSize;
    co.cluster_size = std::get<0>(GetParam());
    co.extended_l2 = std::get<1>(GetParam());
    co.backing_file = "base.raw";
    co.backing_format = "raw";
    OpenOptions oo;
    oo.open_backing = [backing](
                          const std::string&,
                          const std::string&) -> Result<std::unique_ptr<block::Device>> {
      // A view sharing the one raw device, so the test can keep it.
      struct Shared final : block::ForwardingDevice {
        using ForwardingDevice::ForwardingDevice;
        Result<block::ReadPlan> PlanRead(uint64_t offset, uint64_t length) override {
          return inner().PlanRead(offset, length);
        }
      };
      return std::unique_ptr<block::Device>(std::make_unique<Shared>(backing));
    };
    m_ = testing::CreateMem(co, oo);
    ASSERT_TRUE(m_.image);
    std::mt19937_64 rng(std::get<0>(GetParam()) + std::get<1>(GetParam()));
    for (int i = 0; i < 60; ++i) {
      const uint64_t len = 512 * (1 + rng() % 300);
      const uint64_t off = 512 * (rng() % ((kSize - len) / 512));
      Status s;
      switch (rng() % 5) {
        case 0:
        case 1:
          s = m_.image->Write(off, Pattern(100 + i, len));
          break;
        case 2:
          s = m_.image->WriteZeroes(off, len, {.may_unmap = false});
          break;
        case 3:
          s = m_.image->WriteZeroes(off, len, {.may_unmap = true});
          break;
        default:
          s = m_.image->Discard(off, len);
      }
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }

  io::MemoryStorage* base_storage_ = nullptr;
  testing::MemImage m_;
};

TEST_P(PlanReadTest, CarriedOutPlansReadWhatReadReads) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 300; ++i) {
    const uint64_t len = i == 0 ? kSize : 1 + rng() % (3 << 20);
    const uint64_t off = i == 0 ? 0 : rng() % (kSize - len + 1);
    auto plan = m_.image->PlanRead(off, len);
    ASSERT_TRUE(plan.has_value()) << plan.status().ToString();
    std::vector<uint8_t> want(len);
    ASSERT_TRUE(m_.image->Read(off, want).ok());
    ASSERT_EQ(CarryOut(*plan, len), want) << "range " << off << "+" << len;
    for (const block::ReadPiece& p : plan->pieces) {
      EXPECT_TRUE(p.storage == nullptr || p.storage == m_.storage ||
                  p.storage == base_storage_);
    }
  }
  // Neighbouring pieces are joined: the whole image in one plan has far
  // fewer pieces than clusters.
  auto whole = m_.image->PlanRead(0, kSize);
  ASSERT_TRUE(whole.has_value());
  for (size_t i = 1; i < whole->pieces.size(); ++i) {
    const block::ReadPiece& a = whole->pieces[i - 1];
    const block::ReadPiece& b = whole->pieces[i];
    EXPECT_FALSE(a.storage == b.storage &&
                 (a.storage == nullptr || a.host_offset + a.length == b.host_offset))
        << "pieces " << i - 1 << " and " << i << " could be one";
  }
}

TEST_P(PlanReadTest, RangesPastTheEndAreRefused) {
  auto past = m_.image->PlanRead(kSize - 512, 1024);
  ASSERT_FALSE(past.has_value());
  EXPECT_EQ(past.error().code(), Code::kOutOfRange);
  auto empty = m_.image->PlanRead(kSize, 0);
  ASSERT_TRUE(empty.has_value());
  EXPECT_TRUE(empty->pieces.empty());
}

INSTANTIATE_TEST_SUITE_P(Layouts, PlanReadTest,
                         ::testing::Combine(::testing::Values(65536u, 131072u),
                                            ::testing::Values(false, true)));

TEST(PlanReadRefusalTest, CompressedClustersAndPlanlessBackingFilesNeedRead) {
  CreateOptions co;
  co.size = 4 << 20;
  co.cluster_size = 65536;
  auto m = testing::CreateMem(co);
  ASSERT_TRUE(m.image);
  ASSERT_TRUE(m.image->WriteCompressed(65536, std::vector<uint8_t>(65536, 0x5a)).ok());
  ASSERT_TRUE(m.image->Write(0, Pattern(1, 65536)).ok());
  EXPECT_TRUE(m.image->PlanRead(0, 65536).has_value());
  auto compressed = m.image->PlanRead(60000, 10000);
  ASSERT_FALSE(compressed.has_value());
  EXPECT_EQ(compressed.error().code(), Code::kNotSupported);

  // A backing device without plans (the test's FakeDevice): refused only
  // where a piece comes from it.
  co.backing_file = "fake";
  auto clone = testing::CreateMem(co, testing::BackedBy(Pattern(3, 4 << 20)));
  ASSERT_TRUE(clone.image);
  ASSERT_TRUE(clone.image->Write(0, Pattern(4, 65536)).ok());
  EXPECT_TRUE(clone.image->PlanRead(0, 65536).has_value());
  auto below = clone.image->PlanRead(0, 65537);
  ASSERT_FALSE(below.has_value());
  EXPECT_EQ(below.error().code(), Code::kNotSupported);
}

// A live plan keeps its clusters from reuse. A discard punches them at
// once (the plan then reads zeros, as a Read racing the discard may) but
// frees them only in the next flush, after every reader that may still use
// the old mapping: that flush waits for the plan, so no other guest range
// can be written into those clusters while the plan may read them.
TEST(PlanReadPinTest, ALivePlanHoldsOffTheFreeingOfItsClusters) {
  CreateOptions co;
  co.size = 4 << 20;
  co.cluster_size = 65536;
  co.extended_l2 = false;
  auto m = testing::CreateMem(co);
  ASSERT_TRUE(m.image);
  const std::vector<uint8_t> data = Pattern(9, 4 * 65536);
  ASSERT_TRUE(m.image->Write(0, data).ok());
  ASSERT_TRUE(m.image->Flush().ok());
  auto plan = std::make_unique<block::ReadPlan>();
  {
    auto p = m.image->PlanRead(0, data.size());
    ASSERT_TRUE(p.has_value());
    *plan = std::move(*p);
  }
  EXPECT_EQ(CarryOut(*plan, data.size()), data);
  ASSERT_TRUE(m.image->Discard(0, data.size()).ok());
  std::atomic<bool> flushed{false};
  auto flush = std::async(std::launch::async, [&] {
    Status s = m.image->Flush();
    flushed = true;
    return s;
  });
  EXPECT_EQ(flush.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "the flush freed clusters a live plan names";
  EXPECT_FALSE(flushed.load());
  // Reads and writes elsewhere go on meanwhile; the writes cannot take the
  // planned clusters (they are not free yet).
  const std::vector<uint8_t> other = Pattern(10, 65536);
  ASSERT_TRUE(m.image->Write(2 << 20, other).ok());
  for (const block::ReadPiece& p : plan->pieces) {
    auto mine = m.image->PlanRead(2 << 20, other.size());
    ASSERT_TRUE(mine.has_value());
    for (const block::ReadPiece& q : mine->pieces) {
      if (q.storage == nullptr || p.storage == nullptr) continue;
      EXPECT_TRUE(q.host_offset >= p.host_offset + p.length ||
                  q.host_offset + q.length <= p.host_offset)
          << "a new write took a cluster a live plan names";
    }
  }
  EXPECT_EQ(CarryOut(*plan, data.size()), std::vector<uint8_t>(data.size(), 0))
      << "the discard punched the planned clusters: zeros, never other bytes";
  plan.reset();
  ASSERT_EQ(flush.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_TRUE(flush.get().ok());
  std::vector<uint8_t> back(other.size());
  ASSERT_TRUE(m.image->Read(2 << 20, back).ok());
  EXPECT_EQ(back, other);
}

// Readers that keep coming do not hold a barrier off: each new plan counts
// in the epoch after the barrier's.
TEST(ReaderEpochsTest, NewReadersDoNotStarveTheBarrier) {
  ReaderEpochs epochs;
  const unsigned first = epochs.Enter();
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    for (int i = 0; i < 200000 && !stop.load(); ++i) epochs.Leave(epochs.Enter());
  });
  auto barrier = std::async(std::launch::async, [&] { epochs.WaitForEarlier(); });
  EXPECT_EQ(barrier.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout)
      << "the barrier passed a reader that entered before it";
  epochs.Leave(first);
  EXPECT_EQ(barrier.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  stop = true;
  churn.join();
  EXPECT_EQ(epochs.active(), 0u);
}

}  // namespace
}  // namespace thindisk::qcow2
