// qcow2::Image on MemoryStorage: read/write round trips at every alignment,
// first-write amplification, persistence across reopen.
#include <map>

#include "qcow2/image_test_util.h"

namespace thindisk::qcow2 {
namespace {

using testing::CreateMem;
using testing::MemImage;
using testing::Pattern;
using testing::Reopen;

// Guest content we expect, sparse: 64 KiB chunks, missing chunks are zero.
class Model {
 public:
  void Write(uint64_t off, std::span<const uint8_t> data) {
    for (size_t done = 0; done < data.size();) {
      uint64_t pos = off + done;
      uint64_t n = std::min<uint64_t>(kChunk - pos % kChunk, data.size() - done);
      std::memcpy(&Byte(pos), data.data() + done, n);
      done += n;
    }
  }
  void Zero(uint64_t off, uint64_t len) {
    for (uint64_t i = 0; i < len; ++i) {
      auto it = chunks_.find((off + i) / kChunk);
      if (it != chunks_.end()) it->second[(off + i) % kChunk] = 0;
    }
  }
  void Expect(Image& img, uint64_t off, uint64_t len) const {
    std::vector<uint8_t> got(len);
    Status s = img.Read(off, got);
    ASSERT_TRUE(s.ok()) << s.ToString();
    static const std::vector<uint8_t> kZeros(kChunk, 0);
    for (uint64_t pos = off; pos < off + len;) {
      uint64_t in = pos % kChunk;
      uint64_t n = std::min(kChunk - in, off + len - pos);
      auto it = chunks_.find(pos / kChunk);
      const uint8_t* want = (it == chunks_.end() ? kZeros.data() : it->second.data()) + in;
      if (std::memcmp(got.data() + (pos - off), want, n) != 0) {
        for (uint64_t i = 0; i < n; ++i) {
          if (got[pos - off + i] != want[i]) {
            FAIL() << "guest byte " << pos + i << ": got " << int(got[pos - off + i])
                   << " want " << int(want[i]);
          }
        }
      }
      pos += n;
    }
  }
  // Checks every chunk ever written plus its neighbours.
  void ExpectAll(Image& img) const {
    for (const auto& [idx, c] : chunks_) {
      uint64_t start = idx ? (idx - 1) * kChunk : 0;
      uint64_t end = std::min(img.size(), (idx + 2) * kChunk);
      Expect(img, start, end - start);
    }
  }

 private:
  static constexpr uint64_t kChunk = 64 * 1024;
  uint8_t& Byte(uint64_t off) {
    auto& c = chunks_[off / kChunk];
    if (c.empty()) c.assign(kChunk, 0);
    return c[off % kChunk];
  }
  std::map<uint64_t, std::vector<uint8_t>> chunks_;
};

struct Layout {
  const char* name;
  uint32_t cluster_size;
  bool extended_l2;
  uint32_t version;
  uint32_t refcount_bits;
};

CreateOptions OptionsFor(const Layout& l, uint64_t size) {
  CreateOptions o;
  o.size = size;
  o.cluster_size = l.cluster_size;
  o.extended_l2 = l.extended_l2;
  o.version = l.version;
  o.refcount_bits = l.refcount_bits;
  if (l.version == 2) o.compression_type = CompressionType::kZlib;
  return o;
}

class ImageLayoutTest : public ::testing::TestWithParam<Layout> {};

TEST_P(ImageLayoutTest, FreshImageReadsZeros) {
  auto m = CreateMem(OptionsFor(GetParam(), 64ull << 20));
  ASSERT_TRUE(m.image);
  Model model;
  model.Expect(*m.image, 0, 4ull << 20);
  model.Expect(*m.image, (64ull << 20) - 100000, 100000);
}

TEST_P(ImageLayoutTest, RoundTripsAtEveryAlignment) {
  const Layout& l = GetParam();
  // Big enough to cross an L2 table boundary (l2 entries * cluster size).
  uint64_t l2_span = uint64_t(l.cluster_size) / (l.extended_l2 ? 16 : 8) * l.cluster_size;
  uint64_t size = std::max<uint64_t>(64ull << 20, l2_span + (8ull << 20));
  auto m = CreateMem(OptionsFor(l, size));
  ASSERT_TRUE(m.image);
  Model model;
  struct W { uint64_t off, len; };
  const uint64_t cs = l.cluster_size;
  std::vector<W> writes = {
      {0, 512},                     // first sector
      {4096, 4096},                 // 4 KiB aligned
      {3 * cs + 1000, 333},         // unaligned inside a cluster
      {5 * cs - 700, 1500},         // crosses a cluster boundary
      {8 * cs + 512, 3 * cs},       // spans several clusters
      {l2_span - 3000, 7000},       // crosses an L2 table boundary
      {4096 + 100, 50},             // overwrite inside existing data
      {size - 777, 777},            // the very end
  };
  uint64_t seed = 1;
  for (const W& w : writes) {
    auto data = Pattern(seed++, w.len);
    Status s = m.image->Write(w.off, data);
    ASSERT_TRUE(s.ok()) << s.ToString() << " at " << w.off;
    model.Write(w.off, data);
    model.ExpectAll(*m.image);
  }
  ASSERT_TRUE(m.image->Flush().ok());
  model.ExpectAll(*m.image);
  auto r = Reopen(m);
  ASSERT_TRUE(r.image);
  model.ExpectAll(*r.image);
  // Writing again after reopen (in place, subcluster fill) keeps working.
  auto data = Pattern(99, 9000);
  ASSERT_TRUE(r.image->Write(cs / 2, data).ok());
  model.Write(cs / 2, data);
  model.ExpectAll(*r.image);
}

TEST_P(ImageLayoutTest, OutOfRangeAndReadOnly) {
  auto m = CreateMem(OptionsFor(GetParam(), 1 << 20));
  ASSERT_TRUE(m.image);
  std::vector<uint8_t> buf(1024);
  EXPECT_EQ(m.image->Read((1 << 20) - 512, buf).code(), Code::kOutOfRange);
  EXPECT_EQ(m.image->Write((1 << 20) - 512, buf).code(), Code::kOutOfRange);
  OpenOptions ro;
  ro.read_only = true;
  auto r = Reopen(m, ro);
  ASSERT_TRUE(r.image);
  EXPECT_EQ(r.image->Write(0, buf).code(), Code::kReadOnly);
  EXPECT_EQ(r.image->Discard(0, 512).code(), Code::kReadOnly);
  EXPECT_TRUE(r.image->Read(0, buf).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ImageLayoutTest,
    ::testing::Values(Layout{"c512", 512, false, 3, 16}, Layout{"c4k_rc1", 4096, false, 3, 1},
                      Layout{"c64k", 65536, false, 3, 16},
                      Layout{"c64k_ext_rc64", 65536, true, 3, 64},
                      Layout{"c128k_ext", 131072, true, 3, 16},
                      Layout{"c2m_ext", 2 << 20, true, 3, 16},
                      Layout{"v2_c64k", 65536, false, 2, 16}),
    [](const ::testing::TestParamInfo<Layout>& i) { return std::string(i.param.name); });

TEST(ImageTest, FirstWriteAmplificationWithDefaultLayout) {
  CreateOptions o;  // 128 KiB clusters, extended L2
  o.size = 1ull << 30;
  auto m = CreateMem(o);
  ASSERT_TRUE(m.image);
  ASSERT_TRUE(m.image->Flush().ok());
  uint64_t before = m.storage->bytes_written();
  std::mt19937_64 rng(7);
  const int kWrites = 2048;
  std::vector<uint8_t> block = Pattern(3, 4096);
  for (int i = 0; i < kWrites; ++i) {
    uint64_t off = (rng() % (o.size / 4096)) * 4096;
    ASSERT_TRUE(m.image->Write(off, block).ok());
  }
  ASSERT_TRUE(m.image->Flush().ok());
  double guest = double(kWrites) * 4096;
  double host = double(m.storage->bytes_written() - before);
  EXPECT_LE(host / guest, 1.15) << "host " << host << " guest " << guest;
}

TEST(ImageTest, FlushWithNothingDirtyWritesNothing) {
  CreateOptions o;
  o.size = 16 << 20;
  auto m = CreateMem(o);
  ASSERT_TRUE(m.image);
  ASSERT_TRUE(m.image->Write(0, Pattern(1, 4096)).ok());
  ASSERT_TRUE(m.image->Flush().ok());
  uint64_t after_first = m.storage->bytes_written();
  ASSERT_TRUE(m.image->Flush().ok());
  EXPECT_EQ(m.storage->bytes_written(), after_first);
}

TEST(ImageTest, MetadataReachesStorageOnlyAtFlush) {
  CreateOptions o;
  o.size = 16 << 20;
  auto m = CreateMem(o);
  ASSERT_TRUE(m.image);
  ASSERT_TRUE(m.image->Flush().ok());
  uint64_t before = m.storage->bytes_written();
  ASSERT_TRUE(m.image->Write(1 << 20, Pattern(1, 4096)).ok());
  // Only the data itself: L2 and refcounts wait for the flush.
  EXPECT_EQ(m.storage->bytes_written() - before, 4096u);
  // An image opened on a copy of the storage now still reads zeros there.
  auto copy = m.storage->Clone();
  auto other = Image::Open(std::move(copy), {});
  ASSERT_TRUE(other.has_value());
  std::vector<uint8_t> buf(4096);
  ASSERT_TRUE((*other)->Read(1 << 20, buf).ok());
  EXPECT_EQ(buf, std::vector<uint8_t>(4096, 0));
}

TEST(ImageTest, SmallCacheEvictsThroughOrderedFlush) {
  CreateOptions o;
  o.size = 256ull << 20;
  o.cluster_size = 4096;
  o.extended_l2 = false;
  OpenOptions oo;
  oo.cache_bytes = 8 * 4096;  // a handful of tables
  auto m = CreateMem(o, oo);
  ASSERT_TRUE(m.image);
  Model model;
  // Each write lands under a different L2 table (512 entries * 4 KiB).
  for (uint64_t i = 0; i < 40; ++i) {
    auto data = Pattern(i, 3000);
    uint64_t off = i * (2ull << 20) + 1234;
    ASSERT_TRUE(m.image->Write(off, data).ok());
    model.Write(off, data);
  }
  model.ExpectAll(*m.image);
  auto r = Reopen(m, oo);
  ASSERT_TRUE(r.image);
  model.ExpectAll(*r.image);
}

TEST(ImageTest, CloseTwiceIsSafe) {
  CreateOptions o;
  o.size = 1 << 20;
  auto m = CreateMem(o);
  ASSERT_TRUE(m.image);
  EXPECT_TRUE(m.image->Close().ok());
  EXPECT_TRUE(m.image->Close().ok());
}

}  // namespace
}  // namespace thindisk::qcow2
