// Persistent bitmaps between thindisk and QEMU 7.2 on real files: bitmaps
// qemu-img adds track the engine's writes exactly (seen through qemu-nbd -B
// and nbdinfo --map), bitmaps the engine adds are qemu's (qemu-img info,
// check, bitmap --merge/--clear/--disable/--remove), and the reverse; what
// qemu-io writes under an engine-made bitmap the engine reads back; a
// bitmap a killed qemu-nbd left in_use is refused but removable.
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "qcow2/bitmaps.h"
#include "qcow2/bitmaps_test_util.h"
#include "qcow2/image_interop_test_util.h"

namespace thindisk::qcow2 {
namespace {

using testing::ByteRange;
using testing::InteropTest;
using testing::MustList;
using testing::MustRead;
using testing::Names;
using testing::Pattern;
using testing::SetRuns;
using testing::Shell;
using testing::Touched;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kSize = 64 * kMiB;

bool HaveQemuNbdTools() {
  return Shell("qemu-nbd --version").exit_code == 0 &&
         Shell("nbdinfo --version").exit_code == 0 &&
         Shell("qemu-io --version").exit_code == 0;
}

#define REQUIRE_QEMU_NBD_TOOLS()                                        \
  do {                                                                  \
    REQUIRE_QEMU_IMG();                                                 \
    TD_REQUIRE_TOOL("qemu-nbd", ::thindisk::qcow2::HaveQemuNbdTools()); \
  } while (0)

struct QemuBitmap {
  std::string name;
  uint64_t granularity = 0;
  std::vector<std::string> flags;
};

class BitmapInteropTest : public InteropTest {
 protected:
  void TearDown() override {
    StopNbd();
    InteropTest::TearDown();
  }

  void QemuImg(const std::string& args) {
    auto r = Shell("timeout 60 qemu-img " + args);
    ASSERT_EQ(r.exit_code, 0) << "qemu-img " << args << "\n" << r.output;
  }

  // The bitmaps `qemu-img info --output=json` lists, in its order.
  std::vector<QemuBitmap> QemuBitmaps(const std::string& img) {
    auto r = Shell("timeout 60 qemu-img info --output=json " + img + " 2>/dev/null");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<QemuBitmap> out;
    auto j = nlohmann::json::parse(r.output, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << r.output;
    if (j.is_discarded()) return out;
    const auto& data = j["format-specific"]["data"];
    if (!data.contains("bitmaps")) return out;
    for (const auto& b : data["bitmaps"]) {
      QemuBitmap q;
      q.name = b["name"].get<std::string>();
      q.granularity = b["granularity"].get<uint64_t>();
      for (const auto& f : b["flags"]) q.flags.push_back(f.get<std::string>());
      out.push_back(q);
    }
    return out;
  }

  void ExpectQemuCheckClean(const std::string& img) {
    auto r = Shell("timeout 60 qemu-img check " + img);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("eaked"), std::string::npos) << r.output;
  }

  // qemu-nbd serving `img` (read-only unless `rw`) with `bitmaps` exported;
  // --fork returns once the socket accepts connections.
  void StartNbd(const std::string& img, const std::vector<std::string>& bitmaps,
                bool rw = false) {
    socket_ = Path("nbd.sock");
    std::string cmd = "timeout 60 qemu-nbd --fork -t -f qcow2 -k " + socket_ +
                      " --pid-file=" + Path("nbd.pid") + (rw ? "" : " -r");
    for (const std::string& b : bitmaps) cmd += " -B " + b;
    auto r = Shell(cmd + " " + img);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    std::ifstream pidfile(Path("nbd.pid"));
    pidfile >> nbd_pid_;
    ASSERT_GT(nbd_pid_, 0) << "no pid in " << Path("nbd.pid");
  }

  static bool Gone(pid_t pid) {
    if (::kill(pid, 0) != 0) return true;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string pid_s, comm, state;
    stat >> pid_s >> comm >> state;
    return state == "Z";  // exited, not yet reaped by whoever adopted it
  }

  // Stops the server (SIGTERM, or `signal`) and waits at most 20 s for it.
  void StopNbd(int signal = SIGTERM) {
    if (nbd_pid_ <= 0) return;
    const pid_t pid = nbd_pid_;
    nbd_pid_ = 0;
    ::kill(pid, signal);
    for (int i = 0; i < 200 && !Gone(pid); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!Gone(pid)) {
      ::kill(pid, SIGKILL);
      ADD_FAILURE() << "qemu-nbd " << pid << " ignored signal " << signal;
    }
  }

  // The dirty granules nbdinfo --map=qemu:dirty-bitmap:NAME shows.
  BitVector NbdDirty(const std::string& bitmap, uint32_t granularity_bits) {
    auto r = Shell("timeout 60 nbdinfo --json --map=qemu:dirty-bitmap:" + bitmap +
                   " 'nbd+unix:///?socket=" + socket_ + "'");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    BitVector bits(BitmapBits(kSize, granularity_bits));
    auto j = nlohmann::json::parse(r.output, nullptr, false);
    EXPECT_TRUE(j.is_array()) << r.output;
    if (!j.is_array()) return bits;
    uint64_t covered = 0;
    for (const auto& e : j) {
      const uint64_t offset = e["offset"].get<uint64_t>();
      const uint64_t length = e["length"].get<uint64_t>();
      EXPECT_EQ(offset, covered) << "extents leave a gap";
      covered = offset + length;
      if (e["type"].get<uint64_t>() == 1)
        testing::MarkRange(bits, granularity_bits, {offset, length});
    }
    EXPECT_EQ(covered, kSize);
    return bits;
  }

  std::unique_ptr<Image> Open(const std::string& img, bool read_only = false) {
    return OpenImage(img, read_only);
  }

  std::string socket_;
  pid_t nbd_pid_ = 0;
};

void ExpectSameBits(const BitVector& got, const BitVector& want,
                    const std::string& what) {
  EXPECT_TRUE(got == want) << what << "\n  got  " << SetRuns(got) << "\n  want "
                           << SetRuns(want);
}

const std::vector<ByteRange> kEngineChanges = {{0, 4096},
                                               {kMiB + 512, 1},
                                               {3 * kMiB, 65536},
                                               {10 * kMiB + 7, 100000},
                                               {20 * kMiB, 131072}};

// Writes, zeroes and discards kEngineChanges through the engine.
void ChangeThroughEngine(Image& img) {
  for (size_t i = 0; i < kEngineChanges.size(); ++i) {
    const ByteRange& r = kEngineChanges[i];
    Status s;
    if (i == 3) {
      s = img.WriteZeroes(r.offset, r.length, {});
    } else if (i == 4) {
      s = img.Discard(r.offset, r.length);
    } else {
      s = img.Write(r.offset, Pattern(i, r.length), {});
    }
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
}

TEST_F(BitmapInteropTest, QemuBitmapsTrackEngineWritesExactly) {
  REQUIRE_QEMU_NBD_TOOLS();
  const std::string img = Path("q.qcow2");
  QemuImg("create -q -f qcow2 " + img + " " + std::to_string(kSize));
  QemuImg("bitmap --add " + img + " b0");
  QemuImg("bitmap --add -g 4096 " + img + " small");
  QemuImg("bitmap --add --disable " + img + " d");

  auto image = Open(img);
  ASSERT_TRUE(image);
  std::vector<BitmapInfo> list = MustList(*image);
  ASSERT_EQ(list.size(), 3u);
  EXPECT_TRUE(list[0].enabled && list[0].granularity() == 65536 && list[0].consistent());
  EXPECT_TRUE(list[1].enabled && list[1].granularity() == 4096 && list[1].consistent());
  EXPECT_TRUE(!list[2].enabled && list[2].granularity() == 65536 && list[2].consistent());
  ChangeThroughEngine(*image);
  ASSERT_TRUE(image->Close().ok());
  image.reset();

  ExpectQemuCheckClean(img);
  StartNbd(img, {"b0", "small", "d"});
  ExpectSameBits(NbdDirty("b0", 16), Touched(kSize, 16, kEngineChanges), "b0");
  ExpectSameBits(NbdDirty("small", 12), Touched(kSize, 12, kEngineChanges), "small");
  ExpectSameBits(NbdDirty("d", 16), Touched(kSize, 16, {}), "d");
}

TEST_F(BitmapInteropTest, EngineBitmapsAreQemuBitmaps) {
  REQUIRE_QEMU_NBD_TOOLS();
  // An image the engine creates (128 KiB clusters, extended L2, zstd).
  const std::string img = Path("t.qcow2");
  {
    io::OpenOptions fo;
    fo.create = true;
    auto storage = io::OpenFile(img, fo);
    ASSERT_TRUE(storage.has_value()) << storage.status().ToString();
    CreateOptions co;
    co.size = kSize;
    ASSERT_TRUE(Create(**storage, co).ok());
  }
  auto image = Open(img);
  ASSERT_TRUE(image);
  ASSERT_TRUE(testing::Add(*image, "e", 16).ok());
  ASSERT_TRUE(testing::Add(*image, "d", 12, false).ok());
  ASSERT_TRUE(testing::Add(*image, "f", 9).ok());
  ChangeThroughEngine(*image);
  ASSERT_TRUE(image->Close().ok());
  image.reset();

  // qemu-img info: names, granularities and flags, in order.
  std::vector<QemuBitmap> q = QemuBitmaps(img);
  ASSERT_EQ(q.size(), 3u);
  EXPECT_EQ(q[0].name, "e");
  EXPECT_EQ(q[0].granularity, 65536u);
  EXPECT_EQ(q[0].flags, std::vector<std::string>{"auto"});
  EXPECT_EQ(q[1].name, "d");
  EXPECT_EQ(q[1].granularity, 4096u);
  EXPECT_TRUE(q[1].flags.empty());
  EXPECT_EQ(q[2].name, "f");
  EXPECT_EQ(q[2].granularity, 512u);
  EXPECT_EQ(q[2].flags, std::vector<std::string>{"auto"});
  ExpectQemuCheckClean(img);
  StartNbd(img, {"e", "f", "d"});
  ExpectSameBits(NbdDirty("e", 16), Touched(kSize, 16, kEngineChanges), "e");
  ExpectSameBits(NbdDirty("f", 9), Touched(kSize, 9, kEngineChanges), "f");
  ExpectSameBits(NbdDirty("d", 12), Touched(kSize, 12, {}), "d");
  StopNbd();

  // qemu-img's operations on them. --merge e into d: every 4 KiB granule
  // of each dirty 64 KiB granule.
  QemuImg("bitmap --merge e " + img + " d");
  ExpectQemuCheckClean(img);
  image = Open(img, /*read_only=*/true);
  ASSERT_TRUE(image);
  BitVector merged(BitmapBits(kSize, 12));
  const BitVector e = Touched(kSize, 16, kEngineChanges);
  for (uint64_t k = e.NextSet(0); k < e.size(); k = e.NextSet(k + 1)) {
    testing::MarkRange(merged, 12, {k << 16, 1 << 16});
  }
  ExpectSameBits(MustRead(*image, "d"), merged, "d after qemu-img --merge e");
  image.reset();

  QemuImg("bitmap --clear " + img + " f");
  QemuImg("bitmap --disable " + img + " e");
  QemuImg("bitmap --remove " + img + " d");
  ExpectQemuCheckClean(img);
  image = Open(img);
  ASSERT_TRUE(image);
  std::vector<BitmapInfo> list = MustList(*image);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].name, "e");
  EXPECT_FALSE(list[0].enabled);
  EXPECT_EQ(list[1].name, "f");
  EXPECT_TRUE(list[1].enabled);
  ExpectSameBits(MustRead(*image, "e"), e, "e after qemu-img --disable");
  ExpectSameBits(MustRead(*image, "f"), Touched(kSize, 9, {}),
                 "f after qemu-img --clear");
  // The engine goes on tracking with what qemu left.
  ASSERT_TRUE(image->Write(30 * kMiB, Pattern(9, 512), {}).ok());
  ASSERT_TRUE(image->Close().ok());
  image.reset();
  ExpectQemuCheckClean(img);
  StartNbd(img, {"e", "f"});
  ExpectSameBits(NbdDirty("e", 16), e, "disabled e");
  ExpectSameBits(NbdDirty("f", 9), Touched(kSize, 9, {{30 * kMiB, 512}}), "f");
}

TEST_F(BitmapInteropTest, EngineOperationsOnQemuBitmaps) {
  REQUIRE_QEMU_NBD_TOOLS();
  const std::string img = Path("r.qcow2");
  QemuImg("create -q -f qcow2 " + img + " " + std::to_string(kSize));
  QemuImg("bitmap --add " + img + " a");
  QemuImg("bitmap --add --disable " + img + " b");
  QemuImg("bitmap --add -g 4096 " + img + " c");
  auto io = Shell("timeout 60 qemu-io -f qcow2 -c 'write 0 64k' -c 'write 5M 4k' " + img);
  ASSERT_EQ(io.exit_code, 0) << io.output;
  const std::vector<ByteRange> qemu_writes = {{0, 65536}, {5 * kMiB, 4096}};

  auto image = Open(img);
  ASSERT_TRUE(image);
  const BitVector a = MustRead(*image, "a");
  ExpectSameBits(a, Touched(kSize, 16, qemu_writes), "a as qemu-io left it");
  ExpectSameBits(MustRead(*image, "b"), Touched(kSize, 16, {}), "b");
  ExpectSameBits(MustRead(*image, "c"), Touched(kSize, 12, qemu_writes), "c");
  ASSERT_TRUE(MergeIntoBitmap(*image, "b", a, 16).ok());
  ASSERT_TRUE(ClearBitmap(*image, "a").ok());
  ASSERT_TRUE(RemoveBitmap(*image, "c").ok());
  ASSERT_TRUE(SetBitmapEnabled(*image, "b", true).ok());
  ASSERT_TRUE(image->Write(7 * kMiB, Pattern(1, 512), {}).ok());
  ASSERT_TRUE(image->Close().ok());
  image.reset();

  std::vector<QemuBitmap> q = QemuBitmaps(img);
  ASSERT_EQ(q.size(), 2u);
  EXPECT_EQ(q[0].name, "a");
  EXPECT_EQ(q[0].flags, std::vector<std::string>{"auto"});
  EXPECT_EQ(q[1].name, "b");
  EXPECT_EQ(q[1].flags, std::vector<std::string>{"auto"});
  ExpectQemuCheckClean(img);
  StartNbd(img, {"a", "b"});
  ExpectSameBits(NbdDirty("a", 16), Touched(kSize, 16, {{7 * kMiB, 512}}), "a");
  std::vector<ByteRange> b_changes = qemu_writes;
  b_changes.push_back({7 * kMiB, 512});
  ExpectSameBits(NbdDirty("b", 16), Touched(kSize, 16, b_changes), "b");
}

TEST_F(BitmapInteropTest, EngineReadsWhatQemuIoMarkedInItsBitmap) {
  REQUIRE_QEMU_NBD_TOOLS();
  const std::string img = Path("w.qcow2");
  QemuImg("create -q -f qcow2 -o cluster_size=65536 " + img + " " +
          std::to_string(kSize));
  auto image = Open(img);
  ASSERT_TRUE(image);
  ASSERT_TRUE(testing::Add(*image, "mine", DefaultBitmapGranularityBits(*image)).ok());
  ASSERT_TRUE(testing::Add(*image, "fine", 9).ok());
  ASSERT_TRUE(image->Write(kMiB, Pattern(1, 100), {}).ok());
  ASSERT_TRUE(image->Close().ok());
  image.reset();

  auto io = Shell(
      "timeout 60 qemu-io -f qcow2 -c 'write 2M 64k' -c 'write 10M 512' -c "
      "'write -z 40M 1M' " +
      img);
  ASSERT_EQ(io.exit_code, 0) << io.output;
  ExpectQemuCheckClean(img);
  const std::vector<ByteRange> all = {
      {kMiB, 100}, {2 * kMiB, 65536}, {10 * kMiB, 512}, {40 * kMiB, kMiB}};
  image = Open(img, /*read_only=*/true);
  ASSERT_TRUE(image);
  ExpectSameBits(MustRead(*image, "mine"), Touched(kSize, 16, all), "mine");
  ExpectSameBits(MustRead(*image, "fine"), Touched(kSize, 9, all), "fine");
  for (const BitmapInfo& b : MustList(*image)) EXPECT_TRUE(b.consistent()) << b.problem;
}

TEST_F(BitmapInteropTest, BitmapsAKilledQemuNbdLeftInUseCanOnlyBeRemoved) {
  REQUIRE_QEMU_NBD_TOOLS();
  const std::string img = Path("k.qcow2");
  QemuImg("create -q -f qcow2 " + img + " " + std::to_string(kSize));
  QemuImg("bitmap --add " + img + " e");
  QemuImg("bitmap --add --disable " + img + " d");
  StartNbd(img, {}, /*rw=*/true);  // qemu flags every bitmap in_use while open
  StopNbd(SIGKILL);

  auto image = Open(img);
  ASSERT_TRUE(image);
  std::vector<BitmapInfo> list = MustList(*image);
  ASSERT_EQ(list.size(), 2u);
  for (const BitmapInfo& b : list) {
    EXPECT_TRUE(b.in_use) << b.name;
    EXPECT_FALSE(b.consistent()) << b.name;
  }
  EXPECT_EQ(ClearBitmap(*image, "e").code(), Code::kCorrupt);
  EXPECT_EQ(ReadBitmap(*image, "e").status().code(), Code::kCorrupt);
  EXPECT_FALSE(image->Resize(2 * kSize, false).ok());
  ASSERT_TRUE(RemoveBitmap(*image, "e").ok());
  ASSERT_TRUE(image->Close().ok());
  image.reset();

  std::vector<QemuBitmap> q = QemuBitmaps(img);
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0].name, "d");
  EXPECT_EQ(q[0].flags, std::vector<std::string>{"in-use"});
  auto check = Shell("timeout 60 qemu-img check " + img);
  EXPECT_NE(check.exit_code, 2) << check.output;  // leaks at most
  QemuImg("bitmap --remove " + img + " d");
  EXPECT_TRUE(QemuBitmaps(img).empty());
}

}  // namespace
}  // namespace thindisk::qcow2
