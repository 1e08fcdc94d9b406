// Persistent bitmaps through the engine (bitmaps.h), on in-memory images:
// what enabled bitmaps mark for every kind of change, what survives a close,
// and the operations (add, list, clear, enable, disable, remove, merge) with
// their errors. Tracking under resize, snapshots, in_use bitmaps, crashes
// and threads is in bitmaps_tracking_test.cc; operations that fail part-way
// in bitmaps_fault_test.cc.
#include "qcow2/bitmaps.h"

#include <gtest/gtest.h>

#include "qcow2/bitmaps_test_util.h"

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

// ---- what enabled bitmaps mark ----

struct Layout {
  uint32_t cluster_size;
  bool extended_l2;
};

std::string LayoutName(const ::testing::TestParamInfo<Layout>& p) {
  return std::to_string(p.param.cluster_size) +
         (p.param.extended_l2 ? "Extended" : "Standard");
}

class BitmapMarking : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override {
    m_ = CreateMem(Options(kSize, GetParam().cluster_size, GetParam().extended_l2));
    ASSERT_TRUE(m_.image);
    ASSERT_TRUE(Add(*m_.image, "e16", 16).ok());
    ASSERT_TRUE(Add(*m_.image, "e9", 9).ok());
    ASSERT_TRUE(Add(*m_.image, "d12", 12, /*enabled=*/false).ok());
  }
  uint64_t cs() const { return GetParam().cluster_size; }
  uint64_t subcluster() const { return GetParam().extended_l2 ? cs() / 32 : cs(); }

  // After each change: the enabled bitmaps hold exactly the granules
  // changed so far, the disabled one nothing.
  void ExpectExactly(Image& image) {
    EXPECT_BITS(image, "e16", Touched(kSize, 16, changed_));
    EXPECT_BITS(image, "e9", Touched(kSize, 9, changed_));
    EXPECT_BITS(image, "d12", Touched(kSize, 12, {}));
  }

  MemImage m_;
  std::vector<ByteRange> changed_;
};

TEST_P(BitmapMarking, ListsEnabledAndDisabledBitmapsInOrder) {
  std::vector<BitmapInfo> list = MustList(*m_.image);
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].name, "e16");
  EXPECT_EQ(list[0].granularity(), 65536u);
  EXPECT_TRUE(list[0].enabled);
  EXPECT_EQ(list[1].name, "e9");
  EXPECT_EQ(list[1].granularity_bits, 9u);
  EXPECT_TRUE(list[1].enabled);
  EXPECT_EQ(list[2].name, "d12");
  EXPECT_EQ(list[2].granularity(), 4096u);
  EXPECT_FALSE(list[2].enabled);
  for (const BitmapInfo& b : list) {
    EXPECT_FALSE(b.in_use) << b.name;
    EXPECT_TRUE(b.consistent()) << b.name << ": " << b.problem;
  }
  ExpectExactly(*m_.image);  // new bitmaps are clean
}

TEST_P(BitmapMarking, EveryKindOfChangeMarksExactlyTheGranulesItTouches) {
  Image& img = *m_.image;
  const std::vector<uint8_t> data = Pattern(1, 1000);
  ASSERT_TRUE(img.Write(3 * cs() + 100, data, {}).ok());
  changed_.push_back({3 * cs() + 100, 1000});
  ExpectExactly(img);

  ASSERT_TRUE(img.WriteZeroes(kMiB + 7, 70000, {}).ok());
  changed_.push_back({kMiB + 7, 70000});
  ExpectExactly(img);

  ASSERT_TRUE(img.WriteZeroes(6 * kMiB, 2 * cs(), {.may_unmap = true}).ok());
  changed_.push_back({6 * kMiB, 2 * cs()});
  ExpectExactly(img);

  ASSERT_TRUE(img.Discard(2 * kMiB + 3, 3 * cs()).ok());
  changed_.push_back({2 * kMiB + 3, 3 * cs()});
  ExpectExactly(img);

  ASSERT_TRUE(img.WriteCompressed(4 * kMiB + cs(), Pattern(2, cs())).ok());
  changed_.push_back({4 * kMiB + cs(), cs()});
  ExpectExactly(img);

  ASSERT_TRUE(img.Deallocate(5 * kMiB + subcluster(), 2 * subcluster()).ok());
  changed_.push_back({5 * kMiB + subcluster(), 2 * subcluster()});
  ExpectExactly(img);

  // The last byte of the disk: the last granule of every bitmap.
  ASSERT_TRUE(img.Write(kSize - 1, Pattern(3, 1), {}).ok());
  changed_.push_back({kSize - 1, 1});
  ExpectExactly(img);
}

TEST_P(BitmapMarking, RequestsThatFailTheirChecksMarkNothing) {
  Image& img = *m_.image;
  EXPECT_EQ(img.Write(kSize - 10, Pattern(1, 20), {}).code(), Code::kOutOfRange);
  EXPECT_EQ(img.WriteZeroes(kSize, 512, {}).code(), Code::kOutOfRange);
  EXPECT_FALSE(img.WriteCompressed(cs() / 2, Pattern(2, cs())).ok());  // unaligned
  ExpectExactly(img);
}

TEST_P(BitmapMarking, ReadsDoNotMark) {
  Image& img = *m_.image;
  std::vector<uint8_t> buf(3 * cs());
  ASSERT_TRUE(img.Read(cs(), buf).ok());
  ASSERT_TRUE(img.GetStatus(0, kSize).has_value());
  ASSERT_TRUE(img.Flush().ok());
  ExpectExactly(img);
}

TEST_P(BitmapMarking, CloseKeepsExactlyTheChangedGranules) {
  const std::vector<ByteRange> writes = {
      {0, 1}, {cs() * 7 + 5, 3 * cs()}, {9 * kMiB, 512}};
  for (size_t i = 0; i < writes.size(); ++i) {
    ASSERT_TRUE(m_.image->Write(writes[i].offset, Pattern(i, writes[i].length), {}).ok());
    changed_.push_back(writes[i]);
  }
  // Before the close, what the disk holds is a superset (whole regions
  // marked ahead: bitmap_tracker.h); the durable copy must cover the changes.
  {
    auto copy = m_.storage->Clone();
    OpenOptions ro;
    ro.read_only = true;
    auto seen = Image::Open(std::move(copy), ro);
    ASSERT_TRUE(seen.has_value()) << seen.status().ToString();
    EXPECT_TRUE(testing::Covers(MustRead(**seen, "e16"), Touched(kSize, 16, changed_)))
        << testing::SetRuns(MustRead(**seen, "e16"));
    EXPECT_TRUE(testing::Covers(MustRead(**seen, "e9"), Touched(kSize, 9, changed_)));
  }
  // After it, exactly the changes, whether reopened for writing or reading.
  MemImage rw = Reopen(m_);
  ASSERT_TRUE(rw.image);
  ExpectExactly(*rw.image);
  OpenOptions ro;
  ro.read_only = true;
  MemImage again = Reopen(rw, ro);
  ASSERT_TRUE(again.image);
  ExpectExactly(*again.image);
  ASSERT_TRUE(again.image->Close().ok());
  ExpectCheckClean(*again.storage);
}

TEST_P(BitmapMarking, TrackingContinuesAfterReopen) {
  ASSERT_TRUE(m_.image->Write(cs(), Pattern(1, 100), {}).ok());
  changed_.push_back({cs(), 100});
  MemImage r = Reopen(m_);
  ASSERT_TRUE(r.image);
  ASSERT_TRUE(r.image->Discard(3 * kMiB, 5 * cs()).ok());
  changed_.push_back({3 * kMiB, 5 * cs()});
  ExpectExactly(*r.image);
  MemImage r2 = Reopen(r);
  ASSERT_TRUE(r2.image);
  ExpectExactly(*r2.image);
}

INSTANTIATE_TEST_SUITE_P(Layouts, BitmapMarking,
                         ::testing::Values(Layout{128 * 1024, true}, Layout{65536, false},
                                           Layout{512, false}),
                         LayoutName);

// ---- operations ----

TEST(BitmapOps, ANewBitmapStartsCleanWhateverTheImageHolds) {
  MemImage m = CreateMem(Options(kSize));
  ASSERT_TRUE(m.image->Write(0, Pattern(1, kMiB), {}).ok());
  ASSERT_TRUE(Add(*m.image, "late").ok());
  EXPECT_BITS(*m.image, "late", Touched(kSize, 16, {}));
}

TEST(BitmapOps, ClearEmptiesAnEnabledBitmapThatThenKeepsTracking) {
  MemImage m = CreateMem(Options(kSize));
  ASSERT_TRUE(Add(*m.image, "e").ok());
  ASSERT_TRUE(Add(*m.image, "other").ok());
  ASSERT_TRUE(m.image->Write(0, Pattern(1, 3 * kMiB), {}).ok());
  ASSERT_TRUE(ClearBitmap(*m.image, "e").ok());
  EXPECT_BITS(*m.image, "e", Touched(kSize, 16, {}));
  EXPECT_BITS(*m.image, "other", Touched(kSize, 16, {{0, 3 * kMiB}}));  // untouched
  ASSERT_TRUE(m.image->Write(5 * kMiB, Pattern(2, 10), {}).ok());
  EXPECT_BITS(*m.image, "e", Touched(kSize, 16, {{5 * kMiB, 10}}));
  MemImage r = Reopen(m);
  ASSERT_TRUE(r.image);
  EXPECT_BITS(*r.image, "e", Touched(kSize, 16, {{5 * kMiB, 10}}));
  EXPECT_BITS(*r.image, "other", Touched(kSize, 16, {{0, 3 * kMiB}, {5 * kMiB, 10}}));
}

TEST(BitmapOps, ClearEmptiesADisabledBitmap) {
  MemImage m = CreateMem(Options(kSize));
  ASSERT_TRUE(Add(*m.image, "d", 12, false).ok());
  BitVector src = Touched(kSize, 12, {{kMiB, 3 * kMiB}});
  ASSERT_TRUE(MergeIntoBitmap(*m.image, "d", src, 12).ok());
  EXPECT_BITS(*m.image, "d", src);
  ASSERT_TRUE(ClearBitmap(*m.image, "d").ok());
  EXPECT_BITS(*m.image, "d", Touched(kSize, 12, {}));
  MemImage r = Reopen(m);
  ASSERT_TRUE(r.image);
  EXPECT_BITS(*r.image, "d", Touched(kSize, 12, {}));
  ASSERT_TRUE(r.image->Close().ok());
  ExpectCheckClean(*r.storage);
}

TEST(BitmapOps, DisabledBitmapsKeepTheirBitsAndEnablingResumesTracking) {
  MemImage m = CreateMem(Options(kSize));
  ASSERT_TRUE(Add(*m.image, "b").ok());
  ASSERT_TRUE(m.image->Write(0, Pattern(1, 100), {}).ok());  // A: tracked
  ASSERT_TRUE(SetBitmapEnabled(*m.image, "b", false).ok());
  EXPECT_FALSE(MustList(*m.image)[0].enabled);
  ASSERT_TRUE(m.image->Write(2 * kMiB, Pattern(2, 100), {}).ok());  // B: not tracked
  EXPECT_BITS(*m.image, "b", Touched(kSize, 16, {{0, 100}}));

  MemImage r = Reopen(m);  // disabled on disk too
  ASSERT_TRUE(r.image);
  EXPECT_FALSE(MustList(*r.image)[0].enabled);
  ASSERT_TRUE(r.image->Write(3 * kMiB, Pattern(3, 100), {}).ok());  // not tracked
  EXPECT_BITS(*r.image, "b", Touched(kSize, 16, {{0, 100}}));

  ASSERT_TRUE(SetBitmapEnabled(*r.image, "b", true).ok());
  EXPECT_TRUE(MustList(*r.image)[0].enabled);
  ASSERT_TRUE(r.image->Write(4 * kMiB, Pattern(4, 100), {}).ok());  // C: tracked
  const BitVector want = Touched(kSize, 16, {{0, 100}, {4 * kMiB, 100}});
  EXPECT_BITS(*r.image, "b", want);
  // Enabling or disabling twice changes nothing.
  ASSERT_TRUE(SetBitmapEnabled(*r.image, "b", true).ok());
  EXPECT_BITS(*r.image, "b", want);

  MemImage r2 = Reopen(r);
  ASSERT_TRUE(r2.image);
  EXPECT_TRUE(MustList(*r2.image)[0].enabled);
  EXPECT_BITS(*r2.image, "b", want);
  ASSERT_TRUE(r2.image->Close().ok());
  ExpectCheckClean(*r2.storage);
}

TEST(BitmapOps, RemoveFreesEverythingTheBitmapHeld) {
  MemImage m = CreateMem(Options(kSize));
  ASSERT_TRUE(Add(*m.image, "a").ok());
  ASSERT_TRUE(Add(*m.image, "b", 9).ok());
  ASSERT_TRUE(Add(*m.image, "c", 12, false).ok());
  ASSERT_TRUE(m.image->Write(kMiB, Pattern(1, kMiB), {}).ok());
  ASSERT_TRUE(MergeIntoBitmap(*m.image, "c", Touched(kSize, 12, {{0, kSize}}), 12).ok());

  ASSERT_TRUE(RemoveBitmap(*m.image, "b").ok());
  EXPECT_EQ(Names(*m.image), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(ReadBitmap(*m.image, "b").status().code(), Code::kNotFound);
  // The others go on as before.
  ASSERT_TRUE(m.image->Write(7 * kMiB, Pattern(2, 10), {}).ok());
  EXPECT_BITS(*m.image, "a", Touched(kSize, 16, {{kMiB, kMiB}, {7 * kMiB, 10}}));
  ASSERT_TRUE(m.image->Close().ok());
  ExpectCheckClean(*m.storage);

  MemImage r = Reopen(m);
  ASSERT_TRUE(r.image);
  EXPECT_EQ(Names(*r.image), (std::vector<std::string>{"a", "c"}));
  ASSERT_TRUE(RemoveBitmap(*r.image, "c").ok());  // a disabled one with data
  ASSERT_TRUE(RemoveBitmap(*r.image, "a").ok());  // the last one
  EXPECT_TRUE(Names(*r.image).empty());
  EXPECT_FALSE(r.image->header().bitmaps.has_value());
  EXPECT_EQ(r.image->header().autoclear_features & kAutoclearBitmaps, 0u);
  ASSERT_TRUE(r.image->Write(0, Pattern(3, 10), {}).ok());  // nothing tracks it
  ASSERT_TRUE(r.image->Close().ok());
  ExpectCheckClean(*r.storage);

  MemImage r2 = Reopen(r);
  ASSERT_TRUE(r2.image);
  EXPECT_TRUE(Names(*r2.image).empty());
  ASSERT_TRUE(Add(*r2.image, "a").ok());  // the name is free again
}

TEST(BitmapOps, MergeIsAByteRangeOrFromFinerIntoCoarser) {
  MemImage m = CreateMem(Options(kSize));
  ASSERT_TRUE(Add(*m.image, "t64", 16, false).ok());
  BitVector src(BitmapBits(kSize, 12));
  for (uint64_t bit : {0, 17, 31, 32, 100}) src.SetRange(bit, 1);
  ASSERT_TRUE(MergeIntoBitmap(*m.image, "t64", src, 12).ok());
  // [0, 4K) -> 0; [68K, 72K) and [124K, 128K) -> 1; [128K, 132K) -> 2;
  // [400K, 404K) -> 6.
  BitVector want(BitmapBits(kSize, 16));
  for (uint64_t bit : {0, 1, 2, 6}) want.SetRange(bit, 1);
  EXPECT_BITS(*m.image, "t64", want);
  // An OR: merging again, or merging nothing, keeps it.
  ASSERT_TRUE(MergeIntoBitmap(*m.image, "t64", src, 12).ok());
  ASSERT_TRUE(
      MergeIntoBitmap(*m.image, "t64", BitVector(BitmapBits(kSize, 12)), 12).ok());
  EXPECT_BITS(*m.image, "t64", want);
  MemImage r = Reopen(m);
  ASSERT_TRUE(r.image);
  EXPECT_BITS(*r.image, "t64", want);
}

TEST(BitmapOps, MergeIsAByteRangeOrFromCoarserIntoFiner) {
  MemImage m = CreateMem(Options(kSize));
  ASSERT_TRUE(Add(*m.image, "t4", 12).ok());  // enabled: merged into the tracked bits
  ASSERT_TRUE(m.image->Write(8 * kMiB, Pattern(1, 5000), {}).ok());
  BitVector src(BitmapBits(kSize, 16));
  src.SetRange(1, 1);  // [64K, 128K)
  src.SetRange(3, 1);  // [192K, 256K)
  ASSERT_TRUE(MergeIntoBitmap(*m.image, "t4", src, 16).ok());
  const BitVector want = Touched(
      kSize, 12, {{8 * kMiB, 5000}, {64 * 1024, 64 * 1024}, {192 * 1024, 64 * 1024}});
  EXPECT_BITS(*m.image, "t4", want);
  MemImage r = Reopen(m);
  ASSERT_TRUE(r.image);
  EXPECT_BITS(*r.image, "t4", want);
  ASSERT_TRUE(r.image->Close().ok());
  ExpectCheckClean(*r.storage);
}

TEST(BitmapOps, MergeClipsASourceGranuleAtTheEndOfTheDisk) {
  // 1 MiB + 4 KiB: the 64 KiB source granule 16 covers [1M, 1M + 64K),
  // only 4 KiB of which is disk; granules past the disk are ignored.
  const uint64_t size = kMiB + 4096;
  MemImage m = CreateMem(Options(size));
  ASSERT_TRUE(Add(*m.image, "t", 12, false).ok());
  BitVector src(BitmapBits(size, 16) + 8);
  src.SetRange(16, 8);
  ASSERT_TRUE(MergeIntoBitmap(*m.image, "t", src, 16).ok());
  EXPECT_BITS(*m.image, "t", Touched(size, 12, {{kMiB, 4096}}));
}

// ---- errors ----

TEST(BitmapErrors, NamesAreOneTo1023BytesAndUnique) {
  MemImage m = CreateMem(Options(kSize));
  ASSERT_TRUE(Add(*m.image, "b").ok());
  EXPECT_EQ(Add(*m.image, "b").code(), Code::kInvalidArgument);
  EXPECT_EQ(Add(*m.image, "b", 12, false).code(), Code::kInvalidArgument);
  EXPECT_EQ(Add(*m.image, "").code(), Code::kInvalidArgument);
  EXPECT_EQ(Add(*m.image, std::string(1024, 'n')).code(), Code::kInvalidArgument);
  ASSERT_TRUE(Add(*m.image, std::string(1023, 'n')).ok());
  EXPECT_EQ(Names(*m.image), (std::vector<std::string>{"b", std::string(1023, 'n')}));
  MemImage r = Reopen(m);
  ASSERT_TRUE(r.image);
  EXPECT_EQ(Names(*r.image), (std::vector<std::string>{"b", std::string(1023, 'n')}));
}

TEST(BitmapErrors, GranularityIsFrom512BytesTo2GiB) {
  MemImage m = CreateMem(Options(kSize));
  EXPECT_EQ(Add(*m.image, "g8", 8).code(), Code::kInvalidArgument);
  EXPECT_EQ(Add(*m.image, "g32", 32).code(), Code::kInvalidArgument);
  EXPECT_EQ(Add(*m.image, "g0", 0).code(), Code::kInvalidArgument);
  ASSERT_TRUE(Add(*m.image, "g9", 9).ok());
  ASSERT_TRUE(Add(*m.image, "g31", 31).ok());
  EXPECT_EQ(Names(*m.image), (std::vector<std::string>{"g9", "g31"}));
}

TEST(BitmapErrors, TooManyBitsForTheDiskIsRefused) {
  // qemu: "Too much space will be occupied by the bitmap. Use larger granularity".
  MemImage m = CreateMem(Options((2ull << 40) + 512));
  EXPECT_EQ(Add(*m.image, "fine", 9, false).code(), Code::kInvalidArgument);
  EXPECT_TRUE(Names(*m.image).empty());
}

TEST(BitmapErrors, UnknownNamesAreNotFound) {
  MemImage m = CreateMem(Options(kSize));
  ASSERT_TRUE(Add(*m.image, "known").ok());
  BitVector src(BitmapBits(kSize, 16));
  EXPECT_EQ(ReadBitmap(*m.image, "nosuch").status().code(), Code::kNotFound);
  EXPECT_EQ(RemoveBitmap(*m.image, "nosuch").code(), Code::kNotFound);
  EXPECT_EQ(ClearBitmap(*m.image, "nosuch").code(), Code::kNotFound);
  EXPECT_EQ(SetBitmapEnabled(*m.image, "nosuch", false).code(), Code::kNotFound);
  EXPECT_EQ(SetBitmapEnabled(*m.image, "nosuch", true).code(), Code::kNotFound);
  EXPECT_EQ(MergeIntoBitmap(*m.image, "nosuch", src, 16).code(), Code::kNotFound);
  EXPECT_EQ(RemoveBitmap(*m.image, "Known").code(), Code::kNotFound);  // case matters
  EXPECT_EQ(Names(*m.image), (std::vector<std::string>{"known"}));
}

TEST(BitmapErrors, AReadOnlyImageListsAndReadsButChangesNothing) {
  MemImage m = CreateMem(Options(kSize));
  ASSERT_TRUE(Add(*m.image, "e").ok());
  ASSERT_TRUE(m.image->Write(kMiB, Pattern(1, 10), {}).ok());
  OpenOptions ro;
  ro.read_only = true;
  MemImage r = Reopen(m, ro);
  ASSERT_TRUE(r.image);
  EXPECT_EQ(Names(*r.image), (std::vector<std::string>{"e"}));
  EXPECT_BITS(*r.image, "e", Touched(kSize, 16, {{kMiB, 10}}));
  EXPECT_EQ(Add(*r.image, "new").code(), Code::kReadOnly);
  EXPECT_EQ(RemoveBitmap(*r.image, "e").code(), Code::kReadOnly);
  EXPECT_EQ(ClearBitmap(*r.image, "e").code(), Code::kReadOnly);
  EXPECT_EQ(SetBitmapEnabled(*r.image, "e", false).code(), Code::kReadOnly);
  EXPECT_EQ(MergeIntoBitmap(*r.image, "e", BitVector(BitmapBits(kSize, 16)), 16).code(),
            Code::kReadOnly);
  EXPECT_EQ(Names(*r.image), (std::vector<std::string>{"e"}));
}

TEST(BitmapErrors, AVersion2ImageHasNoPlaceForBitmaps) {
  CreateOptions co = Options(kSize, 65536, false);
  co.version = 2;
  co.compression_type = CompressionType::kZlib;
  MemImage m = CreateMem(co);
  ASSERT_TRUE(m.image);
  EXPECT_EQ(Add(*m.image, "b").code(), Code::kNotSupported);
  EXPECT_TRUE(Names(*m.image).empty());
  EXPECT_EQ(ReadBitmap(*m.image, "b").status().code(), Code::kNotFound);
}

TEST(BitmapErrors, OperationsOnAClosedImageFail) {
  MemImage m = CreateMem(Options(kSize));
  ASSERT_TRUE(Add(*m.image, "e").ok());
  ASSERT_TRUE(m.image->Close().ok());
  EXPECT_FALSE(Add(*m.image, "f").ok());
  EXPECT_FALSE(ClearBitmap(*m.image, "e").ok());
  EXPECT_FALSE(RemoveBitmap(*m.image, "e").ok());
}

TEST(BitmapDefaults, GranularityIsTheClusterSizeWithin4KiBAnd64KiB) {
  // qemu-img bitmap --add's default: 512 -> 4K, 4K -> 4K, 32K -> 32K,
  // 64K -> 64K, 128K -> 64K, 2M -> 64K.
  const std::pair<uint32_t, uint32_t> cases[] = {
      {512, 12}, {4096, 12}, {32768, 15}, {65536, 16}, {131072, 16}, {2u << 20, 16}};
  for (auto [cluster, bits] : cases) {
    MemImage m = CreateMem(Options(kSize, cluster, false));
    ASSERT_TRUE(m.image) << cluster;
    EXPECT_EQ(DefaultBitmapGranularityBits(*m.image), bits) << cluster;
  }
}

}  // namespace
}  // namespace thindisk::qcow2
