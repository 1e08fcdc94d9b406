#include "qcow2/refcount_rebuild.h"

#include <set>
#include <string>
#include <vector>

#include "qcow2/allocator.h"
#include "qcow2/format.h"
#include "qcow2/header_update.h"
#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

// Refcount blocks are read through a small cache; nothing is ever dirtied.
constexpr size_t kReadCacheTables = 16;

uint64_t DivRoundUp(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Clusters holding the current refcount table and blocks (they are free
// once the header points at the new ones).
Result<std::set<uint64_t>> OldStructures(io::Storage& storage, const Header& h) {
  std::set<uint64_t> clusters;
  const uint64_t cs = h.cluster_size();
  for (uint64_t i = 0; i < h.refcount_table_clusters; ++i) {
    clusters.insert(h.refcount_table_offset / cs + i);
  }
  // Allocator::Open validated the table (size limit, alignment, bounds).
  std::vector<uint8_t> raw(uint64_t(h.refcount_table_clusters) * cs);
  TD_RETURN_IF_ERROR(storage.ReadAt(h.refcount_table_offset, raw));
  for (uint64_t i = 0; i < raw.size() / 8; ++i) {
    uint64_t offset = LoadBe64(&raw[i * 8]);
    if (offset != 0) clusters.insert(offset / cs);
  }
  return clusters;
}

}  // namespace

Status ChangeRefcountWidth(io::Storage& storage, uint32_t refcount_bits) {
  uint32_t order = 0;
  while (order <= 6 && (1u << order) != refcount_bits) ++order;
  if (order > 6) {
    return Status::InvalidArgument("refcount_bits must be a power of two from 1 to 64, not " +
                                   std::to_string(refcount_bits));
  }
  TD_ASSIGN_OR_RETURN(HeaderCluster hc, ReadHeaderCluster(storage));
  Header h = std::move(hc.header);
  if (h.refcount_order == order) return Status::Ok();
  if (h.version < 3) {
    return Status::InvalidArgument("refcount_bits other than 16 needs compat=1.1");
  }
  if (h.incompatible_features & kIncompatDirty) {
    return Status::InvalidArgument("image is dirty: repair it (check -r all) first");
  }
  const uint64_t cs = h.cluster_size();

  // 1. Every cluster's refcount, from the current structures.
  TD_ASSIGN_OR_RETURN(uint64_t file_size, storage.Size());
  TD_ASSIGN_OR_RETURN(auto old, Allocator::Open(storage, h, file_size, kReadCacheTables,
                                                [] { return Status::Ok(); }));
  TD_ASSIGN_OR_RETURN(std::set<uint64_t> old_structures, OldStructures(storage, h));
  const uint64_t used = DivRoundUp(std::max(file_size, old->host_end()), cs);
  std::vector<uint64_t> counts(used, 0);
  const uint64_t max_count = MaxRefcount(order);
  for (uint64_t c = 0; c < used; ++c) {
    if (old_structures.count(c)) continue;
    TD_ASSIGN_OR_RETURN(counts[c], old->GetRefcount(c * cs));
    if (counts[c] > max_count) {
      return Status::InvalidArgument(
          "cluster at host offset " + std::to_string(c * cs) + " has refcount " +
          std::to_string(counts[c]) + ", more than refcount_bits=" +
          std::to_string(refcount_bits) + " can hold");
    }
  }
  old.reset();

  // 2. Size the new table and blocks, placed at the end; they count
  //    themselves, so iterate until the sizes settle.
  const uint64_t per_block = cs * 8 / refcount_bits;
  uint64_t blocks = 0, table_clusters = 0;
  while (true) {
    uint64_t total = used + table_clusters + blocks;
    uint64_t need_blocks = DivRoundUp(total, per_block);
    uint64_t need_table = DivRoundUp(need_blocks * 8, cs);
    if (need_blocks == blocks && need_table == table_clusters) break;
    blocks = need_blocks;
    table_clusters = need_table;
  }
  if (table_clusters * cs > kMaxRefcountTableBytes) {
    return Status::InvalidArgument("the new refcount table would exceed its size limit");
  }
  const uint64_t table_start = used;
  const uint64_t blocks_start = used + table_clusters;
  counts.resize(blocks_start + blocks, 0);
  for (uint64_t c = table_start; c < blocks_start + blocks; ++c) counts[c] = 1;

  // 3. Write blocks, then the table; sync. Nothing points at them yet.
  std::vector<uint8_t> block(cs);
  for (uint64_t b = 0; b < blocks; ++b) {
    std::fill(block.begin(), block.end(), 0);
    for (uint64_t i = 0; i < per_block && b * per_block + i < counts.size(); ++i) {
      SetRefcount(block, order, i, counts[b * per_block + i]);
    }
    storage.Announce(io::Event::kRefblockAlloc);
    TD_RETURN_IF_ERROR(storage.WriteAt((blocks_start + b) * cs, block));
  }
  std::vector<uint8_t> table(table_clusters * cs, 0);
  for (uint64_t b = 0; b < blocks; ++b) StoreBe64(&table[b * 8], (blocks_start + b) * cs);
  storage.Announce(io::Event::kReftableGrow);
  TD_RETURN_IF_ERROR(storage.WriteAt(table_start * cs, table));
  TD_RETURN_IF_ERROR(storage.Flush());

  // 4. The switch: one header write (sector 0 only).
  Header next = h;
  next.refcount_order = order;
  next.refcount_table_offset = table_start * cs;
  next.refcount_table_clusters = uint32_t(table_clusters);
  TD_RETURN_IF_ERROR(RewriteHeader(storage, next));

  // 5. The old structures are free clusters now: give their space back.
  for (uint64_t c : old_structures) {
    storage.Announce(io::Event::kDiscardPunch);
    Status p = storage.PunchHole(c * cs, cs);
    if (!p.ok() && p.code() != Code::kNotSupported) return p;
  }
  return storage.Flush();
}

}  // namespace thindisk::qcow2
