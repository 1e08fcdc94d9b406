// Compressed clusters: reading (with a small cache of decompressed
// clusters) and WriteCompressed.
#include <algorithm>
#include <cstring>

#include "qcow2/image_impl.h"
#include "util/compress.h"

namespace thindisk::qcow2 {
namespace {

// Decompressed clusters kept per image: enough for sequential reads that
// come in pieces smaller than a cluster.
constexpr size_t kCompressedCacheEntries = 4;
constexpr uint64_t kSector = 512;

Codec CodecOf(CompressionType t) {
  return t == CompressionType::kZstd ? Codec::kZstd : Codec::kZlib;
}

}  // namespace

void ImageImpl::DropCompressedCache() {
  util::MutexLock lock(compressed_mu_);
  compressed_cache_.clear();
}

Status ImageImpl::ReadCompressedCluster(uint64_t gc, const L2Mapping& m,
                                        std::vector<uint8_t>* cluster) {
  {
    util::MutexLock lock(compressed_mu_);
    for (auto it = compressed_cache_.begin(); it != compressed_cache_.end(); ++it) {
      if (it->host_offset == m.host_offset) {
        *cluster = *it->data;
        compressed_cache_.splice(compressed_cache_.begin(), compressed_cache_, it);
        return Status::Ok();
      }
    }
  }
  std::vector<uint8_t> raw(m.compressed_size);
  TD_RETURN_IF_ERROR(storage_->ReadAt(m.host_offset, raw));
  auto data = std::make_shared<std::vector<uint8_t>>(cs());
  Status s = Decompress(CodecOf(compression_type_), raw, *data);
  if (!s.ok()) {
    return Status::Corrupt(GuestPos(gc) + ": compressed cluster does not decompress: " +
                           s.message());
  }
  *cluster = *data;
  util::MutexLock lock(compressed_mu_);
  compressed_cache_.push_front({m.host_offset, std::move(data)});
  if (compressed_cache_.size() > kCompressedCacheEntries) compressed_cache_.pop_back();
  return Status::Ok();
}

Status ImageImpl::WriteCompressed(uint64_t offset, std::span<const uint8_t> data) {
  if (read_only_) return Status::ReadOnly(info_.filename + ": image is opened read-only");
  TD_RETURN_IF_ERROR(CheckRange(offset, data.size()));
  if (offset & (cs() - 1)) {
    return Status::InvalidArgument("compressed write at an offset that is not cluster aligned");
  }
  if (data.size() != cs() && offset + data.size() != size_.load()) {
    return Status::InvalidArgument("compressed write must cover one whole cluster");
  }
  TD_RETURN_IF_ERROR(MarkChanged(offset, data.size()));
  ChangeDone change_done(tracker_.get());
  // The last cluster is padded with zeros, as qemu does: a compressed
  // cluster always decompresses to a full cluster.
  std::vector<uint8_t> padded;
  std::span<const uint8_t> input = data;
  if (data.size() < cs()) {
    padded.assign(cs(), 0);
    std::memcpy(padded.data(), data.data(), data.size());
    input = padded;
  }
  // Storing compressed must save at least one sector.
  std::vector<uint8_t> out(cs() - kSector);
  Result<size_t> n = Status::NotSupported("skipped");
  // zstd gives up on incompressible input by itself about as fast as the
  // entropy guess (random data: 700-900 MB/s on 2 CPUs either way), and the
  // guess stores some compressible clusters raw (W6: 0.5% of the corpus
  // ratio); zlib would spend ~9 ms per MiB finding out, so it is asked first.
  if (compression_type_ == CompressionType::kZstd || !LooksIncompressible(input)) {
    n = Compress(CodecOf(compression_type_), kDefaultCompressionLevel, input, out);
  }
  if (!n) {
    if (n.error().code() != Code::kNotSupported) return n.error();
    return Write(offset, data, {});
  }
  uint64_t gc = offset >> cluster_bits_;
  auto guard = range_lock_.Lock(gc, 1);
  L2Mapping old;
  uint64_t host = 0;
  {
    util::MutexLock lock(mu_);
    TD_ASSIGN_OR_RETURN(old, LookupLocked(gc));
    TD_ASSIGN_OR_RETURN(host, allocator_->AllocateBytes(*n));
  }
  storage_->Announce(io::Event::kCompressedWrite);
  Status s = storage_->WriteAt(host, std::span<const uint8_t>(out.data(), *n));
  L2Mapping m;
  m.kind = ClusterKind::kCompressed;
  m.host_offset = host;
  m.compressed_size = *n;
  util::MutexLock lock(mu_);
  if (s.ok()) s = SetMappingLocked(gc, m);
  if (!s.ok()) {
    // Give back the references AllocateBytes took (on every host cluster
    // the bytes touch), as for any compressed mapping.
    FreeMappingLocked(m);
    return s;
  }
  FreeMappingLocked(old);
  return Status::Ok();
}

}  // namespace thindisk::qcow2
