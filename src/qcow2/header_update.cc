// Ordered, crash-safe header rewrites (see header_update.h for the steps).
#include "qcow2/header_update.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

// Writes of one sector are atomic: a torn write keeps a prefix of whole
// sectors (io::FaultyStorage::kTearGrain models the same).
constexpr uint64_t kSector = 512;
// The header cluster is at most 2 MiB (kMaxClusterBits).
constexpr uint64_t kMaxHeadBytes = 1ull << kMaxClusterBits;
// Offsets inside the header of the backing name's place and length.
constexpr size_t kBackingOffsetField = 8;
constexpr size_t kBackingSizeField = 16;

uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

struct Interval {
  uint64_t lo;
  uint64_t hi;  // exclusive
};

bool Overlaps(const Interval& a, const Interval& b) { return a.lo < b.hi && b.lo < a.hi; }

// The lowest 8-aligned place >= `lo` for `n` bytes inside [0, limit) that
// overlaps none of `used`; 0 when there is none.
uint64_t FindGap(uint64_t lo, uint64_t n, uint64_t limit, const std::vector<Interval>& used) {
  std::vector<uint64_t> candidates = {Align8(lo)};
  for (const Interval& u : used) candidates.push_back(Align8(std::max(u.hi, lo)));
  std::sort(candidates.begin(), candidates.end());
  for (uint64_t c : candidates) {
    if (c + n > limit) continue;
    Interval want{c, c + n};
    bool free = std::none_of(used.begin(), used.end(),
                             [&](const Interval& u) { return Overlaps(u, want); });
    if (free) return c;
  }
  return 0;
}

// The header and extension area of `h` without the backing name (its
// offset and size fields left 0 for the caller to place).
Result<std::vector<uint8_t>> EncodeArea(const Header& h) {
  Header copy = h;
  copy.backing_file.clear();
  return EncodeHeader(copy);
}

void PlaceName(std::vector<uint8_t>& area, uint64_t offset, uint64_t size) {
  StoreBe64(&area[kBackingOffsetField], size ? offset : 0);
  StoreBe32(&area[kBackingSizeField], uint32_t(size));
}

// Writes `data` at `offset`, announced as a header step, and keeps the
// in-memory copy of the header cluster in step.
Status WriteStep(io::Storage& storage, std::vector<uint8_t>& cluster, uint64_t offset,
                 std::span<const uint8_t> data) {
  storage.Announce(io::Event::kHeaderUpdate);
  TD_RETURN_IF_ERROR(storage.WriteAt(offset, data));
  std::copy(data.begin(), data.end(), cluster.begin() + offset);
  return Status::Ok();
}

// Sector 0 as it will be once `area` (its first sector) replaces it.
std::vector<uint8_t> Sector0(const std::vector<uint8_t>& cluster, const std::vector<uint8_t>& area) {
  std::vector<uint8_t> sector(cluster.begin(), cluster.begin() + kSector);
  std::copy(area.begin(), area.begin() + std::min<uint64_t>(kSector, area.size()), sector.begin());
  return sector;
}

// True when bytes [kSector, area.size()) of `area` differ from the cluster.
bool TailDiffers(const std::vector<uint8_t>& cluster, const std::vector<uint8_t>& area) {
  if (area.size() <= kSector) return false;
  return !std::equal(area.begin() + kSector, area.end(), cluster.begin() + kSector);
}

// Intervals of the header cluster that header `h` (decoded from `cluster`) uses.
std::vector<Interval> UsedBy(const Header& h, std::span<const uint8_t> cluster) {
  std::vector<Interval> used = {{0, ExtensionAreaEnd(h, cluster)}};
  if (!h.backing_file.empty()) {
    used.push_back({h.backing_file_offset, h.backing_file_offset + h.backing_file.size()});
  }
  return used;
}

// One write of the whole new header, for clusters too small for the steps.
Status WriteWhole(io::Storage& storage, std::vector<uint8_t>& cluster, const Header& h) {
  TD_ASSIGN_OR_RETURN(std::vector<uint8_t> full, EncodeHeader(h));
  TD_RETURN_IF_ERROR(WriteStep(storage, cluster, 0, full));
  return storage.Flush();
}

// Step 1: moves the header on disk to the old header minus its feature name
// table, whose extension area fits in sector 0, with the backing name at a
// place outside `keep_free`. Returns false (doing nothing) when impossible.
Result<bool> Shrink(io::Storage& storage, std::vector<uint8_t>& cluster, Header& current,
                    const std::vector<Interval>& keep_free) {
  Header shrunk = current;
  shrunk.feature_names.clear();
  TD_ASSIGN_OR_RETURN(std::vector<uint8_t> area, EncodeArea(shrunk));
  if (area.size() > kSector) return false;
  std::vector<Interval> avoid = UsedBy(current, cluster);
  avoid.insert(avoid.end(), keep_free.begin(), keep_free.end());
  avoid.push_back({0, kSector});
  const std::string& name = current.backing_file;
  uint64_t place = 0;
  if (!name.empty()) {
    place = FindGap(kSector, name.size(), cluster.size(), avoid);
    if (place == 0) return false;
    // The old header does not use these bytes: a crash leaves it intact.
    TD_RETURN_IF_ERROR(WriteStep(storage, cluster, place,
                                 {reinterpret_cast<const uint8_t*>(name.data()), name.size()}));
    TD_RETURN_IF_ERROR(storage.Flush());
  }
  PlaceName(area, place, name.size());
  std::vector<uint8_t> sector = Sector0(cluster, area);
  TD_RETURN_IF_ERROR(WriteStep(storage, cluster, 0, sector));
  TD_RETURN_IF_ERROR(storage.Flush());
  shrunk.backing_file_offset = place;
  shrunk.backing_file_size = uint32_t(name.size());
  current = std::move(shrunk);
  return true;
}

}  // namespace

uint64_t ExtensionAreaEnd(const Header& h, std::span<const uint8_t> bytes) {
  uint64_t limit = std::min<uint64_t>(h.cluster_size(), bytes.size());
  if (h.backing_file_offset != 0) limit = std::min(limit, h.backing_file_offset);
  uint64_t pos = h.version >= 3 ? h.header_length : kV2HeaderLength;
  while (pos + 8 <= limit) {
    uint32_t type = LoadBe32(&bytes[pos]);
    uint32_t len = LoadBe32(&bytes[pos + 4]);
    if (type == kExtEnd) return pos + 8;
    if (len > limit - pos - 8) return limit;
    pos += 8 + Align8(len);
  }
  return std::min(pos, limit);
}

Result<HeaderCluster> ReadHeaderCluster(io::Storage& storage) {
  TD_ASSIGN_OR_RETURN(uint64_t file_size, storage.Size());
  std::vector<uint8_t> head(std::min(file_size, kMaxHeadBytes));
  TD_RETURN_IF_ERROR(storage.ReadAt(0, head));
  auto header = DecodeHeader(head, file_size);
  if (!header) return header.error().WithContext(storage.name());
  head.resize(std::min<uint64_t>(head.size(), header->cluster_size()));
  return HeaderCluster{std::move(*header), std::move(head)};
}

Status RewriteHeader(io::Storage& storage, const Header& new_header) {
  TD_ASSIGN_OR_RETURN(HeaderCluster cur, ReadHeaderCluster(storage));
  if (new_header.cluster_bits != cur.header.cluster_bits) {
    return Status::InvalidArgument("a header rewrite cannot change the cluster size");
  }
  // Validates the whole header (limits, fits in a cluster) before any write.
  TD_RETURN_IF_ERROR(EncodeHeader(new_header).status());
  std::vector<uint8_t> cluster = std::move(cur.bytes);
  cluster.resize(new_header.cluster_size(), 0);  // past the end of file reads as zeros
  Header current = std::move(cur.header);
  TD_ASSIGN_OR_RETURN(std::vector<uint8_t> area, EncodeArea(new_header));
  const std::string& name = new_header.backing_file;
  if (cluster.size() <= kSector) return WriteWhole(storage, cluster, new_header);

  // 1. New extension bytes past sector 0 may only land where the header on
  //    disk does not look.
  Interval tail{kSector, std::max<uint64_t>(kSector, area.size())};
  auto tail_in_use = [&] {
    std::vector<Interval> used = UsedBy(current, cluster);
    return std::any_of(used.begin(), used.end(),
                       [&](const Interval& u) { return Overlaps(u, tail); });
  };
  bool tail_differs = TailDiffers(cluster, area);
  if (tail_differs && tail_in_use()) {
    TD_ASSIGN_OR_RETURN(bool shrunk, Shrink(storage, cluster, current, {{0, area.size()}}));
    if (!shrunk) return WriteWhole(storage, cluster, new_header);
  }

  // 2. The new backing name and extension tail, into unused bytes.
  std::vector<Interval> avoid = UsedBy(current, cluster);
  avoid.push_back({0, std::max<uint64_t>(area.size(), kSector)});
  uint64_t place = 0;
  if (!name.empty()) {
    place = FindGap(area.size(), name.size(), cluster.size(), avoid);
    if (place == 0) return WriteWhole(storage, cluster, new_header);
  }
  PlaceName(area, place, name.size());
  bool wrote = false;
  if (!name.empty()) {
    TD_RETURN_IF_ERROR(WriteStep(storage, cluster, place,
                                 {reinterpret_cast<const uint8_t*>(name.data()), name.size()}));
    wrote = true;
  }
  if (tail_differs) {
    TD_RETURN_IF_ERROR(WriteStep(storage, cluster, kSector,
                                 std::span<const uint8_t>(area).subspan(kSector)));
    wrote = true;
  }
  if (wrote) TD_RETURN_IF_ERROR(storage.Flush());

  // 3. The switch: one sector.
  std::vector<uint8_t> sector = Sector0(cluster, area);
  TD_RETURN_IF_ERROR(WriteStep(storage, cluster, 0, sector));
  return storage.Flush();
}

Status UpdateHeader(io::Storage& storage, const std::function<Status(Header&)>& edit) {
  TD_ASSIGN_OR_RETURN(HeaderCluster cur, ReadHeaderCluster(storage));
  Header h = std::move(cur.header);
  TD_RETURN_IF_ERROR(edit(h));
  return RewriteHeader(storage, h);
}

Status SetBackingFile(io::Storage& storage, const std::string& name, const std::string& format) {
  if (name.size() > kMaxBackingFileSize) {
    return Status::InvalidArgument("backing file name is longer than " +
                                   std::to_string(kMaxBackingFileSize) + " bytes");
  }
  return UpdateHeader(storage, [&](Header& h) {
    h.backing_file = name;
    h.backing_format = name.empty() ? "" : format;
    return Status::Ok();
  });
}

}  // namespace thindisk::qcow2
