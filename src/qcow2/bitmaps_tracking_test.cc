// Persistent bitmaps beside the engine's other operations: resize (bits kept,
// new space clean, bits past a shrink gone), internal snapshots (apply is
// refused, create and delete keep them), in_use bitmaps (listed with the
// problem, only removable), power loss (the surviving bitmap covers every
// change: bitmap_tracker.h) and concurrent writers.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <span>
#include <thread>

#include "io/faulty_storage.h"
#include "qcow2/bitmaps.h"
#include "qcow2/bitmaps_test_util.h"
#include "qcow2/snapshot.h"
#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

using testing::Add;
using testing::ByteRange;
using testing::CreateMem;
using testing::ExpectCheckClean;
using testing::MemImage;
using testing::MustList;
using testing::MustRead;
using testing::Names;
using testing::Options;
using testing::Pattern;
using testing::Reopen;
using testing::Touched;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kSize = 16 * kMiB;

// ---- resize ----

TEST(BitmapResize, GrowKeepsTheBitsAndTheNewSpaceStartsClean) {
  MemImage m = CreateMem(Options(kSize));
  ASSERT_TRUE(Add(*m.image, "e").ok());
  ASSERT_TRUE(Add(*m.image, "fine", 9).ok());
  ASSERT_TRUE(Add(*m.image, "d", 12, false).ok());
  ASSERT_TRUE(
      MergeIntoBitmap(*m.image, "d", Touched(kSize, 12, {{kSize - 4096, 4096}}), 12)
          .ok());
  ASSERT_TRUE(m.image->Write(kMiB, Pattern(1, 100), {}).ok());
  ASSERT_TRUE(m.image->Write(kSize - 1, Pattern(2, 1), {}).ok());
  const std::vector<ByteRange> before = {{kMiB, 100}, {kSize - 1, 1}};

  const uint64_t grown = 3 * kSize + 512;
  ASSERT_TRUE(m.image->Resize(grown, false).ok());
  EXPECT_BITS(*m.image, "e", Touched(grown, 16, before));
  EXPECT_BITS(*m.image, "fine", Touched(grown, 9, before));
  EXPECT_BITS(*m.image, "d", Touched(grown, 12, {{kSize - 4096, 4096}}));
  // The new space is tracked.
  ASSERT_TRUE(m.image->Write(2 * kSize, Pattern(3, 10), {}).ok());
  ASSERT_TRUE(m.image->Write(grown - 1, Pattern(4, 1), {}).ok());
  std::vector<ByteRange> all = before;
  all.push_back({2 * kSize, 10});
  all.push_back({grown - 1, 1});
  EXPECT_BITS(*m.image, "e", Touched(grown, 16, all));
  EXPECT_BITS(*m.image, "fine", Touched(grown, 9, all));

  MemImage r = Reopen(m);
  ASSERT_TRUE(r.image);
  EXPECT_BITS(*r.image, "e", Touched(grown, 16, all));
  EXPECT_BITS(*r.image, "fine", Touched(grown, 9, all));
  EXPECT_BITS(*r.image, "d", Touched(grown, 12, {{kSize - 4096, 4096}}));
  for (const BitmapInfo& b : MustList(*r.image)) EXPECT_TRUE(b.consistent()) << b.problem;
  ASSERT_TRUE(r.image->Close().ok());
  ExpectCheckClean(*r.storage);
}

TEST(BitmapResize, ShrinkDropsTheBitsPastTheNewEnd) {
  MemImage m = CreateMem(Options(kSize));
  ASSERT_TRUE(Add(*m.image, "e").ok());
  ASSERT_TRUE(Add(*m.image, "d", 12, false).ok());
  ASSERT_TRUE(MergeIntoBitmap(*m.image, "d", Touched(kSize, 12, {{0, kSize}}), 12).ok());
  ASSERT_TRUE(m.image->Write(kMiB, Pattern(1, 100), {}).ok());
  ASSERT_TRUE(m.image->Write(12 * kMiB, Pattern(2, 100), {}).ok());
  ASSERT_TRUE(m.image->Discard(12 * kMiB, 4 * kMiB).ok());  // so the shrink may go

  const uint64_t small = 5 * kMiB + 512;
  ASSERT_TRUE(m.image->Resize(small, true).ok());
  EXPECT_BITS(*m.image, "e", Touched(small, 16, {{kMiB, 100}}));
  EXPECT_BITS(*m.image, "d", Touched(small, 12, {{0, small}}));
  ASSERT_TRUE(m.image->Write(small - 1, Pattern(3, 1), {}).ok());
  const BitVector want = Touched(small, 16, {{kMiB, 100}, {small - 1, 1}});
  EXPECT_BITS(*m.image, "e", want);

  MemImage r = Reopen(m);
  ASSERT_TRUE(r.image);
  EXPECT_BITS(*r.image, "e", want);
  EXPECT_BITS(*r.image, "d", Touched(small, 12, {{0, small}}));
  ASSERT_TRUE(r.image->Close().ok());
  ExpectCheckClean(*r.storage);
}

TEST(BitmapResize, ShrinkThenGrowLeavesTheRegainedSpaceClean) {
  MemImage m = CreateMem(Options(kSize));
  ASSERT_TRUE(Add(*m.image, "e", 12).ok());
  ASSERT_TRUE(m.image->Discard(8 * kMiB, 8 * kMiB).ok());  // marks [8M, 16M)
  ASSERT_TRUE(m.image->Resize(8 * kMiB, true).ok());
  ASSERT_TRUE(m.image->Resize(kSize, false).ok());
  EXPECT_BITS(*m.image, "e", Touched(kSize, 12, {}));
  MemImage r = Reopen(m);
  ASSERT_TRUE(r.image);
  EXPECT_BITS(*r.image, "e", Touched(kSize, 12, {}));
}

// ---- internal snapshots ----

TEST(BitmapSnapshots, ApplyIsRefusedCreateAndDeleteKeepTheBitmaps) {
  MemImage m = CreateMem(Options(kSize));
  ASSERT_TRUE(Add(*m.image, "e").ok());
  ASSERT_TRUE(Add(*m.image, "d", 16, false).ok());
  ASSERT_TRUE(m.image->Write(0, Pattern(1, 4096), {}).ok());
  ASSERT_TRUE(CreateSnapshot(*m.image, {.name = "s1"}).ok());
  EXPECT_EQ(Names(*m.image), (std::vector<std::string>{"e", "d"}));
  EXPECT_BITS(*m.image, "e", Touched(kSize, 16, {{0, 4096}}));

  ASSERT_TRUE(m.image->Write(2 * kMiB, Pattern(2, 4096), {}).ok());
  const BitVector want = Touched(kSize, 16, {{0, 4096}, {2 * kMiB, 4096}});
  // qemu: "Could not apply snapshot 's1': Device has active dirty bitmaps",
  // even when the only bitmap is disabled.
  Status apply = ApplySnapshot(*m.image, "s1");
  EXPECT_EQ(apply.code(), Code::kNotSupported) << apply.ToString();
  std::vector<uint8_t> got(4096);
  ASSERT_TRUE(m.image->Read(2 * kMiB, got).ok());
  EXPECT_EQ(got, Pattern(2, 4096));  // still the current content
  EXPECT_BITS(*m.image, "e", want);
  ASSERT_TRUE(RemoveBitmap(*m.image, "e").ok());
  EXPECT_EQ(ApplySnapshot(*m.image, "s1").code(), Code::kNotSupported);  // "d" is left
  ASSERT_TRUE(Add(*m.image, "e").ok());

  ASSERT_TRUE(CreateSnapshot(*m.image, {.name = "s2"}).ok());
  ASSERT_TRUE(DeleteSnapshot(*m.image, "s1").ok());
  ASSERT_TRUE(m.image->Write(3 * kMiB, Pattern(3, 10), {}).ok());
  MemImage r = Reopen(m);
  ASSERT_TRUE(r.image);
  EXPECT_EQ(Names(*r.image), (std::vector<std::string>{"d", "e"}));
  EXPECT_BITS(*r.image, "e", Touched(kSize, 16, {{3 * kMiB, 10}}));
  ASSERT_TRUE(r.image->Close().ok());
  ExpectCheckClean(*r.storage);
}

// ---- in_use bitmaps ----

class InUseBitmap : public ::testing::Test {
 protected:
  // "bad" (enabled, flagged in_use on disk, as a crashed qemu leaves it)
  // and "good" (enabled), both with one write.
  void SetUp() override {
    MemImage m = CreateMem(Options(kSize));
    ASSERT_TRUE(m.image);
    ASSERT_TRUE(Add(*m.image, "bad").ok());
    ASSERT_TRUE(Add(*m.image, "good").ok());
    ASSERT_TRUE(m.image->Write(kMiB, Pattern(1, 10), {}).ok());
    ASSERT_TRUE(m.image->Close().ok());
    testing::SetDirectoryFlags(*m.storage, m.image->header(), "bad", kBitmapInUse);
    m_ = Reopen(m);
    ASSERT_TRUE(m_.image);
  }
  MemImage m_;
};

TEST_F(InUseBitmap, IsListedWithItsProblem) {
  std::vector<BitmapInfo> list = MustList(*m_.image);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].name, "bad");
  EXPECT_TRUE(list[0].in_use);
  EXPECT_FALSE(list[0].consistent());
  EXPECT_NE(list[0].problem, "");
  EXPECT_TRUE(list[1].consistent()) << list[1].problem;
  EXPECT_EQ(ReadBitmap(*m_.image, "bad").status().code(), Code::kCorrupt);
  EXPECT_BITS(*m_.image, "good", Touched(kSize, 16, {{kMiB, 10}}));
}

TEST_F(InUseBitmap, IsRefusedByEverythingButRemove) {
  Image& img = *m_.image;
  EXPECT_EQ(ClearBitmap(img, "bad").code(), Code::kCorrupt);
  EXPECT_EQ(MergeIntoBitmap(img, "bad", BitVector(BitmapBits(kSize, 16)), 16).code(),
            Code::kCorrupt);
  EXPECT_EQ(SetBitmapEnabled(img, "bad", true).code(), Code::kCorrupt);
  EXPECT_EQ(SetBitmapEnabled(img, "bad", false).code(), Code::kCorrupt);
  // qemu: "Bitmap 'bad' is inconsistent and cannot be used" on resize.
  EXPECT_FALSE(img.Resize(2 * kSize, false).ok());
  EXPECT_EQ(img.size(), kSize);
  EXPECT_FALSE(img.Resize(kSize / 2, true).ok());
  EXPECT_EQ(img.size(), kSize);
  // Writes go on; the good bitmap tracks them.
  ASSERT_TRUE(img.Write(2 * kMiB, Pattern(2, 10), {}).ok());
  EXPECT_BITS(img, "good", Touched(kSize, 16, {{kMiB, 10}, {2 * kMiB, 10}}));
  EXPECT_TRUE(MustList(img)[0].in_use);
  ASSERT_TRUE(img.Close().ok());
  ExpectCheckClean(*m_.storage);
}

TEST_F(InUseBitmap, CanBeRemovedAndThenResizeWorks) {
  ASSERT_TRUE(RemoveBitmap(*m_.image, "bad").ok());
  EXPECT_EQ(Names(*m_.image), (std::vector<std::string>{"good"}));
  ASSERT_TRUE(m_.image->Resize(2 * kSize, false).ok());
  EXPECT_BITS(*m_.image, "good", Touched(2 * kSize, 16, {{kMiB, 10}}));
  ASSERT_TRUE(m_.image->Close().ok());
  ExpectCheckClean(*m_.storage);
}

// ---- hostile bitmap metadata ----

// Points bitmap `name`'s first table entry at `host_offset` (image closed).
void RedirectFirstDataCluster(io::Storage& storage, const Header& h,
                              const std::string& name, uint64_t host_offset) {
  ASSERT_TRUE(h.bitmaps.has_value());
  std::vector<uint8_t> raw(h.bitmaps->bitmap_directory_size);
  ASSERT_TRUE(storage.ReadAt(h.bitmaps->bitmap_directory_offset, raw).ok());
  auto dir = DecodeBitmapDirectory(raw, h.bitmaps->nb_bitmaps);
  ASSERT_TRUE(dir.has_value());
  for (const BitmapDirectoryEntry& e : *dir) {
    if (e.name != name) continue;
    uint8_t entry[8];
    StoreBe64(entry, host_offset);
    ASSERT_TRUE(storage.WriteAt(e.bitmap_table_offset, entry).ok());
    return;
  }
  FAIL() << "no bitmap " << name;
}

// A bitmap table naming the L1 table as a data cluster (qemu's "shared
// cluster" corruption): the engine may refuse the bitmap, but a session
// must not write bitmap bits over the L1 table, nor free it.
TEST(BitmapHostile, ADataClusterThatIsTheL1TableIsNeverWritten) {
  MemImage m = CreateMem(Options(kSize, 65536, false));
  ASSERT_TRUE(Add(*m.image, "e").ok());
  const std::vector<uint8_t> data = Pattern(1, 65536);
  ASSERT_TRUE(m.image->Write(0, data, {}).ok());
  ASSERT_TRUE(m.image->Close().ok());
  const Header h = m.image->header();
  RedirectFirstDataCluster(*m.storage, h, "e", h.l1_table_offset);
  std::vector<uint8_t> l1_before(8 * h.l1_size);
  ASSERT_TRUE(m.storage->ReadAt(h.l1_table_offset, l1_before).ok());

  MemImage r = Reopen(m);
  ASSERT_TRUE(r.image);
  // Bit 1 of the bitmap (guest 64 KiB) lies in the first L1 entry's bytes.
  ASSERT_TRUE(r.image->Write(65536, Pattern(2, 4096), {}).ok());
  ASSERT_TRUE(r.image->Write(9 * kMiB, Pattern(3, 4096), {}).ok());
  {
    // Were the power to fail now: the L1 table is intact.
    std::vector<uint8_t> l1_now(8 * h.l1_size);
    ASSERT_TRUE(r.storage->ReadAt(h.l1_table_offset, l1_now).ok());
    EXPECT_EQ(l1_now, l1_before) << "the L1 table changed while the image is open";
  }
  ASSERT_TRUE(r.image->Close().ok());
  // The L1 table holds L1 entries only: the first one as before, and no
  // bitmap bits anywhere.
  std::vector<uint8_t> l1_after(8 * h.l1_size);
  ASSERT_TRUE(r.storage->ReadAt(h.l1_table_offset, l1_after).ok());
  EXPECT_EQ(LoadBe64(&l1_after[0]), LoadBe64(&l1_before[0]));
  for (uint32_t i = 0; i < h.l1_size; ++i) {
    const uint64_t entry = LoadBe64(&l1_after[8 * i]);
    EXPECT_EQ(entry & kL1Reserved, 0u) << "L1 entry " << i << " is garbage";
  }
  OpenOptions ro;
  ro.read_only = true;
  MemImage again = Reopen(r, ro);
  ASSERT_TRUE(again.image);
  std::vector<uint8_t> got(65536);
  ASSERT_TRUE(again.image->Read(0, got).ok());
  EXPECT_EQ(got, data);
  std::vector<uint8_t> got2(4096);
  ASSERT_TRUE(again.image->Read(9 * kMiB, got2).ok());
  EXPECT_EQ(got2, Pattern(3, 4096));
}

// qemu reads a table entry of 1 as a cluster of all ones (and never
// writes one): the engine reads it so, and keeps tracking on top of it.
TEST(BitmapHostile, AnAllOnesTableEntryReadsAsEveryGranuleDirty) {
  MemImage m = CreateMem(Options(kSize));
  ASSERT_TRUE(Add(*m.image, "e", 9).ok());  // 4 KiB of bits: one data cluster
  ASSERT_TRUE(Add(*m.image, "d", 9, false).ok());
  ASSERT_TRUE(m.image->Close().ok());
  RedirectFirstDataCluster(*m.storage, m.image->header(), "e", kBitmapTableAllOnes);
  RedirectFirstDataCluster(*m.storage, m.image->header(), "d", kBitmapTableAllOnes);
  const BitVector all = Touched(kSize, 9, {{0, kSize}});

  MemImage r = Reopen(m);
  ASSERT_TRUE(r.image);
  EXPECT_BITS(*r.image, "e", all);
  EXPECT_BITS(*r.image, "d", all);
  ASSERT_TRUE(r.image->Write(kMiB, Pattern(1, 10), {}).ok());
  ASSERT_TRUE(ClearBitmap(*r.image, "d").ok());
  EXPECT_BITS(*r.image, "d", Touched(kSize, 9, {}));
  MemImage r2 = Reopen(r);
  ASSERT_TRUE(r2.image);
  EXPECT_BITS(*r2.image, "e", all);
  EXPECT_BITS(*r2.image, "d", Touched(kSize, 9, {}));
  ASSERT_TRUE(r2.image->Close().ok());
  ExpectCheckClean(*r2.storage, /*leaks_allowed=*/true);  // e's old data cluster
}

// ---- an empty disk ----

TEST(BitmapEmptyDisk, AnEmptyDiskTakesNoBitmapAndABitmapKeepsTheDiskFromEmptying) {
  // qemu 7.2 cannot keep a bitmap of a 0-byte disk either: refused, not leaked.
  MemImage m = CreateMem(Options(0));
  ASSERT_TRUE(m.image);
  Status s = Add(*m.image, "e");
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(MustList(*m.image).empty());
  ASSERT_TRUE(m.image->Resize(kMiB, false).ok());
  ASSERT_TRUE(Add(*m.image, "e").ok());
  s = m.image->Resize(0, true);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_EQ(m.image->size(), kMiB);
  ASSERT_TRUE(m.image->Write(4096, Pattern(1, 10), {}).ok());
  EXPECT_BITS(*m.image, "e", Touched(kMiB, 16, {{4096, 10}}));
  ASSERT_TRUE(m.image->Close().ok());
  ExpectCheckClean(*m.storage);
}

// ---- power loss ----

struct CrashCase {
  io::PowerLossMode mode;
  uint64_t mark_ahead;  // 0: the default (every region covers the disk here)
};

class BitmapCrash : public ::testing::TestWithParam<CrashCase> {};

// Whatever a power cut keeps, an enabled bitmap marks every granule whose
// content differs from what it was when tracking began.
TEST_P(BitmapCrash, SurvivingBitmapsCoverEveryChange) {
  constexpr uint64_t kDisk = 8 * kMiB;
  const CrashCase& c = GetParam();
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    // 1. An image with data in its first half and two enabled bitmaps.
    MemImage m = CreateMem(Options(kDisk, 65536, false));
    ASSERT_TRUE(m.image);
    std::vector<uint8_t> base = Pattern(seed, kDisk / 2);
    base.resize(kDisk, 0);
    ASSERT_TRUE(m.image->Write(0, std::span(base).first(kDisk / 2), {}).ok());
    ASSERT_TRUE(Add(*m.image, "e16", 16).ok());
    ASSERT_TRUE(Add(*m.image, "e12", 12).ok());
    ASSERT_TRUE(m.image->Close().ok());

    // 2. Random changes on a storage that loses power, never flushed.
    auto faulty_or =
        io::NewFaultyStorage(std::shared_ptr<io::Storage>(m.storage->Clone()));
    ASSERT_TRUE(faulty_or.has_value());
    io::FaultyStorage* faulty = faulty_or->get();
    OpenOptions oo;
    oo.bitmap_mark_ahead = c.mark_ahead;
    oo.cache_bytes = 4 * 65536;  // evictions write metadata mid-way
    auto img = Image::Open(std::move(*faulty_or), oo);
    ASSERT_TRUE(img.has_value()) << img.status().ToString();
    std::mt19937_64 rng(seed * 31 + uint64_t(c.mode));
    const int ops = 10 + int(rng() % 50);
    for (int i = 0; i < ops; ++i) {
      const uint64_t off = rng() % kDisk;
      const uint64_t len = std::min<uint64_t>(1 + rng() % 200000, kDisk - off);
      const int kind = int(rng() % 8);
      Status s;
      if (kind < 5) {
        s = (*img)->Write(off, Pattern(seed * 1000 + i, len), {});
      } else if (kind < 7) {
        s = (*img)->Discard(off, len);
      } else {
        s = (*img)->WriteZeroes(off, len, {});
      }
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    auto after = faulty->SimulatePowerLoss(c.mode, seed);
    ASSERT_TRUE(after.has_value()) << after.status().ToString();
    (*img).reset();  // the process dies

    // 3. No corruption; both bitmaps consistent and covering every change.
    std::shared_ptr<io::MemoryStorage> survivor(std::move(*after));
    ExpectCheckClean(*survivor, /*leaks_allowed=*/true);
    OpenOptions ro;
    ro.read_only = true;
    auto seen = Image::Open(survivor->Clone(), ro);
    ASSERT_TRUE(seen.has_value()) << seen.status().ToString();
    for (const BitmapInfo& b : MustList(**seen)) EXPECT_TRUE(b.consistent()) << b.problem;
    std::vector<uint8_t> now(kDisk);
    ASSERT_TRUE((*seen)->Read(0, now).ok());
    for (uint32_t g : {16u, 12u}) {
      const std::string name = "e" + std::to_string(g);
      const BitVector bits = MustRead(**seen, name);
      ASSERT_EQ(bits.size(), BitmapBits(kDisk, g));
      for (uint64_t k = 0; k < bits.size(); ++k) {
        const uint64_t a = k << g, b = std::min(kDisk, (k + 1) << g);
        if (!std::equal(now.begin() + a, now.begin() + b, base.begin() + a)) {
          ASSERT_TRUE(bits.Test(k))
              << name << ": granule " << k << " changed but is clean";
        }
      }
    }
    // 4. A writer opens it without marking anything inconsistent.
    auto rw = Image::Open(survivor->Clone(), {});
    ASSERT_TRUE(rw.has_value()) << rw.status().ToString();
    for (const BitmapInfo& b : MustList(**rw)) EXPECT_FALSE(b.in_use) << b.name;
    ASSERT_TRUE((*rw)->Close().ok());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, BitmapCrash,
    ::testing::Values(CrashCase{io::PowerLossMode::kDropUnflushed, 0},
                      CrashCase{io::PowerLossMode::kKeepRandomSubset, 0},
                      CrashCase{io::PowerLossMode::kTearLast, 0},
                      CrashCase{io::PowerLossMode::kDropUnflushed, 256 * 1024},
                      CrashCase{io::PowerLossMode::kKeepRandomSubset, 256 * 1024},
                      CrashCase{io::PowerLossMode::kTearOne, 256 * 1024},
                      CrashCase{io::PowerLossMode::kTearLast, 256 * 1024}));

// ---- concurrent writers ----

TEST(BitmapConcurrency, ParallelWritersAreAllTracked) {
  constexpr uint64_t kDisk = 64 * kMiB;
  constexpr int kThreads = 8;
  constexpr uint64_t kSlice = kDisk / kThreads;
  OpenOptions oo;
  oo.bitmap_mark_ahead = kMiB;  // many regions: writers share write rounds
  MemImage m = CreateMem(Options(kDisk), oo);
  ASSERT_TRUE(m.image);
  ASSERT_TRUE(Add(*m.image, "e16", 16).ok());
  ASSERT_TRUE(Add(*m.image, "e12", 12).ok());
  MemImage r = Reopen(m, oo);  // tracking from open, with the small regions
  ASSERT_TRUE(r.image);

  std::vector<std::vector<ByteRange>> ranges(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t + 1);
      for (int i = 0; i < 24; ++i) {
        const uint64_t off = t * kSlice + rng() % (kSlice - 1);
        const uint64_t len =
            std::min<uint64_t>(1 + rng() % 150000, (t + 1) * kSlice - off);
        Status s = r.image->Write(off, Pattern(t * 100 + i, len), {});
        EXPECT_TRUE(s.ok()) << s.ToString();
        ranges[t].push_back({off, len});
      }
    });
  }
  for (std::thread& th : threads) th.join();
  std::vector<ByteRange> all;
  for (const auto& v : ranges) all.insert(all.end(), v.begin(), v.end());
  EXPECT_BITS(*r.image, "e16", Touched(kDisk, 16, all));
  EXPECT_BITS(*r.image, "e12", Touched(kDisk, 12, all));
  MemImage r2 = Reopen(r);
  ASSERT_TRUE(r2.image);
  EXPECT_BITS(*r2.image, "e16", Touched(kDisk, 16, all));
  EXPECT_BITS(*r2.image, "e12", Touched(kDisk, 12, all));
  ASSERT_TRUE(r2.image->Close().ok());
  ExpectCheckClean(*r2.storage);
}

// A served image's control socket clears and queries while writers run
// (and an NBD export reads the live bits): each call is atomic, a clear
// with a generation fails once a change started or ended after it was read,
// and what the writers change after the last clear is all there.
TEST(BitmapConcurrency, LiveQueriesAndClearsBesideWriters) {
  constexpr uint64_t kDisk = 16 * kMiB;
  auto dev = std::shared_ptr<block::Device>([&] {
    MemImage m = CreateMem(Options(kDisk));
    EXPECT_TRUE(Add(*m.image, "live", 16).ok());
    return std::move(m.image);
  }());
  auto view = ExportBitmap(dev, "live");
  ASSERT_TRUE(view.has_value()) << view.status().ToString();
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&, t] {
      std::mt19937_64 rng(t + 7);
      for (int i = 0; i < 400 && !stop.load(); ++i) {
        const uint64_t off = rng() % (kDisk - 8192);
        EXPECT_TRUE(dev->Write(off, Pattern(i, 1 + rng() % 8192), {}).ok());
      }
    });
  }
  int cleared = 0, refused = 0;
  for (int i = 0; i < 200; ++i) {
    auto st = QueryBitmapLive(*dev, "live");
    ASSERT_TRUE(st.has_value()) << st.status().ToString();
    auto run = (*view)->RunAt(0, kDisk);
    ASSERT_TRUE(run.has_value());
    Status s = ClearBitmapLive(*dev, "live", st->generation);
    if (s.ok()) ++cleared;
    else if (s.code() == Code::kBusy) ++refused;
    else FAIL() << s.ToString();
  }
  stop = true;
  for (std::thread& w : writers) w.join();
  EXPECT_GT(cleared + refused, 0);
  // Quiet now: a clear at the current generation holds, then one write shows.
  auto st = QueryBitmapLive(*dev, "live");
  ASSERT_TRUE(st.has_value());
  ASSERT_TRUE(ClearBitmapLive(*dev, "live", st->generation).ok());
  EXPECT_EQ(QueryBitmapLive(*dev, "live")->dirty_bytes, 0u);
  ASSERT_TRUE(dev->Write(5 * kMiB + 1, Pattern(1, 10), {}).ok());
  auto after = QueryBitmapLive(*dev, "live");
  EXPECT_EQ(after->dirty_bytes, 64u * 1024);
  EXPECT_GT(after->generation, st->generation);
  EXPECT_EQ(ClearBitmapLive(*dev, "live", st->generation).code(), Code::kBusy);
  ASSERT_TRUE(dev->Close().ok());
}

}  // namespace
}  // namespace thindisk::qcow2
