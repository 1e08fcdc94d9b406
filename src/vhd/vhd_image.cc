#include "vhd/vhd_image.h"

#include <algorithm>
#include <array>
#include <string>
#include <utility>

#include "util/endian.h"

namespace thindisk::vhd {

namespace {

// Bit `sector` of a VHD sector bitmap: most significant bit first.
bool BitSet(const std::vector<uint8_t>& bitmap, uint64_t sector) {
  return (bitmap[sector / 8] >> (7 - sector % 8)) & 1;
}

// The footer to use: the one at the end of the file, or for a dynamic disk
// whose end footer is damaged, the copy in the first sector.
Result<Footer> ReadFooter(io::Storage& storage, uint64_t file_size) {
  if (file_size < kFooterSize) return Status::Corrupt("vhd file is shorter than its footer");
  std::array<uint8_t, kFooterSize> tail{};
  TD_RETURN_IF_ERROR(storage.ReadAt(file_size - kFooterSize, tail));
  Result<Footer> end = DecodeFooter(tail);
  if (end.has_value()) return end;
  std::array<uint8_t, kFooterSize> head{};
  TD_RETURN_IF_ERROR(storage.ReadAt(0, head));
  if (!HasFooterCookie(head)) return end.error();
  Result<Footer> copy = DecodeFooter(head);
  if (copy.has_value() && copy->disk_type == DiskType::kDynamic) return copy;
  return end.error();
}

struct Dynamic {
  DynamicHeader header;
  std::vector<uint32_t> bat;
};

// Reads the dynamic header and the BAT entries the disk uses; every
// allocated block (bitmap and data) must lie inside the file.
Result<Dynamic> ReadDynamic(io::Storage& storage, const Footer& footer, uint64_t file_size) {
  if (footer.data_offset > file_size || kDynamicHeaderSize > file_size - footer.data_offset) {
    return Status::Corrupt("vhd dynamic header lies past the end of the file");
  }
  std::array<uint8_t, kDynamicHeaderSize> bytes{};
  TD_RETURN_IF_ERROR(storage.ReadAt(footer.data_offset, bytes));
  Dynamic d;
  TD_ASSIGN_OR_RETURN(d.header, DecodeDynamicHeader(bytes, footer, file_size));
  const DynamicHeader& h = d.header;
  // DecodeDynamicHeader bounded the table by the file and kMaxBatBytes.
  const uint64_t entries = (footer.current_size + h.block_size - 1) / h.block_size;
  std::vector<uint8_t> raw(entries * 4);
  TD_RETURN_IF_ERROR(storage.ReadAt(h.table_offset, raw));
  d.bat.resize(entries);
  const uint64_t block_bytes = h.bitmap_bytes() + h.block_size;
  for (uint64_t i = 0; i < entries; ++i) {
    uint32_t sector = LoadBe32(raw.data() + 4 * i);
    d.bat[i] = sector;
    if (sector == kBatUnused) continue;
    uint64_t start = uint64_t(sector) * kSectorSize;
    if (start > file_size || block_bytes > file_size - start) {
      return Status::Corrupt("vhd block " + std::to_string(i) + " at sector " +
                             std::to_string(sector) + " lies past the end of the file");
    }
  }
  return d;
}

}  // namespace

Result<std::unique_ptr<VhdImage>> VhdImage::Open(std::unique_ptr<io::Storage> storage,
                                                 const std::string& filename) {
  if (!storage) return Status::InvalidArgument("VhdImage::Open: null storage");
  auto opened = [&]() -> Result<std::pair<Footer, Dynamic>> {
    TD_ASSIGN_OR_RETURN(uint64_t file_size, storage->Size());
    TD_ASSIGN_OR_RETURN(Footer footer, ReadFooter(*storage, file_size));
    Dynamic dynamic;
    if (footer.disk_type == DiskType::kFixed) {
      if (footer.current_size > file_size - kFooterSize) {
        return Status::Corrupt("fixed vhd says " + std::to_string(footer.current_size) +
                               " bytes but the file holds " +
                               std::to_string(file_size - kFooterSize));
      }
    } else {
      TD_ASSIGN_OR_RETURN(dynamic, ReadDynamic(*storage, footer, file_size));
    }
    return std::make_pair(footer, std::move(dynamic));
  }();
  if (!opened.has_value()) return opened.error().WithContext(filename);
  auto [footer, dynamic] = std::move(opened).value();

  block::DeviceInfo info;
  info.format = "vpc";
  info.filename = filename;
  info.cluster_size = footer.disk_type == DiskType::kDynamic ? dynamic.header.block_size : 0;
  info.preferred_block = 4096;
  std::unique_ptr<VhdImage> image(new VhdImage(std::move(info), footer.current_size));
  image->storage_ = std::move(storage);
  image->footer_ = footer;
  image->dynamic_ = dynamic.header;
  image->bat_ = std::move(dynamic.bat);
  return image;
}

bool VhdImage::BlockStart(uint64_t index, uint64_t* start) const {
  uint32_t sector = bat_[index];
  if (sector == kBatUnused) return false;
  *start = uint64_t(sector) * kSectorSize;
  return true;
}

Result<std::vector<uint8_t>> VhdImage::ReadBitmap(uint64_t start) {
  std::vector<uint8_t> bitmap(dynamic_.bitmap_bytes());
  TD_RETURN_IF_ERROR(storage_->ReadAt(start, bitmap));
  return bitmap;
}

Status VhdImage::ReadFromBlock(uint64_t start, uint64_t in_block, std::span<uint8_t> out) {
  TD_ASSIGN_OR_RETURN(std::vector<uint8_t> bitmap, ReadBitmap(start));
  const uint64_t data = start + dynamic_.bitmap_bytes();
  // Runs of sectors with the same bit: stored data, or zeros.
  while (!out.empty()) {
    uint64_t sector = in_block / kSectorSize;
    bool set = BitSet(bitmap, sector);
    uint64_t run_end = (sector + 1) * kSectorSize;
    while (run_end < in_block + out.size() && BitSet(bitmap, run_end / kSectorSize) == set) {
      run_end += kSectorSize;
    }
    size_t n = size_t(std::min<uint64_t>(run_end - in_block, out.size()));
    std::span<uint8_t> piece = out.first(n);
    if (set) {
      TD_RETURN_IF_ERROR(storage_->ReadAt(data + in_block, piece));
    } else {
      std::fill(piece.begin(), piece.end(), 0);
    }
    in_block += n;
    out = out.subspan(n);
  }
  return Status::Ok();
}

Status VhdImage::Read(uint64_t offset, std::span<uint8_t> buf) {
  TD_RETURN_IF_ERROR(CheckRead(offset, buf.size()));
  if (footer_.disk_type == DiskType::kFixed) return storage_->ReadAt(offset, buf);
  const uint64_t block_size = dynamic_.block_size;
  while (!buf.empty()) {
    uint64_t index = offset / block_size;
    uint64_t in_block = offset % block_size;
    size_t n = size_t(std::min<uint64_t>(buf.size(), block_size - in_block));
    std::span<uint8_t> piece = buf.first(n);
    uint64_t start = 0;
    if (BlockStart(index, &start)) {
      TD_RETURN_IF_ERROR(ReadFromBlock(start, in_block, piece));
    } else {
      std::fill(piece.begin(), piece.end(), 0);
    }
    offset += n;
    buf = buf.subspan(n);
  }
  return Status::Ok();
}

Result<block::Extent> VhdImage::GetStatus(uint64_t offset, uint64_t max_length) {
  TD_ASSIGN_OR_RETURN(uint64_t end, StatusEnd(offset, max_length));
  if (footer_.disk_type == DiskType::kFixed) {
    return block::PlainStatus(*storage_, offset, offset, end - offset);
  }
  const uint64_t block_size = dynamic_.block_size;
  block::Extent e;
  e.offset = offset;
  uint64_t index = offset / block_size;
  uint64_t start = 0;
  if (!BlockStart(index, &start)) {
    // A hole: extend over every following unallocated block.
    uint64_t pos = (index + 1) * block_size;
    while (pos < end && !BlockStart(pos / block_size, &start)) pos += block_size;
    e.length = std::min(pos, end) - offset;
    e.zero = true;
    return e;
  }
  TD_ASSIGN_OR_RETURN(std::vector<uint8_t> bitmap, ReadBitmap(start));
  const uint64_t block_end = std::min(end, (index + 1) * block_size);
  const uint64_t in_block = offset % block_size;
  bool set = BitSet(bitmap, in_block / kSectorSize);
  uint64_t pos = offset - in_block + (in_block / kSectorSize + 1) * kSectorSize;
  while (pos < block_end && BitSet(bitmap, (pos % block_size) / kSectorSize) == set) {
    pos += kSectorSize;
  }
  e.length = std::min(pos, block_end) - offset;
  e.present = set;
  e.data = set;
  e.zero = !set;
  if (set) {
    e.has_host_offset = true;
    e.host_offset = start + dynamic_.bitmap_bytes() + in_block;
  }
  return e;
}

Result<bool> Probe(io::Storage& storage) {
  TD_ASSIGN_OR_RETURN(uint64_t file_size, storage.Size());
  if (file_size < kFooterSize) return false;
  std::array<uint8_t, kFooterSize> sector{};
  TD_RETURN_IF_ERROR(storage.ReadAt(0, sector));
  return HasFooterCookie(sector);
}

}  // namespace thindisk::vhd
