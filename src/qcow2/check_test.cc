#include "qcow2/check.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "io/memory_storage.h"
#include "qcow2/format.h"
#include "qcow2/image.h"
#include "util/capability_test_util.h"
#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

// ---- helpers: poke at an image's metadata by hand ----

std::vector<uint8_t> Read(io::Storage& s, uint64_t offset, uint64_t n) {
  std::vector<uint8_t> v(n);
  EXPECT_TRUE(s.ReadAt(offset, v).ok());
  return v;
}

Header HeaderOf(io::Storage& s) {
  uint64_t size = *s.Size();
  auto h = DecodeHeader(Read(s, 0, std::min<uint64_t>(size, 2 << 20)), size);
  EXPECT_TRUE(h.has_value()) << h.status().ToString();
  return h.has_value() ? *h : Header{};
}

uint64_t RefcountBlockOffset(io::Storage& s, const Header& h, uint64_t cluster) {
  uint64_t entries = h.cluster_size() * 8 / h.refcount_bits();
  return LoadBe64(Read(s, h.refcount_table_offset + cluster / entries * 8, 8).data());
}

void PokeRefcount(io::Storage& s, uint64_t cluster, uint64_t value) {
  Header h = HeaderOf(s);
  uint64_t entries = h.cluster_size() * 8 / h.refcount_bits();
  uint64_t rb = RefcountBlockOffset(s, h, cluster);
  ASSERT_NE(rb, 0u);
  std::vector<uint8_t> block = Read(s, rb, h.cluster_size());
  SetRefcount(block, h.refcount_order, cluster % entries, value);
  ASSERT_TRUE(s.WriteAt(rb, block).ok());
}

uint64_t PeekRefcount(io::Storage& s, uint64_t cluster) {
  Header h = HeaderOf(s);
  uint64_t entries = h.cluster_size() * 8 / h.refcount_bits();
  uint64_t rb = RefcountBlockOffset(s, h, cluster);
  if (rb == 0) return 0;
  return GetRefcount(Read(s, rb, h.cluster_size()), h.refcount_order, cluster % entries);
}

uint64_t Be64At(io::Storage& s, uint64_t offset) { return LoadBe64(Read(s, offset, 8).data()); }
void PutBe64At(io::Storage& s, uint64_t offset, uint64_t v) {
  uint8_t b[8];
  StoreBe64(b, v);
  ASSERT_TRUE(s.WriteAt(offset, b).ok());
}

// A 4 MiB image, 64 KiB clusters, standard L2, metadata-preallocated so it
// has L2 tables and data clusters to get wrong.
CreateOptions SmallOptions() {
  CreateOptions o;
  o.size = 4 << 20;
  o.cluster_size = 65536;
  o.extended_l2 = false;
  o.preallocation = Preallocation::kMetadata;
  return o;
}

std::unique_ptr<io::MemoryStorage> SmallImage() {
  auto s = io::NewMemoryStorage("check.qcow2");
  EXPECT_TRUE(Create(*s, SmallOptions()).ok());
  return s;
}

CheckReport CheckOk(io::Storage& s, RepairMode mode) {
  auto r = Check(s, mode);
  EXPECT_TRUE(r.has_value()) << r.status().ToString();
  return r.has_value() ? *r : CheckReport{};
}

std::string Messages(const CheckReport& r) {
  std::string out;
  for (const auto& m : r.messages) out += m + "\n";
  return out;
}

void ExpectClean(io::Storage& s) {
  CheckReport r = CheckOk(s, RepairMode::kNone);
  EXPECT_EQ(r.corruptions, 0u) << Messages(r);
  EXPECT_EQ(r.leaks, 0u) << Messages(r);
  EXPECT_EQ(r.check_errors, 0u) << Messages(r);
}

// ---- unit tests on memory ----

TEST(Check, FreshImagesAreClean) {
  for (bool ext : {false, true}) {
    for (Preallocation p : {Preallocation::kOff, Preallocation::kMetadata}) {
      CreateOptions o;
      o.size = 8 << 20;
      o.extended_l2 = ext;
      o.preallocation = p;
      auto s = io::NewMemoryStorage();
      ASSERT_TRUE(Create(*s, o).ok());
      CheckReport r = CheckOk(*s, RepairMode::kNone);
      EXPECT_EQ(r.corruptions + r.leaks + r.check_errors, 0u) << Messages(r);
      EXPECT_TRUE(r.messages.empty()) << Messages(r);
      EXPECT_EQ(r.total_clusters, o.size / o.cluster_size);
      uint64_t expect_alloc = p == Preallocation::kOff ? 0 : r.total_clusters;
      EXPECT_EQ(r.allocated_clusters, expect_alloc);
      EXPECT_EQ(r.fragmented_clusters, 0u) << "preallocated data is contiguous";
      EXPECT_EQ(r.image_end_offset, *s->Size());
    }
  }
}

TEST(Check, LeakIsFoundAndFixedByRepairLeaks) {
  auto s = SmallImage();
  // A crash after raising a refcount and before using the cluster: the file
  // has one more cluster, counted but referenced by nothing.
  uint64_t end = *s->Size();
  uint64_t leaked = end / 65536;
  ASSERT_TRUE(s->Resize(end + 65536).ok());
  PokeRefcount(*s, leaked, 1);

  CheckReport r = CheckOk(*s, RepairMode::kNone);
  EXPECT_EQ(r.leaks, 1u) << Messages(r);
  EXPECT_EQ(r.corruptions, 0u) << Messages(r);
  EXPECT_EQ(r.image_end_offset, end + 65536);
  EXPECT_EQ(PeekRefcount(*s, leaked), 1u) << "kNone changes nothing";

  r = CheckOk(*s, RepairMode::kLeaks);
  EXPECT_EQ(r.leaks_fixed, 1u) << Messages(r);
  EXPECT_EQ(r.leaks, 0u);
  EXPECT_EQ(r.image_end_offset, end);
  EXPECT_EQ(PeekRefcount(*s, leaked), 0u);
  ExpectClean(*s);
}

TEST(Check, LoweredRefcountIsCorruptionFixedOnlyByRepairAll) {
  auto s = SmallImage();
  Header h = HeaderOf(*s);
  uint64_t l2 = L1Offset(Be64At(*s, h.l1_table_offset));
  uint64_t data = Be64At(*s, l2) & kOffsetMask;  // guest cluster 0
  PokeRefcount(*s, data / 65536, 0);

  CheckReport r = CheckOk(*s, RepairMode::kNone);
  EXPECT_GE(r.corruptions, 1u) << Messages(r);
  EXPECT_EQ(r.leaks, 0u);
  EXPECT_NE(Messages(r).find("refcount=0 reference=1"), std::string::npos) << Messages(r);

  r = CheckOk(*s, RepairMode::kLeaks);
  EXPECT_GE(r.corruptions, 1u) << "leak repair does not raise refcounts";
  EXPECT_EQ(r.corruptions_fixed, 0u);
  EXPECT_EQ(PeekRefcount(*s, data / 65536), 0u);

  r = CheckOk(*s, RepairMode::kAll);
  EXPECT_EQ(r.corruptions, 0u) << Messages(r);
  EXPECT_EQ(r.corruptions_fixed, 1u) << Messages(r);
  EXPECT_EQ(PeekRefcount(*s, data / 65536), 1u);
  ExpectClean(*s);
}

TEST(Check, WrongCopiedFlagsAreFixedByRepairAll) {
  auto s = SmallImage();
  Header h = HeaderOf(*s);
  uint64_t l1e = Be64At(*s, h.l1_table_offset);
  PutBe64At(*s, h.l1_table_offset, l1e & ~kCopied);  // L2 refcount is 1: flag must be set
  uint64_t l2 = L1Offset(l1e);
  PutBe64At(*s, l2 + 8, Be64At(*s, l2 + 8) & ~kCopied);

  CheckReport r = CheckOk(*s, RepairMode::kNone);
  EXPECT_EQ(r.corruptions, 2u) << Messages(r);
  EXPECT_NE(Messages(r).find("OFLAG_COPIED L2 cluster"), std::string::npos);
  EXPECT_NE(Messages(r).find("OFLAG_COPIED data cluster"), std::string::npos);

  r = CheckOk(*s, RepairMode::kAll);
  EXPECT_EQ(r.corruptions_fixed, 2u) << Messages(r);
  EXPECT_TRUE(Be64At(*s, h.l1_table_offset) & kCopied);
  EXPECT_TRUE(Be64At(*s, l2 + 8) & kCopied);
  ExpectClean(*s);
}

TEST(Check, MissingRefcountBlockIsRebuiltByRepairAll) {
  auto s = SmallImage();
  Header h = HeaderOf(*s);
  uint64_t old_block = Be64At(*s, h.refcount_table_offset);
  PutBe64At(*s, h.refcount_table_offset, 0);

  CheckReport r = CheckOk(*s, RepairMode::kNone);
  // Every used cluster but the old block itself now has refcount 0 (the old
  // block is referenced by nothing: it reads as a cluster with no refcount).
  uint64_t used = *s->Size() / 65536;
  EXPECT_EQ(r.corruptions, used - 1 + /*COPIED flags of L1 + 64 data entries*/ 1 + 64)
      << Messages(r);

  r = CheckOk(*s, RepairMode::kAll);
  EXPECT_EQ(r.corruptions, 0u) << Messages(r);
  EXPECT_NE(Be64At(*s, h.refcount_table_offset), 0u);
  EXPECT_NE(Be64At(*s, h.refcount_table_offset), old_block);
  r = CheckOk(*s, RepairMode::kNone);
  EXPECT_EQ(r.corruptions, 0u) << Messages(r);
  EXPECT_EQ(r.leaks, 0u) << Messages(r);
}

TEST(Check, OverlappingMetadataIsReported) {
  auto s = SmallImage();
  Header h = HeaderOf(*s);
  // Point the L1 entry at the refcount table, as if it were an L2 table:
  // its first entry (the refcount block) then reads as a data cluster.
  PutBe64At(*s, h.l1_table_offset, h.refcount_table_offset | kCopied);
  CheckReport r = CheckOk(*s, RepairMode::kNone);
  EXPECT_GE(r.corruptions, 2u) << Messages(r);
  EXPECT_NE(Messages(r).find("overlapping metadata"), std::string::npos) << Messages(r);
  r = CheckOk(*s, RepairMode::kAll);
  EXPECT_GE(r.corruptions, 2u) << "overlaps cannot be repaired";
}

TEST(Check, BadReferencesAreCorruptions) {
  auto s = SmallImage();
  Header h = HeaderOf(*s);
  uint64_t l2 = L1Offset(Be64At(*s, h.l1_table_offset));
  PutBe64At(*s, l2 + 0, kCopied | (1ull << 40));     // past the end of the file
  PutBe64At(*s, l2 + 8, kCopied | 0x10200);          // not cluster aligned
  PutBe64At(*s, l2 + 16, kCopied | kCompressed | 5);  // compressed with COPIED
  CheckReport r = CheckOk(*s, RepairMode::kNone);
  std::string m = Messages(r);
  EXPECT_NE(m.find("past the end of the file"), std::string::npos) << m;
  EXPECT_NE(m.find("unaligned L2 entry"), std::string::npos) << m;
  EXPECT_NE(m.find("COPIED flag must never be set for compressed"), std::string::npos) << m;
  // The three data clusters those entries used to name are now leaked.
  EXPECT_EQ(r.leaks, 3u) << m;
}

TEST(Check, SuccessfulRepairClearsDirtyAndCorruptBits) {
  auto s = SmallImage();
  uint64_t end = *s->Size();
  ASSERT_TRUE(s->Resize(end + 65536).ok());
  PokeRefcount(*s, end / 65536, 1);  // a leak, as lazy refcounts leave behind
  const uint64_t features = Be64At(*s, 72);  // zstd: the compression bit
  PutBe64At(*s, 72, features | kIncompatDirty | kIncompatCorrupt);

  CheckReport r = CheckOk(*s, RepairMode::kNone);
  EXPECT_EQ(r.leaks, 1u);
  EXPECT_EQ(Be64At(*s, 72), features | kIncompatDirty | kIncompatCorrupt) << "kNone writes nothing";

  r = CheckOk(*s, RepairMode::kLeaks);
  EXPECT_EQ(r.leaks_fixed, 1u);
  EXPECT_EQ(Be64At(*s, 72), features | kIncompatCorrupt) << "leak repair clears only the dirty bit";

  r = CheckOk(*s, RepairMode::kAll);
  EXPECT_EQ(r.corruptions + r.leaks, 0u) << Messages(r);
  EXPECT_EQ(Be64At(*s, 72), features);
}

// Random damage to the metadata clusters (header excluded): the check must
// return a report (never crash or hang), and after kAll repair a second
// check must not find more than the first left behind.
TEST(Check, RandomMetadataDamageIsReportedNeverFatal) {
  auto pristine = SmallImage();
  Header h = HeaderOf(*pristine);
  const uint64_t metadata_end = L1Offset(Be64At(*pristine, h.l1_table_offset)) + 65536;
  uint64_t state = 0x9E3779B97F4A7C15ull;  // fixed seed: failures reproduce
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int iter = 0; iter < 150; ++iter) {
    auto s = pristine->Clone();
    for (int f = 0; f < 1 + int(next() % 6); ++f) {
      // Damage near the start of a table, where the live entries are.
      uint64_t cluster = 1 + next() % (metadata_end / 65536 - 1);
      uint64_t at = cluster * 65536 + next() % 64;
      uint8_t b = uint8_t(next());
      ASSERT_TRUE(s->WriteAt(at, std::span<const uint8_t>(&b, 1)).ok());
    }
    auto r = Check(*s, RepairMode::kAll);
    ASSERT_TRUE(r.has_value()) << "iteration " << iter << ": " << r.status().ToString();
    auto again = Check(*s, RepairMode::kNone);
    ASSERT_TRUE(again.has_value()) << "iteration " << iter;
    EXPECT_LE(again->corruptions, r->corruptions) << "iteration " << iter << "\n"
                                                  << Messages(*again);
    EXPECT_EQ(again->leaks, r->leaks) << "iteration " << iter << "\n" << Messages(*again);
  }
}

TEST(Check, UndecodableHeaderIsAnError) {
  auto s = io::NewMemoryStorage();
  std::vector<uint8_t> junk(4096, 0x5a);
  ASSERT_TRUE(s->WriteAt(0, junk).ok());
  auto r = Check(*s, RepairMode::kNone);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kCorrupt);
}

TEST(Check, CompressedAndSnapshotReferencesCountOnce) {
  // Hand-built: guest clusters 0 and 1 compressed into one host cluster;
  // a snapshot shares the active L2 table.
  auto s = SmallImage();
  Header h = HeaderOf(*s);
  uint64_t l1e = Be64At(*s, h.l1_table_offset);
  uint64_t l2 = L1Offset(l1e);
  uint64_t data0 = Be64At(*s, l2) & kOffsetMask;
  uint64_t data1 = Be64At(*s, l2 + 8) & kOffsetMask;
  L2Mapping c0{.kind = ClusterKind::kCompressed, .host_offset = data0, .compressed_size = 1000};
  L2Mapping c1{.kind = ClusterKind::kCompressed, .host_offset = data0 + 1000,
               .compressed_size = 2000};
  PutBe64At(*s, l2, EncodeL2Entry(c0, false, 16).entry);
  PutBe64At(*s, l2 + 8, EncodeL2Entry(c1, false, 16).entry);
  PokeRefcount(*s, data0 / 65536, 2);  // one reference per compressed cluster
  PokeRefcount(*s, data1 / 65536, 0);  // no longer used

  CheckReport r = CheckOk(*s, RepairMode::kNone);
  EXPECT_EQ(r.corruptions + r.leaks, 0u) << Messages(r);
  EXPECT_EQ(r.compressed_clusters, 2u);
  EXPECT_EQ(r.allocated_clusters, 64u);

  // Snapshot: its L1 (one cluster at the end of the file) names the same
  // L2 table, so the L2 table and everything in it gain one reference.
  uint64_t snap_l1 = *s->Size();
  uint64_t table = snap_l1 + 65536;
  ASSERT_TRUE(s->Resize(table + 65536).ok());
  PutBe64At(*s, snap_l1, l2);
  Snapshot sn;
  sn.l1_table_offset = snap_l1;
  sn.l1_size = 1;
  sn.id = "1";
  sn.name = "s";
  ASSERT_TRUE(s->WriteAt(table, EncodeSnapshotTable({sn})).ok());
  uint8_t hdr[12];
  StoreBe32(hdr, 1);
  StoreBe64(hdr + 4, table);
  ASSERT_TRUE(s->WriteAt(60, hdr).ok());
  PokeRefcount(*s, snap_l1 / 65536, 1);
  PokeRefcount(*s, table / 65536, 1);
  r = CheckOk(*s, RepairMode::kNone);
  // L2 table and the 62 plain data clusters now need refcount 2, the
  // compressed host cluster 4. (COPIED flags still match the on-disk
  // refcounts of 1.)
  EXPECT_EQ(r.corruptions, 1u + 62 + 1) << Messages(r);
  r = CheckOk(*s, RepairMode::kAll);
  EXPECT_EQ(r.corruptions, 0u) << Messages(r);
  // Raised refcounts, then the COPIED flags that became wrong: L1 + 62 data.
  EXPECT_EQ(r.corruptions_fixed, 1u + 62 + 1 + 1 + 62) << Messages(r);
  EXPECT_EQ(PeekRefcount(*s, data0 / 65536), 4u);
  EXPECT_EQ(PeekRefcount(*s, l2 / 65536), 2u);
  EXPECT_FALSE(Be64At(*s, h.l1_table_offset) & kCopied);
  ExpectClean(*s);
}

// ---- cross-checks with qemu-img on real files ----

struct CommandResult {
  int exit_code = -1;
  std::string output;
};

CommandResult RunCommand(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen((cmd + " 2>/dev/null").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool HaveTool(const std::string& tool) {
  return RunCommand(tool + " --version").exit_code == 0;
}

// A missing qemu-img or qemu-io skips locally, fails in CI
// (util/capability_test_util.h).
#define SKIP_WITHOUT_QEMU()                            \
  do {                                                 \
    TD_REQUIRE_TOOL("qemu-img", HaveTool("qemu-img")); \
    TD_REQUIRE_TOOL("qemu-io", HaveTool("qemu-io"));   \
  } while (0)

class QemuCheck : public testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "td_check_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) { return dir_ + "/" + name; }
  std::unique_ptr<io::Storage> Open(const std::string& path) {
    auto f = io::OpenFile(path, io::OpenOptions{});
    EXPECT_TRUE(f.has_value()) << f.status().ToString();
    return f.has_value() ? std::move(*f) : nullptr;
  }
  nlohmann::json QemuImgCheck(const std::string& path, int* exit_code = nullptr) {
    CommandResult r = RunCommand("qemu-img check --output=json '" + path + "'");
    if (exit_code) *exit_code = r.exit_code;
    auto j = nlohmann::json::parse(r.output, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.output;
    return j;
  }
  void Sh(const std::string& cmd) {
    CommandResult r = RunCommand(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  }
  // Our report and qemu-img's agree on every count they share.
  void ExpectSameAsQemu(const std::string& path) {
    auto f = Open(path);
    ASSERT_TRUE(f);
    CheckReport r = CheckOk(*f, RepairMode::kNone);
    f.reset();
    nlohmann::json j = QemuImgCheck(path);
    EXPECT_EQ(r.corruptions, j.value("corruptions", uint64_t{0})) << Messages(r) << j.dump();
    EXPECT_EQ(r.leaks, j.value("leaks", uint64_t{0})) << Messages(r) << j.dump();
    EXPECT_EQ(r.total_clusters, j.value("total-clusters", uint64_t{0}));
    EXPECT_EQ(r.allocated_clusters, j.value("allocated-clusters", uint64_t{0}));
    EXPECT_EQ(r.fragmented_clusters, j.value("fragmented-clusters", uint64_t{0}));
    EXPECT_EQ(r.compressed_clusters, j.value("compressed-clusters", uint64_t{0}));
    EXPECT_EQ(r.image_end_offset, j.value("image-end-offset", uint64_t{0}));
  }
  std::string dir_;
};

TEST_F(QemuCheck, QemuWrittenImagesAgree) {
  SKIP_WITHOUT_QEMU();
  // Scattered writes (fragmentation), a snapshot, more writes after it
  // (copy-on-write away from shared clusters), and a compressed copy.
  std::string a = Path("a.qcow2");
  Sh("qemu-img create -q -f qcow2 -o cluster_size=65536 '" + a + "' 32M");
  Sh("qemu-io -c 'write -P 1 8M 256k' -c 'write -P 2 0 64k' -c 'write -P 3 20M 1M' '" + a + "'");
  Sh("qemu-img snapshot -c snap1 '" + a + "'");
  Sh("qemu-io -c 'write -P 4 8M 64k' -c 'write -P 5 30M 128k' '" + a + "'");
  ExpectSameAsQemu(a);

  std::string c = Path("c.qcow2");
  Sh("qemu-img convert -c -O qcow2 -o compression_type=zstd,extended_l2=on,cluster_size=65536 '" +
     a + "' '" + c + "'");
  ExpectSameAsQemu(c);

  std::string e = Path("e.qcow2");
  Sh("qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=131072,refcount_bits=8 '" + e +
     "' 16M");
  Sh("qemu-io -c 'write -P 7 4k 4k' -c 'write -z 1M 1M' -c 'write -P 8 5M 300k' '" + e + "'");
  ExpectSameAsQemu(e);

  // Persistent dirty bitmaps: directory, bitmap tables and bitmap data
  // clusters are referenced too (else they would show up as leaks).
  std::string b = Path("bitmaps.qcow2");
  Sh("qemu-img create -q -f qcow2 '" + b + "' 32M");
  Sh("qemu-img bitmap --add '" + b + "' b0");
  Sh("qemu-io -c 'write -P 1 0 1M' -c 'write -P 2 20M 64k' '" + b + "'");
  Sh("qemu-img bitmap --add --granularity 512 '" + b + "' b1");
  Sh("qemu-io -c 'write -P 3 4M 3M' '" + b + "'");
  ExpectSameAsQemu(b);
  auto f = Open(b);
  ASSERT_TRUE(f);
  CheckReport r = CheckOk(*f, RepairMode::kNone);
  EXPECT_TRUE(r.messages.empty()) << Messages(r);
}

TEST_F(QemuCheck, LeakCountsAgreeAndRepairSatisfiesQemu) {
  SKIP_WITHOUT_QEMU();
  std::string a = Path("leak.qcow2");
  Sh("qemu-img create -q -f qcow2 '" + a + "' 16M");
  Sh("qemu-io -c 'write -P 1 0 256k' '" + a + "'");
  {
    auto f = Open(a);
    ASSERT_TRUE(f);
    uint64_t end = *f->Size();
    uint64_t first = (end + 65535) / 65536;
    ASSERT_TRUE(f->Resize((first + 2) * 65536).ok());
    PokeRefcount(*f, first, 1);
    PokeRefcount(*f, first + 1, 3);
  }
  ExpectSameAsQemu(a);
  {
    auto f = Open(a);
    CheckReport r = CheckOk(*f, RepairMode::kLeaks);
    EXPECT_EQ(r.leaks_fixed, 2u) << Messages(r);
  }
  int rc = -1;
  nlohmann::json j = QemuImgCheck(a, &rc);
  EXPECT_EQ(rc, 0) << j.dump();
  EXPECT_EQ(j.value("leaks", 0), 0);
}

TEST_F(QemuCheck, CorruptionCountsAgreeAndRepairSatisfiesQemu) {
  SKIP_WITHOUT_QEMU();
  std::string a = Path("corrupt.qcow2");
  Sh("qemu-img create -q -f qcow2 '" + a + "' 16M");
  Sh("qemu-io -c 'write -P 1 0 256k' '" + a + "'");
  {
    auto f = Open(a);
    ASSERT_TRUE(f);
    Header h = HeaderOf(*f);
    uint64_t l2 = L1Offset(Be64At(*f, h.l1_table_offset));
    uint64_t data = Be64At(*f, l2 + 8) & kOffsetMask;
    PokeRefcount(*f, data / 65536, 2);   // leak + wrong COPIED
    uint64_t data2 = Be64At(*f, l2 + 16) & kOffsetMask;
    PokeRefcount(*f, data2 / 65536, 0);  // corruption (+ wrong COPIED)
    PutBe64At(*f, h.l1_table_offset, Be64At(*f, h.l1_table_offset) & ~kCopied);
  }
  ExpectSameAsQemu(a);
  {
    auto f = Open(a);
    CheckReport r = CheckOk(*f, RepairMode::kAll);
    EXPECT_EQ(r.corruptions, 0u) << Messages(r);
    EXPECT_EQ(r.leaks, 0u) << Messages(r);
  }
  int rc = -1;
  nlohmann::json j = QemuImgCheck(a, &rc);
  EXPECT_EQ(rc, 0) << j.dump();
  Sh("qemu-io -c 'read -P 1 0 256k' '" + a + "'");  // data intact
}

// A bitmap directory that does not decode: check reports it; check -r all
// drops the extension (its bitmaps were lost either way) and reclaims the
// clusters it held in the same run, and qemu then finds the image clean.
TEST_F(QemuCheck, RepairDropsABitmapDirectoryThatDoesNotDecode) {
  SKIP_WITHOUT_QEMU();
  std::string a = Path("bad-dir.qcow2");
  Sh("qemu-img create -q -f qcow2 '" + a + "' 16M");
  Sh("qemu-img bitmap --add '" + a + "' b");
  Sh("qemu-io -c 'write -P 1 0 256k' '" + a + "'");
  {
    auto f = Open(a);
    ASSERT_TRUE(f);
    Header h = HeaderOf(*f);
    ASSERT_TRUE(h.bitmaps.has_value());
    // The entry is 24 bytes and the name "b", padded to 32: a padding byte.
    uint8_t junk = 0x5a;
    ASSERT_TRUE(f->WriteAt(h.bitmaps->bitmap_directory_offset + 26, {&junk, 1}).ok());
  }
  {
    auto f = Open(a);
    CheckReport r = CheckOk(*f, RepairMode::kNone);
    EXPECT_EQ(r.corruptions, 1u) << Messages(r);
    r = CheckOk(*f, RepairMode::kAll);
    EXPECT_EQ(r.corruptions, 0u) << Messages(r);
    EXPECT_GE(r.leaks_fixed, 2u) << Messages(r);  // the directory and the table
    r = CheckOk(*f, RepairMode::kNone);
    EXPECT_EQ(r.corruptions + r.leaks, 0u) << Messages(r);
    Header h = HeaderOf(*f);
    EXPECT_FALSE(h.bitmaps.has_value());
    EXPECT_EQ(h.autoclear_features & kAutoclearBitmaps, 0u);
  }
  int rc = -1;
  nlohmann::json j = QemuImgCheck(a, &rc);
  EXPECT_EQ(rc, 0) << j.dump();
  Sh("qemu-io -c 'read -P 1 0 256k' '" + a + "'");  // data intact
}

}  // namespace
}  // namespace thindisk::qcow2
