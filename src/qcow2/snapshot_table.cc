// qcow2 snapshot table codec. Every length in an entry is checked against
// the bytes that remain and a named limit before it is used.
#include "qcow2/snapshot_table.h"

#include <fmt/format.h>

#include <cstring>

#include "qcow2/format.h"  // kMaxSnapshots, kMaxL1Bytes
#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

// Snapshot table limits (QEMU's): extra data per entry and the whole table.
constexpr uint32_t kMaxSnapshotExtraData = 1024;
constexpr uint64_t kMaxSnapshotTableBytes = 64ull << 20;

// Entries start on 8-byte boundaries.
uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

}  // namespace

Result<std::vector<Snapshot>> DecodeSnapshotTable(std::span<const uint8_t> bytes,
                                                  uint32_t nb_snapshots, uint32_t cluster_bits) {
  if (nb_snapshots > kMaxSnapshots) {
    return Status::Corrupt(fmt::format("nb_snapshots {} exceeds {}", nb_snapshots, kMaxSnapshots));
  }
  const uint64_t cluster_mask = (uint64_t{1} << cluster_bits) - 1;
  std::vector<Snapshot> out;
  uint64_t pos = 0;
  for (uint32_t i = 0; i < nb_snapshots; ++i) {
    if (pos > kMaxSnapshotTableBytes) {
      return Status::Corrupt(fmt::format("snapshot table exceeds {} bytes", kMaxSnapshotTableBytes));
    }
    if (bytes.size() < kSnapshotFixedSize || pos > bytes.size() - kSnapshotFixedSize) {
      return Status::Corrupt(fmt::format("snapshot table truncated at entry {} (offset {:#x})", i,
                                         pos));
    }
    const uint8_t* p = &bytes[pos];
    Snapshot s;
    s.l1_table_offset = LoadBe64(p);
    s.l1_size = LoadBe32(p + 8);
    uint16_t id_size = LoadBe16(p + 12);
    uint16_t name_size = LoadBe16(p + 14);
    s.date_sec = LoadBe32(p + 16);
    s.date_nsec = LoadBe32(p + 20);
    s.vm_clock_nsec = LoadBe64(p + 24);
    s.vm_state_size = LoadBe32(p + 32);
    uint32_t extra_size = LoadBe32(p + 36);
    if (extra_size > kMaxSnapshotExtraData) {
      return Status::Corrupt(fmt::format("snapshot {} extra data size {} exceeds {}", i,
                                         extra_size, kMaxSnapshotExtraData));
    }
    if (s.l1_table_offset & cluster_mask) {
      return Status::Corrupt(fmt::format("snapshot {} L1 table offset {:#x} is not cluster aligned",
                                         i, s.l1_table_offset));
    }
    if (uint64_t{s.l1_size} * 8 > kMaxL1Bytes) {
      return Status::Corrupt(fmt::format("snapshot {} l1_size {} exceeds the limit", i,
                                         s.l1_size));
    }
    uint64_t entry_size = uint64_t{kSnapshotFixedSize} + extra_size + id_size + name_size;
    if (entry_size > bytes.size() - pos) {
      return Status::Corrupt(fmt::format("snapshot {} runs past the end of the snapshot table", i));
    }
    const uint8_t* v = p + kSnapshotFixedSize;
    s.extra.assign(v, v + extra_size);
    if (extra_size >= 8) s.vm_state_size_large = LoadBe64(v);
    if (extra_size >= 16) s.disk_size = LoadBe64(v + 8);
    v += extra_size;
    s.id.assign(reinterpret_cast<const char*>(v), id_size);
    v += id_size;
    s.name.assign(reinterpret_cast<const char*>(v), name_size);
    pos += Align8(entry_size);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<uint8_t> EncodeSnapshotTable(const std::vector<Snapshot>& snapshots) {
  std::vector<uint8_t> out;
  for (const Snapshot& s : snapshots) {
    std::vector<uint8_t> extra = s.extra;
    if (extra.size() < 16) extra.resize(16, 0);
    StoreBe64(&extra[0], s.vm_state_size_large);
    StoreBe64(&extra[8], s.disk_size);
    size_t pos = out.size();
    size_t entry_size = kSnapshotFixedSize + extra.size() + s.id.size() + s.name.size();
    out.resize(pos + Align8(entry_size), 0);
    uint8_t* p = &out[pos];
    StoreBe64(p, s.l1_table_offset);
    StoreBe32(p + 8, s.l1_size);
    StoreBe16(p + 12, uint16_t(s.id.size()));
    StoreBe16(p + 14, uint16_t(s.name.size()));
    StoreBe32(p + 16, s.date_sec);
    StoreBe32(p + 20, s.date_nsec);
    StoreBe64(p + 24, s.vm_clock_nsec);
    StoreBe32(p + 32, s.vm_state_size);
    StoreBe32(p + 36, uint32_t(extra.size()));
    uint8_t* v = p + kSnapshotFixedSize;
    std::memcpy(v, extra.data(), extra.size());
    v += extra.size();
    std::memcpy(v, s.id.data(), s.id.size());
    v += s.id.size();
    std::memcpy(v, s.name.data(), s.name.size());
  }
  return out;
}

}  // namespace thindisk::qcow2
