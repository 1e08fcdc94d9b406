#include "vmdk/sparse_extent.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

namespace thindisk::vmdk {

namespace {

// True when [sector * 512, sector * 512 + bytes) lies inside the file.
bool InsideFile(uint64_t sector, uint64_t bytes, uint64_t file_size) {
  if (sector > file_size / kSectorSize) return false;
  return bytes <= file_size - sector * kSectorSize;
}

// Inflates one zlib stream (RFC 1950, what the spec's "deflate" grains
// hold) into `out`; a stream shorter than `out` leaves zeros after it.
Status InflateGrain(std::span<const uint8_t> in, std::span<uint8_t> out) {
  z_stream z{};
  if (inflateInit(&z) != Z_OK) return Status::Internal("inflateInit failed");
  z.next_in = const_cast<Bytef*>(in.data());
  z.avail_in = uInt(in.size());
  z.next_out = out.data();
  z.avail_out = uInt(out.size());
  int rc = inflate(&z, Z_FINISH);
  size_t produced = out.size() - z.avail_out;
  inflateEnd(&z);
  if (rc == Z_STREAM_END) {
    std::fill(out.begin() + produced, out.end(), 0);
    return Status::Ok();
  }
  if (rc == Z_BUF_ERROR && z.avail_out == 0) {
    return Status::Corrupt("vmdk compressed grain inflates to more than one grain");
  }
  return Status::Corrupt("vmdk compressed grain is not a valid zlib stream");
}

// Stream-optimized images may put the grain directory after the grains and
// give its place only in the footer: footer marker, footer (a header copy),
// end-of-stream marker, one sector each, at the end of the file.
Result<SparseHeader> ReadFooter(io::Storage& storage, const SparseHeader& h, uint64_t file_size) {
  if (file_size < 4 * kSectorSize) {
    return Status::Corrupt("vmdk grain directory is at the end, but the file has no footer");
  }
  std::array<uint8_t, 3 * kSectorSize> tail{};
  TD_RETURN_IF_ERROR(storage.ReadAt(file_size - tail.size(), tail));
  Marker footer_marker = DecodeMarker(std::span(tail).subspan(0, 16));
  Marker eos = DecodeMarker(std::span(tail).subspan(2 * kSectorSize, 16));
  if (footer_marker.size != 0 || footer_marker.type != kMarkerFooter || eos.size != 0 ||
      eos.type != kMarkerEndOfStream) {
    return Status::Corrupt("vmdk footer or end-of-stream marker is missing");
  }
  TD_ASSIGN_OR_RETURN(SparseHeader f,
                      DecodeSparseHeader(std::span(tail).subspan(kSectorSize, kSectorSize),
                                         file_size));
  if (f.gd_offset == kGdAtEnd) return Status::Corrupt("vmdk footer has no grain directory");
  if (f.capacity != h.capacity || f.grain_size != h.grain_size ||
      f.num_gtes_per_gt != h.num_gtes_per_gt || f.compressed() != h.compressed()) {
    return Status::Corrupt("vmdk footer disagrees with the header");
  }
  return f;
}

}  // namespace

Result<std::unique_ptr<SparseExtent>> SparseExtent::Open(io::Storage& storage,
                                                          SparseHeader header) {
  TD_ASSIGN_OR_RETURN(uint64_t file_size, storage.Size());
  if (header.gd_offset == kGdAtEnd) {
    TD_ASSIGN_OR_RETURN(header, ReadFooter(storage, header, file_size));
  }
  // DecodeSparseHeader checked the directory lies inside the file, so its
  // size is bounded by the file's.
  const uint64_t entries = header.gd_entries();
  std::vector<uint8_t> bytes(entries * 4);
  TD_RETURN_IF_ERROR(storage.ReadAt(header.gd_offset * kSectorSize, bytes));
  std::vector<uint32_t> gd(entries);
  for (uint64_t i = 0; i < entries; ++i) gd[i] = LoadLe32(bytes.data() + 4 * i);
  return std::unique_ptr<SparseExtent>(new SparseExtent(storage, header, file_size, std::move(gd)));
}

Result<std::shared_ptr<const std::vector<uint32_t>>> SparseExtent::LoadTable(uint64_t gt_index) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tables_.find(gt_index);
    if (it != tables_.end()) return it->second;
  }
  const uint32_t sector = gd_[gt_index];
  const uint64_t bytes_per_table = uint64_t(h_.num_gtes_per_gt) * 4;
  if (!InsideFile(sector, bytes_per_table, file_size_)) {
    return Status::Corrupt("vmdk grain table " + std::to_string(gt_index) + " at sector " +
                           std::to_string(sector) + " lies past the end of the file");
  }
  std::vector<uint8_t> bytes(bytes_per_table);
  TD_RETURN_IF_ERROR(storage_.ReadAt(uint64_t(sector) * kSectorSize, bytes));
  auto table = std::make_shared<std::vector<uint32_t>>(h_.num_gtes_per_gt);
  for (uint32_t i = 0; i < h_.num_gtes_per_gt; ++i) (*table)[i] = LoadLe32(bytes.data() + 4 * i);
  std::lock_guard<std::mutex> lock(mu_);
  // Dropping everything when full is crude but bounded; reads are mostly
  // sequential (convert), so the working set is one table.
  if ((tables_.size() + 1) * bytes_per_table > kGtCacheBytes) tables_.clear();
  tables_[gt_index] = table;
  return std::shared_ptr<const std::vector<uint32_t>>(table);
}

Result<SparseExtent::Grain> SparseExtent::Lookup(uint64_t grain_index) {
  const uint64_t gt_index = grain_index / h_.num_gtes_per_gt;
  Grain g;
  if (gt_index >= gd_.size() || gd_[gt_index] == 0) {
    g.table_missing = true;
    return g;
  }
  TD_ASSIGN_OR_RETURN(auto table, LoadTable(gt_index));
  const uint32_t gte = (*table)[grain_index % h_.num_gtes_per_gt];
  if (gte == kGteUnallocated) return g;
  if (gte == kGteZeroed) {
    g.kind = Kind::kZero;
    return g;
  }
  g.sector = gte;
  if (h_.compressed()) {
    g.kind = Kind::kCompressed;
    if (!InsideFile(gte, kGrainMarkerSize, file_size_)) {
      return Status::Corrupt("vmdk grain " + std::to_string(grain_index) + " at sector " +
                             std::to_string(gte) + " lies past the end of the file");
    }
    return g;
  }
  g.kind = Kind::kData;
  // The last grain may extend past the capacity; only its used part must
  // be in the file.
  uint64_t guest_start = grain_index * h_.grain_bytes();
  uint64_t needed = std::min(h_.grain_bytes(), h_.capacity_bytes() - guest_start);
  if (!InsideFile(gte, needed, file_size_)) {
    return Status::Corrupt("vmdk grain " + std::to_string(grain_index) + " at sector " +
                           std::to_string(gte) + " lies past the end of the file");
  }
  return g;
}

Status SparseExtent::ReadCompressed(uint64_t grain_index, uint64_t sector,
                                    std::vector<uint8_t>& out) {
  const uint64_t max_data = MaxCompressedGrainBytes(h_.grain_bytes());
  uint64_t data_offset = sector * kSectorSize;
  uint64_t data_size = 0;
  if (h_.flags & kFlagMarkers) {
    std::array<uint8_t, kGrainMarkerSize> marker{};
    TD_RETURN_IF_ERROR(storage_.ReadAt(data_offset, marker));
    uint64_t lba = LoadLe64(marker.data());
    data_size = LoadLe32(marker.data() + 8);
    if (data_size == 0 || data_size > max_data) {
      return Status::Corrupt("vmdk grain " + std::to_string(grain_index) +
                             " has a bad compressed size " + std::to_string(data_size));
    }
    if (lba != grain_index * h_.grain_size) {
      return Status::Corrupt("vmdk grain " + std::to_string(grain_index) +
                             " is filed under the wrong place (marker lba " +
                             std::to_string(lba) + ")");
    }
    data_offset += kGrainMarkerSize;
    if (data_size > file_size_ - data_offset) {
      return Status::Corrupt("vmdk compressed grain " + std::to_string(grain_index) +
                             " runs past the end of the file");
    }
  } else {
    // Without markers the stream's length is not recorded: read what can
    // hold one and let inflate find its end.
    data_size = std::min(max_data, file_size_ - data_offset);
  }
  std::vector<uint8_t> compressed(data_size);
  TD_RETURN_IF_ERROR(storage_.ReadAt(data_offset, compressed));
  out.resize(h_.grain_bytes());
  Status s = InflateGrain(compressed, out);
  if (!s.ok()) return s.WithContext("grain " + std::to_string(grain_index));
  return Status::Ok();
}

Status SparseExtent::Read(uint64_t offset, std::span<uint8_t> buf) {
  const uint64_t grain_bytes = h_.grain_bytes();
  std::vector<uint8_t> grain_buf;
  while (!buf.empty()) {
    const uint64_t index = offset / grain_bytes;
    const uint64_t in_grain = offset % grain_bytes;
    const size_t n = size_t(std::min<uint64_t>(buf.size(), grain_bytes - in_grain));
    TD_ASSIGN_OR_RETURN(Grain g, Lookup(index));
    std::span<uint8_t> piece = buf.first(n);
    switch (g.kind) {
      case Kind::kUnallocated:
      case Kind::kZero:
        std::fill(piece.begin(), piece.end(), 0);
        break;
      case Kind::kData:
        TD_RETURN_IF_ERROR(storage_.ReadAt(g.sector * kSectorSize + in_grain, piece));
        break;
      case Kind::kCompressed:
        TD_RETURN_IF_ERROR(ReadCompressed(index, g.sector, grain_buf));
        std::memcpy(piece.data(), grain_buf.data() + in_grain, n);
        break;
    }
    offset += n;
    buf = buf.subspan(n);
  }
  return Status::Ok();
}

Result<block::Extent> SparseExtent::GetStatus(uint64_t offset, uint64_t end) {
  const uint64_t grain_bytes = h_.grain_bytes();
  const uint64_t table_bytes = h_.gt_coverage_bytes();
  TD_ASSIGN_OR_RETURN(Grain first, Lookup(offset / grain_bytes));
  block::Extent e;
  e.offset = offset;
  e.present = first.kind != Kind::kUnallocated;
  e.data = first.kind == Kind::kData || first.kind == Kind::kCompressed;
  e.zero = !e.data;
  if (first.kind == Kind::kData) {
    e.has_host_offset = true;
    e.host_offset = first.sector * kSectorSize + offset % grain_bytes;
  }
  // Extend over following grains of the same kind (and, for plain data,
  // contiguous on the host), skipping whole missing tables at once.
  Grain g = first;
  uint64_t pos = offset;
  uint64_t host_next = e.host_offset;
  while (true) {
    uint64_t step_end = g.table_missing ? (pos / table_bytes + 1) * table_bytes
                                        : (pos / grain_bytes + 1) * grain_bytes;
    host_next += step_end - pos;
    pos = std::min(step_end, end);
    if (pos >= end) break;
    TD_ASSIGN_OR_RETURN(g, Lookup(pos / grain_bytes));
    if (g.kind != first.kind) break;
    if (g.kind == Kind::kData && g.sector * kSectorSize != host_next) break;
  }
  e.length = pos - offset;
  return e;
}

}  // namespace thindisk::vmdk
