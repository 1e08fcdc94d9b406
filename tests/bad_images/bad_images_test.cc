// Hostile and corrupt qcow2 images against the thindisk binary.
//
// Each case starts from a valid image made by qemu-img (and filled by
// qemu-io), patches bytes in memory as the qcow2 spec lays them out, and
// runs `thindisk info`, `thindisk io -c 'read 0 64k'` and `thindisk check`
// on the result. DESIGN.md rule 4: bad input is an error, never a crash.
// For every command we demand: no crash or hang (exit < 128, no signal, no
// sanitizer report) and the image files byte-for-byte unchanged. For the
// commands the case says must fail: a non-zero exit and, unless `check`
// reports findings (exit 2 or 3), exactly one "thindisk: ..." line on stderr
// that names the problem (one of the case's keywords, case-insensitive).
//
// Which commands must fail: damage to the header fails all three; damage to
// the tables (L1/L2 entries) is only seen by io (which reads cluster 0) and
// check (which walks every table), since info reads the header alone; bad
// backing chains only matter to io, because info and check look at the one
// image (as qemu-img's do) and may succeed.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "qcow2_bytes.h"
#include "run_command.h"

// Compile-time paths from tests/CMakeLists.txt; the environment variables of
// the same names without _BIN (THINDISK, QEMU_IMG, QEMU_IO) override them.
#ifndef THINDISK_BIN
#define THINDISK_BIN "thindisk"
#endif
#ifndef QEMU_IMG_BIN
#define QEMU_IMG_BIN "qemu-img"
#endif
#ifndef QEMU_IO_BIN
#define QEMU_IO_BIN "qemu-io"
#endif

namespace thindisk::testing {
namespace {

namespace fs = std::filesystem;

enum Command : unsigned { kInfo = 1, kIo = 2, kCheck = 4, kAll = kInfo | kIo | kCheck };
constexpr uint64_t kSeedSize = 16 << 20;

std::string ToolPath(const char* env, const char* fallback) {
  const char* v = getenv(env);
  return v && *v ? v : fallback;
}
std::string Thindisk() { return ToolPath("THINDISK", THINDISK_BIN); }
std::string QemuImg() { return ToolPath("QEMU_IMG", QEMU_IMG_BIN); }
std::string QemuIo() { return ToolPath("QEMU_IO", QEMU_IO_BIN); }
bool ToolsRequired() { return getenv("CI") || getenv("THINDISK_REQUIRE_TOOLS"); }

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

Bytes ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// What a case builds: the image the commands open and every file that must
// survive them unchanged.
struct Build {
  fs::path dir;
  fs::path target;
  std::vector<fs::path> files;
  bool force_qcow2 = false;  // pass -f qcow2: probing would take a bad magic for raw

  // Runs a tool that must succeed while building.
  void Must(const std::vector<std::string>& argv) const {
    CommandResult r = RunCommand(argv);
    ASSERT_TRUE(r.started && !r.signaled && !r.timed_out && r.exit_code == 0)
        << JoinArgs(argv) << " failed: " << r.out << r.err;
  }

  // A valid image made by qemu-img with `opts`, filled by qemu-io `cmds`,
  // returned as bytes (the file is removed).
  Bytes Seed(const std::string& opts, const std::vector<std::string>& cmds) const {
    fs::path p = dir / "seed";
    Must({QemuImg(), "create", "-q", "-f", "qcow2", "-o", opts, p, std::to_string(kSeedSize)});
    std::vector<std::string> io = {QemuIo()};
    for (const std::string& c : cmds) {
      io.push_back("-c");
      io.push_back(c);
    }
    io.push_back(p);
    if (!cmds.empty()) Must(io);
    Bytes b = ReadFile(p);
    fs::remove(p);
    // After a failure above, keep the patchers inside their buffer.
    if (::testing::Test::HasFatalFailure() && b.size() < (4u << 20)) b.resize(4u << 20);
    return b;
  }
  // The usual seed: 64 KiB clusters, clusters 0 and 1 written.
  Bytes Seed64k() const { return Seed("cluster_size=65536", {"write -P 0x11 0 128k"}); }

  // Writes the image under test.
  void Image(const Bytes& bytes) {
    target = dir / "img";
    WriteFile(target, bytes);
    files = {target};
  }
};

struct Case {
  const char* name;
  unsigned must_fail;
  std::vector<std::string> keywords;
  std::function<void(Build&)> build;
};

// gtest prints the case by name, not as bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

void PatchHeader32(Build& b, size_t at, uint32_t v) {
  Bytes x = b.Seed64k();
  Put32(x, at, v);
  b.Image(x);
}

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// Sets an incompatible feature bit; `table` names it in the feature name
// table, or (empty) the table is dropped altogether.
void UnknownIncompatibleBit(Build& b, const std::string& table_name) {
  Bytes x = b.Seed64k();
  std::vector<Extension> exts = ReadExtensions(x);
  std::erase_if(exts, [](const Extension& e) { return e.type == kExtFeatureNameTable; });
  if (!table_name.empty()) {
    Extension names{kExtFeatureNameTable, FeatureNameEntry(0, 7, table_name)};
    Bytes dirty = FeatureNameEntry(0, 0, "dirty bit");
    names.data.insert(names.data.end(), dirty.begin(), dirty.end());
    exts.push_back(names);
  }
  WriteExtensions(x, exts);
  Put64(x, kIncompatibleFeaturesAt, Get64(x, kIncompatibleFeaturesAt) | (1ull << 7));
  b.Image(x);
}

// a -> b -> a, or a chain of `depth` overlays above one base.
void BackingChain(Build& b, int depth, bool loop) {
  auto name = [&](int i) { return "layer" + std::to_string(i); };
  auto create = [&](int i, const std::string& backing) {
    std::vector<std::string> argv = {QemuImg(), "create", "-q", "-f", "qcow2"};
    if (!backing.empty()) argv.insert(argv.end(), {"-u", "-b", backing, "-F", "qcow2"});
    argv.push_back(b.dir / name(i));
    argv.push_back(std::to_string(kSeedSize));
    b.Must(argv);
    b.files.push_back(b.dir / name(i));
  };
  if (loop) {
    create(0, name(1));
    create(1, name(0));
    b.target = b.dir / name(0);
    return;
  }
  create(0, "");
  for (int i = 1; i <= depth; ++i) create(i, name(i - 1));
  b.target = b.dir / name(depth);
}

// An image with the bitmaps qemu-img adds (`add` flags each, e.g.
// {"bm0"}, {"--disable", "bm1"}), after a write; `patch` gets the bytes and
// the directory's offset, then the image is the result.
void BitmapImage(Build& b, const std::vector<std::vector<std::string>>& adds,
                 const std::function<void(Bytes&, uint64_t)>& patch) {
  fs::path p = b.dir / "seed";
  b.Must({QemuImg(), "create", "-q", "-f", "qcow2", "-o", "cluster_size=65536", p,
          std::to_string(kSeedSize)});
  for (const std::vector<std::string>& add : adds) {
    std::vector<std::string> argv = {QemuImg(), "bitmap", "--add"};
    argv.insert(argv.end(), add.begin(), add.end() - 1);
    argv.push_back(p);
    argv.push_back(add.back());
    b.Must(argv);
  }
  b.Must({QemuIo(), "-c", "write -P 0x11 0 128k", p});
  Bytes x = ReadFile(p);
  fs::remove(p);
  uint64_t dir = 0;
  for (const Extension& e : ReadExtensions(x)) {
    if (e.type == kExtBitmaps && e.data.size() >= 24) dir = Get64(e.data, 16);
  }
  ASSERT_NE(dir, 0u) << "qemu-img wrote no bitmap directory";
  patch(x, dir);
  b.Image(x);
}

// Directory entry fields (qcow2 spec "Bitmap directory").
constexpr size_t kBitmapTableOffsetAt = 0;
constexpr size_t kBitmapFlagsAt = 12;
constexpr size_t kBitmapGranularityAt = 17;
constexpr size_t kBitmapNameAt = 24;

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {"TruncatedHeader", kAll, {"header", "truncat", "short", "small"},
       [](Build& b) { Bytes x = b.Seed64k(); x.resize(48); b.Image(x); }},
      {"BadMagic", kAll, {"magic", "not a qcow2", "not qcow2"},
       [](Build& b) {
         Bytes x = b.Seed64k();
         x[0] = 'X';
         b.Image(x);
         b.force_qcow2 = true;
       }},
      {"Version1", kAll, {"version"}, [](Build& b) { PatchHeader32(b, kVersionAt, 1); }},
      {"Version4", kAll, {"version"}, [](Build& b) { PatchHeader32(b, kVersionAt, 4); }},
      {"ClusterBits8", kAll, {"cluster"}, [](Build& b) { PatchHeader32(b, kClusterBitsAt, 8); }},
      {"ClusterBits22", kAll, {"cluster"}, [](Build& b) { PatchHeader32(b, kClusterBitsAt, 22); }},
      {"L1TablePastEof", kAll, {"l1"},
       [](Build& b) {
         Bytes x = b.Seed64k();
         Put64(x, kL1TableOffsetAt, RoundUp(x.size(), ClusterSize(x)) + 16 * ClusterSize(x));
         b.Image(x);
       }},
      {"L1TableOverlapsHeader", kIo | kCheck, {"l1", "overlap", "header"},
       [](Build& b) { Bytes x = b.Seed64k(); Put64(x, kL1TableOffsetAt, 0); b.Image(x); }},
      {"RefcountTablePastEof", kAll, {"refcount"},
       [](Build& b) {
         Bytes x = b.Seed64k();
         Put64(x, kRefcountTableOffsetAt, RoundUp(x.size(), ClusterSize(x)) + 16 * ClusterSize(x));
         b.Image(x);
       }},
      {"UnalignedL2OffsetInL1", kIo | kCheck, {"align", "l2", "l1"},
       [](Build& b) {
         Bytes x = b.Seed64k();
         Put64(x, L1EntryAt(x, 0), Get64(x, L1EntryAt(x, 0)) + 512);
         b.Image(x);
       }},
      {"UnalignedDataOffsetInL2", kIo | kCheck, {"align", "l2"},
       [](Build& b) {
         Bytes x = b.Seed64k();
         Put64(x, L2EntryAt(x, 0), Get64(x, L2EntryAt(x, 0)) + 512);
         b.Image(x);
       }},
      {"L2EntryReservedBits", kIo | kCheck, {"reserved", "l2"},
       [](Build& b) {
         Bytes x = b.Seed64k();
         Put64(x, L2EntryAt(x, 0), Get64(x, L2EntryAt(x, 0)) | (1ull << 56));
         b.Image(x);
       }},
      {"HugeL1Size", kAll, {"l1"},
       [](Build& b) { PatchHeader32(b, kL1SizeAt, 0x10000000); }},
      {"L1TooSmallForVirtualSize", kAll, {"l1"},
       [](Build& b) { Bytes x = b.Seed64k(); Put64(x, kSizeAt, 1ull << 40); b.Image(x); }},
      {"HugeRefcountTableClusters", kAll, {"refcount"},
       [](Build& b) { PatchHeader32(b, kRefcountTableClustersAt, 0x00ffffff); }},
      {"RefcountOrder7", kAll, {"refcount"},
       [](Build& b) { PatchHeader32(b, kRefcountOrderAt, 7); }},
      {"BackingLoop", kIo, {"loop", "deep", "depth"},
       [](Build& b) { BackingChain(b, 0, true); }},
      {"BackingChainDepth20", kIo, {"deep", "depth"},
       [](Build& b) { BackingChain(b, 20, false); }},
      {"BackingNameTooLong", kAll, {"backing"},
       [](Build& b) {
         Bytes x = b.Seed64k();
         std::fill(x.begin() + 4096, x.begin() + 4096 + 1100, 'a');
         Put64(x, kBackingFileOffsetAt, 4096);
         Put32(x, kBackingFileSizeAt, 1100);
         b.Image(x);
       }},
      {"BackingNameOffsetPastCluster", kAll, {"backing"},
       [](Build& b) {
         Bytes x = b.Seed64k();
         Put64(x, kBackingFileOffsetAt, ClusterSize(x) + 512);
         Put32(x, kBackingFileSizeAt, 8);
         b.Image(x);
       }},
      {"UnknownIncompatibleBitUnnamed", kAll, {"incompatible", "feature", "unsupported", "unknown"},
       [](Build& b) { UnknownIncompatibleBit(b, ""); }},
      {"UnknownIncompatibleBitNamed", kAll, {"hostile_feature_x"},
       [](Build& b) { UnknownIncompatibleBit(b, "hostile_feature_x"); }},
      {"Encrypted", kAll, {"encrypt", "aes"},
       [](Build& b) { PatchHeader32(b, kCryptMethodAt, 1); }},
      {"UnknownCompressionType", kAll, {"compression"},
       [](Build& b) {
         Bytes x = b.Seed64k();
         Put64(x, kIncompatibleFeaturesAt, Get64(x, kIncompatibleFeaturesAt) | kIncompatCompression);
         x[kCompressionTypeAt] = 7;
         b.Image(x);
       }},
      {"ExternalDataFile", kAll, {"data file", "data-file", "data_file", "external"},
       [](Build& b) {
         Bytes x = b.Seed64k();
         Put64(x, kIncompatibleFeaturesAt, Get64(x, kIncompatibleFeaturesAt) | kIncompatDataFile);
         b.Image(x);
       }},
      {"CompressedClusterPastEof", kIo | kCheck,
       {"compress", "eof", "end of", "past", "beyond", "outside"},
       [](Build& b) {
         Bytes x = b.Seed("cluster_size=65536", {"write -c -P 0x11 0 64k"});
         uint64_t entry = Get64(x, L2EntryAt(x, 0));
         ASSERT_TRUE(entry & kCompressedFlag) << "qemu-io did not compress cluster 0";
         // Spec: the host offset takes bits 0..x-1, x = 62 - (cluster_bits - 8).
         uint32_t shift = 62 - (ClusterBits(x) - 8);
         uint64_t sectors = entry & ~kCompressedFlag & ~kCopiedFlag & ~((1ull << shift) - 1);
         Put64(x, L2EntryAt(x, 0), kCompressedFlag | sectors | (x.size() + (4 << 20)));
         b.Image(x);
       }},
      {"ExtendedL2AllocAndZeroBits", kIo | kCheck, {"subcluster", "zero", "alloc", "invalid", "l2"},
       [](Build& b) {
         Bytes x = b.Seed("cluster_size=131072,extended_l2=on", {"write -P 0x11 0 128k"});
         // Bitmap word: bits 0-31 allocated, bits 32-63 reads-as-zero.
         size_t bitmap = L2EntryAt(x, 0) + 8;
         Put64(x, bitmap, Get64(x, bitmap) | (1ull << 32));
         b.Image(x);
       }},
      // Persistent bitmaps. A directory that does not decode keeps a writer
      // out (as qemu refuses the image) and is what check reports; a bad
      // disabled bitmap is reported by check and left alone by a writer.
      {"BitmapDirectoryDuplicateNames", kIo | kCheck, {"bitmap"},
       [](Build& b) {
         BitmapImage(b, {{"bm0"}, {"bm1"}}, [](Bytes& x, uint64_t dir) {
           x[dir + 32 + kBitmapNameAt + 2] = '0';  // the second entry is "bm0" too
         });
       }},
      {"BitmapDirectoryPaddingNotZero", kIo | kCheck, {"bitmap", "padding"},
       [](Build& b) {
         BitmapImage(b, {{"b"}}, [](Bytes& x, uint64_t dir) { x[dir + kBitmapNameAt + 3] = 0x5a; });
       }},
      {"BitmapGranularityHuge", kCheck, {"granularity", "bitmap"},
       [](Build& b) {
         BitmapImage(b, {{"--disable", "bm0"}},
                     [](Bytes& x, uint64_t dir) { x[dir + kBitmapGranularityAt] = 40; });
       }},
      {"BitmapTablePastEof", kCheck, {"bitmap", "table", "outside"},
       [](Build& b) {
         BitmapImage(b, {{"--disable", "bm0"}}, [](Bytes& x, uint64_t dir) {
           Put64(x, dir + kBitmapTableOffsetAt, 1ull << 40);
         });
       }},
      // A qemu that crashed with the image open left it in use: listed as
      // such, never tracked, and the image still opens and checks clean.
      {"BitmapInUseFromACrashedQemu", 0, {},
       [](Build& b) {
         BitmapImage(b, {{"bm0"}}, [](Bytes& x, uint64_t dir) {
           Put32(x, dir + kBitmapFlagsAt, Get32(x, dir + kBitmapFlagsAt) | 1);
         });
       }},
      {"BitmapsExtensionWithNoBitmaps", kAll, {"bitmap"},
       [](Build& b) {
         BitmapImage(b, {{"bm0"}}, [](Bytes& x, uint64_t) {
           std::vector<Extension> exts = ReadExtensions(x);
           for (Extension& e : exts) {
             if (e.type == kExtBitmaps) Put32(e.data, 0, 0);
           }
           WriteExtensions(x, exts);
         });
       }},
  };
  return cases;
}

class BadImageTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    for (const std::string& tool : {Thindisk(), QemuImg(), QemuIo()}) {
      if (IsExecutable(tool)) continue;
      if (ToolsRequired()) FAIL() << "required tool missing: '" << tool << "'";
      GTEST_SKIP() << "tool missing: '" << tool << "'";
    }
    char tmpl[] = "/tmp/td-bad-image-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    build_.dir = tmpl;
  }
  void TearDown() override {
    if (!build_.dir.empty()) fs::remove_all(build_.dir);
  }

  // Runs one thindisk command on the image and checks the rules above.
  void Judge(Command which, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {Thindisk()};
    argv.insert(argv.end(), args.begin(), args.end());
    if (build_.force_qcow2) argv.insert(argv.begin() + 2, {"-f", "qcow2"});
    argv.push_back(build_.target);
    const Case& c = GetParam();
    std::vector<Bytes> before;
    for (const fs::path& f : build_.files) before.push_back(ReadFile(f));

    CommandResult r = RunCommand(argv);
    // The log shows what each command said: the judge of "a clear error".
    std::printf("  %-5s exit %d: %s", args[0].c_str(), r.exit_code,
                r.err.empty() ? "(no stderr)\n" : r.err.c_str());
    std::string what = JoinArgs(argv) + "\nstdout: " + r.out + "\nstderr: " + r.err;
    ASSERT_TRUE(r.started) << what;
    EXPECT_FALSE(r.timed_out) << "hung: " << what;
    EXPECT_FALSE(r.signaled) << "crashed with signal " << r.signal << ": " << what;
    EXPECT_LT(r.exit_code, 128) << what;
    EXPECT_EQ(r.err.find("Sanitizer"), std::string::npos) << what;
    EXPECT_EQ(r.err.find("runtime error:"), std::string::npos) << what;
    for (size_t i = 0; i < build_.files.size(); ++i) {
      EXPECT_TRUE(ReadFile(build_.files[i]) == before[i])
          << build_.files[i] << " was modified by: " << what;
    }
    if (r.timed_out || r.signaled) return;
    if (c.must_fail & which) {
      EXPECT_NE(r.exit_code, 0) << "accepted a bad image: " << what;
    }
    if (r.exit_code == 0) return;

    // Keywords are matched with our temp directory blanked out, so a random
    // mkdtemp suffix like "xl1q" cannot pass for a message naming the L1 table.
    auto names_problem = [&](std::string text) {
      for (size_t at; (at = text.find(build_.dir.string())) != std::string::npos;) {
        text.replace(at, build_.dir.string().size(), "DIR");
      }
      std::string lower = Lower(text);
      for (const std::string& k : c.keywords) {
        if (lower.find(Lower(k)) != std::string::npos) return true;
      }
      return false;
    };
    bool check_findings = which == kCheck && (r.exit_code == 2 || r.exit_code == 3);
    if (check_findings) {
      // A report of findings: it must say what is wrong, in any words.
      EXPECT_TRUE(names_problem(r.out + r.err) ||
                  Lower(r.out + r.err).find("corrupt") != std::string::npos ||
                  Lower(r.out + r.err).find("error") != std::string::npos)
          << "check found problems but did not name them: " << what;
      return;
    }
    std::string err = r.err;
    while (!err.empty() && err.back() == '\n') err.pop_back();
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 0)
        << "want exactly one error line: " << what;
    EXPECT_EQ(err.rfind("thindisk: ", 0), 0u) << "error line must start 'thindisk: ': " << what;
    EXPECT_TRUE(names_problem(err)) << "error does not name the problem (want one of the "
                                    << c.keywords.size() << " keywords, e.g. '"
                                    << c.keywords.front() << "'): " << what;
  }

  Build build_;
};

TEST_P(BadImageTest, FailsCleanlyAndTouchesNothing) {
  GetParam().build(build_);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_FALSE(build_.target.empty());
  Judge(kInfo, {"info"});
  Judge(kIo, {"io", "-c", "read 0 64k"});
  Judge(kCheck, {"check"});
}

INSTANTIATE_TEST_SUITE_P(Qcow2, BadImageTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

TEST(BadImageCatalogue, HasAtLeastTwentyCases) { EXPECT_GE(Cases().size(), 20u); }

}  // namespace
}  // namespace thindisk::testing
