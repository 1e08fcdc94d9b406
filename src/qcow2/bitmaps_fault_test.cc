// Bitmap operations that fail part-way (bitmaps.h: "A failure part-way
// leaves the old or the new state on disk, plus leaked clusters at most").
// Each operation runs with its n-th write (or flush) failing, for every n
// until one run needs fewer; then the storage heals and the guest writes
// once more. Whatever state the failure left, every bitmap the image lists
// as enabled must have tracked that later write, in the session and after a
// reopen, and the check finds no corruption.
#include <gtest/gtest.h>

#include "io/faulty_storage.h"
#include "qcow2/bitmaps.h"
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
using testing::Options;
using testing::Pattern;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kSize = 16 * kMiB;
constexpr ByteRange kBefore = {kMiB, 4096};         // written before the operation
constexpr ByteRange kAfter = {6 * kMiB + 1, 4096};  // written after it failed

enum class Op {
  kRemove,
  kDisable,
  kEnable,
  kClear,
  kMergeIntoEnabled,
  kMergeIntoDisabled,
  kAdd,
  kGrow
};

struct FaultCase {
  Op op;
  const char* name;
  bool fail_flush;  // the n-th flush fails instead of the n-th write
};

std::string CaseName(const ::testing::TestParamInfo<FaultCase>& p) {
  return std::string(p.param.name) +
         (p.param.fail_flush ? "FailingFlush" : "FailingWrite");
}

// "keep" (enabled, 64 KiB), "victim" (enabled, 4 KiB), "off" (disabled).
std::unique_ptr<io::MemoryStorage> Prepared() {
  MemImage m = CreateMem(Options(kSize));
  EXPECT_TRUE(Add(*m.image, "keep", 16).ok());
  EXPECT_TRUE(Add(*m.image, "victim", 12).ok());
  EXPECT_TRUE(Add(*m.image, "off", 16, false).ok());
  EXPECT_TRUE(m.image->Close().ok());
  return m.storage->Clone();
}

Status RunOp(Image& img, Op op) {
  switch (op) {
    case Op::kRemove:
      return RemoveBitmap(img, "victim");
    case Op::kDisable:
      return SetBitmapEnabled(img, "victim", false);
    case Op::kEnable:
      return SetBitmapEnabled(img, "off", true);
    case Op::kClear:
      return ClearBitmap(img, "victim");
    case Op::kMergeIntoEnabled:
      return MergeIntoBitmap(img, "victim", testing::Touched(kSize, 16, {{0, 8 * kMiB}}),
                             16);
    case Op::kMergeIntoDisabled:
      return MergeIntoBitmap(img, "off", testing::Touched(kSize, 16, {{0, 8 * kMiB}}),
                             16);
    case Op::kAdd:
      return Add(img, "new", 9);
    case Op::kGrow:
      return img.Resize(2 * kSize, false);
  }
  return Status::Internal("unknown op");
}

// Every bitmap `image` lists as enabled and consistent marks `r`.
void ExpectEnabledBitmapsMark(Image& image, ByteRange r, const std::string& when) {
  for (const BitmapInfo& b : MustList(image)) {
    if (!b.enabled || !b.consistent()) continue;
    const BitVector bits = MustRead(image, b.name);
    const uint64_t first = r.offset >> b.granularity_bits;
    EXPECT_TRUE(first < bits.size() && bits.Test(first))
        << when << ": bitmap '" << b.name
        << "' is listed as enabled but missed the write at " << r.offset << " ("
        << testing::SetRuns(bits) << ")";
  }
}

class BitmapOpFaults : public ::testing::TestWithParam<FaultCase> {};

TEST_P(BitmapOpFaults, EnabledBitmapsKeepTrackingWhateverStateAFailureLeaves) {
  const FaultCase& c = GetParam();
  const std::unique_ptr<io::MemoryStorage> prepared = Prepared();
  bool fired = true;
  for (uint64_t n = 1; fired && n <= 40; ++n) {
    SCOPED_TRACE("failing " + std::string(c.fail_flush ? "flush" : "write") + " " +
                 std::to_string(n));
    std::shared_ptr<io::MemoryStorage> base(prepared->Clone());
    auto faulty_or = io::NewFaultyStorage(base);
    ASSERT_TRUE(faulty_or.has_value());
    io::FaultyStorage* faulty = faulty_or->get();
    OpenOptions oo;
    oo.bitmap_mark_ahead = 64 * 1024;  // kBefore's marks do not cover kAfter
    auto img_or = Image::Open(std::move(*faulty_or), oo);
    ASSERT_TRUE(img_or.has_value()) << img_or.status().ToString();
    Image& img = **img_or;
    ASSERT_TRUE(img.Write(kBefore.offset, Pattern(1, kBefore.length), {}).ok());

    if (c.fail_flush) {
      faulty->FailNthFlush(n);
    } else {
      faulty->FailNthWrite(n);
    }
    const Status s = RunOp(img, c.op);
    fired = faulty->faults_injected() > 0;
    faulty->ClearFaults();
    if (fired) {
      EXPECT_FALSE(s.ok()) << "an operation whose write failed reported success";
    } else {
      EXPECT_TRUE(s.ok()) << s.ToString();
    }

    ASSERT_TRUE(img.Write(kAfter.offset, Pattern(2, kAfter.length), {}).ok());
    ExpectEnabledBitmapsMark(img, kAfter, "in the session");
    ASSERT_TRUE(img.Close().ok());
    ExpectCheckClean(*base, /*leaks_allowed=*/true);

    OpenOptions ro;
    ro.read_only = true;
    auto again = Image::Open(base->Clone(), ro);
    ASSERT_TRUE(again.has_value()) << again.status().ToString();
    ExpectEnabledBitmapsMark(**again, kAfter, "after reopening");
  }
  EXPECT_FALSE(fired) << "the operation still wrote after 40 injected faults";
}

// A power cut part-way (the disk dies at the n-th write, or every flush
// from the n-th on fails): the old or the new state, never a corrupt image
// nor an inconsistent bitmap, and "keep" still marks what was written
// before the operation.
TEST_P(BitmapOpFaults, PowerLossPartWayLeavesTheOldOrTheNewState) {
  const FaultCase& c = GetParam();
  const std::unique_ptr<io::MemoryStorage> prepared = Prepared();
  bool fired = true;
  for (uint64_t n = 1; fired && n <= 40; ++n) {
    for (io::PowerLossMode mode :
         {io::PowerLossMode::kDropUnflushed, io::PowerLossMode::kKeepRandomSubset}) {
      SCOPED_TRACE("power cut at " + std::string(c.fail_flush ? "flush " : "write ") +
                   std::to_string(n) + ", mode " + std::to_string(int(mode)));
      auto faulty_or =
          io::NewFaultyStorage(std::shared_ptr<io::Storage>(prepared->Clone()));
      ASSERT_TRUE(faulty_or.has_value());
      io::FaultyStorage* faulty = faulty_or->get();
      auto img = Image::Open(std::move(*faulty_or), {});
      ASSERT_TRUE(img.has_value()) << img.status().ToString();
      ASSERT_TRUE((*img)->Write(kBefore.offset, Pattern(1, kBefore.length), {}).ok());
      if (c.fail_flush) {
        faulty->FailNthFlush(n, EIO, /*persistent=*/true);
      } else {
        faulty->FailNthWrite(n, EIO, /*persistent=*/true);
      }
      (void)RunOp(**img, c.op);
      fired = faulty->faults_injected() > 0;
      auto after = faulty->SimulatePowerLoss(mode, n);
      ASSERT_TRUE(after.has_value()) << after.status().ToString();
      (*img).reset();

      std::shared_ptr<io::MemoryStorage> survivor(std::move(*after));
      ExpectCheckClean(*survivor, /*leaks_allowed=*/true);
      auto rw = Image::Open(survivor->Clone(), {});
      ASSERT_TRUE(rw.has_value()) << rw.status().ToString();
      bool keep_seen = false;
      for (const BitmapInfo& b : MustList(**rw)) {
        EXPECT_TRUE(b.consistent()) << b.name << ": " << b.problem;
        if (b.name != "keep" && (b.name != "victim" || c.op == Op::kClear)) continue;
        keep_seen |= b.name == "keep";
        const BitVector bits = MustRead(**rw, b.name);
        EXPECT_TRUE(bits.size() > (kBefore.offset >> b.granularity_bits) &&
                    bits.Test(kBefore.offset >> b.granularity_bits))
            << b.name << " lost the write made before the operation";
      }
      EXPECT_TRUE(keep_seen);
      ASSERT_TRUE((*rw)->Close().ok());
    }
  }
  EXPECT_FALSE(fired) << "the operation still wrote after 40 injected faults";
}

INSTANTIATE_TEST_SUITE_P(
    Ops, BitmapOpFaults,
    ::testing::Values(
        FaultCase{Op::kRemove, "Remove", false}, FaultCase{Op::kRemove, "Remove", true},
        FaultCase{Op::kDisable, "Disable", false},
        FaultCase{Op::kDisable, "Disable", true}, FaultCase{Op::kEnable, "Enable", false},
        FaultCase{Op::kEnable, "Enable", true}, FaultCase{Op::kClear, "Clear", false},
        FaultCase{Op::kClear, "Clear", true},
        FaultCase{Op::kMergeIntoEnabled, "MergeIntoEnabled", false},
        FaultCase{Op::kMergeIntoEnabled, "MergeIntoEnabled", true},
        FaultCase{Op::kMergeIntoDisabled, "MergeIntoDisabled", false},
        FaultCase{Op::kAdd, "Add", false}, FaultCase{Op::kAdd, "Add", true},
        FaultCase{Op::kGrow, "Grow", false}, FaultCase{Op::kGrow, "Grow", true}),
    CaseName);

}  // namespace
}  // namespace thindisk::qcow2
