// Snapshot create, apply and delete with a fault at every step they take
// (docs/write-ordering.md "Snapshots"): an I/O error once, a power cut
// before the step's write (dropping, or keeping any subset of, the unflushed
// writes), and a power cut during it (the write torn). The image left
// behind must
//  (a) pass qcow2::Check with leaks at most, except that an image whose
//      dirty bit is set may show OFLAG_COPIED mismatches (the bit tells
//      every reader to rebuild refcounts and flags before use);
//  (b) after a read-write open (which repairs a dirty image) pass Check
//      with no corruption;
//  (c) hold either the old or the new snapshot list, and every snapshot and
//      the active image read exactly what they held (the active image:
//      before or after an apply).
#include "io/faulty_storage.h"
#include "qcow2/check.h"
#include "qcow2/image_test_util.h"
#include "qcow2/snapshot.h"

namespace thindisk::qcow2 {
namespace {

using testing::Pattern;

constexpr uint64_t kSize = 2 << 20;

enum class Op { kCreate, kApply, kDelete };

struct CrashCase {
  Op op;
  uint32_t cluster;
  bool ext;
};

std::string OpName(Op op) {
  return op == Op::kCreate ? "create" : op == Op::kApply ? "apply" : "delete";
}

// Contents the base image holds: snapshot "k" = zeros, "s0" = a, the
// active image = b.
struct Base {
  std::unique_ptr<io::MemoryStorage> storage;
  std::vector<uint8_t> a, b;
};

Base MakeBase(const CrashCase& c) {
  Base base;
  auto mem = io::NewMemoryStorage("snap.qcow2");
  CreateOptions o;
  o.size = kSize;
  o.cluster_size = c.cluster;
  o.extended_l2 = c.ext;
  EXPECT_TRUE(Create(*mem, o).ok());
  auto img = Image::Open(std::move(mem), {});
  EXPECT_TRUE(img.has_value());
  // "k" (all zeros) keeps the table non-empty when s0 is deleted, without
  // sharing a cluster: deleting s0 then leaves clusters only the active
  // image holds, which must get COPIED back.
  EXPECT_TRUE(CreateSnapshot(**img, {"k"}).ok());
  base.a.assign(kSize, 0);
  std::vector<uint8_t> text(c.cluster);
  for (size_t i = 0; i < text.size(); ++i) text[i] = uint8_t("compress me "[i % 12]);
  EXPECT_TRUE((*img)->WriteCompressed(kSize - c.cluster, text).ok());
  std::copy(text.begin(), text.end(), base.a.end() - c.cluster);
  auto d = Pattern(1, 700000);
  EXPECT_TRUE((*img)->Write(3000, d).ok());
  std::copy(d.begin(), d.end(), base.a.begin() + 3000);
  EXPECT_TRUE(CreateSnapshot(**img, {"s0"}).ok());
  base.b = base.a;
  auto e = Pattern(2, 300000);
  EXPECT_TRUE((*img)->Write(100000, e).ok());
  std::copy(e.begin(), e.end(), base.b.begin() + 100000);
  EXPECT_TRUE((*img)->Close().ok());
  base.storage = static_cast<io::MemoryStorage&>((*img)->storage()).Clone();
  return base;
}

Status RunOp(Op op, Image& img) {
  switch (op) {
    case Op::kCreate:
      return CreateSnapshot(img, {"s1"});
    case Op::kApply:
      return ApplySnapshot(img, "s0");
    case Op::kDelete:
      return DeleteSnapshot(img, "s0");
  }
  return Status::Internal("unknown op");
}

std::vector<uint8_t> ReadAll(Image& img) {
  std::vector<uint8_t> got(img.size());
  EXPECT_TRUE(img.Read(0, got).ok());
  return got;
}

std::string Lines(const CheckReport& r) {
  std::string all;
  for (auto& m : r.messages) all += m + "\n";
  return all;
}

// (a), (b), (c) on the bytes a crash left behind.
void ExpectSurvivor(io::MemoryStorage& survivor, const CrashCase& c, const Base& base) {
  // (a)
  auto report = Check(survivor, RepairMode::kNone);
  ASSERT_TRUE(report.has_value()) << report.status().ToString();
  OpenOptions ro;
  ro.read_only = true;
  auto peek = Image::Open(survivor.Clone(), ro);
  ASSERT_TRUE(peek.has_value()) << peek.status().ToString();
  bool dirty = (*peek)->header().incompatible_features & kIncompatDirty;
  for (const std::string& line : report->messages) {
    if (line.rfind("ERROR", 0) != 0) continue;
    EXPECT_TRUE(dirty && line.find("OFLAG_COPIED") != std::string::npos)
        << "corruption in a " << (dirty ? "dirty" : "clean") << " image:\n"
        << Lines(*report);
  }
  // (b)
  auto img = Image::Open(survivor.Clone(), {});
  ASSERT_TRUE(img.has_value()) << img.status().ToString();
  ASSERT_TRUE((*img)->Close().ok());
  auto repaired = static_cast<io::MemoryStorage&>((*img)->storage()).Clone();
  auto after = Check(*repaired, RepairMode::kNone);
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->corruptions, 0u) << Lines(*after);
  // (c)
  auto live = Image::Open(repaired->Clone(), {});
  ASSERT_TRUE(live.has_value());
  auto list = ListSnapshots(**live);
  ASSERT_TRUE(list.has_value()) << list.status().ToString();
  std::vector<std::string> names;
  for (const Snapshot& s : *list) names.push_back(s.name);
  using Names = std::vector<std::string>;
  std::vector<uint8_t> active = ReadAll(**live);
  switch (c.op) {
    case Op::kCreate:
      EXPECT_TRUE(names == (Names{"k", "s0"}) || names == (Names{"k", "s0", "s1"}));
      EXPECT_TRUE(active == base.b);
      break;
    case Op::kApply:
      EXPECT_TRUE(names == (Names{"k", "s0"}));
      EXPECT_TRUE(active == base.a || active == base.b);
      break;
    case Op::kDelete:
      EXPECT_TRUE(names == (Names{"k", "s0"}) || names == Names{"k"});
      EXPECT_TRUE(active == base.b);
      break;
  }
  ASSERT_TRUE((*live)->Close().ok());
  for (const std::string& name : names) {
    auto view = Image::Open(repaired->Clone(), {});
    ASSERT_TRUE(view.has_value());
    ASSERT_TRUE(ApplySnapshot(**view, name).ok());
    std::vector<uint8_t> want = name == "s0"  ? base.a
                                : name == "k" ? std::vector<uint8_t>(kSize, 0)
                                              : base.b;
    EXPECT_TRUE(ReadAll(**view) == want) << "snapshot " << name;
  }
}

struct Fault {
  const char* what;
  bool power_loss;
  io::FaultyStorage::EventFault fault;
  io::PowerLossMode mode;
};

class SnapshotCrashTest : public ::testing::TestWithParam<CrashCase> {};

TEST_P(SnapshotCrashTest, EveryStepLeavesOldOrNewSnapshotSet) {
  const CrashCase& c = GetParam();
  Base base = MakeBase(c);
  ASSERT_TRUE(base.storage);

  // A clean run counts the steps the operation announces.
  uint64_t counts[io::kEventCount] = {};
  {
    auto faulty =
        io::NewFaultyStorage(std::shared_ptr<io::Storage>(base.storage->Clone()));
    ASSERT_TRUE(faulty.has_value());
    io::FaultyStorage* f = faulty->get();
    auto img = Image::Open(std::move(*faulty), {});
    ASSERT_TRUE(img.has_value());
    uint64_t before[io::kEventCount];
    for (int e = 0; e < io::kEventCount; ++e) before[e] = f->event_count(io::Event(e));
    ASSERT_TRUE(RunOp(c.op, **img).ok());
    for (int e = 0; e < io::kEventCount; ++e)
      counts[e] = f->event_count(io::Event(e)) - before[e];
    ASSERT_GT(counts[int(io::Event::kHeaderUpdate)], 0u);
    if (c.op != Op::kApply) {
      ASSERT_GT(counts[int(io::Event::kSnapshotTable)], 0u);
    }
  }

  int cases = 0;
  for (int e = 0; e < io::kEventCount; ++e) {
    for (uint64_t nth = 1; nth <= counts[e]; ++nth) {
      io::Event event = io::Event(e);
      std::vector<Fault> faults = {
          {"EIO once", false, {event, nth, EIO, false, false, false}, {}},
          {"EIO from then on", false, {event, nth, EIO, true, false, false}, {}},
          {"power cut before it, unflushed dropped",
           true,
           {event, nth, EIO, true, true, false},
           io::PowerLossMode::kDropUnflushed},
          {"power cut after it, random subset kept",
           true,
           {event, nth, EIO, true, true, true},
           io::PowerLossMode::kKeepRandomSubset},
          {"power cut during it, write torn",
           true,
           {event, nth, EIO, true, true, true},
           io::PowerLossMode::kTearLast},
      };
      for (const Fault& fault : faults) {
        SCOPED_TRACE(OpName(c.op) + ": " + fault.what + " at " + io::EventName(event) +
                     " #" + std::to_string(nth));
        auto mem = std::shared_ptr<io::Storage>(base.storage->Clone());
        auto faulty = io::NewFaultyStorage(mem);
        ASSERT_TRUE(faulty.has_value());
        io::FaultyStorage* f = faulty->get();
        auto img = Image::Open(std::move(*faulty), {});
        ASSERT_TRUE(img.has_value());
        f->FailAtEvent(fault.fault);
        (void)RunOp(c.op, **img);
        std::unique_ptr<io::MemoryStorage> survivor;
        if (fault.power_loss) {
          auto lost = f->SimulatePowerLoss(fault.mode, nth * 31 + uint64_t(e));
          ASSERT_TRUE(lost.has_value());
          survivor = std::move(*lost);
          img->reset();  // the process dies
        } else {
          // The error is reported; the caller closes the image, which
          // writes what the failed step left pending.
          (void)(*img)->Close();
          img->reset();
          survivor = static_cast<io::MemoryStorage&>(*mem).Clone();
        }
        ExpectSurvivor(*survivor, c, base);
        ++cases;
        if (HasFatalFailure()) return;
      }
    }
  }
  EXPECT_GT(cases, 8);
}

INSTANTIATE_TEST_SUITE_P(Cases, SnapshotCrashTest,
                         ::testing::Values(CrashCase{Op::kCreate, 65536, false},
                                           CrashCase{Op::kCreate, 131072, true},
                                           CrashCase{Op::kApply, 65536, false},
                                           CrashCase{Op::kApply, 131072, true},
                                           CrashCase{Op::kDelete, 65536, false},
                                           CrashCase{Op::kDelete, 131072, true}));

}  // namespace
}  // namespace thindisk::qcow2
