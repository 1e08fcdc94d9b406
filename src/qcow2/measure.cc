#include "qcow2/measure.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "io/forwarding_storage.h"
#include "io/memory_storage.h"

namespace thindisk::qcow2 {
namespace {

uint64_t DivRoundUp(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

bool AllZero(std::span<const uint8_t> b) {
  return std::all_of(b.begin(), b.end(), [](uint8_t x) { return x == 0; });
}

// Storage that keeps only what is not all zeros: an all-zero write becomes
// a zero-range (extending the size like the write would), so the replayed
// data (zeros) costs no memory while metadata tables are kept and read
// back exactly. Reads return what a real file would.
class MetadataOnlyStorage final : public io::ForwardingStorage {
 public:
  MetadataOnlyStorage() : ForwardingStorage(io::NewMemoryStorage("measure")) {}
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override {
    if (!buf.empty() && AllZero(buf)) return inner().ZeroRange(offset, buf.size());
    return inner().WriteAt(offset, buf);
  }
  Status Flush() override { return Status::Ok(); }
};

// Replays the writes `thindisk convert` issues for `src` (no target backing
// file): zero extents are skipped; data is read in kConvertChunk pieces and
// every run of non-zero kConvertSparseGrain blocks is one write.
Status ReplayConversion(block::Device& src, block::Device& dst) {
  const uint64_t size = src.size();
  std::vector<uint8_t> buf(kConvertChunk);
  const std::vector<uint8_t> zeros(kConvertChunk, 0);
  for (uint64_t offset = 0; offset < size;) {
    TD_ASSIGN_OR_RETURN(block::Extent e, src.GetStatus(offset, size - offset));
    if (e.length == 0) return Status::Internal("block status returned an empty extent");
    uint64_t n = std::min(e.length, size - offset);
    if (!e.zero) {
      n = std::min(n, kConvertChunk);
      std::span<uint8_t> data(buf.data(), n);
      TD_RETURN_IF_ERROR(src.Read(offset, data));
      auto write = [&](uint64_t from, uint64_t to) {
        return dst.Write(offset + from, std::span<const uint8_t>(zeros.data(), to - from));
      };
      uint64_t run_start = 0;
      bool in_run = false;
      for (uint64_t pos = 0; pos < n; pos += kConvertSparseGrain) {
        bool zero = AllZero(data.subspan(pos, std::min(kConvertSparseGrain, n - pos)));
        if (!zero && !in_run) {
          run_start = pos;
          in_run = true;
        } else if (zero && in_run) {
          TD_RETURN_IF_ERROR(write(run_start, pos));
          in_run = false;
        }
      }
      if (in_run) TD_RETURN_IF_ERROR(write(run_start, n));
    }
    offset += n;
  }
  return Status::Ok();
}

}  // namespace

Result<uint64_t> FullyAllocatedSize(const CreateOptions& o) {
  if (!std::has_single_bit(o.cluster_size) || o.cluster_size < 512 ||
      o.refcount_bits == 0 || o.refcount_bits > 64 || !std::has_single_bit(o.refcount_bits)) {
    return Status::InvalidArgument("invalid cluster size or refcount bits");
  }
  const uint64_t cs = o.cluster_size;
  const uint64_t l2_entries = cs / (o.extended_l2 ? 16 : 8);
  const uint64_t data = DivRoundUp(o.size, cs);
  const uint64_t l2_tables = DivRoundUp(data, l2_entries);
  const uint64_t l1_clusters = DivRoundUp(l2_tables * 8, cs);
  const uint64_t rb_entries = cs * 8 / o.refcount_bits;
  // Refcount blocks count everything, themselves and the table included.
  uint64_t rt = 1, rb = 1, total = 0;
  while (true) {
    total = 1 + rt + rb + l1_clusters + l2_tables + data;
    uint64_t need_rb = DivRoundUp(total, rb_entries);
    uint64_t need_rt = DivRoundUp(need_rb * 8, cs);
    if (need_rb == rb && need_rt == rt) break;
    rb = std::max(rb, need_rb);
    rt = std::max(rt, need_rt);
  }
  return total * cs;
}

uint64_t MeasureBitmaps(const std::vector<BitmapInfo>& bitmaps, uint64_t virtual_size,
                        uint64_t cluster_size) {
  if (bitmaps.empty()) return 0;
  uint64_t clusters = 0;
  uint64_t directory_bytes = 0;
  for (const BitmapInfo& b : bitmaps) {
    // qemu reserves the whole bitmap (the table's size) and its table.
    const uint64_t data = BitmapTableEntries(virtual_size, b.granularity_bits, cluster_size);
    clusters += data + DivRoundUp(data * 8, cluster_size);
    // A directory entry: 24 bytes and the name, padded to 8 (no extra data).
    directory_bytes += (24 + b.name.size() + 7) / 8 * 8;
  }
  // The directory is rounded up as a whole, not per entry.
  clusters += DivRoundUp(directory_bytes, cluster_size);
  return clusters * cluster_size;
}

Result<MeasureResult> Measure(block::Device* source, const CreateOptions& options) {
  CreateOptions o = options;
  if (source != nullptr) o.size = source->size();
  MeasureResult r;
  TD_ASSIGN_OR_RETURN(r.fully_allocated, FullyAllocatedSize(o));
  if (o.preallocation != Preallocation::kOff || !o.backing_file.empty()) {
    r.required = r.fully_allocated;
    return r;
  }
  auto storage = std::make_unique<MetadataOnlyStorage>();
  MetadataOnlyStorage* raw = storage.get();
  TD_RETURN_IF_ERROR(Create(*storage, o));
  if (source != nullptr) {
    TD_ASSIGN_OR_RETURN(std::unique_ptr<Image> image, Image::Open(std::move(storage), {}));
    Status s = ReplayConversion(*source, *image);
    Status c = image->Close();
    TD_RETURN_IF_ERROR(s);
    TD_RETURN_IF_ERROR(c);
    TD_ASSIGN_OR_RETURN(r.required, image->storage().Size());
    return r;
  }
  TD_ASSIGN_OR_RETURN(r.required, raw->Size());
  return r;
}

}  // namespace thindisk::qcow2
