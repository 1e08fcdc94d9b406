#include "qcow2/format.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <iterator>

#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

// A well-formed v3 image layout: 64 KiB clusters, 1 GiB, refcount table at
// cluster 1, L1 (2 entries) at cluster 3, file of 4 clusters.
constexpr uint64_t kFileSize = 4 * 65536;

Header ValidHeader() {
  Header h;
  h.cluster_bits = 16;
  h.size = 1ull << 30;
  h.l1_size = 2;
  h.l1_table_offset = 3 * 65536;
  h.refcount_table_offset = 65536;
  h.refcount_table_clusters = 1;
  h.feature_names = DefaultFeatureNames();
  return h;
}

// The header bytes padded to one cluster, as they would sit in the file.
std::vector<uint8_t> Bytes(const Header& h) {
  auto enc = EncodeHeader(h);
  EXPECT_TRUE(enc.has_value()) << enc.status().ToString();
  std::vector<uint8_t> out = *enc;
  out.resize(h.cluster_size(), 0);
  return out;
}

// ---- round trips ----

TEST(Header, V3RoundTripKeepsEveryField) {
  Header h = ValidHeader();
  h.cluster_bits = 17;
  h.l1_size = 1;
  h.l1_table_offset = 3 << 17;
  h.refcount_table_offset = 1 << 17;
  h.incompatible_features = kIncompatExtendedL2 | kIncompatCompression;
  h.compatible_features = kCompatLazyRefcounts;
  h.autoclear_features = 0;
  h.refcount_order = 3;
  h.compression_type = CompressionType::kZstd;
  h.backing_file = "base image.qcow2";
  h.backing_format = "qcow2";
  h.unknown_extensions.push_back({0x12345678, {1, 2, 3, 4, 5}});
  std::vector<uint8_t> bytes = Bytes(h);
  EXPECT_EQ(LoadBe32(&bytes[100]), 112u) << "v3 header_length as QEMU 7.2 writes it";
  EXPECT_EQ(bytes[104], 1) << "compression_type byte";

  auto d = DecodeHeader(bytes, 4 << 17);
  ASSERT_TRUE(d.has_value()) << d.status().ToString();
  EXPECT_EQ(d->version, 3u);
  EXPECT_EQ(d->cluster_bits, 17u);
  EXPECT_EQ(d->size, h.size);
  EXPECT_EQ(d->l1_size, 1u);
  EXPECT_EQ(d->l1_table_offset, h.l1_table_offset);
  EXPECT_EQ(d->refcount_table_offset, h.refcount_table_offset);
  EXPECT_EQ(d->refcount_table_clusters, 1u);
  EXPECT_EQ(d->incompatible_features, h.incompatible_features);
  EXPECT_EQ(d->compatible_features, kCompatLazyRefcounts);
  EXPECT_EQ(d->refcount_order, 3u);
  EXPECT_EQ(d->header_length, 112u);
  EXPECT_EQ(d->compression_type, CompressionType::kZstd);
  EXPECT_EQ(d->backing_file, "base image.qcow2");
  EXPECT_EQ(d->backing_format, "qcow2");
  ASSERT_EQ(d->feature_names.size(), DefaultFeatureNames().size());
  EXPECT_EQ(d->feature_names[4].name, "extended L2 entries");
  ASSERT_EQ(d->unknown_extensions.size(), 1u);
  EXPECT_EQ(d->unknown_extensions[0].type, 0x12345678u);
  EXPECT_EQ(d->unknown_extensions[0].data, (std::vector<uint8_t>{1, 2, 3, 4, 5}));
  EXPECT_TRUE(d->extended_l2());
  EXPECT_EQ(d->l2_entries(), (1u << 17) / 16);

  // Encoding the decoded header gives the same bytes.
  EXPECT_EQ(Bytes(*d), bytes);
}

TEST(Header, V2RoundTripHasNoV3FieldsOrFeatureTable) {
  Header h = ValidHeader();
  h.version = 2;
  h.backing_file = "base.raw";
  h.backing_format = "raw";
  std::vector<uint8_t> bytes = Bytes(h);
  EXPECT_NE(LoadBe32(&bytes[72]), kExtFeatureNameTable);
  EXPECT_EQ(LoadBe32(&bytes[72]), kExtBackingFormat);
  auto d = DecodeHeader(bytes, kFileSize);
  ASSERT_TRUE(d.has_value()) << d.status().ToString();
  EXPECT_EQ(d->version, 2u);
  EXPECT_EQ(d->header_length, kV2HeaderLength);
  EXPECT_EQ(d->refcount_order, 4u);
  EXPECT_TRUE(d->feature_names.empty());
  EXPECT_EQ(d->backing_file, "base.raw");
  EXPECT_EQ(d->backing_format, "raw");
}

TEST(Header, EncodeRefusesWhatDoesNotFit) {
  Header h = ValidHeader();
  h.cluster_bits = 9;
  h.backing_file = std::string(600, 'x');
  auto r = EncodeHeader(h);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kInvalidArgument);
  h = ValidHeader();
  h.version = 2;
  h.incompatible_features = kIncompatExtendedL2;
  EXPECT_FALSE(EncodeHeader(h).has_value());
}

TEST(Header, Length104MeansNoCompressionTypeField) {
  Header h = ValidHeader();
  std::vector<uint8_t> bytes = Bytes(h);
  // Rebuild as a 104-byte header: move the extensions down by 8 bytes.
  bytes.erase(bytes.begin() + 104, bytes.begin() + 112);
  bytes.resize(65536, 0);
  StoreBe32(&bytes[100], 104);
  auto d = DecodeHeader(bytes, kFileSize);
  ASSERT_TRUE(d.has_value()) << d.status().ToString();
  EXPECT_EQ(d->header_length, 104u);
  EXPECT_EQ(d->compression_type, CompressionType::kZlib);
  EXPECT_EQ(d->feature_names.size(), DefaultFeatureNames().size());
}

std::vector<uint8_t> ReadFixture(const std::string& name) {
  std::ifstream f(std::string(TD_QCOW2_TESTDATA) + "/" + name, std::ios::binary);
  EXPECT_TRUE(f.good()) << name;
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(Header, DecodesQemuDefaultV3) {
  auto d = DecodeHeader(ReadFixture("qemu72_v3_default.hdr"), 196624);
  ASSERT_TRUE(d.has_value()) << d.status().ToString();
  EXPECT_EQ(d->cluster_bits, 16u);
  EXPECT_EQ(d->size, 1ull << 30);
  EXPECT_EQ(d->header_length, 112u);
  EXPECT_EQ(d->l1_size, 2u);
  EXPECT_EQ(d->l1_table_offset, 0x30000u);
  EXPECT_EQ(d->refcount_table_offset, 0x10000u);
  EXPECT_EQ(d->compression_type, CompressionType::kZlib);
  // QEMU's feature name table carries the same names we write.
  ASSERT_EQ(d->feature_names.size(), DefaultFeatureNames().size());
  for (size_t i = 0; i < d->feature_names.size(); ++i) {
    EXPECT_EQ(d->feature_names[i].name, DefaultFeatureNames()[i].name);
    EXPECT_EQ(d->feature_names[i].type, DefaultFeatureNames()[i].type);
    EXPECT_EQ(d->feature_names[i].bit, DefaultFeatureNames()[i].bit);
  }
}

TEST(Header, DecodesQemuZstdExtendedL2) {
  auto d = DecodeHeader(ReadFixture("qemu72_v3_zstd_extl2_128k.hdr"), 393224);
  ASSERT_TRUE(d.has_value()) << d.status().ToString();
  EXPECT_EQ(d->cluster_bits, 17u);
  EXPECT_TRUE(d->extended_l2());
  EXPECT_EQ(d->compression_type, CompressionType::kZstd);
  EXPECT_EQ(d->incompatible_features, kIncompatExtendedL2 | kIncompatCompression);
}

TEST(Header, DecodesQemuV2WithBacking) {
  auto d = DecodeHeader(ReadFixture("qemu72_v2_backing.hdr"), 196624);
  ASSERT_TRUE(d.has_value()) << d.status().ToString();
  EXPECT_EQ(d->version, 2u);
  EXPECT_EQ(d->backing_file, "a.qcow2");
  EXPECT_EQ(d->backing_format, "qcow2");
}

// ---- hostile headers: one defect each ----

struct Hostile {
  const char* name;
  std::function<void(std::vector<uint8_t>& bytes, uint64_t& file_size)> mutate;
  Code code;
  const char* message_part;  // the message must name the problem
};

void Put32(std::vector<uint8_t>& b, size_t at, uint32_t v) { StoreBe32(&b[at], v); }
void Put64(std::vector<uint8_t>& b, size_t at, uint64_t v) { StoreBe64(&b[at], v); }

// Replaces the extension area with the given raw bytes (header is 112 bytes).
void SetExtensions(std::vector<uint8_t>& b, std::vector<uint8_t> ext) {
  std::fill(b.begin() + 112, b.end(), 0);
  std::copy(ext.begin(), ext.end(), b.begin() + 112);
}

const Hostile kHostile[] = {
    {"TooShort", [](auto& b, auto&) { b.resize(40); }, Code::kCorrupt, "too short"},
    {"BadMagic", [](auto& b, auto&) { Put32(b, 0, 0x514649fa); }, Code::kCorrupt, "magic"},
    {"Version1", [](auto& b, auto&) { Put32(b, 4, 1); }, Code::kNotSupported, "version 1"},
    {"Version4", [](auto& b, auto&) { Put32(b, 4, 4); }, Code::kNotSupported, "version 4"},
    {"HeaderLengthBelow104", [](auto& b, auto&) { Put32(b, 100, 96); }, Code::kCorrupt,
     "header_length 96"},
    {"HeaderLengthNotMultipleOf8", [](auto& b, auto&) { Put32(b, 100, 108); }, Code::kCorrupt,
     "header_length 108"},
    {"HeaderLengthBeyondCluster", [](auto& b, auto&) { Put32(b, 100, 65544); }, Code::kCorrupt,
     "header_length 65544"},
    {"ClusterBits8", [](auto& b, auto&) { Put32(b, 20, 8); }, Code::kCorrupt, "cluster_bits 8"},
    {"ClusterBits22", [](auto& b, auto&) { Put32(b, 20, 22); }, Code::kNotSupported,
     "cluster_bits 22"},
    {"ClusterBitsHuge", [](auto& b, auto&) { Put32(b, 20, 0xffffffff); }, Code::kNotSupported,
     "cluster_bits 4294967295"},
    {"EncryptedAes", [](auto& b, auto&) { Put32(b, 32, 1); }, Code::kNotSupported, "encrypted"},
    {"EncryptedLuks", [](auto& b, auto&) { Put32(b, 32, 2); }, Code::kNotSupported, "encrypted"},
    {"VirtualSizeTooLarge", [](auto& b, auto&) { Put64(b, 24, (1ull << 61) + 1); },
     Code::kNotSupported, "virtual size"},
    {"L1TooSmallForSize", [](auto& b, auto&) { Put32(b, 36, 1); }, Code::kCorrupt,
     "l1_size 1 is too small"},
    {"L1TooLarge", [](auto& b, auto&) { Put32(b, 36, 0x01000000); }, Code::kNotSupported,
     "l1_size 16777216"},
    {"L1Unaligned", [](auto& b, auto&) { Put64(b, 40, 0x30200); }, Code::kCorrupt,
     "l1_table_offset 0x30200 is not aligned"},
    {"L1OverlapsHeader", [](auto& b, auto&) { Put64(b, 40, 0); }, Code::kCorrupt,
     "l1_table_offset at offset 0 overlaps the header"},
    {"L1PastEndOfFile", [](auto& b, auto&) { Put64(b, 40, 0x40000); }, Code::kCorrupt,
     "l1_table_offset at 0x40000"},
    {"L1OffsetWraps", [](auto& b, auto&) { Put64(b, 40, 0xffffffffffff0000); }, Code::kCorrupt,
     "past the end of the file"},
    {"RefcountTableUnaligned", [](auto& b, auto&) { Put64(b, 48, 0x10008); }, Code::kCorrupt,
     "refcount_table_offset 0x10008"},
    {"RefcountTableOverlapsHeader", [](auto& b, auto&) { Put64(b, 48, 0); }, Code::kCorrupt,
     "refcount_table_offset at offset 0"},
    {"RefcountTablePastEnd", [](auto& b, auto&) { Put64(b, 48, 0x40000); }, Code::kCorrupt,
     "refcount_table_offset at 0x40000"},
    {"RefcountTableTooLarge", [](auto& b, auto&) { Put32(b, 56, 129); }, Code::kNotSupported,
     "refcount_table_clusters 129"},
    {"RefcountTableEmpty", [](auto& b, auto&) { Put32(b, 56, 0); }, Code::kCorrupt,
     "refcount_table_clusters is 0"},
    {"RefcountOrder7", [](auto& b, auto&) { Put32(b, 96, 7); }, Code::kCorrupt,
     "refcount_order 7"},
    {"SnapshotsUnaligned",
     [](auto& b, auto&) {
       Put32(b, 60, 1);
       Put64(b, 64, 0x20010);
     },
     Code::kCorrupt, "snapshots_offset 0x20010"},
    {"SnapshotsAtZero", [](auto& b, auto&) { Put32(b, 60, 1); }, Code::kCorrupt,
     "snapshots_offset at offset 0"},
    {"TooManySnapshots",
     [](auto& b, auto&) {
       Put32(b, 60, 65537);
       Put64(b, 64, 0x20000);
     },
     Code::kCorrupt, "nb_snapshots 65537"},
    {"UnknownIncompatibleBitNamedByImage",
     [](auto& b, auto&) {
       std::vector<uint8_t> ext(8 + 48, 0);
       StoreBe32(&ext[0], kExtFeatureNameTable);
       StoreBe32(&ext[4], 48);
       ext[8] = 0;  // incompatible
       ext[9] = 5;
       std::string name = "frobnicated clusters";
       std::copy(name.begin(), name.end(), ext.begin() + 10);
       SetExtensions(b, ext);
       Put64(b, 72, 1ull << 5);
     },
     Code::kNotSupported, "bit 5 (\"frobnicated clusters\")"},
    {"UnknownIncompatibleBitUnnamed", [](auto& b, auto&) { Put64(b, 72, 1ull << 40); },
     Code::kNotSupported, "incompatible feature bit 40"},
    {"ExternalDataFile", [](auto& b, auto&) { Put64(b, 72, kIncompatDataFile); },
     Code::kNotSupported, "external data file"},
    {"UnknownCompressionType",
     [](auto& b, auto&) {
       Put64(b, 72, kIncompatCompression);
       b[104] = 2;
     },
     Code::kNotSupported, "compression_type 2"},
    {"ZstdWithoutIncompatibleBit", [](auto& b, auto&) { b[104] = 1; }, Code::kCorrupt,
     "compression_type 1 without"},
    {"CompressionBitWithZlib", [](auto& b, auto&) { Put64(b, 72, kIncompatCompression); },
     Code::kCorrupt, "compression type incompatible bit"},
    {"ExtendedL2WithSmallClusters",
     [](auto& b, auto&) {
       Put32(b, 20, 13);
       Put64(b, 72, kIncompatExtendedL2);
     },
     Code::kCorrupt, "extended L2 entries need cluster_bits >= 14"},
    {"ExtensionRunsPastCluster",
     [](auto& b, auto&) {
       std::vector<uint8_t> ext(8, 0);
       StoreBe32(&ext[0], 0x11111111);
       StoreBe32(&ext[4], 65536);
       SetExtensions(b, ext);
     },
     Code::kCorrupt, "header extension 0x11111111"},
    {"ExtensionHeaderCutOff",
     [](auto& b, auto&) {
       // Unterminated chain of empty extensions up to 4 bytes before the end.
       std::fill(b.begin() + 112, b.end(), 0);
       for (size_t at = 112; at + 8 <= b.size(); at += 8) Put32(b, at, 0x22222222);
       b.resize(b.size() - 4);
     },
     Code::kCorrupt, "runs past the end of the extension area"},
    {"FeatureTableBadLength",
     [](auto& b, auto&) {
       std::vector<uint8_t> ext(8 + 50, 0);
       StoreBe32(&ext[0], kExtFeatureNameTable);
       StoreBe32(&ext[4], 50);
       SetExtensions(b, ext);
     },
     Code::kCorrupt, "feature name table length 50"},
    {"BackingNameTooLong",
     [](auto& b, auto&) {
       Put64(b, 8, 0x1000);
       Put32(b, 16, 2000);
     },
     Code::kCorrupt, "backing_file_size 2000"},
    {"BackingNamePastCluster",
     [](auto& b, auto&) {
       Put64(b, 8, 65530);
       Put32(b, 16, 100);
     },
     Code::kCorrupt, "backing file name at 0xfffa"},
    {"BackingNameInsideHeader",
     [](auto& b, auto&) {
       Put64(b, 8, 16);
       Put32(b, 16, 8);
     },
     Code::kCorrupt, "backing file name at 0x10"},
    {"DuplicateBackingFormat",
     [](auto& b, auto&) {
       std::vector<uint8_t> ext(32, 0);
       StoreBe32(&ext[0], kExtBackingFormat);
       StoreBe32(&ext[4], 3);
       StoreBe32(&ext[16], kExtBackingFormat);
       StoreBe32(&ext[20], 3);
       SetExtensions(b, ext);
     },
     Code::kCorrupt, "duplicate backing format"},
};

class HostileHeader : public testing::TestWithParam<Hostile> {};

TEST_P(HostileHeader, IsRefusedWithANamedReason) {
  const Hostile& c = GetParam();
  std::vector<uint8_t> bytes = Bytes(ValidHeader());
  uint64_t file_size = kFileSize;
  ASSERT_TRUE(DecodeHeader(bytes, file_size).has_value()) << "the base header must be valid";
  c.mutate(bytes, file_size);
  auto r = DecodeHeader(bytes, file_size);
  ASSERT_FALSE(r.has_value()) << c.name << " was accepted";
  EXPECT_EQ(r.error().code(), c.code) << r.error().ToString();
  EXPECT_NE(r.error().message().find(c.message_part), std::string::npos)
      << "message \"" << r.error().message() << "\" does not name \"" << c.message_part << "\"";
}

INSTANTIATE_TEST_SUITE_P(Defects, HostileHeader, testing::ValuesIn(kHostile),
                         [](const auto& info) { return std::string(info.param.name); });

// Random corruption of a valid header with extensions and a backing name:
// decoding must either refuse with kCorrupt/kNotSupported or produce a
// header that encodes again. (Run under ASan/UBSan to catch overreads.)
TEST(Header, RandomMutationsAreRefusedOrDecodeConsistently) {
  Header base = ValidHeader();
  base.backing_file = "backing.img";
  base.backing_format = "raw";
  base.unknown_extensions.push_back({0x7777, {9, 9, 9}});
  const std::vector<uint8_t> good = Bytes(base);
  uint64_t state = 0x2545F4914F6CDD1Dull;  // fixed seed: failures reproduce
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> bytes = good;
    int flips = 1 + int(next() % 4);
    for (int f = 0; f < flips; ++f) {
      size_t at = next() % 640;  // header, extensions and backing name
      bytes[at] = uint8_t(next());
    }
    uint64_t file_size = (next() % 8 == 0) ? next() % (1 << 20) : kFileSize;
    auto d = DecodeHeader(bytes, file_size);
    if (!d.has_value()) {
      ASSERT_TRUE(d.error().code() == Code::kCorrupt || d.error().code() == Code::kNotSupported)
          << d.error().ToString();
      ASSERT_FALSE(d.error().message().empty());
      continue;
    }
    ++accepted;
    EXPECT_LE(d->backing_file.size(), kMaxBackingFileSize);
    EXPECT_GE(d->cluster_bits, kMinClusterBits);
    EXPECT_LE(d->cluster_bits, kMaxClusterBits);
    EXPECT_LE(uint64_t{d->l1_size} * 8, kMaxL1Bytes);
  }
  EXPECT_GT(accepted, 0) << "some mutations (e.g. of the name bytes) stay valid";
}

TEST(Header, UnknownAutoclearAndCompatibleBitsAreAccepted) {
  std::vector<uint8_t> bytes = Bytes(ValidHeader());
  Put64(bytes, 80, ~0ull);
  Put64(bytes, 88, ~0ull);
  auto d = DecodeHeader(bytes, kFileSize);
  ASSERT_TRUE(d.has_value()) << d.status().ToString();
  EXPECT_EQ(d->autoclear_features, ~0ull);
}

TEST(Header, DirtyAndCorruptBitsDecode) {
  std::vector<uint8_t> bytes = Bytes(ValidHeader());
  Put64(bytes, 72, kIncompatDirty | kIncompatCorrupt);
  auto d = DecodeHeader(bytes, kFileSize);
  ASSERT_TRUE(d.has_value()) << d.status().ToString();
  EXPECT_EQ(d->incompatible_features, kIncompatDirty | kIncompatCorrupt);
}

}  // namespace
}  // namespace thindisk::qcow2
