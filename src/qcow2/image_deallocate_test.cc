// Deallocate: an overlay's ranges become unallocated and read through to the
// backing file again; a crash at any step leaves each range reading as the
// overlay's old content or as the backing file, with leaks at most.
#include <gtest/gtest.h>

#include "io/faulty_storage.h"
#include "qcow2/check.h"
#include "qcow2/image_test_util.h"

namespace thindisk::qcow2 {
namespace {

using testing::BackedBy;
using testing::Pattern;

constexpr uint64_t kSize = 4 << 20;

struct Layout {
  uint32_t cluster;
  bool ext;
};

// Fills an overlay with data, zeros and subcluster pieces; returns the
// guest view afterwards.
std::vector<uint8_t> Populate(Image& img, const std::vector<uint8_t>& base, uint32_t cluster) {
  std::vector<uint8_t> view = base;
  auto write = [&](uint64_t off, uint64_t len, uint64_t seed) {
    auto data = Pattern(seed, len);
    ASSERT_TRUE(img.Write(off, data).ok());
    std::copy(data.begin(), data.end(), view.begin() + off);
  };
  write(0, cluster, 1);
  write(3 * uint64_t(cluster) + 4096, 8192, 2);
  write(kSize - cluster, cluster, 3);
  EXPECT_TRUE(img.WriteZeroes(8 * uint64_t(cluster), 2 * uint64_t(cluster), {}).ok());
  std::fill(view.begin() + 8 * cluster, view.begin() + 10 * cluster, 0);
  return view;
}

class DeallocateTest : public ::testing::TestWithParam<Layout> {};

TEST_P(DeallocateTest, WholeImageReadsThroughToBacking) {
  const Layout l = GetParam();
  auto base = Pattern(99, kSize);
  CreateOptions co;
  co.size = kSize;
  co.cluster_size = l.cluster;
  co.extended_l2 = l.ext;
  co.backing_file = "base";
  auto m = testing::CreateMem(co, BackedBy(base));
  ASSERT_TRUE(m.image);
  Populate(*m.image, base, l.cluster);
  ASSERT_TRUE(m.image->Deallocate(0, kSize).ok());
  testing::ExpectContent(*m.image, base, 0, kSize);
  auto e = m.image->GetStatus(0, kSize);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->length, kSize);
  EXPECT_EQ(e->depth, 1u);
  auto r = testing::Reopen(m, BackedBy(base));
  ASSERT_TRUE(r.image);
  testing::ExpectContent(*r.image, base, 0, kSize);
  ASSERT_TRUE(r.image->Close().ok());
  auto report = Check(*r.storage, RepairMode::kNone);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->corruptions, 0u);
  EXPECT_EQ(report->leaks, 0u);
  EXPECT_EQ(report->allocated_clusters, 0u);
}

TEST_P(DeallocateTest, PartRangeKeepsTheRest) {
  const Layout l = GetParam();
  auto base = Pattern(7, kSize);
  CreateOptions co;
  co.size = kSize;
  co.cluster_size = l.cluster;
  co.extended_l2 = l.ext;
  co.backing_file = "base";
  auto m = testing::CreateMem(co, BackedBy(base));
  ASSERT_TRUE(m.image);
  auto view = Populate(*m.image, base, l.cluster);
  // The first subcluster (or cluster) of the 4th cluster's written piece.
  uint64_t grain = l.ext ? l.cluster / 32 : l.cluster;
  uint64_t off = 3 * uint64_t(l.cluster);
  ASSERT_TRUE(m.image->Deallocate(off, grain).ok());
  std::copy(base.begin() + off, base.begin() + off + grain, view.begin() + off);
  testing::ExpectContent(*m.image, view, 0, kSize);
  EXPECT_EQ(m.image->Deallocate(1, grain).code(), Code::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Layouts, DeallocateTest,
                         ::testing::Values(Layout{65536, false}, Layout{131072, true},
                                           Layout{4096, false}));

// Clusters that follow each other on the host are punched at once (a RADOS
// pool then removes whole objects), and all their space comes back; clusters
// with live ones between them on the host are punched alone, and the live
// ones keep their data.
TEST(DeallocatePunchTest, HostRunsArePunchedAtOnce) {
  constexpr uint64_t kCluster = 65536;
  constexpr uint64_t kHalf = kSize / 2;
  auto base = Pattern(3, kSize);
  for (bool interleaved : {false, true}) {
    SCOPED_TRACE(interleaved ? "the first half interleaved with the second" : "in order");
    CreateOptions co;
    co.size = kSize;
    co.cluster_size = kCluster;
    co.extended_l2 = false;
    co.backing_file = "base";
    auto c = testing::CreateCounted(co, BackedBy(base));
    ASSERT_TRUE(c.image);
    io::FaultyStorage* storage = c.storage;
    Image& image = *c.image;
    auto data = Pattern(4, kSize);
    // Host clusters are taken in write order.
    for (uint64_t i = 0; i < kHalf / kCluster; ++i) {
      for (uint64_t off : {i * kCluster, kHalf + i * kCluster}) {
        if (!interleaved && off >= kHalf) continue;
        ASSERT_TRUE(image.Write(off, std::span(data).subspan(off, kCluster)).ok());
      }
    }
    if (!interleaved) {
      ASSERT_TRUE(image.Write(kHalf, std::span(data).subspan(kHalf)).ok());
    }
    ASSERT_TRUE(image.Flush().ok());
    const uint64_t full = *storage->AllocatedBytes();
    const uint64_t punches = storage->event_count(io::Event::kDiscardPunch);
    ASSERT_TRUE(image.Deallocate(0, kHalf).ok());
    const uint64_t taken = storage->event_count(io::Event::kDiscardPunch) - punches;
    if (interleaved) {
      EXPECT_EQ(taken, kHalf / kCluster);
    } else {
      // One run, or two when the L2 table lies between the first cluster and the rest.
      EXPECT_LE(taken, 2u);
    }
    EXPECT_LE(*storage->AllocatedBytes() + kHalf, full);
    std::vector<uint8_t> want(base.begin(), base.begin() + kHalf);
    want.insert(want.end(), data.begin() + kHalf, data.end());
    testing::ExpectContent(image, want, 0, kSize);
  }
}

// Power cut at every step of a deallocation of the whole overlay.
TEST(DeallocateCrashTest, EachRangeReadsOldOrBacking) {
  constexpr uint32_t kCluster = 65536;
  auto base = Pattern(5, kSize);
  for (bool ext : {false, true}) {
    SCOPED_TRACE(ext ? "extended L2" : "standard L2");
    auto mem = std::shared_ptr<io::Storage>(io::NewMemoryStorage("ov.qcow2"));
    CreateOptions co;
    co.size = kSize;
    co.cluster_size = kCluster;
    co.extended_l2 = ext;
    co.backing_file = "base";
    ASSERT_TRUE(Create(*mem, co).ok());
    std::vector<uint8_t> before;
    std::unique_ptr<io::MemoryStorage> populated;
    {
      auto img = Image::Open(static_cast<io::MemoryStorage&>(*mem).Clone(), BackedBy(base));
      ASSERT_TRUE(img.has_value());
      before = Populate(**img, base, kCluster);
      ASSERT_TRUE((*img)->Close().ok());
      populated = static_cast<io::MemoryStorage&>((*img)->storage()).Clone();
    }
    for (int ev = 0; ev < io::kEventCount; ++ev) {
      for (uint64_t nth = 1; nth <= 4; ++nth) {
        auto faulty_or = io::NewFaultyStorage(populated->Clone());
        ASSERT_TRUE(faulty_or.has_value());
        io::FaultyStorage* faulty = faulty_or->get();
        io::FaultyStorage::EventFault f;
        f.event = io::Event(ev);
        f.nth = nth;
        f.freeze = true;
        f.freeze_after_next = nth % 2 == 0;
        faulty->FailAtEvent(f);
        auto img = Image::Open(std::move(*faulty_or), BackedBy(base));
        ASSERT_TRUE(img.has_value());
        (void)(*img)->Deallocate(0, kSize);
        if (!faulty->event_fault_fired()) continue;
        SCOPED_TRACE(std::string("power cut at ") + io::EventName(io::Event(ev)) + " #" +
                     std::to_string(nth));
        for (auto mode : {io::PowerLossMode::kDropUnflushed, io::PowerLossMode::kTearLast,
                          io::PowerLossMode::kKeepRandomSubset}) {
          auto after = faulty->SimulatePowerLoss(mode, nth);
          ASSERT_TRUE(after.has_value());
          auto report = Check(**after, RepairMode::kNone);
          ASSERT_TRUE(report.has_value());
          EXPECT_EQ(report->corruptions, 0u);
          OpenOptions oo = BackedBy(base);
          oo.read_only = true;
          auto survivor = Image::Open(std::move(*after), oo);
          ASSERT_TRUE(survivor.has_value()) << survivor.status().ToString();
          std::vector<uint8_t> got(kSize);
          ASSERT_TRUE((*survivor)->Read(0, got).ok());
          for (uint64_t b = 0; b < kSize; b += 512) {
            bool old_ok = std::equal(got.begin() + b, got.begin() + b + 512, before.begin() + b);
            bool base_ok = std::equal(got.begin() + b, got.begin() + b + 512, base.begin() + b);
            ASSERT_TRUE(old_ok || base_ok) << "sector at " << b << " reads neither";
          }
        }
        (*img).reset();
      }
    }
  }
}

}  // namespace
}  // namespace thindisk::qcow2
