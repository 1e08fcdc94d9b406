// qcow2 header codec: the fixed fields, the header extensions and the
// backing file name. Pure functions over byte spans; every field read from
// an image is checked against a named limit before it is used for
// arithmetic or sizing. (Table entries: table_entry.cc; the snapshot table:
// snapshot_table.cc.)
#include "qcow2/format.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

// QEMU 7.2 writes v3 headers of 112 bytes: the 104 mandatory bytes, the
// compression_type byte at offset 104 and 7 bytes of padding. A header_length
// of exactly 104 means compression_type is absent (reads as zlib).
constexpr uint32_t kCompressionTypeOffset = 104;
constexpr uint32_t kEncodedV3HeaderLength = 112;
constexpr uint32_t kExtHeaderSize = 8;
constexpr uint32_t kFeatureNameEntrySize = 48;
constexpr uint32_t kFeatureNameMax = 46;
// Backing format names are short ("qcow2", "raw"); QEMU refuses >= 1023.
constexpr uint32_t kMaxBackingFormatSize = 1023;

uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

std::string Hex(uint64_t v) { return fmt::format("{:#x}", v); }

// The name the image's own feature name table gives (type, bit), or "".
std::string FeatureNameFor(const std::vector<FeatureName>& names, uint8_t type, uint8_t bit) {
  for (const auto& f : names) {
    if (f.type == type && f.bit == bit) return f.name;
  }
  return "";
}

// Validates a table that the header places at `offset` with `bytes` bytes.
// An empty table (bytes == 0) may sit anywhere aligned, including 0.
Status CheckTableOffset(const char* what, uint64_t offset, uint64_t bytes, uint64_t cluster_size,
                        uint64_t file_size) {
  if (offset & (cluster_size - 1)) {
    return Status::Corrupt(fmt::format("{} {} is not aligned to the cluster size {}", what,
                                       Hex(offset), cluster_size));
  }
  if (bytes == 0) return Status::Ok();
  if (offset == 0) {
    return Status::Corrupt(fmt::format("{} at offset 0 overlaps the header cluster", what));
  }
  if (offset > file_size || bytes > file_size - offset) {
    return Status::Corrupt(fmt::format("{} at {} ({} bytes) lies past the end of the file ({} bytes)",
                                       what, Hex(offset), bytes, file_size));
  }
  return Status::Ok();
}

struct ParsedExtensions {
  std::string backing_format;
  std::vector<FeatureName> feature_names;
  std::vector<RawExtension> unknown;
  std::optional<RawExtension> bitmaps;  // decoded by DecodeHeader, which knows the features
};

Result<std::vector<FeatureName>> DecodeFeatureNames(std::span<const uint8_t> data) {
  if (data.size() % kFeatureNameEntrySize != 0) {
    return Status::Corrupt(fmt::format(
        "feature name table length {} is not a multiple of {}", data.size(), kFeatureNameEntrySize));
  }
  std::vector<FeatureName> names;
  for (size_t i = 0; i < data.size(); i += kFeatureNameEntrySize) {
    FeatureName f;
    f.type = data[i];
    f.bit = data[i + 1];
    const auto* name = reinterpret_cast<const char*>(&data[i + 2]);
    f.name.assign(name, strnlen(name, kFeatureNameMax));
    // Out-of-range entries (type > 2, bit > 63) are harmless labels: keep
    // them so a rewrite preserves the table, they simply never match.
    names.push_back(std::move(f));
  }
  return names;
}

// Walks the extension area [start, end). Each extension is a type, a length
// and data padded to 8 bytes; type 0 ends the list.
Result<ParsedExtensions> DecodeExtensions(std::span<const uint8_t> bytes, uint64_t start,
                                          uint64_t end) {
  ParsedExtensions out;
  bool seen_backing_format = false, seen_feature_names = false;
  uint64_t pos = start;
  while (true) {
    if (pos + kExtHeaderSize > end) {
      // QEMU tolerates a missing end marker when the area is exactly full.
      if (pos == end) break;
      return Status::Corrupt(fmt::format(
          "header extension at {} runs past the end of the extension area ({})", Hex(pos),
          Hex(end)));
    }
    uint32_t type = LoadBe32(&bytes[pos]);
    uint32_t len = LoadBe32(&bytes[pos + 4]);
    if (type == kExtEnd) break;
    pos += kExtHeaderSize;
    if (len > end - pos) {
      return Status::Corrupt(fmt::format(
          "header extension {} at {} has length {} running past the end of the extension area "
          "({})",
          Hex(type), Hex(pos - kExtHeaderSize), len, Hex(end)));
    }
    std::span<const uint8_t> data = bytes.subspan(pos, len);
    switch (type) {
      case kExtBackingFormat:
        if (seen_backing_format) return Status::Corrupt("duplicate backing format extension");
        if (len >= kMaxBackingFormatSize) {
          return Status::Corrupt(fmt::format("backing format extension length {} too large", len));
        }
        seen_backing_format = true;
        out.backing_format.assign(reinterpret_cast<const char*>(data.data()), data.size());
        break;
      case kExtFeatureNameTable: {
        if (seen_feature_names) return Status::Corrupt("duplicate feature name table extension");
        seen_feature_names = true;
        TD_ASSIGN_OR_RETURN(out.feature_names, DecodeFeatureNames(data));
        break;
      }
      case kExtBitmaps:
        if (out.bitmaps) return Status::Corrupt("duplicate bitmaps extension");
        out.bitmaps = RawExtension{type, {data.begin(), data.end()}};
        break;
      default:
        out.unknown.push_back(RawExtension{type, {data.begin(), data.end()}});
        break;
    }
    // The padding may be missing at the very end of the area.
    pos = std::min<uint64_t>(end, pos + Align8(len));
  }
  return out;
}

// Step of DecodeHeader: the features and their consistency.
Status CheckFeatures(const Header& h) {
  if (h.incompatible_features & kIncompatDataFile) {
    return Status::NotSupported(
        "external data files are not supported (incompatible feature bit 2)");
  }
  uint64_t unknown = h.incompatible_features & ~kIncompatKnown;
  if (unknown) {
    int bit = __builtin_ctzll(unknown);
    std::string name = FeatureNameFor(h.feature_names, 0, uint8_t(bit));
    return Status::NotSupported(fmt::format(
        "unsupported incompatible feature bit {}{}", bit,
        name.empty() ? std::string(" (unnamed)") : fmt::format(" (\"{}\")", name)));
  }
  bool has_bit = h.incompatible_features & kIncompatCompression;
  uint8_t ct = uint8_t(h.compression_type);
  if (ct != uint8_t(CompressionType::kZlib) && ct != uint8_t(CompressionType::kZstd)) {
    return Status::NotSupported(fmt::format("unknown compression_type {}", unsigned(ct)));
  }
  if (ct != 0 && !has_bit) {
    return Status::Corrupt(fmt::format(
        "compression_type {} without the compression type incompatible bit", unsigned(ct)));
  }
  if (ct == 0 && has_bit) {
    return Status::Corrupt("compression type incompatible bit set but compression_type is zlib");
  }
  if (h.extended_l2() && h.cluster_bits < 14) {
    return Status::Corrupt(fmt::format(
        "extended L2 entries need cluster_bits >= 14 (512-byte subclusters), got {}",
        h.cluster_bits));
  }
  return Status::Ok();
}

// Step of DecodeHeader: the tables the header points at.
Status CheckTables(const Header& h, uint64_t file_size) {
  uint64_t cs = h.cluster_size();
  if (h.size > kMaxVirtualSize) {
    return Status::NotSupported(fmt::format("virtual size {} exceeds the limit {}", h.size,
                                            kMaxVirtualSize));
  }
  uint64_t l1_bytes = uint64_t{h.l1_size} * 8;
  if (l1_bytes > kMaxL1Bytes) {
    return Status::NotSupported(fmt::format("l1_size {} ({} bytes) exceeds the limit of {} bytes",
                                            h.l1_size, l1_bytes, kMaxL1Bytes));
  }
  uint64_t l2_span = cs * h.l2_entries();
  uint64_t l1_needed = h.size / l2_span + (h.size % l2_span != 0);
  if (h.l1_size < l1_needed) {
    return Status::Corrupt(fmt::format("l1_size {} is too small for virtual size {} (needs {})",
                                       h.l1_size, h.size, l1_needed));
  }
  TD_RETURN_IF_ERROR(
      CheckTableOffset("l1_table_offset", h.l1_table_offset, l1_bytes, cs, file_size));
  if (h.refcount_table_clusters == 0) {
    return Status::Corrupt("refcount_table_clusters is 0: the image has no refcount table");
  }
  if (h.refcount_table_clusters > kMaxRefcountTableBytes / cs) {
    return Status::NotSupported(fmt::format(
        "refcount_table_clusters {} exceeds the limit of {} bytes", h.refcount_table_clusters,
        kMaxRefcountTableBytes));
  }
  TD_RETURN_IF_ERROR(CheckTableOffset("refcount_table_offset", h.refcount_table_offset,
                                      uint64_t{h.refcount_table_clusters} * cs, cs, file_size));
  if (h.nb_snapshots > kMaxSnapshots) {
    return Status::Corrupt(fmt::format("nb_snapshots {} exceeds the limit {}", h.nb_snapshots,
                                       kMaxSnapshots));
  }
  return CheckTableOffset("snapshots_offset", h.snapshots_offset,
                          uint64_t{h.nb_snapshots} * kSnapshotFixedSize, cs, file_size);
}

}  // namespace

Result<Header> DecodeHeader(std::span<const uint8_t> bytes, uint64_t file_size) {
  // 1. Fixed fields.
  if (bytes.size() < kV2HeaderLength) {
    return Status::Corrupt(fmt::format("file too short for a qcow2 header ({} bytes)",
                                       bytes.size()));
  }
  const uint8_t* p = bytes.data();
  uint32_t magic = LoadBe32(p);
  if (magic != kMagic) {
    return Status::Corrupt(fmt::format("bad magic {} (not a qcow2 image)", Hex(magic)));
  }
  Header h;
  h.version = LoadBe32(p + 4);
  if (h.version != 2 && h.version != 3) {
    return Status::NotSupported(fmt::format("unsupported qcow2 version {}", h.version));
  }
  h.backing_file_offset = LoadBe64(p + 8);
  h.backing_file_size = LoadBe32(p + 16);
  h.cluster_bits = LoadBe32(p + 20);
  h.size = LoadBe64(p + 24);
  h.crypt_method = LoadBe32(p + 32);
  h.l1_size = LoadBe32(p + 36);
  h.l1_table_offset = LoadBe64(p + 40);
  h.refcount_table_offset = LoadBe64(p + 48);
  h.refcount_table_clusters = LoadBe32(p + 56);
  h.nb_snapshots = LoadBe32(p + 60);
  h.snapshots_offset = LoadBe64(p + 64);

  if (h.cluster_bits < kMinClusterBits) {
    return Status::Corrupt(fmt::format("cluster_bits {} is below the minimum {}", h.cluster_bits,
                                       kMinClusterBits));
  }
  if (h.cluster_bits > kMaxClusterBits) {
    return Status::NotSupported(fmt::format("cluster_bits {} exceeds the supported maximum {}",
                                            h.cluster_bits, kMaxClusterBits));
  }
  if (h.crypt_method != 0) {
    return Status::NotSupported(fmt::format("encrypted images are not supported (crypt_method {})",
                                            h.crypt_method));
  }
  const uint64_t cs = h.cluster_size();

  // 2. Version 3 fields.
  if (h.version == 2) {
    h.incompatible_features = h.compatible_features = h.autoclear_features = 0;
    h.refcount_order = 4;
    h.header_length = kV2HeaderLength;
    h.compression_type = CompressionType::kZlib;
  } else {
    if (bytes.size() < kV3HeaderLength) {
      return Status::Corrupt(fmt::format("file too short for a version 3 header ({} bytes)",
                                         bytes.size()));
    }
    h.incompatible_features = LoadBe64(p + 72);
    h.compatible_features = LoadBe64(p + 80);
    h.autoclear_features = LoadBe64(p + 88);
    h.refcount_order = LoadBe32(p + 96);
    h.header_length = LoadBe32(p + 100);
    if (h.header_length < kV3HeaderLength || h.header_length % 8 != 0) {
      return Status::Corrupt(fmt::format(
          "header_length {} is invalid (version 3 needs >= {} and a multiple of 8)",
          h.header_length, kV3HeaderLength));
    }
    if (h.header_length > cs || h.header_length > bytes.size()) {
      return Status::Corrupt(fmt::format("header_length {} exceeds the first cluster ({} bytes)",
                                         h.header_length, std::min<uint64_t>(cs, bytes.size())));
    }
    if (h.refcount_order > 6) {
      return Status::Corrupt(fmt::format("refcount_order {} exceeds 6 (64-bit refcounts)",
                                         h.refcount_order));
    }
    h.compression_type = CompressionType::kZlib;
    if (h.header_length > kCompressionTypeOffset) {
      h.compression_type = CompressionType(p[kCompressionTypeOffset]);
    }
  }

  // 3. Backing file name: inside the first cluster, after the header.
  if (h.backing_file_offset != 0) {
    if (h.backing_file_size > kMaxBackingFileSize) {
      return Status::Corrupt(fmt::format("backing_file_size {} exceeds {}", h.backing_file_size,
                                         kMaxBackingFileSize));
    }
    uint64_t limit = std::min<uint64_t>(cs, bytes.size());
    if (h.backing_file_offset < h.header_length || h.backing_file_offset > limit ||
        h.backing_file_size > limit - h.backing_file_offset) {
      return Status::Corrupt(fmt::format(
          "backing file name at {} ({} bytes) is not inside the first cluster after the header",
          Hex(h.backing_file_offset), h.backing_file_size));
    }
    h.backing_file.assign(reinterpret_cast<const char*>(p + h.backing_file_offset),
                          h.backing_file_size);
  } else {
    h.backing_file_size = 0;
  }

  // 4. Extensions, between the header and the backing name (or the end of
  // the first cluster).
  uint64_t ext_end = std::min<uint64_t>(cs, bytes.size());
  if (h.backing_file_offset != 0) ext_end = std::min<uint64_t>(ext_end, h.backing_file_offset);
  TD_ASSIGN_OR_RETURN(ParsedExtensions ext, DecodeExtensions(bytes, h.header_length, ext_end));
  h.backing_format = std::move(ext.backing_format);
  h.feature_names = std::move(ext.feature_names);
  h.unknown_extensions = std::move(ext.unknown);
  if (ext.bitmaps && h.version >= 3 && (h.autoclear_features & kAutoclearBitmaps)) {
    auto bitmaps = DecodeBitmapsExtension(ext.bitmaps->data, cs, file_size);
    if (!bitmaps) return bitmaps.error();
    h.bitmaps = *bitmaps;
  } else if (ext.bitmaps) {
    // Inconsistent (the autoclear bit is clear): not ours to interpret.
    h.unknown_extensions.insert(h.unknown_extensions.begin(), std::move(*ext.bitmaps));
  }

  // 5. Features, then the tables.
  TD_RETURN_IF_ERROR(CheckFeatures(h));
  TD_RETURN_IF_ERROR(CheckTables(h, file_size));
  return h;
}

namespace {

Result<std::vector<uint8_t>> EncodeHeaderAsIs(const Header& h);

}  // namespace

Result<std::vector<uint8_t>> EncodeHeader(const Header& h) {
  auto bytes = EncodeHeaderAsIs(h);
  if (bytes || h.feature_names.empty() || bytes.error().code() != Code::kInvalidArgument) {
    return bytes;
  }
  // The feature name table only labels bits for messages: where it does
  // not fit (512-byte clusters with bitmaps or a long backing name), the
  // header goes without it, as qemu writes it.
  Header without = h;
  without.feature_names.clear();
  auto smaller = EncodeHeaderAsIs(without);
  return smaller ? smaller : bytes;
}

namespace {

Result<std::vector<uint8_t>> EncodeHeaderAsIs(const Header& h) {
  if (h.version != 2 && h.version != 3) {
    return Status::InvalidArgument(fmt::format("cannot encode qcow2 version {}", h.version));
  }
  if (h.cluster_bits < kMinClusterBits || h.cluster_bits > kMaxClusterBits) {
    return Status::InvalidArgument(fmt::format("cluster_bits {} out of range", h.cluster_bits));
  }
  if (h.backing_file.size() > kMaxBackingFileSize) {
    return Status::InvalidArgument(fmt::format("backing file name is {} bytes; the limit is {}",
                                               h.backing_file.size(), kMaxBackingFileSize));
  }
  if (h.backing_format.size() >= kMaxBackingFormatSize) {
    return Status::InvalidArgument("backing format name too long");
  }
  const bool v3 = h.version == 3;
  if (!v3 && (h.incompatible_features || h.refcount_order != 4 ||
              h.compression_type != CompressionType::kZlib)) {
    return Status::InvalidArgument(
        "version 2 images cannot have feature bits, refcount_order != 4 or zstd compression");
  }
  const uint32_t header_length = v3 ? kEncodedV3HeaderLength : kV2HeaderLength;
  std::vector<uint8_t> out(header_length, 0);
  uint8_t* p = out.data();
  StoreBe32(p, kMagic);
  StoreBe32(p + 4, h.version);
  StoreBe32(p + 20, h.cluster_bits);
  StoreBe64(p + 24, h.size);
  StoreBe32(p + 32, h.crypt_method);
  StoreBe32(p + 36, h.l1_size);
  StoreBe64(p + 40, h.l1_table_offset);
  StoreBe64(p + 48, h.refcount_table_offset);
  StoreBe32(p + 56, h.refcount_table_clusters);
  StoreBe32(p + 60, h.nb_snapshots);
  StoreBe64(p + 64, h.snapshots_offset);
  if (v3) {
    StoreBe64(p + 72, h.incompatible_features);
    StoreBe64(p + 80, h.compatible_features);
    StoreBe64(p + 88, h.autoclear_features);
    StoreBe32(p + 96, h.refcount_order);
    StoreBe32(p + 100, header_length);
    p[kCompressionTypeOffset] = uint8_t(h.compression_type);
  }

  auto append_ext = [&out](uint32_t type, std::span<const uint8_t> data) {
    size_t pos = out.size();
    out.resize(pos + kExtHeaderSize + Align8(data.size()), 0);
    StoreBe32(&out[pos], type);
    StoreBe32(&out[pos + 4], uint32_t(data.size()));
    if (!data.empty()) std::memcpy(&out[pos + kExtHeaderSize], data.data(), data.size());
  };
  // The bitmaps extension first: right after the fixed fields it lies in
  // the header's first sector, so a header write that moves the directory
  // (one sector, written whole) can never pair a new count with an old
  // offset.
  if (h.bitmaps) {
    if (!v3) return Status::InvalidArgument("version 2 images cannot have bitmaps");
    append_ext(kExtBitmaps, EncodeBitmapsExtension(*h.bitmaps));
  }
  if (!h.backing_format.empty()) {
    append_ext(kExtBackingFormat, {reinterpret_cast<const uint8_t*>(h.backing_format.data()),
                                   h.backing_format.size()});
  }
  if (v3 && !h.feature_names.empty()) {
    std::vector<uint8_t> table(h.feature_names.size() * kFeatureNameEntrySize, 0);
    for (size_t i = 0; i < h.feature_names.size(); ++i) {
      const FeatureName& f = h.feature_names[i];
      if (f.name.size() > kFeatureNameMax) {
        return Status::InvalidArgument(fmt::format("feature name \"{}\" longer than {} bytes",
                                                   f.name, kFeatureNameMax));
      }
      uint8_t* e = &table[i * kFeatureNameEntrySize];
      e[0] = f.type;
      e[1] = f.bit;
      std::memcpy(e + 2, f.name.data(), f.name.size());
    }
    append_ext(kExtFeatureNameTable, table);
  }
  for (const RawExtension& e : h.unknown_extensions) {
    if (e.type == kExtEnd || e.type == kExtBackingFormat || e.type == kExtFeatureNameTable ||
        (e.type == kExtBitmaps && h.bitmaps)) {
      return Status::InvalidArgument(
          fmt::format("extension type {} cannot be kept as unknown", Hex(e.type)));
    }
    if (e.data.size() > h.cluster_size()) {
      return Status::InvalidArgument("header extension larger than a cluster");
    }
    append_ext(e.type, e.data);
  }
  append_ext(kExtEnd, {});

  if (!h.backing_file.empty()) {
    uint64_t offset = out.size();
    out.insert(out.end(), h.backing_file.begin(), h.backing_file.end());
    StoreBe64(&out[8], offset);
    StoreBe32(&out[16], uint32_t(h.backing_file.size()));
  }
  if (out.size() > h.cluster_size()) {
    return Status::InvalidArgument(fmt::format(
        "header, extensions and backing name need {} bytes; the cluster holds {}", out.size(),
        h.cluster_size()));
  }
  return out;
}

}  // namespace

std::vector<FeatureName> DefaultFeatureNames() {
  return {
      {0, 0, "dirty bit"},       {0, 1, "corrupt bit"},        {0, 2, "external data file"},
      {0, 3, "compression type"}, {0, 4, "extended L2 entries"}, {1, 0, "lazy refcounts"},
      {2, 0, "bitmaps"},         {2, 1, "raw external data"},
  };
}

}  // namespace thindisk::qcow2
