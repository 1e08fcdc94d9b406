#include "vmdk/format.h"

#include <algorithm>
#include <string>

namespace thindisk::vmdk {

namespace {

// Byte offsets of the header fields (the spec's SparseExtentHeader, packed).
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 4;
constexpr size_t kOffFlags = 8;
constexpr size_t kOffCapacity = 12;
constexpr size_t kOffGrainSize = 20;
constexpr size_t kOffDescriptorOffset = 28;
constexpr size_t kOffDescriptorSize = 36;
constexpr size_t kOffNumGtesPerGt = 44;
constexpr size_t kOffRgdOffset = 48;
constexpr size_t kOffGdOffset = 56;
constexpr size_t kOffOverHead = 64;
constexpr size_t kOffUncleanShutdown = 72;
constexpr size_t kOffNewlineChars = 73;  // '\n', ' ', '\r', '\n'
constexpr size_t kOffCompressAlgorithm = 77;

constexpr uint8_t kNewlineChars[4] = {'\n', ' ', '\r', '\n'};

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// True when [sector * 512, sector * 512 + bytes) lies inside the file.
bool InsideFile(uint64_t sector, uint64_t bytes, uint64_t file_size) {
  if (sector > file_size / kSectorSize) return false;
  uint64_t start = sector * kSectorSize;
  return bytes <= file_size - start;
}

}  // namespace

Result<SparseHeader> DecodeSparseHeader(std::span<const uint8_t> bytes, uint64_t file_size) {
  if (bytes.size() < kHeaderSize || file_size < kHeaderSize) {
    return Status::Corrupt("vmdk sparse header is truncated");
  }
  const uint8_t* p = bytes.data();
  if (LoadLe32(p + kOffMagic) != kSparseMagic) {
    return Status::Corrupt("not a vmdk sparse extent (bad magic)");
  }
  SparseHeader h;
  h.version = LoadLe32(p + kOffVersion);
  h.flags = LoadLe32(p + kOffFlags);
  h.capacity = LoadLe64(p + kOffCapacity);
  h.grain_size = LoadLe64(p + kOffGrainSize);
  h.descriptor_offset = LoadLe64(p + kOffDescriptorOffset);
  h.descriptor_size = LoadLe64(p + kOffDescriptorSize);
  h.num_gtes_per_gt = LoadLe32(p + kOffNumGtesPerGt);
  h.rgd_offset = LoadLe64(p + kOffRgdOffset);
  h.gd_offset = LoadLe64(p + kOffGdOffset);
  h.over_head = LoadLe64(p + kOffOverHead);
  h.unclean_shutdown = p[kOffUncleanShutdown] != 0;
  h.compress_algorithm = uint16_t(p[kOffCompressAlgorithm] | p[kOffCompressAlgorithm + 1] << 8);

  if (h.version == 0 || h.version > kMaxVersion) {
    return Status::NotSupported("vmdk sparse extent version " + std::to_string(h.version) +
                                " is not supported (1.." + std::to_string(kMaxVersion) + ")");
  }
  if (h.flags & kFlagNewlineTest) {
    for (size_t i = 0; i < 4; ++i) {
      if (p[kOffNewlineChars + i] != kNewlineChars[i]) {
        return Status::Corrupt(
            "vmdk newline detection bytes are damaged (was the file copied in text mode?)");
      }
    }
  }
  if (!IsPowerOfTwo(h.grain_size) || h.grain_size > kMaxGrainSectors) {
    return Status::Corrupt("vmdk grain size of " + std::to_string(h.grain_size) +
                           " sectors is not a power of two up to " +
                           std::to_string(kMaxGrainSectors));
  }
  if (h.capacity > kMaxCapacitySectors) {
    return Status::Corrupt("vmdk capacity of " + std::to_string(h.capacity) +
                           " sectors is larger than 64 TiB");
  }
  if (h.num_gtes_per_gt == 0 || h.num_gtes_per_gt > kMaxGtesPerGt) {
    return Status::Corrupt("vmdk grain table size of " + std::to_string(h.num_gtes_per_gt) +
                           " entries is outside 1.." + std::to_string(kMaxGtesPerGt));
  }
  // qemu decides compression by the algorithm field alone; the spec also
  // sets flag bit 16. Either one means compressed grains.
  if (h.compress_algorithm == kCompressionDeflate) h.flags |= kFlagCompressed;
  if (h.compress_algorithm > kCompressionDeflate ||
      (h.compressed() && h.compress_algorithm != kCompressionDeflate)) {
    return Status::NotSupported("vmdk compression algorithm " +
                                std::to_string(h.compress_algorithm) +
                                " is not supported (only deflate)");
  }
  if (h.descriptor_offset != 0) {
    if (h.descriptor_size > kMaxDescriptorBytes / kSectorSize) {
      return Status::Corrupt("vmdk embedded descriptor of " + std::to_string(h.descriptor_size) +
                             " sectors is larger than 1 MiB");
    }
    if (!InsideFile(h.descriptor_offset, h.descriptor_size * kSectorSize, file_size)) {
      return Status::Corrupt("vmdk embedded descriptor lies past the end of the file");
    }
  }
  if (h.gd_offset != kGdAtEnd && !InsideFile(h.gd_offset, h.gd_entries() * 4, file_size)) {
    return Status::Corrupt("vmdk grain directory (" + std::to_string(h.gd_entries()) +
                           " entries at sector " + std::to_string(h.gd_offset) +
                           ") lies past the end of the file");
  }
  if (h.gd_offset == 0 && h.gd_entries() > 0) {
    return Status::Corrupt("vmdk grain directory overlaps the header (sector 0)");
  }
  return h;
}

void EncodeSparseHeader(const SparseHeader& h, std::span<uint8_t> out) {
  uint8_t* p = out.data();
  std::fill(out.begin(), out.begin() + kHeaderSize, 0);
  StoreLe32(p + kOffMagic, kSparseMagic);
  StoreLe32(p + kOffVersion, h.version);
  StoreLe32(p + kOffFlags, h.flags);
  StoreLe64(p + kOffCapacity, h.capacity);
  StoreLe64(p + kOffGrainSize, h.grain_size);
  StoreLe64(p + kOffDescriptorOffset, h.descriptor_offset);
  StoreLe64(p + kOffDescriptorSize, h.descriptor_size);
  StoreLe32(p + kOffNumGtesPerGt, h.num_gtes_per_gt);
  StoreLe64(p + kOffRgdOffset, h.rgd_offset);
  StoreLe64(p + kOffGdOffset, h.gd_offset);
  StoreLe64(p + kOffOverHead, h.over_head);
  p[kOffUncleanShutdown] = h.unclean_shutdown ? 1 : 0;
  for (size_t i = 0; i < 4; ++i) p[kOffNewlineChars + i] = kNewlineChars[i];
  p[kOffCompressAlgorithm] = uint8_t(h.compress_algorithm);
  p[kOffCompressAlgorithm + 1] = uint8_t(h.compress_algorithm >> 8);
}

Marker DecodeMarker(std::span<const uint8_t> bytes) {
  Marker m;
  m.value = LoadLe64(bytes.data());
  m.size = LoadLe32(bytes.data() + 8);
  m.type = LoadLe32(bytes.data() + 12);
  return m;
}

}  // namespace thindisk::vmdk
