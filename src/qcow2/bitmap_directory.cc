// The bitmaps extension, directory and table entries (bitmap_directory.h).
#include "qcow2/bitmap_directory.h"

#include <fmt/format.h>

#include <set>

#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

// Directory entry layout (spec "Bitmap directory").
constexpr size_t kEntryFixedSize = 24;

uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }
uint64_t DivUp(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

}  // namespace

Result<BitmapsExtension> DecodeBitmapsExtension(std::span<const uint8_t> data,
                                                uint64_t cluster_size, uint64_t file_size) {
  if (data.size() != kBitmapsExtensionSize) {
    return Status::Corrupt(fmt::format("bitmaps extension is {} bytes long, not {}", data.size(),
                                       kBitmapsExtensionSize));
  }
  BitmapsExtension ext;
  ext.nb_bitmaps = LoadBe32(&data[0]);
  const uint32_t reserved = LoadBe32(&data[4]);
  ext.bitmap_directory_size = LoadBe64(&data[8]);
  ext.bitmap_directory_offset = LoadBe64(&data[16]);
  if (reserved != 0) return Status::Corrupt("bitmaps extension: reserved field is not zero");
  if (ext.nb_bitmaps == 0) return Status::Corrupt("bitmaps extension with no bitmaps");
  if (ext.nb_bitmaps > kMaxBitmaps) {
    return Status::Corrupt(
        fmt::format("bitmaps extension: {} bitmaps, more than {}", ext.nb_bitmaps, kMaxBitmaps));
  }
  const uint64_t size = ext.bitmap_directory_size;
  const uint64_t offset = ext.bitmap_directory_offset;
  if (size < kEntryFixedSize * uint64_t{ext.nb_bitmaps} || size > kMaxBitmapDirectorySize) {
    return Status::Corrupt(fmt::format(
        "bitmap directory size {} does not fit {} bitmaps (at least {} bytes, at most {})", size,
        ext.nb_bitmaps, kEntryFixedSize * ext.nb_bitmaps, kMaxBitmapDirectorySize));
  }
  if (offset == 0 || (offset & (cluster_size - 1))) {
    return Status::Corrupt(
        fmt::format("bitmap directory offset {:#x} is not a cluster boundary past the header",
                    offset));
  }
  if (offset > file_size || size > file_size - offset) {
    return Status::Corrupt(fmt::format(
        "bitmap directory at {:#x} ({} bytes) lies past the end of the file ({} bytes)", offset,
        size, file_size));
  }
  return ext;
}

std::vector<uint8_t> EncodeBitmapsExtension(const BitmapsExtension& ext) {
  std::vector<uint8_t> out(kBitmapsExtensionSize, 0);
  StoreBe32(&out[0], ext.nb_bitmaps);
  StoreBe64(&out[8], ext.bitmap_directory_size);
  StoreBe64(&out[16], ext.bitmap_directory_offset);
  return out;
}

Result<std::vector<BitmapDirectoryEntry>> DecodeBitmapDirectory(std::span<const uint8_t> bytes,
                                                                uint32_t nb_bitmaps) {
  if (nb_bitmaps > kMaxBitmaps || bytes.size() > kMaxBitmapDirectorySize) {
    return Status::Corrupt("bitmap directory exceeds the limits");
  }
  std::vector<BitmapDirectoryEntry> entries;
  entries.reserve(nb_bitmaps);
  std::set<std::string> names;
  uint64_t pos = 0;
  for (uint32_t i = 0; i < nb_bitmaps; ++i) {
    if (bytes.size() - pos < kEntryFixedSize) {
      return Status::Corrupt(fmt::format("bitmap directory ends inside entry {}", i));
    }
    const uint8_t* p = &bytes[pos];
    BitmapDirectoryEntry e;
    e.bitmap_table_offset = LoadBe64(p);
    e.bitmap_table_size = LoadBe32(p + 8);
    e.flags = LoadBe32(p + 12);
    e.type = p[16];
    e.granularity_bits = p[17];
    const uint32_t name_size = LoadBe16(p + 18);
    const uint32_t extra_size = LoadBe32(p + 20);
    if (name_size == 0 || name_size > kMaxBitmapNameSize) {
      return Status::Corrupt(fmt::format("bitmap directory entry {}: name size {} (1 to {})", i,
                                         name_size, kMaxBitmapNameSize));
    }
    // Both sizes are bounded (16 bits; the rest of the directory) before
    // they are added or used.
    const uint64_t room = bytes.size() - pos - kEntryFixedSize;
    if (extra_size > room || name_size > room - extra_size) {
      return Status::Corrupt(
          fmt::format("bitmap directory entry {} runs past the end of the directory", i));
    }
    const uint64_t len = kEntryFixedSize + uint64_t{extra_size} + name_size;
    // Every entry, the last one too, is padded to 8 bytes (qemu refuses a
    // directory cut inside the padding).
    const uint64_t padded = Align8(len);
    if (padded > bytes.size() - pos) {
      return Status::Corrupt(
          fmt::format("bitmap directory entry {} lacks its padding at the directory's end", i));
    }
    const uint8_t* extra = p + kEntryFixedSize;
    e.extra_data.assign(extra, extra + extra_size);
    e.name.assign(reinterpret_cast<const char*>(extra + extra_size), name_size);
    for (uint64_t k = len; k < padded; ++k) {
      if (p[k] != 0) {
        return Status::Corrupt(fmt::format("bitmap directory entry {} ('{}'): padding is not zero",
                                           i, e.name));
      }
    }
    if (!names.insert(e.name).second) {
      return Status::Corrupt(fmt::format("bitmap directory: two bitmaps named '{}'", e.name));
    }
    pos += padded;
    entries.push_back(std::move(e));
  }
  if (pos != bytes.size()) {
    return Status::Corrupt(fmt::format(
        "bitmap directory holds {} bytes after its {} entries", bytes.size() - pos, nb_bitmaps));
  }
  return entries;
}

std::vector<uint8_t> EncodeBitmapDirectory(const std::vector<BitmapDirectoryEntry>& entries) {
  std::vector<uint8_t> out;
  for (const BitmapDirectoryEntry& e : entries) {
    const size_t pos = out.size();
    const uint64_t len = kEntryFixedSize + e.extra_data.size() + e.name.size();
    out.resize(pos + Align8(len), 0);
    uint8_t* p = &out[pos];
    StoreBe64(p, e.bitmap_table_offset);
    StoreBe32(p + 8, e.bitmap_table_size);
    StoreBe32(p + 12, e.flags);
    p[16] = e.type;
    p[17] = e.granularity_bits;
    StoreBe16(p + 18, uint16_t(e.name.size()));
    StoreBe32(p + 20, uint32_t(e.extra_data.size()));
    std::copy(e.extra_data.begin(), e.extra_data.end(), p + kEntryFixedSize);
    std::copy(e.name.begin(), e.name.end(), p + kEntryFixedSize + e.extra_data.size());
  }
  return out;
}

uint64_t BitmapBits(uint64_t virtual_size, uint32_t granularity_bits) {
  return DivUp(virtual_size, uint64_t{1} << granularity_bits);
}

uint64_t BitmapDataBytes(uint64_t virtual_size, uint32_t granularity_bits) {
  return DivUp(BitmapBits(virtual_size, granularity_bits), 8);
}

uint64_t BitmapTableEntries(uint64_t virtual_size, uint32_t granularity_bits,
                            uint64_t cluster_size) {
  return DivUp(BitmapDataBytes(virtual_size, granularity_bits), cluster_size);
}

Status CheckBitmapGeometry(uint64_t virtual_size, uint32_t granularity_bits,
                           uint64_t cluster_size) {
  if (granularity_bits < kMinBitmapGranularityBits ||
      granularity_bits > kMaxBitmapGranularityBits) {
    return Status::InvalidArgument(
        fmt::format("bitmap granularity must be a power of two from {} to {} bytes",
                    uint64_t{1} << kMinBitmapGranularityBits,
                    uint64_t{1} << kMaxBitmapGranularityBits));
  }
  const uint64_t bytes = BitmapDataBytes(virtual_size, granularity_bits);
  if (bytes > kMaxBitmapDataBytes ||
      BitmapTableEntries(virtual_size, granularity_bits, cluster_size) > kMaxBitmapTableEntries) {
    return Status::InvalidArgument(fmt::format(
        "a bitmap of granularity {} over {} bytes would need {} bytes of bitmap data; the limit "
        "is {} (choose a larger granularity)",
        uint64_t{1} << granularity_bits, virtual_size, bytes, kMaxBitmapDataBytes));
  }
  return Status::Ok();
}

std::string CheckBitmapEntry(const BitmapDirectoryEntry& e, uint64_t virtual_size,
                             uint64_t cluster_size, uint64_t file_size) {
  if (e.flags & ~kBitmapKnownFlags) return fmt::format("reserved flags set ({:#x})", e.flags);
  if (e.type != kBitmapTypeDirtyTracking) return fmt::format("unknown type {}", e.type);
  if (!e.extra_data.empty() && !(e.flags & kBitmapExtraDataCompatible)) {
    return "extra data not marked compatible";
  }
  if (e.granularity_bits < kMinBitmapGranularityBits ||
      e.granularity_bits > kMaxBitmapGranularityBits) {
    return fmt::format("granularity 2^{} is outside 2^{}..2^{}", e.granularity_bits,
                       kMinBitmapGranularityBits, kMaxBitmapGranularityBits);
  }
  if (BitmapDataBytes(virtual_size, e.granularity_bits) > kMaxBitmapDataBytes) {
    return "too big to load";
  }
  const uint64_t want = BitmapTableEntries(virtual_size, e.granularity_bits, cluster_size);
  if (e.bitmap_table_size != want) {
    return fmt::format("its table has {} entries; the disk size needs {}", e.bitmap_table_size,
                       want);
  }
  const uint64_t offset = e.bitmap_table_offset;
  const uint64_t bytes = uint64_t{e.bitmap_table_size} * 8;
  if (offset == 0 || (offset & (cluster_size - 1)) || offset > file_size ||
      bytes > file_size - offset) {
    return fmt::format("its table at {:#x} ({} bytes) is unaligned or outside the file", offset,
                       bytes);
  }
  return "";
}

Result<BitmapTableEntry> DecodeBitmapTableEntry(uint64_t raw, uint64_t cluster_size,
                                                uint64_t file_size) {
  if (raw & kBitmapTableReserved) {
    return Status::Corrupt(fmt::format("bitmap table entry {:#x} has reserved bits set", raw));
  }
  BitmapTableEntry e;
  e.host_offset = raw & kBitmapTableOffsetMask;
  e.all_ones = raw & kBitmapTableAllOnes;
  if (e.host_offset == 0) return e;
  if (e.all_ones) {
    return Status::Corrupt(
        fmt::format("bitmap table entry {:#x} has both an offset and the all-ones bit", raw));
  }
  // A last cluster may be cut short by the file's end (reads past it are
  // zeros), as for L2 tables.
  if ((e.host_offset & (cluster_size - 1)) || e.host_offset < cluster_size ||
      e.host_offset >= file_size) {
    return Status::Corrupt(fmt::format(
        "bitmap table entry {:#x} names a data cluster that is unaligned or outside the file",
        raw));
  }
  return e;
}

uint64_t EncodeBitmapTableEntry(const BitmapTableEntry& e) {
  if (e.host_offset != 0) return e.host_offset & kBitmapTableOffsetMask;
  return e.all_ones ? kBitmapTableAllOnes : 0;
}

}  // namespace thindisk::qcow2
