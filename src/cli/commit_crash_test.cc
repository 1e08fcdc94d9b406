// The whole of `commit` (CommitInto: copy into BASE, flush, then empty the
// overlay) under a power cut at every announced step of either image. After
// the cut: both images pass check; BASE holds, per sector, its old content
// or the committed one; the guest view through the overlay is the one it had
// before the commit, at every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "cli/chain_ops.h"
#include "io/faulty_storage.h"
#include "io/memory_storage.h"
#include "qcow2/check.h"
#include "qcow2/image.h"
#include "qcow2/image_test_util.h"

namespace thindisk::cli {
namespace {

using qcow2::testing::BackedBy;
using qcow2::testing::Pattern;

constexpr uint64_t kSize = 4 << 20;
constexpr uint64_t kSector = 512;

qcow2::OpenOptions ReadOnly() {
  qcow2::OpenOptions oo;
  oo.read_only = true;
  return oo;
}

std::vector<uint8_t> ReadAll(block::Device& dev) {
  std::vector<uint8_t> bytes(dev.size());
  Status s = dev.Read(0, bytes);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return bytes;
}

// Images before the commit: BASE (qcow2, written with `base`), and an
// overlay on it holding data, subcluster pieces and zeros.
struct Chain {
  std::unique_ptr<io::MemoryStorage> base_file;
  std::unique_ptr<io::MemoryStorage> overlay_file;
  std::vector<uint8_t> base;  // BASE's content
  std::vector<uint8_t> view;  // the guest view through the overlay
};

Chain MakeChain(uint32_t cluster, bool ext) {
  Chain c;
  c.base = Pattern(7, kSize);
  qcow2::CreateOptions co;
  co.size = kSize;
  co.cluster_size = cluster;
  co.extended_l2 = ext;
  {
    auto mem = io::NewMemoryStorage("base.qcow2");
    EXPECT_TRUE(qcow2::Create(*mem, co).ok());
    auto img = qcow2::Image::Open(std::move(mem), {});
    EXPECT_TRUE(img.has_value());
    // The last quarter of BASE stays unallocated (zeros).
    std::fill(c.base.begin() + 3 * kSize / 4, c.base.end(), 0);
    EXPECT_TRUE((*img)->Write(0, std::span(c.base).first(3 * kSize / 4)).ok());
    EXPECT_TRUE((*img)->Close().ok());
    c.base_file = static_cast<io::MemoryStorage&>((*img)->storage()).Clone();
  }
  co.backing_file = "base.qcow2";
  auto mem = io::NewMemoryStorage("overlay.qcow2");
  EXPECT_TRUE(qcow2::Create(*mem, co).ok());
  auto img = qcow2::Image::Open(std::move(mem), BackedBy(c.base));
  EXPECT_TRUE(img.has_value());
  c.view = c.base;
  auto write = [&](uint64_t off, uint64_t len, uint64_t seed) {
    auto data = Pattern(seed, len);
    EXPECT_TRUE((*img)->Write(off, data).ok());
    std::copy(data.begin(), data.end(), c.view.begin() + off);
  };
  write(0, 3 * uint64_t(cluster), 1);
  write(5 * uint64_t(cluster) + 4096, 8192, 2);             // a piece of a cluster
  write(kSize - 2 * uint64_t(cluster) - 512, 1536, 3);      // across a boundary, into the zeros
  EXPECT_TRUE((*img)->WriteZeroes(8 * uint64_t(cluster), 2 * uint64_t(cluster), {}).ok());
  std::fill(c.view.begin() + 8 * cluster, c.view.begin() + 10 * cluster, 0);
  EXPECT_TRUE((*img)->Close().ok());
  c.overlay_file = static_cast<io::MemoryStorage&>((*img)->storage()).Clone();
  return c;
}

// Check finds no corruption in `file`.
void ExpectClean(io::Storage& file, const char* which) {
  auto report = qcow2::Check(file, qcow2::RepairMode::kNone);
  ASSERT_TRUE(report.has_value()) << which << ": " << report.status().ToString();
  EXPECT_EQ(report->corruptions, 0u) << which;
}

// Every sector of `got` equals `a` or `b` there.
void ExpectEachSectorOneOf(const std::vector<uint8_t>& got, const std::vector<uint8_t>& a,
                           const std::vector<uint8_t>& b, const char* which) {
  ASSERT_EQ(got.size(), a.size());
  for (uint64_t s = 0; s < got.size(); s += kSector) {
    bool is_a = std::equal(got.begin() + s, got.begin() + s + kSector, a.begin() + s);
    bool is_b = std::equal(got.begin() + s, got.begin() + s + kSector, b.begin() + s);
    ASSERT_TRUE(is_a || is_b) << which << ": sector at " << s << " is neither old nor new";
  }
}

io::FaultyStorage::EventFault CutAt(int ev, uint64_t nth) {
  io::FaultyStorage::EventFault f;
  f.event = io::Event(ev);
  f.nth = nth;
  f.freeze = true;
  f.freeze_after_next = nth % 2 == 0;
  return f;
}

constexpr io::PowerLossMode kModes[] = {io::PowerLossMode::kDropUnflushed,
                                        io::PowerLossMode::kTearLast,
                                        io::PowerLossMode::kKeepRandomSubset};

struct Layout {
  uint32_t cluster;
  bool ext;
};

class CommitCrashTest : public ::testing::TestWithParam<Layout> {};

TEST_P(CommitCrashTest, UncutCommitMovesTheViewIntoBase) {
  Chain c = MakeChain(GetParam().cluster, GetParam().ext);
  auto base = qcow2::Image::Open(c.base_file->Clone(), {});
  ASSERT_TRUE(base.has_value());
  auto top = qcow2::Image::Open(c.overlay_file->Clone(), BackedBy(c.base));
  ASSERT_TRUE(top.has_value());
  Progress quiet(false);
  ASSERT_TRUE(CommitInto(**top, **base, 1, true, quiet).ok());
  // The overlay is empty: everything reads through.
  auto e = (*top)->GetStatus(0, kSize);
  ASSERT_TRUE(e.has_value()) << e.status().ToString();
  EXPECT_EQ(e->length, kSize);
  EXPECT_EQ(e->depth, 1u);
  ASSERT_TRUE((*top)->Close().ok());
  auto new_base = static_cast<io::MemoryStorage&>((*base)->storage()).Clone();
  ExpectClean(*new_base, "base");
  auto reopened = qcow2::Image::Open(std::move(new_base), {});
  ASSERT_TRUE(reopened.has_value());
  EXPECT_TRUE(ReadAll(**reopened) == c.view) << "BASE does not hold the overlay's view";
}

// A power cut while the data goes into BASE (or when it is flushed): the
// overlay must not have been emptied, so the guest still sees its view.
TEST_P(CommitCrashTest, CutWhileCopyingIntoBase) {
  Chain c = MakeChain(GetParam().cluster, GetParam().ext);
  int cuts = 0;
  for (int ev = 0; ev < io::kEventCount; ++ev) {
    for (uint64_t nth = 1; nth <= 6; ++nth) {
      auto faulty_or = io::NewFaultyStorage(c.base_file->Clone());
      ASSERT_TRUE(faulty_or.has_value());
      io::FaultyStorage* faulty = faulty_or->get();
      faulty->FailAtEvent(CutAt(ev, nth));
      auto base = qcow2::Image::Open(std::move(*faulty_or), {});
      ASSERT_TRUE(base.has_value());
      auto top_file = c.overlay_file->Clone();
      io::MemoryStorage* top_mem = top_file.get();
      auto top = qcow2::Image::Open(std::move(top_file), BackedBy(c.base));
      ASSERT_TRUE(top.has_value());
      Progress quiet(false);
      Status s = CommitInto(**top, **base, 1, true, quiet);
      if (!faulty->event_fault_fired()) continue;
      SCOPED_TRACE(std::string("power cut in BASE at ") + io::EventName(io::Event(ev)) + " #" +
                   std::to_string(nth));
      ++cuts;
      EXPECT_FALSE(s.ok()) << "commit went on after BASE stopped persisting";
      (void)(*top)->Close();
      for (auto mode : kModes) {
        auto after = faulty->SimulatePowerLoss(mode, nth);
        ASSERT_TRUE(after.has_value());
        ExpectClean(**after, "base");
        auto survivor = qcow2::Image::Open(std::move(*after), ReadOnly());
        ASSERT_TRUE(survivor.has_value()) << survivor.status().ToString();
        std::vector<uint8_t> base_now = ReadAll(**survivor);
        ExpectEachSectorOneOf(base_now, c.base, c.view, "base");
        auto top_after = top_mem->Clone();
        ExpectClean(*top_after, "overlay");
        auto overlay = qcow2::Image::Open(std::move(top_after), BackedBy(base_now, true));
        ASSERT_TRUE(overlay.has_value());
        ASSERT_TRUE(ReadAll(**overlay) == c.view) << "the guest view through the overlay changed";
      }
    }
  }
  EXPECT_GT(cuts, 5);
}

// A power cut while the overlay is emptied (BASE is complete and durable):
// each range reads from the overlay or through to BASE, the same either way.
TEST_P(CommitCrashTest, CutWhileEmptyingTheOverlay) {
  Chain c = MakeChain(GetParam().cluster, GetParam().ext);
  int cuts = 0;
  for (int ev = 0; ev < io::kEventCount; ++ev) {
    for (uint64_t nth = 1; nth <= 6; ++nth) {
      auto base = qcow2::Image::Open(c.base_file->Clone(), {});
      ASSERT_TRUE(base.has_value());
      auto faulty_or = io::NewFaultyStorage(c.overlay_file->Clone());
      ASSERT_TRUE(faulty_or.has_value());
      io::FaultyStorage* faulty = faulty_or->get();
      faulty->FailAtEvent(CutAt(ev, nth));
      auto top = qcow2::Image::Open(std::move(*faulty_or), BackedBy(c.base));
      ASSERT_TRUE(top.has_value());
      Progress quiet(false);
      (void)CommitInto(**top, **base, 1, true, quiet);
      if (!faulty->event_fault_fired()) continue;
      SCOPED_TRACE(std::string("power cut in the overlay at ") + io::EventName(io::Event(ev)) +
                   " #" + std::to_string(nth));
      ++cuts;
      auto base_file = static_cast<io::MemoryStorage&>((*base)->storage()).Clone();
      ExpectClean(*base_file, "base");
      auto base_after = qcow2::Image::Open(std::move(base_file), ReadOnly());
      ASSERT_TRUE(base_after.has_value());
      std::vector<uint8_t> base_now = ReadAll(**base_after);
      ASSERT_TRUE(base_now == c.view) << "BASE is not complete before the overlay changes";
      for (auto mode : kModes) {
        auto after = faulty->SimulatePowerLoss(mode, nth);
        ASSERT_TRUE(after.has_value());
        ExpectClean(**after, "overlay");
        auto overlay = qcow2::Image::Open(std::move(*after), BackedBy(base_now, true));
        ASSERT_TRUE(overlay.has_value()) << overlay.status().ToString();
        ASSERT_TRUE(ReadAll(**overlay) == c.view) << "the guest view through the overlay changed";
      }
      (*top).reset();
    }
  }
  EXPECT_GT(cuts, 2);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CommitCrashTest,
                         ::testing::Values(Layout{65536, false}, Layout{131072, true},
                                           Layout{4096, false}),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return std::to_string(info.param.cluster / 1024) + "k" +
                                  (info.param.ext ? "_xl2" : "");
                         });

}  // namespace
}  // namespace thindisk::cli
