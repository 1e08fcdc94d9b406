#include "vhd/format.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "util/endian.h"

namespace thindisk::vhd {

namespace {

constexpr char kFooterCookie[8] = {'c', 'o', 'n', 'e', 'c', 't', 'i', 'x'};
constexpr char kDynamicCookie[8] = {'c', 'x', 's', 'p', 'a', 'r', 's', 'e'};

// Footer field offsets (spec, "Hard Disk Footer Format").
constexpr size_t kOffFeatures = 8;
constexpr size_t kOffFileFormatVersion = 12;
constexpr size_t kOffDataOffset = 16;
constexpr size_t kOffTimestamp = 24;
constexpr size_t kOffCreatorApplication = 28;
constexpr size_t kOffOriginalSize = 40;
constexpr size_t kOffCurrentSize = 48;
constexpr size_t kOffCylinders = 56;
constexpr size_t kOffHeads = 58;
constexpr size_t kOffSectorsPerTrack = 59;
constexpr size_t kOffDiskType = 60;
constexpr size_t kOffFooterChecksum = 64;

// Dynamic disk header field offsets (spec, "Dynamic Disk Header Format").
constexpr size_t kOffDataOffsetUnused = 8;
constexpr size_t kOffTableOffset = 16;
constexpr size_t kOffHeaderVersion = 24;
constexpr size_t kOffMaxTableEntries = 28;
constexpr size_t kOffBlockSize = 32;
constexpr size_t kOffHeaderChecksum = 36;

constexpr uint32_t kVersionMajorMask = 0xffff0000;
constexpr uint32_t kVersion1 = 0x00010000;
constexpr uint32_t kFeaturesReserved = 0x00000002;  // spec: always set

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

uint32_t Checksum(std::span<const uint8_t> bytes, size_t checksum_at) {
  uint32_t sum = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i >= checksum_at && i < checksum_at + 4) continue;
    sum += bytes[i];
  }
  return ~sum;
}

bool HasFooterCookie(std::span<const uint8_t> bytes) {
  return bytes.size() >= 8 && std::memcmp(bytes.data(), kFooterCookie, 8) == 0;
}

Result<Footer> DecodeFooter(std::span<const uint8_t> bytes) {
  if (bytes.size() < kFooterSize) return Status::Corrupt("vhd footer is truncated");
  if (!HasFooterCookie(bytes)) return Status::Corrupt("not a vhd image (no 'conectix' footer)");
  const uint8_t* p = bytes.data();
  Footer f;
  f.features = LoadBe32(p + kOffFeatures);
  f.file_format_version = LoadBe32(p + kOffFileFormatVersion);
  f.data_offset = LoadBe64(p + kOffDataOffset);
  f.timestamp = LoadBe32(p + kOffTimestamp);
  std::memcpy(f.creator_application, p + kOffCreatorApplication, 4);
  f.original_size = LoadBe64(p + kOffOriginalSize);
  f.current_size = LoadBe64(p + kOffCurrentSize);
  f.cylinders = LoadBe16(p + kOffCylinders);
  f.heads = p[kOffHeads];
  f.sectors_per_track = p[kOffSectorsPerTrack];
  uint32_t type = LoadBe32(p + kOffDiskType);
  f.checksum = LoadBe32(p + kOffFooterChecksum);

  if (f.checksum != Checksum(bytes.first(kFooterSize), kOffFooterChecksum)) {
    return Status::Corrupt("vhd footer checksum does not match");
  }
  if ((f.file_format_version & kVersionMajorMask) != kVersion1) {
    return Status::NotSupported("vhd file format version " +
                                std::to_string(f.file_format_version >> 16) +
                                " is not supported (1)");
  }
  if (type == uint32_t(DiskType::kDifferencing)) {
    return Status::NotSupported("differencing vhd images (with a parent) are not supported");
  }
  if (type != uint32_t(DiskType::kFixed) && type != uint32_t(DiskType::kDynamic)) {
    return Status::NotSupported("vhd disk type " + std::to_string(type) +
                                " is not supported (fixed, dynamic)");
  }
  f.disk_type = DiskType(type);
  if (f.current_size > kMaxDiskSize) {
    return Status::Corrupt("vhd size " + std::to_string(f.current_size) +
                           " is larger than the format's 2040 GiB");
  }
  if (f.disk_type == DiskType::kDynamic && f.data_offset == kNoDataOffset) {
    return Status::Corrupt("dynamic vhd footer has no dynamic header offset");
  }
  return f;
}

Result<DynamicHeader> DecodeDynamicHeader(std::span<const uint8_t> bytes, const Footer& footer,
                                          uint64_t file_size) {
  if (bytes.size() < kDynamicHeaderSize) return Status::Corrupt("vhd dynamic header is truncated");
  const uint8_t* p = bytes.data();
  if (std::memcmp(p, kDynamicCookie, 8) != 0) {
    return Status::Corrupt("vhd dynamic header has no 'cxsparse' cookie");
  }
  DynamicHeader h;
  h.table_offset = LoadBe64(p + kOffTableOffset);
  h.header_version = LoadBe32(p + kOffHeaderVersion);
  h.max_table_entries = LoadBe32(p + kOffMaxTableEntries);
  h.block_size = LoadBe32(p + kOffBlockSize);
  h.checksum = LoadBe32(p + kOffHeaderChecksum);
  if (h.checksum != Checksum(bytes.first(kDynamicHeaderSize), kOffHeaderChecksum)) {
    return Status::Corrupt("vhd dynamic header checksum does not match");
  }
  if ((h.header_version & kVersionMajorMask) != kVersion1) {
    return Status::NotSupported("vhd dynamic header version " +
                                std::to_string(h.header_version >> 16) + " is not supported (1)");
  }
  if (!IsPowerOfTwo(h.block_size) || h.block_size < kMinBlockSize ||
      h.block_size > kMaxBlockSize) {
    return Status::Corrupt("vhd block size " + std::to_string(h.block_size) +
                           " is not a power of two from 512 B to 256 MiB");
  }
  const uint64_t needed = (footer.current_size + h.block_size - 1) / h.block_size;
  if (h.max_table_entries < needed) {
    return Status::Corrupt("vhd block table has " + std::to_string(h.max_table_entries) +
                           " entries, the disk needs " + std::to_string(needed));
  }
  const uint64_t bat_bytes = uint64_t(h.max_table_entries) * 4;
  if (bat_bytes > kMaxBatBytes) {
    return Status::Corrupt("vhd block table of " + std::to_string(h.max_table_entries) +
                           " entries is larger than 256 MiB");
  }
  if (h.table_offset > file_size || bat_bytes > file_size - h.table_offset) {
    return Status::Corrupt("vhd block table lies past the end of the file");
  }
  return h;
}

void EncodeFooter(const Footer& f, std::span<uint8_t> out) {
  uint8_t* p = out.data();
  std::fill(out.begin(), out.begin() + kFooterSize, 0);
  std::memcpy(p, kFooterCookie, 8);
  StoreBe32(p + kOffFeatures, f.features | kFeaturesReserved);
  StoreBe32(p + kOffFileFormatVersion, f.file_format_version);
  StoreBe64(p + kOffDataOffset, f.data_offset);
  StoreBe32(p + kOffTimestamp, f.timestamp);
  std::memcpy(p + kOffCreatorApplication, f.creator_application, 4);
  StoreBe64(p + kOffOriginalSize, f.original_size);
  StoreBe64(p + kOffCurrentSize, f.current_size);
  StoreBe16(p + kOffCylinders, f.cylinders);
  p[kOffHeads] = f.heads;
  p[kOffSectorsPerTrack] = f.sectors_per_track;
  StoreBe32(p + kOffDiskType, uint32_t(f.disk_type));
  StoreBe32(p + kOffFooterChecksum, Checksum(out.first(kFooterSize), kOffFooterChecksum));
}

void EncodeDynamicHeader(const DynamicHeader& h, std::span<uint8_t> out) {
  uint8_t* p = out.data();
  std::fill(out.begin(), out.begin() + kDynamicHeaderSize, 0);
  std::memcpy(p, kDynamicCookie, 8);
  StoreBe64(p + kOffDataOffsetUnused, ~0ull);
  StoreBe64(p + kOffTableOffset, h.table_offset);
  StoreBe32(p + kOffHeaderVersion, h.header_version);
  StoreBe32(p + kOffMaxTableEntries, h.max_table_entries);
  StoreBe32(p + kOffBlockSize, h.block_size);
  StoreBe32(p + kOffHeaderChecksum,
            Checksum(out.first(kDynamicHeaderSize), kOffHeaderChecksum));
}

}  // namespace thindisk::vhd
