#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/image_create.h"
#include "cli/image_summary.h"
#include "cli/io_cmd.h"
#include "io/storage.h"
#include "util/capability_test_util.h"
#include "util/endian.h"

namespace thindisk::cli {
namespace {

namespace fs = std::filesystem;

TEST(ParseIoCommandTest, WriteWithPatternAndSuffixes) {
  auto r = ParseIoCommand("write -P 0xab 4k 64k");
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(r->kind, IoRequest::Kind::kWrite);
  EXPECT_TRUE(r->has_pattern);
  EXPECT_EQ(r->pattern, 0xab);
  EXPECT_EQ(r->offset, 4096u);
  EXPECT_EQ(r->length, 65536u);
  auto glued = ParseIoCommand("write -P171 0 512");
  ASSERT_TRUE(glued.has_value());
  EXPECT_EQ(glued->pattern, 171);
}

TEST(ParseIoCommandTest, DefaultsAndFlags) {
  auto w = ParseIoCommand("write 0 1M");
  ASSERT_TRUE(w.has_value());
  EXPECT_FALSE(w->has_pattern);
  EXPECT_EQ(w->pattern, kDefaultWritePattern);
  auto z = ParseIoCommand("write -z -u 1M 2M");
  ASSERT_TRUE(z.has_value());
  EXPECT_TRUE(z->zero);
  EXPECT_TRUE(z->unmap);
  EXPECT_EQ(z->offset, 1ull << 20);
  auto zq = ParseIoCommand("write -zq 0 4k");
  ASSERT_TRUE(zq.has_value());
  EXPECT_TRUE(zq->zero);
  EXPECT_TRUE(zq->quiet);
  auto d = ParseIoCommand("  discard   64k 64k ");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->kind, IoRequest::Kind::kDiscard);
  EXPECT_EQ(ParseIoCommand("flush")->kind, IoRequest::Kind::kFlush);
  EXPECT_EQ(ParseIoCommand("aio_flush")->kind, IoRequest::Kind::kFlush);
  auto rd = ParseIoCommand("read -P 0 0 4k");
  ASSERT_TRUE(rd.has_value());
  EXPECT_TRUE(rd->has_pattern);
  EXPECT_EQ(rd->pattern, 0);
}

TEST(ParseIoCommandTest, RefusesMalformedCommands) {
  for (const char* bad : {"", "frobnicate 0 1", "write 0", "write 0 1 2", "read -P 256 0 1",
                          "read -P x 0 1", "write -P", "write -z -P 1 0 1", "write -u 0 1",
                          "read -z 0 1", "discard -P 1 0 1", "flush 0", "write 0 2G",
                          "read 0 -1"}) {
    EXPECT_FALSE(ParseIoCommand(bad).has_value()) << "'" << bad << "' parsed";
  }
  // Zeroing needs no buffer, so it may be large.
  EXPECT_TRUE(ParseIoCommand("write -z 0 2G").has_value());
}

// A cluster size under 16 KiB turns the extended L2 default off, as
// qemu-img's is off (`-o cluster_size=4k` alone must create an image); asked
// for explicitly, it stays on and creation refuses it with the reason.
TEST(CreatePlanTest, SmallClustersDefaultToStandardL2) {
  for (const char* size : {"512", "4k", "8k"}) {
    CreatePlan plan;
    plan.format = "qcow2";
    ASSERT_TRUE(ApplyCreateOptions(plan, {std::string("cluster_size=") + size}).ok());
    EXPECT_FALSE(plan.qcow2.extended_l2) << size;
  }
  CreatePlan at_16k;
  at_16k.format = "qcow2";
  ASSERT_TRUE(ApplyCreateOptions(at_16k, {"cluster_size=16k"}).ok());
  EXPECT_TRUE(at_16k.qcow2.extended_l2);
  CreatePlan asked;
  asked.format = "qcow2";
  ASSERT_TRUE(ApplyCreateOptions(asked, {"cluster_size=4k,extended_l2=on"}).ok());
  EXPECT_TRUE(asked.qcow2.extended_l2);
  // The order of the options does not matter.
  CreatePlan later;
  later.format = "qcow2";
  ASSERT_TRUE(ApplyCreateOptions(later, {"extended_l2=on", "cluster_size=4k"}).ok());
  EXPECT_TRUE(later.qcow2.extended_l2);
}

TEST(CreatePlanTest, OptionsAndFormattingLine) {
  CreatePlan plan;
  plan.format = "qcow2";
  ASSERT_TRUE(ApplyCreateOptions(plan, {"cluster_size=64k,extended_l2=off",
                                        "compression_type=zlib,preallocation=metadata"})
                  .ok());
  EXPECT_EQ(plan.qcow2.cluster_size, 65536u);
  EXPECT_FALSE(plan.qcow2.extended_l2);
  EXPECT_EQ(plan.qcow2.preallocation, qcow2::Preallocation::kMetadata);
  plan.size = 1 << 20;
  EXPECT_EQ(FormattingLine("a.qcow2", plan),
            "Formatting 'a.qcow2', fmt=qcow2 cluster_size=65536 extended_l2=off "
            "preallocation=metadata compression_type=zlib size=1048576 lazy_refcounts=off "
            "refcount_bits=16");
  EXPECT_FALSE(ApplyCreateOption(plan, "bogus", "1").ok());
  EXPECT_FALSE(ApplyCreateOption(plan, "compat", "2.0").ok());
  EXPECT_TRUE(ApplyCreateOption(plan, "compat", "v2").ok());
  EXPECT_EQ(plan.qcow2.version, 2u);

  CreatePlan raw;
  raw.format = "raw";
  EXPECT_TRUE(ApplyCreateOption(raw, "preallocation", "falloc").ok());
  EXPECT_FALSE(ApplyCreateOption(raw, "preallocation", "metadata").ok());
  EXPECT_FALSE(ApplyCreateOption(raw, "cluster_size", "64k").ok());
  raw.size = 4096;
  EXPECT_EQ(FormattingLine("r.img", raw), "Formatting 'r.img', fmt=raw size=4096 preallocation=falloc");
}

TEST(CreatePlanTest, DefaultsAreV3ExtendedL2Zstd128k) {
  CreatePlan plan;
  plan.format = "qcow2";
  plan.size = 1 << 30;
  EXPECT_EQ(FormattingLine("d.qcow2", plan),
            "Formatting 'd.qcow2', fmt=qcow2 cluster_size=131072 extended_l2=on "
            "compression_type=zstd size=1073741824 lazy_refcounts=off refcount_bits=16");
}

TEST(ParseIoCommandTest, ReadVerbose) {
  auto v = ParseIoCommand("read -v 0 64");
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->verbose);
  EXPECT_FALSE(v->quiet);
  auto vq = ParseIoCommand("read -vq -P 7 0 64");
  ASSERT_TRUE(vq.has_value());
  EXPECT_TRUE(vq->verbose && vq->quiet && vq->has_pattern);
  EXPECT_FALSE(ParseIoCommand("read 0 64")->verbose);
  EXPECT_FALSE(ParseIoCommand("write -v 0 64").has_value());
  EXPECT_FALSE(ParseIoCommand("discard -v 0 64").has_value());
}

TEST(FormatHexDumpTest, QemuIoLayout) {
  std::vector<uint8_t> bytes = {'A', 'z', '0', ' ', '.', 0x7f, 0x00, 0xc3, 0xff, '9',
                                'Z', 'a', '!', '\n', 0x10, 0x80, 'q', 'r'};
  EXPECT_EQ(FormatHexDump(0x1230, bytes),
            "00001230:  41 7a 30 20 2e 7f 00 c3 ff 39 5a 61 21 0a 10 80  Az0......9Za....\n"
            "00001240:  71 72  qr\n");
  EXPECT_EQ(FormatHexDump(5, std::vector<uint8_t>{'a'}), "00000005:  61  a\n");
  EXPECT_EQ(FormatHexDump(0, {}), "");
  // Offsets past 4 GiB widen the column, as printf("%08x") does.
  EXPECT_EQ(FormatHexDump(0x123456789, std::vector<uint8_t>{0}), "123456789:  00  .\n");
}

// End to end on raw files: the full command paths without the qcow2 engine.
class ThindiskRawTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "td_cli_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& n) const { return (fs::path(dir_) / n).string(); }

  int Run(std::vector<std::string> args) {
    args.insert(args.begin(), "thindisk");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    return RunThindisk(static_cast<int>(argv.size()), argv.data());
  }

  std::string dir_;
};

TEST_F(ThindiskRawTest, CreateWriteReadCompareConvert) {
  ASSERT_EQ(Run({"create", "-q", "-f", "raw", Path("a.raw"), "1M"}), 0);
  EXPECT_EQ(fs::file_size(Path("a.raw")), 1u << 20);
  ASSERT_EQ(Run({"io", "-f", "raw", "-c", "write -P 0x5a 64k 8k", Path("a.raw")}), 0);
  EXPECT_EQ(Run({"io", "-f", "raw", "-c", "read -P 0x5a 64k 8k", Path("a.raw")}), 0);
  EXPECT_EQ(Run({"io", "-f", "raw", "-c", "read -P 0x5a 60k 8k", Path("a.raw")}), 1);

  ASSERT_EQ(Run({"convert", "-f", "raw", "-O", "raw", Path("a.raw"), Path("b.raw")}), 0);
  EXPECT_EQ(Run({"compare", "-q", Path("a.raw"), Path("b.raw")}), 0);
  // Only data was written: the copy is as sparse as the source's data.
  struct stat st {};
  ASSERT_EQ(::stat(Path("b.raw").c_str(), &st), 0);
  EXPECT_LE(static_cast<uint64_t>(st.st_blocks) * 512, 64u << 10);

  ASSERT_EQ(Run({"io", "-f", "raw", "-c", "write -P 1 100k 1", Path("b.raw")}), 0);
  EXPECT_EQ(Run({"compare", "-q", Path("a.raw"), Path("b.raw")}), 1);
  EXPECT_EQ(Run({"compare", "-q", Path("a.raw"), Path("missing.raw")}), 2);
}

TEST_F(ThindiskRawTest, CompareSizeRule) {
  ASSERT_EQ(Run({"create", "-q", "-f", "raw", Path("small.raw"), "64k"}), 0);
  ASSERT_EQ(Run({"create", "-q", "-f", "raw", Path("big.raw"), "128k"}), 0);
  EXPECT_EQ(Run({"compare", "-q", Path("small.raw"), Path("big.raw")}), 0);
  EXPECT_EQ(Run({"compare", "-q", "-s", Path("small.raw"), Path("big.raw")}), 1);
  ASSERT_EQ(Run({"io", "-f", "raw", "-c", "write -P 7 100k 1", Path("big.raw")}), 0);
  EXPECT_EQ(Run({"compare", "-q", Path("small.raw"), Path("big.raw")}), 1);
}

TEST_F(ThindiskRawTest, DiscardAndZeroesReadBackAsZeros) {
  ASSERT_EQ(Run({"create", "-q", "-f", "raw", Path("z.raw"), "256k"}), 0);
  ASSERT_EQ(Run({"io", "-f", "raw", "-c", "write 0 256k", "-c", "discard 0 64k", "-c",
                 "write -z 64k 64k", "-c", "flush", Path("z.raw")}),
            0);
  EXPECT_EQ(Run({"io", "-f", "raw", "-c", "read -P 0 0 128k", "-c", "read -P 0xcd 128k 128k",
                 Path("z.raw")}),
            0);
}

TEST_F(ThindiskRawTest, ConvertFailureLeavesNoDestination) {
  // Converting onto a missing source creates nothing.
  EXPECT_EQ(Run({"convert", "-O", "raw", Path("nope.raw"), Path("out.raw")}), 1);
  EXPECT_FALSE(fs::exists(Path("out.raw")));
  // A file converted onto itself is refused, not truncated.
  ASSERT_EQ(Run({"create", "-q", "-f", "raw", Path("self.raw"), "64k"}), 0);
  EXPECT_EQ(Run({"convert", "-f", "raw", "-O", "raw", Path("self.raw"), Path("self.raw")}), 1);
  EXPECT_EQ(fs::file_size(Path("self.raw")), 64u << 10);
}

TEST_F(ThindiskRawTest, BadArgumentsExitOne) {
  EXPECT_EQ(Run({"create", "-f", "raw", Path("x.raw"), "1Q"}), 1);
  EXPECT_FALSE(fs::exists(Path("x.raw")));
  EXPECT_EQ(Run({"create", "-f", "vmdk", Path("x.raw"), "1M"}), 1);
  EXPECT_EQ(Run({"frobnicate"}), 1);
  EXPECT_EQ(Run({"--version"}), 0);
}

// ---- qcow2, checked against qemu-img itself ----

bool HaveQemuImg() { return std::system("qemu-img --version >/dev/null 2>&1") == 0; }

// A missing qemu-img skips locally, fails in CI (util/capability_test_util.h).
#define REQUIRE_QEMU_IMG() TD_REQUIRE_TOOL("qemu-img", HaveQemuImg())

class ThindiskQcow2Test : public ThindiskRawTest {
 protected:
  // Runs a shell command in dir_ and returns its exit status.
  int Sh(const std::string& cmd) {
    int rc = std::system(("cd '" + dir_ + "' && " + cmd + " >/dev/null 2>&1").c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  }
  // stdout of a shell command run in dir_.
  std::string ShOut(const std::string& cmd) {
    std::string out;
    FILE* p = ::popen(("cd '" + dir_ + "' && " + cmd).c_str(), "r");
    if (!p) return out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    ::pclose(p);
    return out;
  }
  // Our stdout for a thindisk command.
  std::string Capture(std::vector<std::string> args, int* rc) {
    ::testing::internal::CaptureStdout();
    *rc = Run(std::move(args));
    return ::testing::internal::GetCapturedStdout();
  }
};

TEST_F(ThindiskQcow2Test, InfoJsonMatchesQemuImg) {
  REQUIRE_QEMU_IMG();
  ASSERT_EQ(Sh("mkdir sub && qemu-img create -f raw sub/base.raw 2M && "
               "qemu-img create -f qcow2 -o extended_l2=on,cluster_size=64k -b base.raw -F raw "
               "sub/top.qcow2 && qemu-img create -f qcow2 -o compat=0.10 v2.qcow2 1G && "
               "qemu-img snapshot -c snap1 v2.qcow2"),
            0);
  for (const char* image : {"sub/top.qcow2", "v2.qcow2", "sub/base.raw"}) {
    int rc = -1;
    std::string ours = Capture({"info", "--output=json", Path(image)}, &rc);
    ASSERT_EQ(rc, 0) << image;
    std::string theirs = ShOut("qemu-img info --output=json '" + Path(image) + "'");
    EXPECT_EQ(nlohmann::json::parse(ours), nlohmann::json::parse(theirs)) << image;
    std::string ours_human = Capture({"info", Path(image)}, &rc);
    EXPECT_EQ(ours_human, ShOut("qemu-img info '" + Path(image) + "'")) << image;
  }
  int rc = -1;
  std::string ours = Capture({"info", "--output=json", "--backing-chain", Path("sub/top.qcow2")}, &rc);
  ASSERT_EQ(rc, 0);
  std::string theirs =
      ShOut("qemu-img info --output=json --backing-chain '" + Path("sub/top.qcow2") + "'");
  EXPECT_EQ(nlohmann::json::parse(ours), nlohmann::json::parse(theirs));
}

TEST_F(ThindiskQcow2Test, CreateDefaultsPassQemuCheck) {
  REQUIRE_QEMU_IMG();
  ASSERT_EQ(Run({"create", "-q", Path("d.qcow2"), "1G"}), 0);
  EXPECT_EQ(Sh("qemu-img check d.qcow2"), 0);
  auto info = nlohmann::json::parse(ShOut("qemu-img info --output=json d.qcow2"));
  EXPECT_EQ(info["cluster-size"], 131072);
  EXPECT_EQ(info["format-specific"]["data"]["extended-l2"], true);
  EXPECT_EQ(info["format-specific"]["data"]["compression-type"], "zstd");
  EXPECT_EQ(info["format-specific"]["data"]["compat"], "1.1");
  // Without a size, a backed image takes its backing file's.
  ASSERT_EQ(Run({"create", "-q", "-b", "d.qcow2", "-F", "qcow2", Path("o.qcow2")}), 0);
  auto o = nlohmann::json::parse(ShOut("qemu-img info --output=json o.qcow2"));
  EXPECT_EQ(o["virtual-size"], 1ull << 30);
  EXPECT_EQ(o["backing-filename"], "d.qcow2");
}

// A qcow2 size is a sector count: qemu-img create and convert round a size
// that is not a multiple of 512 up, and so does thindisk.
TEST_F(ThindiskQcow2Test, OddSizesRoundUpToSectorsAsQemuImg) {
  REQUIRE_QEMU_IMG();
  ASSERT_EQ(Run({"create", "-q", "-f", "qcow2", Path("odd.qcow2"), "1001"}), 0);
  ASSERT_EQ(Sh("qemu-img create -q -f qcow2 odd.qemu 1001"), 0);
  auto virtual_size = [&](const char* image) {
    return ShOut("qemu-img info --output=json " + std::string(image) +
                 " | jq '.[\"virtual-size\"]'");
  };
  EXPECT_EQ(virtual_size("odd.qcow2"), "1024\n");
  EXPECT_EQ(virtual_size("odd.qcow2"), virtual_size("odd.qemu"));
  EXPECT_EQ(Sh("qemu-img check odd.qcow2"), 0);
  // A 1001-byte raw source converts into a 1024-byte qcow2 holding its
  // bytes, then zeros.
  ASSERT_EQ(Sh("head -c 1001 /dev/urandom > odd.raw && cp odd.raw padded.raw && "
               "truncate -s 1024 padded.raw"),
            0);
  ASSERT_EQ(Run({"convert", "-q", "-f", "raw", "-O", "qcow2", Path("odd.raw"),
                 Path("copy.qcow2")}),
            0);
  EXPECT_EQ(virtual_size("copy.qcow2"), "1024\n");
  EXPECT_EQ(Sh("qemu-img compare -f raw -F qcow2 padded.raw copy.qcow2"), 0);
  EXPECT_EQ(Sh("qemu-img check copy.qcow2"), 0);
}

TEST_F(ThindiskQcow2Test, FailedCreateLeavesNoFile) {
  ASSERT_NE(Run({"create", "-q", "-o", "cluster_size=3", Path("bad.qcow2"), "1M"}), 0);
  EXPECT_FALSE(fs::exists(Path("bad.qcow2")));
  ASSERT_NE(Run({"create", "-q", "-o", "compat=0.10,compression_type=zstd", Path("bad.qcow2"),
                 "1M"}),
            0);
  EXPECT_FALSE(fs::exists(Path("bad.qcow2")));
}

TEST_F(ThindiskQcow2Test, ConvertCompressedAndPlainMatchSource) {
  REQUIRE_QEMU_IMG();
  ASSERT_EQ(Sh("qemu-img create -f raw src.raw 3M && "
               "qemu-io -f raw -c 'write -P 0x11 0 200k' -c 'write -P 0x22 1M 4k' "
               "-c 'write -P 0x33 3068k 4k' src.raw"),
            0);
  ASSERT_EQ(Run({"convert", "-f", "raw", "-O", "qcow2", "-c", Path("src.raw"), Path("c.qcow2")}), 0);
  EXPECT_EQ(Sh("qemu-img check c.qcow2"), 0);
  EXPECT_EQ(Sh("qemu-img compare -f raw -F qcow2 src.raw c.qcow2"), 0);
  auto check = nlohmann::json::parse(ShOut("qemu-img check --output=json c.qcow2"));
  EXPECT_GT(check.value("compressed-clusters", 0), 0);

  ASSERT_EQ(Run({"convert", "-O", "qcow2", Path("c.qcow2"), Path("p.qcow2")}), 0);
  EXPECT_EQ(Sh("qemu-img compare -f raw -F qcow2 src.raw p.qcow2"), 0);
  ASSERT_EQ(Run({"convert", "-O", "raw", Path("p.qcow2"), Path("back.raw")}), 0);
  EXPECT_EQ(Sh("cmp src.raw back.raw"), 0);
  // The source is never modified.
  EXPECT_EQ(Sh("qemu-img check c.qcow2"), 0);
}

TEST_F(ThindiskQcow2Test, MapJsonMatchesQemuImgOnRaw) {
  REQUIRE_QEMU_IMG();
  ASSERT_EQ(Sh("qemu-img create -f raw r.raw 1M && "
               "qemu-io -f raw -c 'write 64k 64k' -c 'write 512k 4k' r.raw"),
            0);
  int rc = -1;
  std::string ours = Capture({"map", "-f", "raw", "--output=json", Path("r.raw")}, &rc);
  ASSERT_EQ(rc, 0);
  std::string theirs = ShOut("qemu-img map -f raw --output=json '" + Path("r.raw") + "'");
  // Same extents apart from qemu's choice to call the first 4 KiB of a raw
  // file data whatever it holds.
  auto a = nlohmann::json::parse(ours);
  auto b = nlohmann::json::parse(theirs);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a.back(), b.back());
  auto data_starts = [](const nlohmann::json& v) {
    std::vector<uint64_t> s;
    for (const auto& e : v) {
      if (e["data"] == true && e["start"] != 0) s.push_back(e["start"]);
    }
    return s;
  };
  EXPECT_EQ(data_starts(a), data_starts(b));
}

// Adds an unreferenced cluster with refcount 1 at the end of the image.
void MakeLeak(const std::string& path) {
  io::OpenOptions o;
  auto storage = io::OpenFile(path, o);
  ASSERT_TRUE(storage.has_value()) << storage.error().message();
  auto header = ReadQcow2Header(**storage);
  ASSERT_TRUE(header.has_value()) << header.error().message();
  uint64_t cs = header->cluster_size();
  uint64_t size = (*storage)->Size().value();
  uint64_t leaked = size / cs;
  ASSERT_TRUE((*storage)->Resize((leaked + 1) * cs).ok());
  uint8_t entry[8];
  ASSERT_TRUE((*storage)->ReadAt(header->refcount_table_offset, entry).ok());
  uint64_t block = LoadBe64(entry);
  ASSERT_EQ(header->refcount_order, 4u);
  uint8_t one[2];
  StoreBe16(one, 1);
  ASSERT_TRUE((*storage)->WriteAt(block + leaked * 2, one).ok());
  ASSERT_TRUE((*storage)->Flush().ok());
}

// Makes the L2 entry of guest cluster `guest_cluster` (standard 64 KiB
// clusters, 8-byte entries) point at an unaligned host offset.
void CorruptL2Entry(const std::string& path, uint64_t guest_cluster) {
  io::OpenOptions o;
  auto storage = io::OpenFile(path, o);
  ASSERT_TRUE(storage.has_value()) << storage.error().message();
  auto header = ReadQcow2Header(**storage);
  ASSERT_TRUE(header.has_value());
  ASSERT_EQ(header->cluster_size(), 65536u);
  ASSERT_FALSE(header->extended_l2());
  uint64_t per_l2 = header->cluster_size() / 8;
  uint8_t word[8];
  ASSERT_TRUE((*storage)->ReadAt(header->l1_table_offset + guest_cluster / per_l2 * 8, word).ok());
  uint64_t l2 = LoadBe64(word) & 0x00fffffffffffe00ull;
  ASSERT_NE(l2, 0u);
  uint64_t at = l2 + guest_cluster % per_l2 * 8;
  ASSERT_TRUE((*storage)->ReadAt(at, word).ok());
  ASSERT_NE(LoadBe64(word), 0u);
  StoreBe64(word, LoadBe64(word) + 512);
  ASSERT_TRUE((*storage)->WriteAt(at, word).ok());
  ASSERT_TRUE((*storage)->Flush().ok());
}

TEST_F(ThindiskQcow2Test, ConvertFailingMidCopyRemovesDestination) {
  REQUIRE_QEMU_IMG();
  // Two L2 tables; the second is only read when the copy reaches it.
  ASSERT_EQ(Sh("qemu-img create -f qcow2 src.qcow2 1G && "
               "qemu-io -c 'write -P 1 0 64k' -c 'write -P 2 600M 64k' src.qcow2"),
            0);
  CorruptL2Entry(Path("src.qcow2"), (600ull << 20) / 65536);
  EXPECT_EQ(Run({"convert", "-O", "raw", Path("src.qcow2"), Path("dst.raw")}), 1);
  EXPECT_FALSE(fs::exists(Path("dst.raw")));
  EXPECT_EQ(Run({"convert", "-O", "qcow2", "-c", Path("src.qcow2"), Path("dst.qcow2")}), 1);
  EXPECT_FALSE(fs::exists(Path("dst.qcow2")));
}

TEST_F(ThindiskQcow2Test, CheckExitCodesAndRepair) {
  REQUIRE_QEMU_IMG();
  ASSERT_EQ(Sh("qemu-img create -f qcow2 l.qcow2 16M && qemu-io -c 'write 0 64k' l.qcow2"), 0);
  EXPECT_EQ(Run({"check", "-q", Path("l.qcow2")}), 0);
  MakeLeak(Path("l.qcow2"));
  ASSERT_EQ(Sh("qemu-img check l.qcow2"), 3);  // qemu-img agrees it is a leak
  int rc = -1;
  auto report = nlohmann::json::parse(Capture({"check", "--output=json", Path("l.qcow2")}, &rc));
  EXPECT_EQ(rc, 3);
  EXPECT_EQ(report["leaks"], 1);
  EXPECT_EQ(report["check-errors"], 0);
  EXPECT_EQ(Run({"check", "-q", "-r", "leaks", Path("l.qcow2")}), 0);
  EXPECT_EQ(Sh("qemu-img check l.qcow2"), 0);
  ASSERT_EQ(Sh("qemu-img create -f raw r.raw 1M"), 0);
  EXPECT_EQ(Run({"check", Path("r.raw")}), 1);
}

TEST_F(ThindiskQcow2Test, IoReadVerboseMatchesQemuIo) {
  REQUIRE_QEMU_IMG();
  // Every byte value, so the ASCII column is checked for all of them.
  {
    std::ofstream f(Path("seq.raw"), std::ios::binary);
    for (int pass = 0; pass < 3; ++pass) {
      for (int b = 0; b < 256; ++b) f.put(char(pass == 1 ? 255 - b : b));
    }
  }
  ASSERT_EQ(Sh("qemu-img convert -f raw -O qcow2 seq.raw seq.qcow2 && "
               "qemu-img resize -q seq.qcow2 5G && "
               "qemu-io -c 'write -P 0x41 4294967290 12' seq.qcow2"),
            0);
  const std::vector<std::string> commands = {
      "read -v 0 768",  "read -v 3 509",          "read -v 100 1",  "read -v 700 100",
      "read -vq 0 16",  "read -v -P 0 0 20",      "read -P 0 -v 1000 16",
      "read -v 4294967290 12"};
  std::string qemu_cmd = "qemu-io";
  std::vector<std::string> args = {"io"};
  for (const std::string& c : commands) {
    qemu_cmd += " -c '" + c + "'";
    args.push_back("-c");
    args.push_back(c);
  }
  args.push_back(Path("seq.qcow2"));
  // Everything but the timing lines must be identical.
  auto without_timing = [](const std::string& out) {
    std::istringstream in(out);
    std::string line, kept;
    while (std::getline(in, line)) {
      if (line.find(" ops; ") == std::string::npos) kept += line + "\n";
    }
    return kept;
  };
  std::string theirs = without_timing(ShOut(qemu_cmd + " seq.qcow2"));
  int rc = -1;
  std::string ours = without_timing(Capture(args, &rc));
  EXPECT_EQ(rc, 1);  // the -P 0 reads fail, as in qemu-io
  ASSERT_NE(theirs.find("000002f0:  f0 f1 f2"), std::string::npos) << theirs;
  EXPECT_EQ(ours, theirs);
}

}  // namespace
}  // namespace thindisk::cli
