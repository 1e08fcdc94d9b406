// qcow2::Create: lays out a new image.
//
// Layout, in clusters: [0] header (+ extensions + backing name), then the
// refcount table, the refcount blocks, the L1 table and, when preallocating,
// every L2 table followed by every data cluster. Everything used is packed
// from cluster 0 up, so the refcounts are "1 for clusters [0, N), 0 beyond":
// the blocks are generated one at a time and never held whole in memory.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <vector>

#include "qcow2/format.h"
#include "util/endian.h"
#include "qcow2/image.h"
#include "qcow2/preallocate.h"

namespace thindisk::qcow2 {
namespace {

constexpr uint64_t kMinClusterSize = 512;
constexpr uint64_t kMaxClusterSize = 2ull << 20;

uint64_t DivRoundUp(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

Status ValidateOptions(const CreateOptions& o) {
  auto invalid = [](std::string m) { return Status::InvalidArgument(std::move(m)); };
  if (o.version != 2 && o.version != 3) {
    return invalid(fmt::format("unsupported qcow2 version {} (use 2 for compat 0.10, 3 for 1.1)",
                               o.version));
  }
  if (!std::has_single_bit(o.cluster_size) || o.cluster_size < kMinClusterSize ||
      o.cluster_size > kMaxClusterSize) {
    return invalid(fmt::format(
        "cluster size {} must be a power of two between 512 bytes and 2 MiB", o.cluster_size));
  }
  if (o.size % 512 != 0) {
    return invalid(fmt::format("image size {} must be a multiple of 512 bytes", o.size));
  }
  if (o.size > kMaxVirtualSize) {
    return invalid(fmt::format("image size {} exceeds the maximum {}", o.size, kMaxVirtualSize));
  }
  if (o.extended_l2 && o.cluster_size < kMinExtendedL2ClusterSize) {
    return invalid(fmt::format(
        "extended L2 entries need a cluster size of at least 16 KiB (got {})", o.cluster_size));
  }
  if (o.refcount_bits == 0 || o.refcount_bits > 64 || !std::has_single_bit(o.refcount_bits)) {
    return invalid(fmt::format("refcount bits {} must be a power of two up to 64",
                               o.refcount_bits));
  }
  if (o.version == 2) {
    if (o.compression_type != CompressionType::kZlib) {
      return invalid("zstd compression needs compat 1.1 (version 3)");
    }
    if (o.extended_l2) return invalid("extended L2 entries need compat 1.1 (version 3)");
    if (o.lazy_refcounts) return invalid("lazy refcounts need compat 1.1 (version 3)");
    if (o.refcount_bits != 16) {
      return invalid(fmt::format("refcount bits {} need compat 1.1 (compat 0.10 has only 16)",
                                 o.refcount_bits));
    }
  }
  if (o.backing_file.size() > kMaxBackingFileSize) {
    return invalid(fmt::format("backing file name is {} bytes; the limit is {}",
                               o.backing_file.size(), kMaxBackingFileSize));
  }
  if (o.backing_file.empty() && !o.backing_format.empty()) {
    return invalid("a backing format was given without a backing file");
  }
  if (!o.backing_file.empty() && o.preallocation != Preallocation::kOff && !o.extended_l2) {
    // Preallocated clusters would hide the backing file's data; only
    // subcluster allocation bits can describe "host space, backing content".
    return invalid("a backing file and preallocation can only be combined with extended L2");
  }
  return Status::Ok();
}

// Where everything goes. Offsets are bytes; counts are clusters.
struct Layout {
  uint64_t cluster_size = 0;
  uint32_t cluster_bits = 0;
  uint32_t refcount_order = 0;
  uint64_t l1_size = 0;  // entries
  uint64_t l1_clusters = 0;
  uint64_t l2_tables = 0;      // preallocated L2 tables
  uint64_t data_clusters = 0;  // preallocated data clusters
  uint64_t rt_clusters = 0;
  uint64_t rb_count = 0;
  uint64_t total_clusters = 0;  // clusters [0, total) have refcount 1
  uint64_t rt_offset = 0, rb_offset = 0, l1_offset = 0, l2_offset = 0, data_offset = 0;
};

Result<Layout> PlanLayout(const CreateOptions& o) {
  Layout l;
  l.cluster_size = o.cluster_size;
  l.cluster_bits = uint32_t(std::countr_zero(o.cluster_size));
  l.refcount_order = uint32_t(std::countr_zero(o.refcount_bits));
  const uint64_t cs = l.cluster_size;
  const uint64_t l2_entries = cs / (o.extended_l2 ? 16 : 8);
  const uint64_t guest_clusters = DivRoundUp(o.size, cs);
  l.l1_size = DivRoundUp(guest_clusters, l2_entries);
  if (l.l1_size * 8 > kMaxL1Bytes) {
    return Status::InvalidArgument(fmt::format(
        "image size {} needs an L1 table of {} bytes (limit {}): use a larger cluster size",
        o.size, l.l1_size * 8, kMaxL1Bytes));
  }
  l.l1_clusters = DivRoundUp(l.l1_size * 8, cs);
  if (o.preallocation != Preallocation::kOff) {
    l.l2_tables = l.l1_size;
    l.data_clusters = guest_clusters;
  }
  // Fixed point: refcount blocks must count every cluster, themselves and
  // the refcount table included. Both counts only grow, so this ends.
  const uint64_t rb_entries = cs * 8 >> l.refcount_order;
  l.rt_clusters = 1;
  l.rb_count = 1;
  while (true) {
    l.total_clusters = 1 + l.rt_clusters + l.rb_count + l.l1_clusters + l.l2_tables +
                       l.data_clusters;
    uint64_t rb = DivRoundUp(l.total_clusters, rb_entries);
    uint64_t rt = DivRoundUp(rb * 8, cs);
    if (rb == l.rb_count && rt == l.rt_clusters) break;
    l.rb_count = std::max(rb, l.rb_count);
    l.rt_clusters = std::max(rt, l.rt_clusters);
  }
  if (l.rt_clusters * cs > kMaxRefcountTableBytes) {
    return Status::InvalidArgument(fmt::format(
        "the refcount table would need {} bytes (limit {}): use a larger cluster size or fewer "
        "refcount bits",
        l.rt_clusters * cs, kMaxRefcountTableBytes));
  }
  l.rt_offset = cs;
  l.rb_offset = l.rt_offset + l.rt_clusters * cs;
  l.l1_offset = l.rb_offset + l.rb_count * cs;
  l.l2_offset = l.l1_offset + l.l1_clusters * cs;
  l.data_offset = l.l2_offset + l.l2_tables * cs;
  return l;
}

Status WriteRefcounts(io::Storage& storage, const Layout& l) {
  const uint64_t cs = l.cluster_size;
  std::vector<uint8_t> table(l.rt_clusters * cs, 0);
  for (uint64_t i = 0; i < l.rb_count; ++i) StoreBe64(&table[i * 8], l.rb_offset + i * cs);
  TD_RETURN_IF_ERROR(storage.WriteAt(l.rt_offset, table));

  const uint64_t rb_entries = cs * 8 >> l.refcount_order;
  std::vector<uint8_t> block(cs);
  for (uint64_t b = 0; b < l.rb_count; ++b) {
    std::fill(block.begin(), block.end(), 0);
    uint64_t first = b * rb_entries;
    uint64_t used = std::min(rb_entries, l.total_clusters - first);
    for (uint64_t i = 0; i < used; ++i) SetRefcount(block, l.refcount_order, i, 1);
    TD_RETURN_IF_ERROR(storage.WriteAt(l.rb_offset + b * cs, block));
  }
  return Status::Ok();
}

// L1 and, when preallocating, the L2 tables mapping every guest cluster to
// its data cluster (COPIED: each has refcount 1).
Status WriteMappings(io::Storage& storage, const Layout& l, const CreateOptions& o) {
  const uint64_t cs = l.cluster_size;
  if (l.l1_size == 0) return Status::Ok();
  std::vector<uint8_t> l1(l.l1_size * 8, 0);
  for (uint64_t i = 0; i < l.l2_tables; ++i) StoreBe64(&l1[i * 8], (l.l2_offset + i * cs) | kCopied);
  TD_RETURN_IF_ERROR(storage.WriteAt(l.l1_offset, l1));

  const uint32_t entry_size = o.extended_l2 ? 16 : 8;
  const uint64_t l2_entries = cs / entry_size;
  // The fresh file reads as zeros, so the subclusters can be marked
  // allocated; with a backing file they stay unallocated (reads go to the
  // backing image) and only the host space is reserved.
  const uint32_t alloc = o.backing_file.empty() ? ~0u : 0u;
  std::vector<uint8_t> table(cs);
  for (uint64_t t = 0; t < l.l2_tables; ++t) {
    std::fill(table.begin(), table.end(), 0);
    for (uint64_t k = 0; k < l2_entries; ++k) {
      uint64_t guest = t * l2_entries + k;
      if (guest >= l.data_clusters) break;
      L2Mapping m;
      m.kind = ClusterKind::kNormal;
      m.host_offset = l.data_offset + guest * cs;
      m.copied = true;
      m.alloc_bitmap = alloc;
      L2Words w = EncodeL2Entry(m, o.extended_l2, l.cluster_bits);
      StoreBe64(&table[k * entry_size], w.entry);
      if (o.extended_l2) StoreBe64(&table[k * entry_size + 8], w.bitmap);
    }
    TD_RETURN_IF_ERROR(storage.WriteAt(l.l2_offset + t * cs, table));
  }
  return Status::Ok();
}

Status PreallocateData(io::Storage& storage, const Layout& l, Preallocation mode,
                       std::string* warning) {
  return PreallocateHostRange(storage, l.data_offset, l.data_clusters * l.cluster_size, mode,
                              warning);
}

Header BuildHeader(const CreateOptions& o, const Layout& l) {
  Header h;
  h.version = o.version;
  h.cluster_bits = l.cluster_bits;
  h.size = o.size;
  h.l1_size = uint32_t(l.l1_size);
  h.l1_table_offset = l.l1_size ? l.l1_offset : 0;
  h.refcount_table_offset = l.rt_offset;
  h.refcount_table_clusters = uint32_t(l.rt_clusters);
  h.refcount_order = l.refcount_order;
  h.compression_type = o.compression_type;
  if (o.extended_l2) h.incompatible_features |= kIncompatExtendedL2;
  if (o.compression_type != CompressionType::kZlib) {
    h.incompatible_features |= kIncompatCompression;
  }
  if (o.lazy_refcounts) h.compatible_features |= kCompatLazyRefcounts;
  h.backing_file = o.backing_file;
  h.backing_format = o.backing_format;
  if (o.version == 3) h.feature_names = DefaultFeatureNames();
  return h;
}

}  // namespace

Status Create(io::Storage& storage, const CreateOptions& options, std::string* warning) {
  // 1. Options and layout.
  TD_RETURN_IF_ERROR(ValidateOptions(options));
  TD_ASSIGN_OR_RETURN(uint64_t existing, storage.Size());
  if (existing != 0) {
    return Status::InvalidArgument(
        fmt::format("{}: cannot create an image on storage that is not empty ({} bytes)",
                    storage.name(), existing));
  }
  TD_ASSIGN_OR_RETURN(Layout layout, PlanLayout(options));

  // 2. The header. The feature name table is optional; like QEMU, leave it
  // out when it does not fit in a small (512-byte) first cluster.
  Header header = BuildHeader(options, layout);
  Result<std::vector<uint8_t>> encoded = EncodeHeader(header);
  if (!encoded.has_value() && !header.feature_names.empty()) {
    header.feature_names.clear();
    encoded = EncodeHeader(header);
  }
  if (!encoded.has_value()) return encoded.error();

  // 3. Metadata, then the size, then data preallocation, then the header
  // last, so a create cut short never looks like a valid image.
  TD_RETURN_IF_ERROR(WriteRefcounts(storage, layout));
  TD_RETURN_IF_ERROR(WriteMappings(storage, layout, options));
  TD_RETURN_IF_ERROR(storage.Resize(layout.total_clusters * layout.cluster_size));
  TD_RETURN_IF_ERROR(PreallocateData(storage, layout, options.preallocation, warning));
  TD_RETURN_IF_ERROR(storage.WriteAt(0, *encoded));
  return storage.Flush();
}

}  // namespace thindisk::qcow2
