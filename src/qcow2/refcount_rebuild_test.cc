// Refcount width changes: data and allocation survive, the image checks
// clean at every width, refcounts that do not fit are refused, and a power
// cut at any step leaves a consistent image of the old or the new width.
#include "qcow2/refcount_rebuild.h"

#include <gtest/gtest.h>

#include "io/faulty_storage.h"
#include "qcow2/allocator.h"
#include "qcow2/check.h"
#include "qcow2/header_update.h"
#include "qcow2/image_test_util.h"

namespace thindisk::qcow2 {
namespace {

using testing::Pattern;

constexpr uint64_t kSize = 8 << 20;

// An image with some data; returns its storage (closed) and guest content.
std::unique_ptr<io::MemoryStorage> Populated(std::vector<uint8_t>* content) {
  CreateOptions co;
  co.size = kSize;
  co.cluster_size = 4096;  // many clusters, several refcount blocks at 1 bit
  co.extended_l2 = false;
  auto m = testing::CreateMem(co);
  content->assign(kSize, 0);
  for (uint64_t i = 0; i < 40; ++i) {
    uint64_t off = (i * 7919 * 4096) % (kSize - 8192);
    auto data = Pattern(i, 6000);
    EXPECT_TRUE(m.image->Write(off, data).ok());
    std::copy(data.begin(), data.end(), content->begin() + off);
  }
  EXPECT_TRUE(m.image->Close().ok());
  return m.storage->Clone();
}

void ExpectCleanWithContent(std::unique_ptr<io::MemoryStorage> storage,
                            const std::vector<uint8_t>& content) {
  auto report = Check(*storage, RepairMode::kNone);
  ASSERT_TRUE(report.has_value()) << report.status().ToString();
  EXPECT_EQ(report->corruptions, 0u);
  OpenOptions ro;
  ro.read_only = true;
  auto img = Image::Open(std::move(storage), ro);
  ASSERT_TRUE(img.has_value()) << img.status().ToString();
  testing::ExpectContent(**img, content, 0, kSize);
}

TEST(RefcountRebuildTest, EveryWidthKeepsDataAndChecksClean) {
  std::vector<uint8_t> content;
  auto storage = Populated(&content);
  for (uint32_t bits : {1u, 64u, 8u, 16u, 2u, 32u}) {
    SCOPED_TRACE(bits);
    ASSERT_TRUE(ChangeRefcountWidth(*storage, bits).ok());
    auto hc = ReadHeaderCluster(*storage);
    ASSERT_TRUE(hc.has_value());
    EXPECT_EQ(hc->header.refcount_bits(), bits);
    auto report = Check(*storage, RepairMode::kNone);
    ASSERT_TRUE(report.has_value());
    EXPECT_EQ(report->corruptions, 0u);
    EXPECT_EQ(report->leaks, 0u);
    ExpectCleanWithContent(storage->Clone(), content);
  }
  // And it takes writes afterwards.
  auto img = Image::Open(storage->Clone(), {});
  ASSERT_TRUE(img.has_value());
  EXPECT_TRUE((*img)->Write(0, Pattern(1234, 65536)).ok());
  EXPECT_TRUE((*img)->Close().ok());
}

TEST(RefcountRebuildTest, RefusesBadWidths) {
  std::vector<uint8_t> content;
  auto storage = Populated(&content);
  EXPECT_EQ(ChangeRefcountWidth(*storage, 3).code(), Code::kInvalidArgument);
  EXPECT_EQ(ChangeRefcountWidth(*storage, 128).code(), Code::kInvalidArgument);
  // A refcount of 2 (a cluster shared twice) does not fit one bit.
  ASSERT_TRUE(ChangeRefcountWidth(*storage, 16).ok());
  auto img = Image::Open(storage->Clone(), {});
  ASSERT_TRUE(img.has_value());
  ASSERT_TRUE((*img)->Close().ok());
  // Raise one cluster's refcount by hand through the allocator.
  auto hc = ReadHeaderCluster(*storage);
  ASSERT_TRUE(hc.has_value());
  auto size = storage->Size();
  ASSERT_TRUE(size.has_value());
  {
    auto alloc = Allocator::Open(*storage, hc->header, *size, 4, [] { return Status::Ok(); });
    ASSERT_TRUE(alloc.has_value());
    ASSERT_TRUE((*alloc)->AddRefcount(hc->header.l1_table_offset, 1, 1).ok());
    ASSERT_TRUE((*alloc)->WriteBlocks().ok());
  }
  Status s = ChangeRefcountWidth(*storage, 1);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("refcount 2"), std::string::npos) << s.message();
}

TEST(RefcountRebuildTest, PowerCutAtAnyStepLeavesAConsistentImage) {
  std::vector<uint8_t> content;
  auto storage = Populated(&content);
  for (io::Event ev : {io::Event::kRefblockAlloc, io::Event::kReftableGrow,
                       io::Event::kHeaderUpdate, io::Event::kDiscardPunch}) {
    for (uint64_t nth : {1, 2, 5}) {
      for (bool after_write : {false, true}) {
        auto faulty = io::NewFaultyStorage(storage->Clone());
        ASSERT_TRUE(faulty.has_value());
        io::FaultyStorage::EventFault f;
        f.event = ev;
        f.nth = nth;
        f.freeze = true;
        f.freeze_after_next = after_write;
        (*faulty)->FailAtEvent(f);
        (void)ChangeRefcountWidth(**faulty, 1);
        if (!(*faulty)->event_fault_fired()) continue;
        SCOPED_TRACE(std::string(io::EventName(ev)) + " #" + std::to_string(nth));
        for (auto mode : {io::PowerLossMode::kDropUnflushed, io::PowerLossMode::kTearLast,
                          io::PowerLossMode::kKeepRandomSubset}) {
          auto after = (*faulty)->SimulatePowerLoss(mode, nth);
          ASSERT_TRUE(after.has_value());
          ExpectCleanWithContent(std::move(*after), content);
        }
      }
    }
  }
}

}  // namespace
}  // namespace thindisk::qcow2
