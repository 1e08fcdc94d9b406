// Resize: shrink refuses data, zeroes the kept tail, frees and truncates;
// grow after shrink reads zeros (never old bytes, never backing data); grow
// with preallocation maps host space without changing what is read.
#include <gtest/gtest.h>

#include "qcow2/check.h"
#include "qcow2/image_test_util.h"

namespace thindisk::qcow2 {
namespace {

using testing::BackedBy;
using testing::CreateMem;
using testing::ExpectContent;
using testing::MemImage;
using testing::Pattern;
using testing::Reopen;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

CreateOptions Opts(uint32_t cluster, bool extended, uint64_t size) {
  CreateOptions o;
  o.size = size;
  o.cluster_size = cluster;
  o.extended_l2 = extended;
  return o;
}

// Opts for a clone of a raw "base.raw" (open it with BackedBy).
CreateOptions CloneOpts(uint32_t cluster, bool extended, uint64_t size) {
  CreateOptions o = Opts(cluster, extended, size);
  o.backing_file = "base.raw";
  o.backing_format = "raw";
  return o;
}

void ExpectClean(io::MemoryStorage& storage) {
  auto report = Check(storage, RepairMode::kNone);
  ASSERT_TRUE(report.has_value()) << report.error().ToString();
  EXPECT_EQ(report->corruptions, 0u);
  EXPECT_EQ(report->leaks, 0u);
  for (const auto& m : report->messages) ADD_FAILURE() << m;
}

class ResizeTest : public ::testing::TestWithParam<std::tuple<uint32_t, bool>> {};

TEST_P(ResizeTest, ShrinkRefusesDataPastTheNewEnd) {
  auto [cluster, extended] = GetParam();
  MemImage m = CreateMem(Opts(cluster, extended, 4 * kMiB));
  auto data = Pattern(1, 4096);
  ASSERT_TRUE(m.image->Write(3 * kMiB + 8192, data).ok());
  Status s = m.image->Resize(2 * kMiB, false);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  s = m.image->Resize(2 * kMiB, true);
  ASSERT_EQ(s.code(), Code::kInvalidArgument);
  // The message names where the data starts.
  uint64_t cluster_start = (3 * kMiB + 8192) / cluster * cluster;
  char hex[32];
  snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(cluster_start));
  EXPECT_NE(s.message().find(hex), std::string::npos) << s.message();
  EXPECT_EQ(m.image->size(), 4 * kMiB);
  std::vector<uint8_t> got(4096);
  ASSERT_TRUE(m.image->Read(3 * kMiB + 8192, got).ok());
  EXPECT_EQ(got, data);
}

TEST_P(ResizeTest, ShrinkUnalignedThenGrowReadsZeros) {
  auto [cluster, extended] = GetParam();
  const uint64_t size = 8 * kMiB;
  MemImage m = CreateMem(Opts(cluster, extended, size));
  std::vector<uint8_t> model = Pattern(2, size);
  ASSERT_TRUE(m.image->Write(0, model).ok());
  // Cut 1.5 KiB into a cluster; the cut part was discarded first.
  const uint64_t new_size = 3 * kMiB + 1536;
  ASSERT_TRUE(m.image->Discard(new_size, size - new_size).ok());
  ASSERT_TRUE(m.image->Flush().ok());
  ASSERT_TRUE(m.image->Resize(new_size, true).ok());
  EXPECT_EQ(m.image->size(), new_size);
  ExpectContent(*m.image, model, 0, new_size);
  // Every cluster past the new end is free and the file was cut after the
  // last cluster in use. (With small clusters a refcount block, which sits
  // at the start of the host range it covers, stays in use and keeps the
  // end: unused refcount blocks are not freed yet.)
  auto file_size = m.storage->Size();
  ASSERT_TRUE(file_size.has_value());
  if (cluster >= 65536) {
    EXPECT_LT(*file_size, new_size + 16 * uint64_t(cluster) + 64 * kKiB);
  }
  MemImage r = Reopen(m);
  ExpectClean(*r.storage);
  ASSERT_TRUE(r.image->Resize(size, false).ok());
  std::fill(model.begin() + new_size, model.end(), 0);
  ExpectContent(*r.image, model, 0, size);
  MemImage r2 = Reopen(r);
  ExpectContent(*r2.image, model, 0, size);
  ExpectClean(*r2.storage);
}

TEST_P(ResizeTest, ShrinkZeroesTheKeptTailOfAllocatedZeros) {
  // The tail holds only zeros, written as data: shrinking is allowed and
  // the tail's host bytes stop being guest data.
  auto [cluster, extended] = GetParam();
  const uint64_t size = 2 * kMiB;
  MemImage m = CreateMem(Opts(cluster, extended, size));
  std::vector<uint8_t> model = Pattern(3, size);
  const uint64_t new_size = kMiB + 512;
  std::fill(model.begin() + new_size, model.end(), 0);
  // Zeros written as data fill the rest of the last kept cluster.
  const uint64_t tail_end = (new_size + cluster - 1) / cluster * cluster;
  ASSERT_TRUE(m.image->Write(0, std::span(model).first(tail_end)).ok());
  ASSERT_TRUE(m.image->Resize(new_size, true).ok());
  ASSERT_TRUE(m.image->Resize(size, false).ok());
  ExpectContent(*m.image, model, 0, size);
  MemImage r = Reopen(m);
  ExpectClean(*r.storage);
}

TEST_P(ResizeTest, ShrinkCloneHidesBackingWhenRegrown) {
  auto [cluster, extended] = GetParam();
  const uint64_t size = 4 * kMiB;
  auto base = Pattern(4, size);
  const OpenOptions oo = BackedBy(base);
  MemImage m = CreateMem(CloneOpts(cluster, extended, size), oo);
  std::vector<uint8_t> model = base;
  auto top = Pattern(5, 64 * kKiB);
  ASSERT_TRUE(m.image->Write(kMiB, top).ok());
  std::copy(top.begin(), top.end(), model.begin() + kMiB);
  ASSERT_TRUE(m.image->Resize(2 * kMiB + 4096, true).ok());
  ASSERT_TRUE(m.image->Resize(size, false).ok());
  std::fill(model.begin() + 2 * kMiB + 4096, model.end(), 0);
  ExpectContent(*m.image, model, 0, size);
  MemImage r = Reopen(m, oo);
  ExpectContent(*r.image, model, 0, size);
  ExpectClean(*r.storage);
}

TEST_P(ResizeTest, GrowPreallocatedGivesTheGrownRangeHostSpace) {
  auto [cluster, extended] = GetParam();
  const uint64_t size = kMiB + 512;  // the old end cuts a cluster
  const uint64_t new_size = 3 * kMiB;
  for (Preallocation mode : {Preallocation::kMetadata, Preallocation::kFalloc,
                             Preallocation::kFull}) {
    SCOPED_TRACE(int(mode));
    MemImage m = CreateMem(Opts(cluster, extended, size));
    std::vector<uint8_t> model(new_size, 0);
    auto data = Pattern(6, 8192);
    ASSERT_TRUE(m.image->Write(size - data.size(), data).ok());
    std::copy(data.begin(), data.end(), model.begin() + (size - data.size()));
    ASSERT_TRUE(m.image->Flush().ok());
    const uint64_t written_before = m.storage->bytes_written();
    std::string warning;
    Status s = m.image->GrowPreallocated(new_size, mode, &warning);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(m.image->size(), new_size);
    ExpectContent(*m.image, model, 0, new_size);
    // Only full (or falloc falling back, with a warning) writes the zeros.
    const uint64_t written = m.storage->bytes_written() - written_before;
    const uint64_t whole_grown = new_size - (size + cluster - 1) / cluster * cluster;
    if (mode == Preallocation::kFull || !warning.empty()) {
      EXPECT_GE(written, whole_grown);
    } else {
      EXPECT_LT(written, whole_grown / 2);
    }
    auto file_size = m.storage->Size();
    ASSERT_TRUE(file_size.has_value());
    EXPECT_GE(*file_size, whole_grown);

    MemImage r = Reopen(m);
    ExpectClean(*r.storage);
    ExpectContent(*r.image, model, 0, new_size);
    // The host clusters are in place: filling the grown range takes no
    // new host space.
    auto fill = Pattern(7, new_size - size);
    ASSERT_TRUE(r.image->Write(size, fill).ok());
    ASSERT_TRUE(r.image->Flush().ok());
    std::copy(fill.begin(), fill.end(), model.begin() + size);
    auto filled_size = r.storage->Size();
    ASSERT_TRUE(filled_size.has_value());
    EXPECT_EQ(*filled_size, *file_size);
    MemImage r2 = Reopen(r);
    ExpectContent(*r2.image, model, 0, new_size);
    ExpectClean(*r2.storage);
  }
}

TEST_P(ResizeTest, GrowPreallocatedCloneReadsZerosNotBacking) {
  auto [cluster, extended] = GetParam();
  const uint64_t size = 4 * kMiB;
  auto base = Pattern(8, size);
  const OpenOptions oo = BackedBy(base);
  MemImage m = CreateMem(CloneOpts(cluster, extended, size), oo);
  const uint64_t cut = kMiB + 4096;
  ASSERT_TRUE(m.image->Resize(cut, true).ok());
  ASSERT_TRUE(m.image->GrowPreallocated(size, Preallocation::kMetadata, nullptr).ok());
  std::vector<uint8_t> model = base;
  std::fill(model.begin() + cut, model.end(), 0);
  ExpectContent(*m.image, model, 0, size);
  MemImage r = Reopen(m, oo);
  ExpectContent(*r.image, model, 0, size);
  ExpectClean(*r.storage);
}

TEST(ResizePreallocationTest, ShrinkingIsRefused) {
  MemImage m = CreateMem(Opts(65536, false, 2 * kMiB));
  Status s = m.image->GrowPreallocated(kMiB, Preallocation::kMetadata, nullptr);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("shrinking"), std::string::npos) << s.message();
  EXPECT_EQ(m.image->size(), 2 * kMiB);
  // Off is a plain grow.
  ASSERT_TRUE(m.image->GrowPreallocated(3 * kMiB, Preallocation::kOff, nullptr).ok());
  EXPECT_EQ(m.image->size(), 3 * kMiB);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ResizeTest,
                         ::testing::Values(std::make_tuple(65536u, false),
                                           std::make_tuple(131072u, true),
                                           std::make_tuple(4096u, false),
                                           std::make_tuple(512u, false)));

}  // namespace
}  // namespace thindisk::qcow2
