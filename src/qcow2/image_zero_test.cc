// Write-zeroes, discard, no stale bytes, block status, backing chains.
#include "qcow2/image_test_util.h"

namespace thindisk::qcow2 {
namespace {

using testing::CreateMem;
using testing::FakeDevice;
using testing::MemImage;
using testing::Pattern;
using testing::Reopen;

std::vector<uint8_t> Zeros(size_t n) { return std::vector<uint8_t>(n, 0); }

std::vector<uint8_t> ReadAll(Image& img, uint64_t off, uint64_t len) {
  std::vector<uint8_t> v(len);
  Status s = img.Read(off, v);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return v;
}

CreateOptions Opts(uint32_t cluster, bool ext, uint32_t version = 3, uint64_t size = 64 << 20) {
  CreateOptions o;
  o.size = size;
  o.cluster_size = cluster;
  o.extended_l2 = ext;
  o.version = version;
  if (version == 2) o.compression_type = CompressionType::kZlib;
  return o;
}

class ZeroLayoutTest : public ::testing::TestWithParam<std::tuple<uint32_t, bool, uint32_t>> {
 protected:
  CreateOptions O(uint64_t size = 64 << 20) {
    auto [c, e, v] = GetParam();
    return Opts(c, e, v, size);
  }
};

TEST_P(ZeroLayoutTest, DiscardThenReadGivesZeros) {
  auto m = CreateMem(O());
  ASSERT_TRUE(m.image);
  uint64_t cs = m.image->info().cluster_size;
  auto data = Pattern(1, 4 * cs);
  ASSERT_TRUE(m.image->Write(cs, data).ok());
  ASSERT_TRUE(m.image->Flush().ok());
  // Whole clusters, a partial piece, and an unaligned tail.
  ASSERT_TRUE(m.image->Discard(cs, cs).ok());
  ASSERT_TRUE(m.image->Discard(2 * cs + 100, 1000).ok());
  ASSERT_TRUE(m.image->Discard(4 * cs - 10, cs + 10).ok());
  std::vector<uint8_t> want = data;
  std::fill(want.begin(), want.begin() + cs, 0);
  std::fill(want.begin() + cs + 100, want.begin() + cs + 1100, 0);
  std::fill(want.end() - cs - 10, want.end(), 0);
  EXPECT_EQ(ReadAll(*m.image, cs, 4 * cs), want);
  ASSERT_TRUE(m.image->Flush().ok());
  auto r = Reopen(m);
  ASSERT_TRUE(r.image);
  EXPECT_EQ(ReadAll(*r.image, cs, 4 * cs), want);
}

TEST_P(ZeroLayoutTest, ReusedClusterNeverExposesOldBytes) {
  auto m = CreateMem(O());
  ASSERT_TRUE(m.image);
  uint64_t cs = m.image->info().cluster_size;
  ASSERT_TRUE(m.image->Write(0, Pattern(2, cs)).ok());
  auto st = m.image->GetStatus(0, cs);
  ASSERT_TRUE(st.has_value());
  ASSERT_TRUE(st->has_host_offset);
  uint64_t host = st->host_offset;
  ASSERT_TRUE(m.image->Discard(0, cs).ok());
  // Two flushes: the first writes the mapping change and applies the free,
  // the second writes the lowered refcount.
  ASSERT_TRUE(m.image->Flush().ok());
  ASSERT_TRUE(m.image->Flush().ok());
  // Poison the freed host cluster behind the engine's back.
  ASSERT_TRUE(m.storage->WriteAt(host, std::vector<uint8_t>(cs, 0xAA)).ok());
  // A small write elsewhere must get that cluster back, and show zeros
  // (not 0xAA) everywhere it did not write.
  auto small = Pattern(3, 512);
  ASSERT_TRUE(m.image->Write(5 * cs + 1024, small).ok());
  auto st2 = m.image->GetStatus(5 * cs + 1024, 512);
  ASSERT_TRUE(st2.has_value());
  ASSERT_TRUE(st2->has_host_offset);
  EXPECT_EQ(st2->host_offset - 1024, host) << "freed cluster was not reused";
  std::vector<uint8_t> want(cs, 0);
  std::copy(small.begin(), small.end(), want.begin() + 1024);
  EXPECT_EQ(ReadAll(*m.image, 5 * cs, cs), want);
  auto r = Reopen(m);
  ASSERT_TRUE(r.image);
  EXPECT_EQ(ReadAll(*r.image, 5 * cs, cs), want);
}

TEST_P(ZeroLayoutTest, WriteZeroesReadsZerosAndPersists) {
  auto m = CreateMem(O());
  ASSERT_TRUE(m.image);
  uint64_t cs = m.image->info().cluster_size;
  auto data = Pattern(4, 3 * cs);
  ASSERT_TRUE(m.image->Write(0, data).ok());
  block::ZeroFlags keep;  // no unmap
  ASSERT_TRUE(m.image->WriteZeroes(cs, cs, keep).ok());
  ASSERT_TRUE(m.image->WriteZeroes(100, 200, keep).ok());
  std::fill(data.begin() + cs, data.begin() + 2 * cs, 0);
  std::fill(data.begin() + 100, data.begin() + 300, 0);
  EXPECT_EQ(ReadAll(*m.image, 0, 3 * cs), data);
  auto r = Reopen(m);
  ASSERT_TRUE(r.image);
  EXPECT_EQ(ReadAll(*r.image, 0, 3 * cs), data);
  // Writing into a zeroed cluster again works.
  auto again = Pattern(5, 700);
  ASSERT_TRUE(r.image->Write(cs + 50, again).ok());
  std::copy(again.begin(), again.end(), data.begin() + cs + 50);
  EXPECT_EQ(ReadAll(*r.image, 0, 3 * cs), data);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ZeroLayoutTest,
                         ::testing::Values(std::make_tuple(65536u, false, 3u),
                                           std::make_tuple(65536u, true, 3u),
                                           std::make_tuple(131072u, true, 3u),
                                           std::make_tuple(4096u, false, 3u),
                                           std::make_tuple(65536u, false, 2u)));

TEST(ImageZeroTest, WholeSubclusterZeroesWriteNoData) {
  auto m = CreateMem(Opts(131072, true));
  ASSERT_TRUE(m.image);
  ASSERT_TRUE(m.image->Write(0, Pattern(1, 4 << 20)).ok());
  ASSERT_TRUE(m.image->Flush().ok());
  uint64_t before = m.storage->bytes_written();
  // 4 KiB subclusters: aligned ranges, inside and across clusters.
  ASSERT_TRUE(m.image->WriteZeroes(8192, 16384, {}).ok());
  ASSERT_TRUE(m.image->WriteZeroes(131072 - 4096, 12288, {}).ok());
  ASSERT_TRUE(m.image->WriteZeroes(1 << 20, 1 << 20, {}).ok());
  EXPECT_EQ(m.storage->bytes_written(), before);
  EXPECT_EQ(ReadAll(*m.image, 8192, 16384), Zeros(16384));
  EXPECT_EQ(ReadAll(*m.image, 1 << 20, 1 << 20), Zeros(1 << 20));
  block::ZeroFlags fast;
  fast.fast_only = true;
  EXPECT_EQ(m.image->WriteZeroes(100, 1000, fast).code(), Code::kNotSupported);
  EXPECT_TRUE(m.image->WriteZeroes(3 << 20, 4096, fast).ok());
}

TEST(ImageZeroTest, DiscardPunchesHostSpace) {
  auto m = CreateMem(Opts(65536, false));
  ASSERT_TRUE(m.image);
  ASSERT_TRUE(m.image->Write(0, Pattern(1, 8 << 20)).ok());
  ASSERT_TRUE(m.image->Flush().ok());
  uint64_t full = *m.storage->AllocatedBytes();
  ASSERT_TRUE(m.image->Discard(0, 8 << 20).ok());
  ASSERT_TRUE(m.image->Flush().ok());
  EXPECT_LE(*m.storage->AllocatedBytes() + (7 << 20), full);
}

// Discards clusters written in `order` (guest cluster indexes, 64 KiB
// each), then writes new data over them: how many punches the discard took.
uint64_t DiscardPunches(const std::vector<uint64_t>& order) {
  constexpr uint64_t kCluster = 65536;
  auto c = testing::CreateCounted(Opts(65536, false));
  if (!c.image) return 0;
  io::FaultyStorage* storage = c.storage;
  Image& image = *c.image;
  for (uint64_t gc : order) EXPECT_TRUE(image.Write(gc * kCluster, Pattern(1, kCluster)).ok());
  EXPECT_TRUE(image.Flush().ok());
  const uint64_t full = *storage->AllocatedBytes();
  const uint64_t punches = storage->event_count(io::Event::kDiscardPunch);
  EXPECT_TRUE(image.Discard(0, order.size() * kCluster).ok());
  EXPECT_TRUE(image.Flush().ok());
  // Every cluster's space came back.
  EXPECT_LE(*storage->AllocatedBytes() + order.size() * kCluster, full);
  const uint64_t taken = storage->event_count(io::Event::kDiscardPunch) - punches;
  // The freed clusters are reused for new data, which no punch may touch.
  const size_t bytes = order.size() * kCluster;
  EXPECT_TRUE(image.Write(0, Pattern(2, bytes)).ok());
  EXPECT_TRUE(image.Flush().ok());
  EXPECT_EQ(ReadAll(image, 0, bytes), Pattern(2, bytes));
  return taken;
}

TEST(ImageZeroTest, DiscardPunchesClustersThatFollowOnTheHostAtOnce) {
  // Written in order, 128 clusters lie in one or two host runs (the L2
  // table may come between the first and the rest): one punch each, which
  // lets a RADOS pool remove whole objects.
  std::vector<uint64_t> forward(128);
  for (uint64_t i = 0; i < forward.size(); ++i) forward[i] = i;
  EXPECT_LE(DiscardPunches(forward), 2u);
  // Written backwards, no cluster follows the one before it on the host:
  // one punch per cluster, and all of them still freed.
  std::vector<uint64_t> backward(forward.rbegin(), forward.rend());
  EXPECT_EQ(DiscardPunches(backward), 128u);
}

// Discarded clusters with live ones between them on the host are punched
// one by one: a run never spans a cluster that keeps its data.
TEST(ImageZeroTest, DiscardNeverPunchesAcrossLiveClusters) {
  constexpr uint64_t kCluster = 65536, kHalf = 64 * kCluster;
  auto c = testing::CreateCounted(Opts(65536, false));
  ASSERT_TRUE(c.image);
  io::FaultyStorage* storage = c.storage;
  Image& image = *c.image;
  auto data = Pattern(5, 2 * kHalf);
  for (uint64_t i = 0; i < kHalf / kCluster; ++i) {  // host: 0, 64, 1, 65, ...
    for (uint64_t off : {i * kCluster, kHalf + i * kCluster})
      ASSERT_TRUE(image.Write(off, std::span(data).subspan(off, kCluster)).ok());
  }
  ASSERT_TRUE(image.Flush().ok());
  const uint64_t punches = storage->event_count(io::Event::kDiscardPunch);
  ASSERT_TRUE(image.Discard(0, kHalf).ok());
  EXPECT_EQ(storage->event_count(io::Event::kDiscardPunch) - punches, kHalf / kCluster);
  EXPECT_EQ(ReadAll(image, 0, kHalf), Zeros(kHalf));
  EXPECT_EQ(ReadAll(image, kHalf, kHalf),
            std::vector<uint8_t>(data.begin() + kHalf, data.end()));
}

TEST(ImageZeroTest, BlockStatusReportsDataZeroAndHoles) {
  auto m = CreateMem(Opts(65536, true));
  ASSERT_TRUE(m.image);
  ASSERT_TRUE(m.image->Write(65536, Pattern(1, 2 * 65536)).ok());
  ASSERT_TRUE(m.image->WriteZeroes(2 * 65536, 65536, {}).ok());  // keeps the cluster
  auto hole = m.image->GetStatus(0, 1 << 20);
  ASSERT_TRUE(hole.has_value());
  EXPECT_EQ(hole->length, 65536u);
  EXPECT_FALSE(hole->data);
  EXPECT_TRUE(hole->zero);
  EXPECT_FALSE(hole->present);
  auto data = m.image->GetStatus(65536, 1 << 20);
  ASSERT_TRUE(data.has_value());
  EXPECT_EQ(data->length, 65536u);
  EXPECT_TRUE(data->data);
  EXPECT_TRUE(data->present);
  EXPECT_EQ(data->depth, 0u);
  EXPECT_TRUE(data->has_host_offset);
  auto zero = m.image->GetStatus(2 * 65536, 1 << 20);
  ASSERT_TRUE(zero.has_value());
  EXPECT_EQ(zero->length, 65536u);
  EXPECT_TRUE(zero->zero);
  EXPECT_FALSE(zero->data);
  EXPECT_TRUE(zero->present);
  auto rest = m.image->GetStatus(3 * 65536, m.image->size());
  ASSERT_TRUE(rest.has_value());
  EXPECT_EQ(rest->offset + rest->length, m.image->size());
}

MemImage CloneOf(std::vector<uint8_t> base, CreateOptions o) {
  o.backing_file = "base.raw";
  o.backing_format = "raw";
  OpenOptions oo;
  oo.open_backing = [base](const std::string& name, const std::string&)
      -> Result<std::unique_ptr<block::Device>> {
    EXPECT_EQ(name, "base.raw");
    return std::unique_ptr<block::Device>(new FakeDevice(base));
  };
  return CreateMem(o, oo);
}

class BackingTest : public ::testing::TestWithParam<std::tuple<uint32_t, bool, uint32_t>> {};

TEST_P(BackingTest, CloneReadsBackingAndCopiesOnlyWhatItMust) {
  auto [cluster, ext, version] = GetParam();
  const uint64_t size = 8 << 20;
  auto base = Pattern(11, size - (1 << 20));  // backing shorter than the clone
  auto m = CloneOf(base, Opts(cluster, ext, version, size));
  ASSERT_TRUE(m.image);
  std::vector<uint8_t> want(size, 0);
  std::copy(base.begin(), base.end(), want.begin());
  EXPECT_EQ(ReadAll(*m.image, 0, size), want);
  // Partial writes: the rest of each cluster still shows the backing data.
  auto a = Pattern(12, 1000);
  ASSERT_TRUE(m.image->Write(cluster + 300, a).ok());
  std::copy(a.begin(), a.end(), want.begin() + cluster + 300);
  auto b = Pattern(13, 5000);
  ASSERT_TRUE(m.image->Write(size - (1 << 20) - 2000, b).ok());  // straddles backing end
  std::copy(b.begin(), b.end(), want.begin() + size - (1 << 20) - 2000);
  EXPECT_EQ(ReadAll(*m.image, 0, size), want);
  // Discard reads zeros, not backing data.
  ASSERT_TRUE(m.image->Discard(4 * cluster, 2 * cluster).ok());
  ASSERT_TRUE(m.image->Discard(7 * cluster + 10, 20).ok());
  std::fill(want.begin() + 4 * cluster, want.begin() + 6 * cluster, 0);
  std::fill(want.begin() + 7 * cluster + 10, want.begin() + 7 * cluster + 30, 0);
  EXPECT_EQ(ReadAll(*m.image, 0, size), want);
  // Status: unallocated ranges come from depth 1.
  auto st = m.image->GetStatus(20 * cluster, cluster);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->depth, 1u);
  EXPECT_TRUE(st->data);
  auto own = m.image->GetStatus(cluster + 300, 100);
  ASSERT_TRUE(own.has_value());
  EXPECT_EQ(own->depth, 0u);
}

INSTANTIATE_TEST_SUITE_P(Layouts, BackingTest,
                         ::testing::Values(std::make_tuple(65536u, false, 3u),
                                           std::make_tuple(65536u, true, 3u),
                                           std::make_tuple(4096u, false, 2u)));

TEST(ImageBackingTest, BackingFileWithoutOpenerFails) {
  auto storage = io::NewMemoryStorage();
  CreateOptions o = Opts(65536, true, 3, 1 << 20);
  o.backing_file = "base.raw";
  ASSERT_TRUE(Create(*storage, o).ok());
  // The control: the image itself is fine (opened without its backing file).
  OpenOptions no_backing;
  no_backing.no_backing = true;
  auto plain = Image::Open(storage->Clone(), no_backing);
  ASSERT_TRUE(plain.has_value()) << plain.error().ToString();
  auto img = Image::Open(std::move(storage), {});
  ASSERT_FALSE(img.has_value());
  EXPECT_EQ(img.error().code(), Code::kInvalidArgument) << img.error().ToString();
  EXPECT_NE(img.error().message().find("backing file 'base.raw'"), std::string::npos)
      << img.error().message();
}

// A dd-style run of 1 KiB first writes (bs=1k) into fresh subclusters: each
// costs its 1 KiB, not a fill of the rest of its 4 KiB subcluster, because
// fresh host space past the end of the file already reads as zeros. What
// the writes did not cover still reads as zeros, and a clone still gets its
// backing data around the new bytes.
TEST(FirstWrites, DdStyleKibWritesAreNotZeroFilled) {
  auto m = CreateMem(Opts(128 << 10, true));
  const uint64_t kRun = 300 << 10;  // across three clusters, ends mid-subcluster
  auto data = Pattern(5, kRun);
  uint64_t before = m.storage->bytes_written();
  for (uint64_t off = 0; off < kRun; off += 1024) {
    ASSERT_TRUE(m.image->Write(off, std::span(data).subspan(off, 1024)).ok());
  }
  // Metadata waits for the flush: everything so far is data.
  EXPECT_EQ(m.storage->bytes_written() - before, kRun);
  ASSERT_TRUE(m.image->Flush().ok());
  EXPECT_EQ(ReadAll(*m.image, 0, kRun), data);
  EXPECT_EQ(ReadAll(*m.image, kRun, 512 << 10), Zeros(512 << 10));
  auto r = Reopen(m);
  EXPECT_EQ(ReadAll(*r.image, 0, kRun), data);
  EXPECT_EQ(ReadAll(*r.image, kRun, 512 << 10), Zeros(512 << 10));
}

TEST(FirstWrites, SmallWritesIntoACloneKeepBackingDataAround) {
  const uint64_t size = 4 << 20;
  auto base = Pattern(9, size);
  auto m = CloneOf(base, Opts(128 << 10, true, 3, size));
  auto data = Pattern(6, 1024);
  for (uint64_t off : {uint64_t(0), uint64_t(1024), uint64_t(6144), uint64_t(200 << 10)}) {
    ASSERT_TRUE(m.image->Write(off, data).ok());
    std::copy(data.begin(), data.end(), base.begin() + off);
  }
  ASSERT_TRUE(m.image->Flush().ok());
  EXPECT_EQ(ReadAll(*m.image, 0, size), base);
}

}  // namespace
}  // namespace thindisk::qcow2

namespace thindisk::qcow2 {
namespace {

TEST(ImageZeroTest, DiscardingAWholeFreshDiskTouchesNoMetadata) {
  auto m = testing::CreateMem(Opts(65536, false, 3, 1ull << 40));  // 1 TiB
  ASSERT_TRUE(m.image);
  ASSERT_TRUE(m.image->Write(5ull << 30, testing::Pattern(1, 4096)).ok());
  ASSERT_TRUE(m.image->Flush().ok());
  uint64_t before = m.storage->bytes_written();
  ASSERT_TRUE(m.image->Discard(0, m.image->size()).ok());
  ASSERT_TRUE(m.image->WriteZeroes(0, m.image->size(), {}).ok());
  ASSERT_TRUE(m.image->Flush().ok());
  // Only the one L2 table that existed changes (plus refcounts/punch).
  EXPECT_LE(m.storage->bytes_written() - before, 4u * 65536);
  EXPECT_EQ(ReadAll(*m.image, 5ull << 30, 4096), Zeros(4096));
}

}  // namespace
}  // namespace thindisk::qcow2

namespace thindisk::qcow2 {
namespace {

// W5's shape: 4 KiB random writes into a clone copy only the touched
// subclusters (extended L2), not whole clusters.
TEST(ImageBackingTest, CloneWritesCopyAtSubclusterGrain) {
  const uint64_t size = 64 << 20;
  auto m = CloneOf(std::vector<uint8_t>(size, 0x77), Opts(131072, true, 3, size));
  ASSERT_TRUE(m.image);
  ASSERT_TRUE(m.image->Flush().ok());
  uint64_t before = m.storage->bytes_written();
  std::mt19937_64 rng(3);
  const int kWrites = 1000;
  auto block = testing::Pattern(6, 4096);
  for (int i = 0; i < kWrites; ++i) {
    ASSERT_TRUE(m.image->Write((rng() % (size / 4096)) * 4096, block).ok());
  }
  ASSERT_TRUE(m.image->Flush().ok());
  double ratio = double(m.storage->bytes_written() - before) / (kWrites * 4096.0);
  EXPECT_LE(ratio, 1.15);
}

}  // namespace
}  // namespace thindisk::qcow2
