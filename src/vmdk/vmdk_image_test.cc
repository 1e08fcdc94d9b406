#include "vmdk/vmdk_image.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "io/memory_storage.h"

namespace thindisk::vmdk {
namespace {

// A sparse vmdk laid out by hand: header, descriptor (sectors 1-4), grain
// directory, grain tables, then grains in index order (plain, or deflated
// behind grain markers), and for gd_at_end the footer triple.
struct SparseSpec {
  uint64_t capacity = 1 << 20;
  uint64_t grain_sectors = 8;  // 4 KiB grains
  uint32_t gtes = 16;          // 64 KiB per table: 16 tables
  bool compressed = false;
  bool gd_at_end = false;
  std::string create_type = "monolithicSparse";
  std::map<uint64_t, uint8_t> grains;  // grain index -> fill byte
  std::set<uint64_t> zero_grains;      // zeroed-grain GTEs
  std::set<uint64_t> missing_tables;   // directory entries left 0
};

struct Built {
  std::unique_ptr<io::MemoryStorage> storage;
  std::vector<uint8_t> expected;  // guest content
  uint64_t gd_sector = 0;
  std::map<uint64_t, uint64_t> grain_sector;
  std::vector<uint64_t> gt_sector;
};

uint64_t Sectors(uint64_t bytes) { return (bytes + kSectorSize - 1) / kSectorSize; }

SparseHeader HeaderFor(const SparseSpec& spec, uint64_t gd_sector) {
  SparseHeader h;
  h.version = spec.compressed ? 3 : 1;
  h.flags = kFlagNewlineTest | kFlagZeroedGrainGte |
            (spec.compressed ? kFlagCompressed | kFlagMarkers : 0);
  h.capacity = spec.capacity / kSectorSize;
  h.grain_size = spec.grain_sectors;
  h.descriptor_offset = 1;
  h.descriptor_size = 4;
  h.num_gtes_per_gt = spec.gtes;
  h.gd_offset = gd_sector;
  h.compress_algorithm = spec.compressed ? kCompressionDeflate : kCompressionNone;
  return h;
}

void WriteSector(io::MemoryStorage& s, uint64_t sector, std::span<const uint8_t> bytes) {
  ASSERT_TRUE(s.WriteAt(sector * kSectorSize, bytes).ok());
}

Built BuildSparse(const SparseSpec& spec) {
  Built b;
  b.storage = io::NewMemoryStorage("test.vmdk");
  b.expected.assign(spec.capacity, 0);
  const uint64_t grain_bytes = spec.grain_sectors * kSectorSize;
  SparseHeader probe = HeaderFor(spec, 5);
  const uint64_t tables = probe.gd_entries();
  b.gd_sector = 5;
  uint64_t next = b.gd_sector + Sectors(tables * 4);
  for (uint64_t t = 0; t < tables; ++t) {
    b.gt_sector.push_back(next);
    next += Sectors(uint64_t(spec.gtes) * 4);
  }
  std::vector<uint8_t> gd(tables * 4, 0);
  std::vector<std::vector<uint8_t>> gts(tables, std::vector<uint8_t>(spec.gtes * 4, 0));
  for (uint64_t t = 0; t < tables; ++t) {
    if (!spec.missing_tables.count(t)) StoreLe32(gd.data() + 4 * t, uint32_t(b.gt_sector[t]));
  }
  for (uint64_t z : spec.zero_grains) {
    StoreLe32(gts[z / spec.gtes].data() + 4 * (z % spec.gtes), kGteZeroed);
  }
  for (auto [index, fill] : spec.grains) {
    std::vector<uint8_t> grain(grain_bytes, fill);
    std::fill(b.expected.begin() + index * grain_bytes,
              b.expected.begin() + (index + 1) * grain_bytes, fill);
    b.grain_sector[index] = next;
    StoreLe32(gts[index / spec.gtes].data() + 4 * (index % spec.gtes), uint32_t(next));
    if (spec.compressed) {
      uLongf len = compressBound(grain_bytes);
      std::vector<uint8_t> out(kGrainMarkerSize + len);
      EXPECT_EQ(compress(out.data() + kGrainMarkerSize, &len, grain.data(), grain_bytes), Z_OK);
      StoreLe64(out.data(), index * spec.grain_sectors);
      StoreLe32(out.data() + 8, uint32_t(len));
      out.resize(Sectors(kGrainMarkerSize + len) * kSectorSize);
      WriteSector(*b.storage, next, out);
      next += Sectors(out.size());
    } else {
      WriteSector(*b.storage, next, grain);
      next += spec.grain_sectors;
    }
  }
  WriteSector(*b.storage, b.gd_sector, gd);
  for (uint64_t t = 0; t < tables; ++t) WriteSector(*b.storage, b.gt_sector[t], gts[t]);

  std::string descriptor = "# Disk DescriptorFile\nversion=1\nCID=0000abcd\nparentCID=ffffffff\n"
                           "createType=\"" + spec.create_type + "\"\nRW " +
                           std::to_string(spec.capacity / kSectorSize) + " SPARSE \"test.vmdk\"\n";
  WriteSector(*b.storage, 1,
              std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(descriptor.data()),
                                       descriptor.size()));
  std::array<uint8_t, kHeaderSize> header{};
  EncodeSparseHeader(HeaderFor(spec, spec.gd_at_end ? kGdAtEnd : b.gd_sector), header);
  WriteSector(*b.storage, 0, header);
  if (spec.gd_at_end) {
    std::array<uint8_t, kSectorSize> marker{};
    StoreLe64(marker.data(), 1);
    StoreLe32(marker.data() + 12, kMarkerFooter);
    WriteSector(*b.storage, next, marker);
    EncodeSparseHeader(HeaderFor(spec, b.gd_sector), header);
    WriteSector(*b.storage, next + 1, header);
    std::array<uint8_t, kSectorSize> eos{};
    WriteSector(*b.storage, next + 2, eos);
    next += 3;
  }
  EXPECT_TRUE(b.storage->Resize(next * kSectorSize).ok());
  return b;
}

Result<std::unique_ptr<VmdkImage>> OpenBuilt(Built& b) {
  return VmdkImage::Open(std::move(b.storage), "test.vmdk", nullptr);
}

SparseSpec MixedSpec() {
  SparseSpec spec;
  spec.grains = {{0, 0xaa}, {1, 0xbb}, {2, 0xcc}, {40, 0x11}, {255, 0xff}};
  spec.zero_grains = {3, 100};
  spec.missing_tables = {5};
  return spec;
}

void ExpectReadsAsBuilt(VmdkImage& image, const std::vector<uint8_t>& expected) {
  ASSERT_EQ(image.size(), expected.size());
  // Unaligned pieces that straddle grains and tables.
  for (uint64_t step : {uint64_t(4096), uint64_t(1000), uint64_t(70000)}) {
    std::vector<uint8_t> got(expected.size());
    for (uint64_t off = 0; off < got.size(); off += step) {
      uint64_t n = std::min<uint64_t>(step, got.size() - off);
      ASSERT_TRUE(image.Read(off, std::span(got.data() + off, n)).ok()) << off;
    }
    EXPECT_TRUE(got == expected) << "step " << step;
  }
}

TEST(VmdkImageTest, ReadsMonolithicSparse) {
  Built b = BuildSparse(MixedSpec());
  auto expected = b.expected;
  auto image = OpenBuilt(b);
  ASSERT_TRUE(image.has_value()) << image.error().ToString();
  EXPECT_EQ((*image)->info().format, "vmdk");
  EXPECT_EQ((*image)->info().cluster_size, 4096u);
  EXPECT_TRUE((*image)->info().read_only);
  EXPECT_EQ((*image)->description().create_type, "monolithicSparse");
  EXPECT_EQ((*image)->description().cid, 0xabcdu);
  ExpectReadsAsBuilt(**image, expected);
}

TEST(VmdkImageTest, StatusReportsDataHolesAndZeroGrains) {
  Built b = BuildSparse(MixedSpec());
  uint64_t grain0 = b.grain_sector.at(0) * kSectorSize;
  auto image = OpenBuilt(b);
  ASSERT_TRUE(image.has_value());
  VmdkImage& img = **image;
  // Grains 0-2 are contiguous on the host: one data extent.
  auto e = img.GetStatus(100, img.size());
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->data && e->present && !e->zero);
  EXPECT_EQ(e->length, 3 * 4096u - 100);
  EXPECT_TRUE(e->has_host_offset);
  EXPECT_EQ(e->host_offset, grain0 + 100);
  // Grain 3: zeroed GTE, present zeros.
  e = img.GetStatus(3 * 4096, img.size());
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->zero && e->present && !e->data);
  EXPECT_EQ(e->length, 4096u);
  // Grains 4..39: unallocated, up to grain 40, which holds data.
  e = img.GetStatus(4 * 4096, img.size());
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->zero && !e->present && !e->data);
  EXPECT_EQ(e->length, 36 * 4096u);
  // From grain 41 a hole runs over the missing table to grain 100.
  e = img.GetStatus(41 * 4096, img.size());
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->length, (100 - 41) * 4096u);
  // max_length clips.
  e = img.GetStatus(41 * 4096, 10);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->length, 10u);
  EXPECT_EQ(img.GetStatus(img.size(), 1).status().code(), Code::kOutOfRange);
}

TEST(VmdkImageTest, ReadsStreamOptimizedWithFooter) {
  SparseSpec spec = MixedSpec();
  spec.compressed = true;
  spec.gd_at_end = true;
  spec.create_type = "streamOptimized";
  Built b = BuildSparse(spec);
  auto expected = b.expected;
  auto image = OpenBuilt(b);
  ASSERT_TRUE(image.has_value()) << image.error().ToString();
  EXPECT_EQ((*image)->description().create_type, "streamOptimized");
  EXPECT_TRUE((*image)->description().extents.at(0).compressed);
  ExpectReadsAsBuilt(**image, expected);
  auto e = (*image)->GetStatus(0, (*image)->size());
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->data);
  EXPECT_FALSE(e->has_host_offset);  // compressed: no plain host bytes
}

TEST(VmdkImageTest, WritesAreRefused) {
  Built b = BuildSparse(MixedSpec());
  auto image = OpenBuilt(b);
  ASSERT_TRUE(image.has_value());
  std::vector<uint8_t> data(512, 1);
  Status s = (*image)->Write(0, data);
  EXPECT_EQ(s.code(), Code::kReadOnly);
  EXPECT_NE(s.message().find("vmdk images are read-only in thindisk (import with convert)"),
            std::string::npos)
      << s.message();
  EXPECT_EQ((*image)->WriteZeroes(0, 512).code(), Code::kReadOnly);
  EXPECT_EQ((*image)->Discard(0, 512).code(), Code::kReadOnly);
  EXPECT_EQ((*image)->Resize(1 << 21).code(), Code::kReadOnly);
  EXPECT_TRUE((*image)->Flush().ok());
  std::vector<uint8_t> buf(10);
  EXPECT_EQ((*image)->Read((*image)->size() - 5, buf).code(), Code::kOutOfRange);
}

// Opens a flat image: descriptor text in one storage, extent in another.
Result<std::unique_ptr<VmdkImage>> OpenFlat(const std::string& descriptor,
                                            std::unique_ptr<io::MemoryStorage> extent,
                                            std::string* asked = nullptr) {
  auto desc = io::NewMemoryStorage("disk.vmdk");
  EXPECT_TRUE(desc->WriteAt(0, std::span<const uint8_t>(
                                   reinterpret_cast<const uint8_t*>(descriptor.data()),
                                   descriptor.size()))
                  .ok());
  auto shared = std::make_shared<std::unique_ptr<io::MemoryStorage>>(std::move(extent));
  OpenExtentFn open = [shared, asked](const std::string& name) -> Result<OpenedExtent> {
    if (asked) *asked = name;
    if (!*shared) return Status::NotFound(name + ": no such file");
    return OpenedExtent{std::move(*shared), "dir/" + name};
  };
  return VmdkImage::Open(std::move(desc), "disk.vmdk", open);
}

std::string FlatDescriptor(const std::string& create_type, uint64_t sectors, uint64_t offset) {
  return "# Disk DescriptorFile\nversion=1\nCID=12345678\nparentCID=ffffffff\ncreateType=\"" +
         create_type + "\"\nRW " + std::to_string(sectors) + " FLAT \"disk-flat.vmdk\" " +
         std::to_string(offset) + "\n";
}

TEST(VmdkImageTest, ReadsMonolithicFlatThroughItsExtent) {
  auto extent = io::NewMemoryStorage("flat");
  std::vector<uint8_t> data(4096, 0x5a);
  ASSERT_TRUE(extent->WriteAt(512 + 8192, data).ok());  // guest 8192 (extent at sector 1)
  ASSERT_TRUE(extent->Resize(512 + (1 << 20)).ok());
  std::string asked;
  auto image = OpenFlat(FlatDescriptor("monolithicFlat", 2048, 1), std::move(extent), &asked);
  ASSERT_TRUE(image.has_value()) << image.error().ToString();
  EXPECT_EQ(asked, "disk-flat.vmdk");
  VmdkImage& img = **image;
  EXPECT_EQ(img.size(), 1u << 20);
  EXPECT_EQ(img.info().cluster_size, 0u);
  EXPECT_EQ(img.description().extents.at(0).filename, "dir/disk-flat.vmdk");
  EXPECT_EQ(img.description().extents.at(0).format, "FLAT");
  std::vector<uint8_t> got(8192 + 4096 + 10);
  ASSERT_TRUE(img.Read(0, got).ok());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], (i >= 8192 && i < 8192 + 4096) ? 0x5a : 0) << i;
  }
  // The memory storage tracks data at 64 KiB chunks: the first chunk holds
  // data, the rest of the extent is a host hole.
  auto e = img.GetStatus(0, img.size());
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->data);
  EXPECT_EQ(e->host_offset, 512u);
  auto hole = img.GetStatus(256 * 1024, img.size());
  ASSERT_TRUE(hole.has_value());
  EXPECT_TRUE(hole->zero && !hole->data);
  EXPECT_EQ(hole->offset + hole->length, img.size());
}

TEST(VmdkImageTest, RefusesShortFlatExtentAndMissingFile) {
  auto extent = io::NewMemoryStorage("flat");
  ASSERT_TRUE(extent->Resize(4096).ok());
  auto short_one = OpenFlat(FlatDescriptor("monolithicFlat", 2048, 0), std::move(extent));
  ASSERT_FALSE(short_one.has_value());
  EXPECT_EQ(short_one.error().code(), Code::kCorrupt);
  auto missing = OpenFlat(FlatDescriptor("monolithicFlat", 2048, 0), nullptr);
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code(), Code::kNotFound);
  auto huge = OpenFlat(FlatDescriptor("monolithicFlat", ~0ull / 1024, 0),
                       io::NewMemoryStorage("flat"));
  ASSERT_FALSE(huge.has_value());
  EXPECT_EQ(huge.error().code(), Code::kCorrupt);
}

TEST(VmdkImageTest, RefusesSplitImages) {
  auto split = OpenFlat(FlatDescriptor("twoGbMaxExtentFlat", 2048, 0),
                        io::NewMemoryStorage("flat"));
  ASSERT_FALSE(split.has_value());
  EXPECT_EQ(split.error().code(), Code::kNotSupported);
  EXPECT_NE(split.error().message().find("disk.vmdk"), std::string::npos);
}

TEST(VmdkImageTest, RefusesOversizedDescriptorFile) {
  std::string text = FlatDescriptor("monolithicFlat", 8, 0);
  text.resize(kMaxDescriptorBytes + 1, ' ');
  auto image = OpenFlat(text, io::NewMemoryStorage("flat"));
  ASSERT_FALSE(image.has_value());
  EXPECT_EQ(image.error().code(), Code::kCorrupt);
}

// Hostile sparse files: each must fail cleanly, on open or on the read
// that follows the bad pointer.
Status OpenAndReadAll(Built& b) {
  TD_ASSIGN_OR_RETURN(auto image, OpenBuilt(b));
  std::vector<uint8_t> buf(image->size());
  TD_RETURN_IF_ERROR(image->Read(0, buf));
  uint64_t off = 0;
  while (off < image->size()) {
    TD_ASSIGN_OR_RETURN(block::Extent e, image->GetStatus(off, image->size() - off));
    off += e.length;
  }
  return Status::Ok();
}

TEST(VmdkImageTest, HostileTruncatedFile) {
  Built b = BuildSparse(MixedSpec());
  ASSERT_TRUE(b.storage->Resize(100).ok());
  auto image = OpenBuilt(b);
  ASSERT_FALSE(image.has_value());
  EXPECT_EQ(image.error().code(), Code::kCorrupt);
  EXPECT_NE(image.error().message().find("test.vmdk"), std::string::npos);
}

TEST(VmdkImageTest, HostileFileCutAfterTables) {
  Built b = BuildSparse(MixedSpec());
  // Drop the last grains: their GTEs now point past EOF.
  ASSERT_TRUE(b.storage->Resize(b.grain_sector.at(255) * kSectorSize).ok());
  Status s = OpenAndReadAll(b);
  EXPECT_EQ(s.code(), Code::kCorrupt) << s.ToString();
}

TEST(VmdkImageTest, HostileGtePastEof) {
  Built b = BuildSparse(MixedSpec());
  std::array<uint8_t, 4> gte{};
  StoreLe32(gte.data(), 0x7fffffff);
  ASSERT_TRUE(b.storage->WriteAt(b.gt_sector[0] * kSectorSize + 4 * 1, gte).ok());
  Status s = OpenAndReadAll(b);
  EXPECT_EQ(s.code(), Code::kCorrupt) << s.ToString();
  EXPECT_NE(s.message().find("past the end"), std::string::npos) << s.message();
}

TEST(VmdkImageTest, HostileGrainTablePastEof) {
  Built b = BuildSparse(MixedSpec());
  std::array<uint8_t, 4> gde{};
  StoreLe32(gde.data(), 0xfffffff0);
  ASSERT_TRUE(b.storage->WriteAt(b.gd_sector * kSectorSize, gde).ok());
  Status s = OpenAndReadAll(b);
  EXPECT_EQ(s.code(), Code::kCorrupt) << s.ToString();
}

TEST(VmdkImageTest, HostileCompressedGrains) {
  SparseSpec spec = MixedSpec();
  spec.compressed = true;
  spec.create_type = "streamOptimized";
  {
    Built b = BuildSparse(spec);  // marker filed under the wrong lba
    std::array<uint8_t, 8> lba{};
    StoreLe64(lba.data(), 12345);
    ASSERT_TRUE(b.storage->WriteAt(b.grain_sector.at(1) * kSectorSize, lba).ok());
    EXPECT_EQ(OpenAndReadAll(b).code(), Code::kCorrupt);
  }
  {
    Built b = BuildSparse(spec);  // absurd compressed size
    std::array<uint8_t, 4> size{};
    StoreLe32(size.data(), 0xffffffff);
    ASSERT_TRUE(b.storage->WriteAt(b.grain_sector.at(1) * kSectorSize + 8, size).ok());
    EXPECT_EQ(OpenAndReadAll(b).code(), Code::kCorrupt);
  }
  {
    Built b = BuildSparse(spec);  // garbage instead of a zlib stream
    std::vector<uint8_t> junk(64, 0x42);
    ASSERT_TRUE(b.storage->WriteAt(b.grain_sector.at(2) * kSectorSize + 12, junk).ok());
    EXPECT_EQ(OpenAndReadAll(b).code(), Code::kCorrupt);
  }
}

TEST(VmdkImageTest, HostileFooter) {
  SparseSpec spec = MixedSpec();
  spec.compressed = true;
  spec.gd_at_end = true;
  Built b = BuildSparse(spec);
  auto size = b.storage->Size();
  ASSERT_TRUE(size.has_value());
  std::array<uint8_t, 4> type{};
  StoreLe32(type.data(), kMarkerGrainTable);  // not a footer marker
  ASSERT_TRUE(b.storage->WriteAt(*size - 3 * kSectorSize + 12, type).ok());
  auto image = OpenBuilt(b);
  ASSERT_FALSE(image.has_value());
  EXPECT_EQ(image.error().code(), Code::kCorrupt);
}

TEST(VmdkImageTest, HostileDescriptorDisagreesWithHeader) {
  Built b = BuildSparse(MixedSpec());
  std::string descriptor = "# Disk DescriptorFile\ncreateType=\"monolithicSparse\"\n"
                           "RW 99 SPARSE \"test.vmdk\"\n";
  descriptor.resize(4 * kSectorSize, '\0');
  ASSERT_TRUE(b.storage->WriteAt(kSectorSize, std::span<const uint8_t>(
                                                  reinterpret_cast<const uint8_t*>(
                                                      descriptor.data()),
                                                  descriptor.size()))
                  .ok());
  auto image = OpenBuilt(b);
  ASSERT_FALSE(image.has_value());
  EXPECT_EQ(image.error().code(), Code::kCorrupt);
}

TEST(VmdkImageTest, ProbeRecognisesVmdkOnly) {
  Built b = BuildSparse(MixedSpec());
  auto sparse = Probe(*b.storage);
  ASSERT_TRUE(sparse.has_value());
  EXPECT_TRUE(*sparse);

  auto desc = io::NewMemoryStorage("d");
  std::string text = FlatDescriptor("monolithicFlat", 8, 0);
  ASSERT_TRUE(desc->WriteAt(0, std::span<const uint8_t>(
                                   reinterpret_cast<const uint8_t*>(text.data()), text.size()))
                  .ok());
  EXPECT_TRUE(*Probe(*desc));
  // The same text at the start of a big (raw) disk is not a descriptor.
  ASSERT_TRUE(desc->Resize(kMaxDescriptorBytes + 1).ok());
  EXPECT_FALSE(*Probe(*desc));

  auto raw = io::NewMemoryStorage("r");
  ASSERT_TRUE(raw->Resize(1 << 20).ok());
  EXPECT_FALSE(*Probe(*raw));
}

}  // namespace
}  // namespace thindisk::vmdk
