// L2 tables are cached in 4 KiB slices: a lookup in a cold table reads
// the slice that holds its entry, not the whole cluster; the cache's bytes
// hold slices of more tables than whole tables would fit; a new table still
// reaches the disk whole, in one write.
#include <gtest/gtest.h>

#include <mutex>
#include <utility>
#include <vector>

#include "io/forwarding_storage.h"
#include "qcow2/check.h"
#include "qcow2/image_test_util.h"
#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

using testing::Pattern;

constexpr uint64_t kSlice = 4096;

// Records every read and every announced step with the size of its write.
class IoLog : public io::ForwardingStorage {
 public:
  explicit IoLog(std::unique_ptr<io::Storage> inner)
      : ForwardingStorage(std::move(inner)) {}
  Status ReadAt(uint64_t o, std::span<uint8_t> b) override {
    {
      std::lock_guard lock(mu_);
      reads_.push_back({o, b.size()});
    }
    return inner().ReadAt(o, b);
  }
  void Announce(io::Event e) override {
    std::lock_guard lock(mu_);
    last_ = e;
  }
  Status WriteAt(uint64_t o, std::span<const uint8_t> b) override {
    {
      std::lock_guard lock(mu_);
      writes_.push_back({last_, b.size()});
    }
    return inner().WriteAt(o, b);
  }
  // The reads since the last call that lie in [from, from + len).
  std::vector<std::pair<uint64_t, uint64_t>> TakeReadsIn(uint64_t from, uint64_t len) {
    std::lock_guard lock(mu_);
    std::vector<std::pair<uint64_t, uint64_t>> in;
    for (const auto& r : reads_) {
      if (r.first >= from && r.first < from + len) in.push_back(r);
    }
    reads_.clear();
    return in;
  }
  // The writes announced as `e` since the last call, by size.
  std::vector<uint64_t> TakeWrites(io::Event e) {
    std::lock_guard lock(mu_);
    std::vector<uint64_t> sizes;
    for (const auto& [event, size] : writes_) {
      if (event == e) sizes.push_back(size);
    }
    writes_.clear();
    return sizes;
  }

 private:
  std::mutex mu_;
  io::Event last_ = io::Event::kDataWrite;
  std::vector<std::pair<uint64_t, uint64_t>> reads_;
  std::vector<std::pair<io::Event, uint64_t>> writes_;
};

class L2SliceTest : public ::testing::TestWithParam<std::tuple<uint32_t, bool>> {
 protected:
  uint64_t cs() const { return std::get<0>(GetParam()); }
  bool extended() const { return std::get<1>(GetParam()); }
  uint64_t entries() const { return cs() / (extended() ? 16 : 8); }
  uint64_t per_slice() const { return kSlice / (extended() ? 16 : 8); }

  // An image of `tables` L2 tables' span with 4 KiB written at each guest
  // cluster of `clusters`, closed and opened again through an IoLog with
  // `cache_bytes` of metadata cache.
  void MakeAndReopen(uint64_t tables, const std::vector<uint64_t>& clusters,
                     uint64_t cache_bytes) {
    CreateOptions co;
    co.size = tables * entries() * cs();
    co.cluster_size = uint32_t(cs());
    co.extended_l2 = extended();
    testing::MemImage m = testing::CreateMem(co);
    ASSERT_TRUE(m.image);
    for (uint64_t gc : clusters)
      ASSERT_TRUE(m.image->Write(gc * cs(), Pattern(gc, 4096)).ok());
    ASSERT_TRUE(m.image->Close().ok());
    auto log = std::make_unique<IoLog>(m.storage->Clone());
    log_ = log.get();
    OpenOptions oo;
    oo.cache_bytes = cache_bytes;
    auto img = Image::Open(std::move(log), oo);
    ASSERT_TRUE(img.has_value()) << img.status().ToString();
    image_ = std::move(*img);
  }
  uint64_t L2TableOf(uint64_t gc) {
    uint8_t raw[8];
    EXPECT_TRUE(image_->storage()
                    .ReadAt(image_->header().l1_table_offset + gc / entries() * 8, raw)
                    .ok());
    return L1Offset(LoadBe64(raw));
  }
  void ExpectReads(uint64_t gc) {
    std::vector<uint8_t> back(4096);
    ASSERT_TRUE(image_->Read(gc * cs(), back).ok());
    EXPECT_TRUE(back == Pattern(gc, 4096)) << "guest cluster " << gc;
  }

  IoLog* log_ = nullptr;
  std::unique_ptr<Image> image_;
};

// A read in a cold table reads the 4 KiB slice with the entry, at its
// place in the table; another entry of the same slice reads nothing more.
TEST_P(L2SliceTest, AColdLookupReadsTheSliceOfItsEntry) {
  const uint64_t last = entries() - 1;
  const std::vector<uint64_t> clusters = {0, 1, per_slice() + 3, last};
  MakeAndReopen(1, clusters, 1 << 20);
  const uint64_t l2 = L2TableOf(0);
  ASSERT_NE(l2, 0u);
  log_->TakeReadsIn(l2, cs());

  using Reads = std::vector<std::pair<uint64_t, uint64_t>>;
  ExpectReads(per_slice() + 3);
  EXPECT_EQ(log_->TakeReadsIn(l2, cs()), (Reads{{l2 + kSlice, kSlice}}));
  ExpectReads(0);
  EXPECT_EQ(log_->TakeReadsIn(l2, cs()), (Reads{{l2, kSlice}}));
  ExpectReads(1);
  EXPECT_EQ(log_->TakeReadsIn(l2, cs()), Reads{});
  ExpectReads(last);
  EXPECT_EQ(log_->TakeReadsIn(l2, cs()), (Reads{{l2 + cs() - kSlice, kSlice}}));
}

// A cache of eight clusters' bytes (seven of them for L2) holds a slice of
// each of 40 tables: a second pass over one entry of each reads no table.
// Whole tables, it held seven.
TEST_P(L2SliceTest, TheCacheHoldsSlicesOfManyMoreTables) {
  constexpr uint64_t kTables = 40;
  std::vector<uint64_t> clusters;
  for (uint64_t t = 0; t < kTables; ++t) clusters.push_back(t * entries() + t % 3);
  MakeAndReopen(kTables, clusters, 8 * cs());
  std::vector<uint64_t> tables;
  for (uint64_t gc : clusters) tables.push_back(L2TableOf(gc));
  auto table_reads = [&] {
    size_t n = 0;
    for (const auto& [offset, length] : log_->TakeReadsIn(0, ~uint64_t{0} >> 1)) {
      for (uint64_t l2 : tables) n += offset >= l2 && offset < l2 + cs();
    }
    return n;
  };
  table_reads();
  for (uint64_t gc : clusters) ExpectReads(gc);
  EXPECT_EQ(table_reads(), kTables) << "the first pass reads one slice of each table";
  for (uint64_t gc : clusters) ExpectReads(gc);
  EXPECT_EQ(table_reads(), 0u) << "the second pass finds every slice in memory";
}

// The first write into a table's span makes the table: every slice of it
// reaches the disk in one write of the whole cluster, announced once; a
// later change writes a sector of one slice. check finds nothing wrong.
TEST_P(L2SliceTest, ANewTableIsOneWriteOfTheWholeCluster) {
  CreateOptions co;
  co.size = 4 * entries() * cs();
  co.cluster_size = uint32_t(cs());
  co.extended_l2 = extended();
  auto o = testing::CreateWrapped<IoLog>(co);
  ASSERT_TRUE(o.image);
  const uint64_t gc = 2 * entries() + per_slice() * 2 + 5;
  ASSERT_TRUE(o.image->Write(gc * cs(), Pattern(gc, 4096)).ok());
  ASSERT_TRUE(o.image->Flush().ok());
  EXPECT_EQ(o.wrapper->TakeWrites(io::Event::kL2Alloc), std::vector<uint64_t>{cs()});
  ASSERT_TRUE(o.image->Write((gc + per_slice()) * cs(), Pattern(gc + 1, 4096)).ok());
  ASSERT_TRUE(o.image->Flush().ok());
  EXPECT_EQ(o.wrapper->TakeWrites(io::Event::kL2Update), std::vector<uint64_t>{512});
  ASSERT_TRUE(o.image->Close().ok());
  auto check = Check(*o.mem, RepairMode::kNone);
  ASSERT_TRUE(check.has_value()) << check.status().ToString();
  EXPECT_EQ(check->corruptions, 0u);
  EXPECT_EQ(check->leaks, 0u);
}

INSTANTIATE_TEST_SUITE_P(Layouts, L2SliceTest,
                         ::testing::Values(std::make_tuple(65536u, false),
                                           std::make_tuple(131072u, true)));

}  // namespace
}  // namespace thindisk::qcow2
