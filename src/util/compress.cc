#include "util/compress.h"

#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <array>
#include <cmath>
#include <string>

namespace thindisk {
namespace {

// qcow2 (and QEMU) use raw deflate with a 4 KiB window.
constexpr int kZlibWindowBits = -12;
constexpr int kZlibMemLevel = 9;
constexpr int kZlibDefaultLevel = 6;
constexpr int kZstdDefaultLevel = 3;
// zlib counts in uInt; clusters are at most 2 MiB, so 1 GiB is generous.
constexpr size_t kMaxSpan = size_t{1} << 30;

Status DoesNotFit(size_t capacity) {
  return Status::NotSupported("compressed data does not fit in " + std::to_string(capacity) +
                              " bytes");
}

// ---- zlib ----------------------------------------------------------------

// One deflate stream per thread, re-initialized only when the level changes.
struct Deflater {
  z_stream s{};
  bool ready = false;
  int level = 0;
  ~Deflater() {
    if (ready) deflateEnd(&s);
  }
  bool Prepare(int want_level) {
    if (ready && level == want_level && deflateReset(&s) == Z_OK) return true;
    if (ready) deflateEnd(&s);
    s = z_stream{};
    ready = deflateInit2(&s, want_level, Z_DEFLATED, kZlibWindowBits, kZlibMemLevel,
                         Z_DEFAULT_STRATEGY) == Z_OK;
    level = want_level;
    return ready;
  }
};

struct Inflater {
  z_stream s{};
  bool ready = false;
  ~Inflater() {
    if (ready) inflateEnd(&s);
  }
  bool Prepare() {
    if (ready && inflateReset(&s) == Z_OK) return true;
    if (ready) inflateEnd(&s);
    s = z_stream{};
    ready = inflateInit2(&s, kZlibWindowBits) == Z_OK;
    return ready;
  }
};

Result<size_t> ZlibCompress(int level, std::span<const uint8_t> src, std::span<uint8_t> dst) {
  if (level == kDefaultCompressionLevel) level = kZlibDefaultLevel;
  if (level < 1 || level > 9) return Status::InvalidArgument("zlib level must be 1..9");
  thread_local Deflater d;
  if (!d.Prepare(level)) return Status::Internal("deflateInit2 failed");
  d.s.next_in = const_cast<Bytef*>(src.data());  // zlib's API is not const-correct
  d.s.avail_in = static_cast<uInt>(src.size());
  d.s.next_out = dst.data();
  d.s.avail_out = static_cast<uInt>(dst.size());
  const int ret = deflate(&d.s, Z_FINISH);
  if (ret == Z_STREAM_END) return static_cast<size_t>(d.s.total_out);
  // Z_OK / Z_BUF_ERROR: output space ran out before the stream ended.
  if (ret == Z_OK || ret == Z_BUF_ERROR) return DoesNotFit(dst.size());
  return Status::Internal("deflate failed: " + std::to_string(ret));
}

Status ZlibDecompress(std::span<const uint8_t> src, std::span<uint8_t> dst) {
  thread_local Inflater inf;
  if (!inf.Prepare()) return Status::Internal("inflateInit2 failed");
  inf.s.next_in = const_cast<Bytef*>(src.data());
  inf.s.avail_in = static_cast<uInt>(src.size());
  inf.s.next_out = dst.data();
  inf.s.avail_out = static_cast<uInt>(dst.size());
  const int ret = inflate(&inf.s, Z_FINISH);
  // A full cluster is success whether or not the stream's end marker was
  // reached (the same acceptance rule QEMU applies); anything else --
  // truncated input, bad codes, distances beyond the 4 KiB window -- is
  // corruption.
  const bool full = inf.s.avail_out == 0;
  if (full && (ret == Z_STREAM_END || ret == Z_BUF_ERROR || ret == Z_OK)) return Status::Ok();
  if (ret == Z_STREAM_END) return Status::Corrupt("zlib stream ends before the cluster is full");
  if (ret == Z_BUF_ERROR || ret == Z_OK) return Status::Corrupt("zlib stream is truncated");
  std::string why = inf.s.msg != nullptr ? inf.s.msg : "code " + std::to_string(ret);
  return Status::Corrupt("zlib stream is invalid: " + why);
}

// ---- zstd ----------------------------------------------------------------

struct ZstdContexts {
  ZSTD_CCtx* cctx = nullptr;
  ZSTD_DCtx* dctx = nullptr;
  ~ZstdContexts() {
    ZSTD_freeCCtx(cctx);
    ZSTD_freeDCtx(dctx);
  }
};
thread_local ZstdContexts zstd_contexts;

Result<size_t> ZstdCompress(int level, std::span<const uint8_t> src, std::span<uint8_t> dst) {
  if (level == kDefaultCompressionLevel) level = kZstdDefaultLevel;
  if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel()) {
    return Status::InvalidArgument("zstd level must be " + std::to_string(ZSTD_minCLevel()) + ".." +
                                   std::to_string(ZSTD_maxCLevel()));
  }
  ZstdContexts& z = zstd_contexts;
  if (z.cctx == nullptr && (z.cctx = ZSTD_createCCtx()) == nullptr) {
    return Status::Internal("ZSTD_createCCtx failed");
  }
  ZSTD_CCtx_reset(z.cctx, ZSTD_reset_session_and_parameters);
  size_t r = ZSTD_CCtx_setParameter(z.cctx, ZSTD_c_compressionLevel, level);
  if (ZSTD_isError(r)) return Status::InvalidArgument(ZSTD_getErrorName(r));
  // One call with the whole input: a single frame that records its size.
  r = ZSTD_compress2(z.cctx, dst.data(), dst.size(), src.data(), src.size());
  if (ZSTD_isError(r)) {
    if (ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall) return DoesNotFit(dst.size());
    return Status::Internal(std::string("ZSTD_compress2: ") + ZSTD_getErrorName(r));
  }
  return r;
}

Status ZstdDecompress(std::span<const uint8_t> src, std::span<uint8_t> dst) {
  ZstdContexts& z = zstd_contexts;
  if (z.dctx == nullptr && (z.dctx = ZSTD_createDCtx()) == nullptr) {
    return Status::Internal("ZSTD_createDCtx failed");
  }
  ZSTD_DCtx_reset(z.dctx, ZSTD_reset_session_and_parameters);
  ZSTD_inBuffer in{src.data(), src.size(), 0};
  ZSTD_outBuffer out{dst.data(), dst.size(), 0};
  // Each call makes progress or we stop, so this loop is bounded by the
  // input and output sizes.
  for (;;) {
    const size_t in_before = in.pos;
    const size_t out_before = out.pos;
    const size_t r = ZSTD_decompressStream(z.dctx, &out, &in);
    if (ZSTD_isError(r)) {
      return Status::Corrupt(std::string("zstd stream is invalid: ") + ZSTD_getErrorName(r));
    }
    if (r == 0) {  // a frame ended and is fully flushed
      if (out.pos == out.size) return Status::Ok();
      if (in.pos == in.size) return Status::Corrupt("zstd stream ends before the cluster is full");
      continue;  // the cluster continues in another frame
    }
    if (in.pos == in_before && out.pos == out_before) {
      return Status::Corrupt(out.pos == out.size ? "zstd frame holds more than a cluster"
                                                 : "zstd stream is truncated");
    }
  }
}

}  // namespace

std::string_view CodecName(Codec codec) {
  switch (codec) {
    case Codec::kZlib: return "zlib";
    case Codec::kZstd: return "zstd";
  }
  return "unknown";
}

Result<size_t> Compress(Codec codec, int level, std::span<const uint8_t> src,
                        std::span<uint8_t> dst) {
  if (src.size() > kMaxSpan || dst.size() > kMaxSpan) {
    return Status::InvalidArgument("compression buffers over 1 GiB");
  }
  // No room at all (a 512-byte cluster can't save a sector): nothing can fit,
  // and zlib would reject the null output buffer as a stream error.
  if (dst.empty()) return DoesNotFit(0);
  switch (codec) {
    case Codec::kZlib: return ZlibCompress(level, src, dst);
    case Codec::kZstd: return ZstdCompress(level, src, dst);
  }
  return Status::InvalidArgument("unknown codec");
}

Status Decompress(Codec codec, std::span<const uint8_t> src, std::span<uint8_t> dst) {
  if (src.size() > kMaxSpan || dst.size() > kMaxSpan) {
    return Status::InvalidArgument("decompression buffers over 1 GiB");
  }
  if (dst.empty()) return Status::Ok();
  switch (codec) {
    case Codec::kZlib: return ZlibDecompress(src, dst);
    case Codec::kZstd: return ZstdDecompress(src, dst);
  }
  return Status::InvalidArgument("unknown codec");
}

bool LooksIncompressible(std::span<const uint8_t> data) {
  constexpr size_t kSlice = 512;
  constexpr size_t kSlices = 8;
  if (data.size() < kSlice) return false;

  std::array<uint32_t, 256> histogram{};
  size_t n = 0;
  auto count = [&](std::span<const uint8_t> part) {
    for (uint8_t b : part) ++histogram[b];
    n += part.size();
  };
  if (data.size() <= kSlice * kSlices) {
    count(data);
  } else {
    // Evenly spaced slices: the first at 0, the last ending at the end.
    const size_t step = (data.size() - kSlice) / (kSlices - 1);
    for (size_t i = 0; i < kSlices; ++i) count(data.subspan(i * step, kSlice));
  }

  double entropy = 0;
  int used_bins = 0;
  for (uint32_t c : histogram) {
    if (c == 0) continue;
    ++used_bins;
    const double p = static_cast<double>(c) / static_cast<double>(n);
    entropy -= p * std::log2(p);
  }
  // Miller-Madow: a histogram of n samples underestimates entropy by about
  // (K-1)/(2n) nats; without it, 4 KiB of random bytes measures ~7.95.
  entropy += (used_bins - 1) / (2.0 * static_cast<double>(n) * std::log(2.0));
  return entropy >= kIncompressibleBitsPerByte;
}

}  // namespace thindisk
