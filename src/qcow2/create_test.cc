#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "io/memory_storage.h"
#include "io/storage.h"
#include "qcow2/format.h"
#include "qcow2/image.h"
#include "util/capability_test_util.h"
#include "util/endian.h"
#include "util/temp_dir_test_util.h"

namespace thindisk::qcow2 {
namespace {

// ---- helpers ----

std::vector<uint8_t> Read(io::Storage& s, uint64_t offset, uint64_t n) {
  std::vector<uint8_t> v(n);
  EXPECT_TRUE(s.ReadAt(offset, v).ok());
  return v;
}

Header DecodeFrom(io::Storage& s) {
  uint64_t size = *s.Size();
  auto h = DecodeHeader(Read(s, 0, std::min<uint64_t>(size, 2 << 20)), size);
  EXPECT_TRUE(h.has_value()) << h.status().ToString();
  return h.has_value() ? *h : Header{};
}

// Refcount of every cluster of the file, read through the refcount table
// independently of create.cc's arithmetic.
std::vector<uint64_t> Refcounts(io::Storage& s, const Header& h) {
  const uint64_t cs = h.cluster_size();
  const uint64_t file_clusters = (*s.Size() + cs - 1) / cs;
  const uint64_t rb_entries = cs * 8 / h.refcount_bits();
  std::vector<uint64_t> out(file_clusters, 0);
  std::vector<uint8_t> table = Read(s, h.refcount_table_offset, h.refcount_table_clusters * cs);
  for (uint64_t i = 0; i * 8 < table.size(); ++i) {
    uint64_t rb = LoadBe64(&table[i * 8]);
    if (rb == 0) continue;
    std::vector<uint8_t> block = Read(s, rb, cs);
    for (uint64_t k = 0; k < rb_entries; ++k) {
      uint64_t rc = GetRefcount(block, h.refcount_order, k);
      uint64_t cluster = i * rb_entries + k;
      if (cluster < file_clusters) {
        out[cluster] = rc;
      } else {
        EXPECT_EQ(rc, 0u) << "refcount for cluster " << cluster << " past the end of the file";
      }
    }
  }
  return out;
}

struct Combo {
  std::string name;
  CreateOptions o;
};

std::vector<Combo> Combos() {
  std::vector<Combo> c;
  auto add = [&c](std::string name, auto fn) {
    CreateOptions o;
    o.size = 64ull << 20;
    fn(o);
    c.push_back({std::move(name), o});
  };
  add("Defaults", [](CreateOptions&) {});
  add("Zlib64kStandardL2", [](CreateOptions& o) {
    o.cluster_size = 65536;
    o.extended_l2 = false;
    o.compression_type = CompressionType::kZlib;
  });
  add("Compat010", [](CreateOptions& o) {
    o.version = 2;
    o.cluster_size = 65536;
    o.extended_l2 = false;
    o.compression_type = CompressionType::kZlib;
  });
  add("LazyRefcounts", [](CreateOptions& o) { o.lazy_refcounts = true; });
  add("Refcount1Bit", [](CreateOptions& o) { o.refcount_bits = 1; });
  add("Refcount64Bit", [](CreateOptions& o) { o.refcount_bits = 64; });
  add("Cluster512", [](CreateOptions& o) {
    o.cluster_size = 512;
    o.extended_l2 = false;
    o.size = 8ull << 20;
  });
  add("Cluster2M", [](CreateOptions& o) { o.cluster_size = 2 << 20; });
  add("OddSize", [](CreateOptions& o) { o.size = (64ull << 20) + 512; });
  add("EmptyImage", [](CreateOptions& o) { o.size = 0; });
  add("MetadataExtL2", [](CreateOptions& o) { o.preallocation = Preallocation::kMetadata; });
  add("MetadataStdL2", [](CreateOptions& o) {
    o.preallocation = Preallocation::kMetadata;
    o.extended_l2 = false;
    o.cluster_size = 65536;
  });
  // Many refcount blocks and a multi-cluster refcount table: exercises the
  // fixed point (the blocks count themselves).
  add("MetadataTinyClusters64BitRefcounts", [](CreateOptions& o) {
    o.preallocation = Preallocation::kMetadata;
    o.cluster_size = 512;
    o.extended_l2 = false;
    o.refcount_bits = 64;
    o.size = 4ull << 20;
  });
  add("Falloc", [](CreateOptions& o) {
    o.preallocation = Preallocation::kFalloc;
    o.size = 16ull << 20;
  });
  add("Full", [](CreateOptions& o) {
    o.preallocation = Preallocation::kFull;
    o.size = 8ull << 20;
  });
  add("Compat010Metadata", [](CreateOptions& o) {
    o.version = 2;
    o.extended_l2 = false;
    o.compression_type = CompressionType::kZlib;
    o.preallocation = Preallocation::kMetadata;
  });
  return c;
}

// Structural checks any created image must pass, on any storage.
void ExpectWellFormed(io::Storage& s, const CreateOptions& o) {
  Header h = DecodeFrom(s);
  EXPECT_EQ(h.version, o.version);
  EXPECT_EQ(h.cluster_size(), o.cluster_size);
  EXPECT_EQ(h.size, o.size);
  EXPECT_EQ(h.extended_l2(), o.extended_l2);
  EXPECT_EQ(h.refcount_bits(), o.refcount_bits);
  EXPECT_EQ(h.compression_type, o.compression_type);
  EXPECT_EQ(bool(h.compatible_features & kCompatLazyRefcounts), o.lazy_refcounts);
  EXPECT_EQ(h.backing_file, o.backing_file);
  EXPECT_EQ(h.backing_format, o.backing_format);
  if (o.version == 3) {
    EXPECT_EQ(h.header_length, 112u);
  }
  const uint64_t cs = h.cluster_size();
  const uint64_t span = cs * h.l2_entries();
  EXPECT_EQ(h.l1_size, (o.size + span - 1) / span);

  // Every cluster of the file is used exactly once; nothing else counted.
  std::vector<uint64_t> rc = Refcounts(s, h);
  for (uint64_t c = 0; c < rc.size(); ++c) ASSERT_EQ(rc[c], 1u) << "cluster " << c;

  // Mappings: unallocated, or (preallocated) one distinct data cluster each.
  std::vector<uint8_t> l1 = Read(s, h.l1_table_offset, h.l1_size * 8);
  std::set<uint64_t> hosts;
  uint64_t mapped = 0;
  for (uint64_t i = 0; i < h.l1_size; ++i) {
    uint64_t e = LoadBe64(&l1[i * 8]);
    if (o.preallocation == Preallocation::kOff) {
      EXPECT_EQ(e, 0u);
      continue;
    }
    ASSERT_NE(L1Offset(e), 0u);
    EXPECT_TRUE(e & kCopied);
    std::vector<uint8_t> l2 = Read(s, L1Offset(e), cs);
    for (uint64_t k = 0; k < h.l2_entries(); ++k) {
      uint64_t entry = LoadBe64(&l2[k * h.l2_entry_size()]);
      uint64_t bitmap = h.extended_l2() ? LoadBe64(&l2[k * 16 + 8]) : 0;
      auto m = DecodeL2Entry(entry, bitmap, h.extended_l2(), h.cluster_bits);
      ASSERT_TRUE(m.has_value()) << m.status().ToString();
      if (m->kind == ClusterKind::kUnallocated) continue;
      EXPECT_EQ(m->kind, ClusterKind::kNormal);
      EXPECT_TRUE(m->copied);
      EXPECT_LT(m->host_offset, *s.Size());
      EXPECT_TRUE(hosts.insert(m->host_offset).second) << "host cluster mapped twice";
      if (h.extended_l2()) {
        EXPECT_EQ(m->alloc_bitmap, o.backing_file.empty() ? ~0u : 0u);
      }
      ++mapped;
    }
  }
  if (o.preallocation != Preallocation::kOff) {
    EXPECT_EQ(mapped, (o.size + cs - 1) / cs);
  }
}

class CreateCombo : public testing::TestWithParam<Combo> {};

TEST_P(CreateCombo, OnMemoryStorageIsWellFormed) {
  auto s = io::NewMemoryStorage("create.qcow2");
  std::string warning;
  ASSERT_TRUE(Create(*s, GetParam().o, &warning).ok());
  EXPECT_TRUE(warning.empty()) << warning;
  ExpectWellFormed(*s, GetParam().o);
  if (GetParam().o.preallocation == Preallocation::kFull) {
    EXPECT_GE(s->bytes_written(), GetParam().o.size) << "full preallocation writes the data area";
  }
}

INSTANTIATE_TEST_SUITE_P(Options, CreateCombo, testing::ValuesIn(Combos()),
                         [](const auto& info) { return info.param.name; });

TEST(Create, BackingFileWithExtendedL2Preallocation) {
  CreateOptions o;
  o.size = 16ull << 20;
  o.backing_file = "/images/base.qcow2";
  o.backing_format = "qcow2";
  o.preallocation = Preallocation::kMetadata;
  auto s = io::NewMemoryStorage();
  ASSERT_TRUE(Create(*s, o).ok());
  ExpectWellFormed(*s, o);  // alloc bits clear: reads still reach the backing file
}

TEST(Create, MetadataPreallocationWritesNoData) {
  CreateOptions o;
  o.size = 64ull << 20;
  o.preallocation = Preallocation::kMetadata;
  auto s = io::NewMemoryStorage();
  ASSERT_TRUE(Create(*s, o).ok());
  EXPECT_LT(s->bytes_written(), 1u << 20);
  EXPECT_GE(*s->Size(), o.size);
}

// Storage whose host cannot fallocate (NFS v3, some FUSE).
class NoFallocStorage : public io::Storage {
 public:
  Status ReadAt(uint64_t o, std::span<uint8_t> b) override { return m_->ReadAt(o, b); }
  Status WriteAt(uint64_t o, std::span<const uint8_t> b) override { return m_->WriteAt(o, b); }
  Status Flush() override { return m_->Flush(); }
  Result<uint64_t> Size() override { return m_->Size(); }
  Status Resize(uint64_t n) override { return m_->Resize(n); }
  Status Allocate(uint64_t, uint64_t) override {
    return Status::NotSupported("fallocate: Operation not supported");
  }
  Status PunchHole(uint64_t o, uint64_t n) override { return m_->PunchHole(o, n); }
  Status ZeroRange(uint64_t o, uint64_t n) override { return m_->ZeroRange(o, n); }
  Result<uint64_t> NextData(uint64_t o) override { return m_->NextData(o); }
  Result<uint64_t> NextHole(uint64_t o) override { return m_->NextHole(o); }
  Result<uint64_t> AllocatedBytes() override { return m_->AllocatedBytes(); }
  uint64_t bytes_written() const override { return m_->bytes_written(); }
  const std::string& name() const override { return m_->name(); }

 private:
  std::unique_ptr<io::MemoryStorage> m_ = io::NewMemoryStorage("nfs.qcow2");
};

TEST(Create, FallocFallsBackToZerosWithAWarning) {
  CreateOptions o;
  o.size = 4ull << 20;
  o.preallocation = Preallocation::kFalloc;
  NoFallocStorage s;
  std::string warning;
  ASSERT_TRUE(Create(s, o, &warning).ok());
  EXPECT_NE(warning.find("cannot preallocate"), std::string::npos) << warning;
  EXPECT_NE(warning.find("nfs.qcow2"), std::string::npos) << warning;
  EXPECT_GE(s.bytes_written(), o.size);
  ExpectWellFormed(s, o);
}

struct BadOptions {
  const char* name;
  void (*mutate)(CreateOptions&);
  const char* message_part;
};

const BadOptions kBadOptions[] = {
    {"ClusterNotPowerOfTwo", [](CreateOptions& o) { o.cluster_size = 96 * 1024; }, "power of two"},
    {"ClusterTooSmall", [](CreateOptions& o) { o.cluster_size = 256; }, "cluster size 256"},
    {"ClusterTooLarge", [](CreateOptions& o) { o.cluster_size = 4 << 20; }, "cluster size"},
    {"ExtendedL2SmallClusters", [](CreateOptions& o) { o.cluster_size = 8192; }, "16 KiB"},
    {"ZstdWithCompat010",
     [](CreateOptions& o) {
       o.version = 2;
       o.extended_l2 = false;
     },
     "zstd"},
    {"ExtendedL2WithCompat010",
     [](CreateOptions& o) {
       o.version = 2;
       o.compression_type = CompressionType::kZlib;
     },
     "extended L2"},
    {"LazyRefcountsWithCompat010",
     [](CreateOptions& o) {
       o.version = 2;
       o.compression_type = CompressionType::kZlib;
       o.extended_l2 = false;
       o.lazy_refcounts = true;
     },
     "lazy refcounts"},
    {"Refcount8WithCompat010",
     [](CreateOptions& o) {
       o.version = 2;
       o.compression_type = CompressionType::kZlib;
       o.extended_l2 = false;
       o.refcount_bits = 8;
     },
     "refcount bits 8"},
    {"RefcountBitsNotPowerOfTwo", [](CreateOptions& o) { o.refcount_bits = 12; }, "refcount bits 12"},
    {"RefcountBitsTooWide", [](CreateOptions& o) { o.refcount_bits = 128; }, "refcount bits 128"},
    {"Version4", [](CreateOptions& o) { o.version = 4; }, "version 4"},
    {"SizeNotSectorMultiple", [](CreateOptions& o) { o.size = 1000; }, "multiple of 512"},
    {"SizeTooLarge", [](CreateOptions& o) { o.size = 1ull << 62; }, "exceeds the maximum"},
    {"L1TooLargeForClusterSize",
     [](CreateOptions& o) {
       o.cluster_size = 512;
       o.extended_l2 = false;
       o.size = 1ull << 40;
     },
     "L1 table"},
    {"BackingFormatWithoutFile", [](CreateOptions& o) { o.backing_format = "raw"; },
     "without a backing file"},
    {"BackingNameTooLong", [](CreateOptions& o) { o.backing_file = std::string(1024, 'b'); },
     "backing file name"},
    {"BackingWithStandardL2Prealloc",
     [](CreateOptions& o) {
       o.backing_file = "base";
       o.extended_l2 = false;
       o.preallocation = Preallocation::kMetadata;
     },
     "extended L2"},
};

class CreateRefuses : public testing::TestWithParam<BadOptions> {};

TEST_P(CreateRefuses, WithAReason) {
  CreateOptions o;
  o.size = 1 << 20;
  GetParam().mutate(o);
  auto s = io::NewMemoryStorage();
  Status st = Create(*s, o);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find(GetParam().message_part), std::string::npos) << st.message();
  EXPECT_EQ(*s->Size(), 0u) << "nothing written";
}

INSTANTIATE_TEST_SUITE_P(Options, CreateRefuses, testing::ValuesIn(kBadOptions),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Create, RefusesNonEmptyStorage) {
  auto s = io::NewMemoryStorage();
  std::vector<uint8_t> junk(100, 7);
  ASSERT_TRUE(s->WriteAt(0, junk).ok());
  CreateOptions o;
  o.size = 1 << 20;
  EXPECT_EQ(Create(*s, o).code(), Code::kInvalidArgument);
}

// ---- interop with qemu-img ----

struct CommandResult {
  int exit_code = -1;
  std::string output;
};

CommandResult RunCommand(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool HaveQemuImg() { return RunCommand("qemu-img --version").exit_code == 0; }

// A temp dir under $TMPDIR (or /tmp).
class TempDir : public test_env::TempDir {
 public:
  TempDir() : test_env::TempDir(std::filesystem::temp_directory_path().string(), "td_create") {}
};

// A missing qemu-img skips locally, fails in CI (util/capability_test_util.h).
#define SKIP_WITHOUT_QEMU_IMG() TD_REQUIRE_TOOL("qemu-img", HaveQemuImg())

Status CreateFile(const std::string& path, const CreateOptions& o) {
  io::OpenOptions oo;
  oo.create = true;
  oo.exclusive = true;
  auto f = io::OpenFile(path, oo);
  if (!f.has_value()) return f.error();
  return Create(**f, o);
}

class CreateInterop : public testing::TestWithParam<Combo> {};

TEST_P(CreateInterop, QemuImgChecksCleanAndReadsOptionsBack) {
  SKIP_WITHOUT_QEMU_IMG();
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const CreateOptions& o = GetParam().o;
  std::string path = dir.path() + "/image.qcow2";
  Status st = CreateFile(path, o);
  ASSERT_TRUE(st.ok()) << st.ToString();

  CommandResult check = RunCommand("qemu-img check --output=json '" + path + "'");
  EXPECT_EQ(check.exit_code, 0) << check.output;
  auto cj = nlohmann::json::parse(check.output, nullptr, false);
  ASSERT_FALSE(cj.is_discarded()) << check.output;
  EXPECT_EQ(cj.value("corruptions", 0), 0);
  EXPECT_EQ(cj.value("leaks", 0), 0);
  EXPECT_EQ(cj.value("check-errors", 0), 0);
  uint64_t cs = o.cluster_size;
  EXPECT_EQ(cj.value("total-clusters", uint64_t{0}), (o.size + cs - 1) / cs);
  EXPECT_EQ(cj.value("allocated-clusters", uint64_t{0}),
            o.preallocation == Preallocation::kOff ? 0 : (o.size + cs - 1) / cs);

  CommandResult info = RunCommand("qemu-img info --output=json '" + path + "'");
  ASSERT_EQ(info.exit_code, 0) << info.output;
  auto ij = nlohmann::json::parse(info.output, nullptr, false);
  ASSERT_FALSE(ij.is_discarded()) << info.output;
  EXPECT_EQ(ij["format"], "qcow2");
  EXPECT_EQ(ij["cluster-size"].get<uint64_t>(), o.cluster_size);
  EXPECT_EQ(ij["virtual-size"].get<uint64_t>(), o.size);
  const auto& data = ij["format-specific"]["data"];
  EXPECT_EQ(data["compat"], o.version == 3 ? "1.1" : "0.10");
  EXPECT_EQ(data["compression-type"], o.compression_type == CompressionType::kZstd ? "zstd" : "zlib");
  EXPECT_EQ(data["refcount-bits"].get<uint32_t>(), o.refcount_bits);
  if (o.version == 3) {
    EXPECT_EQ(data["extended-l2"].get<bool>(), o.extended_l2);
    EXPECT_EQ(data["lazy-refcounts"].get<bool>(), o.lazy_refcounts);
    EXPECT_EQ(data["corrupt"].get<bool>(), false);
  }
}

INSTANTIATE_TEST_SUITE_P(Options, CreateInterop, testing::ValuesIn(Combos()),
                         [](const auto& info) { return info.param.name; });

TEST(CreateInteropBacking, QemuImgSeesTheBackingFile) {
  SKIP_WITHOUT_QEMU_IMG();
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  CreateOptions base;
  base.size = 16ull << 20;
  ASSERT_TRUE(CreateFile(dir.path() + "/base.qcow2", base).ok());
  CreateOptions top = base;
  top.backing_file = dir.path() + "/base.qcow2";
  top.backing_format = "qcow2";
  top.preallocation = Preallocation::kMetadata;
  std::string path = dir.path() + "/top.qcow2";
  ASSERT_TRUE(CreateFile(path, top).ok());

  CommandResult check = RunCommand("qemu-img check '" + path + "'");
  EXPECT_EQ(check.exit_code, 0) << check.output;
  CommandResult info = RunCommand("qemu-img info --output=json '" + path + "'");
  ASSERT_EQ(info.exit_code, 0) << info.output;
  auto ij = nlohmann::json::parse(info.output, nullptr, false);
  ASSERT_FALSE(ij.is_discarded());
  EXPECT_EQ(ij["backing-filename"], top.backing_file);
  EXPECT_EQ(ij["backing-filename-format"], "qcow2");
  // Preallocated but not allocated: every guest byte still comes from the
  // (empty) backing file, so the map shows no data in the top layer.
  CommandResult map = RunCommand("qemu-img map --output=json '" + path + "'");
  ASSERT_EQ(map.exit_code, 0) << map.output;
  auto mj = nlohmann::json::parse(map.output, nullptr, false);
  ASSERT_TRUE(mj.is_array()) << map.output;
  for (const auto& e : mj) EXPECT_NE(e["depth"].get<int>(), 0) << map.output;
}

}  // namespace
}  // namespace thindisk::qcow2
