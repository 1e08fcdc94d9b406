#include "crash/workload.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>

namespace thindisk::crash {
namespace {

using qcow2::CompressionType;

// Small clusters make growth of the L1 and refcount tables cheap: 512-byte
// clusters with 64-bit refcounts need a new refcount block every 32 KiB
// of host file and a larger refcount table after 2 MiB.
const Geometry kGeometries[] = {
    {"c512-std-rc64-grow", 512, false, 64, 3, CompressionType::kZlib, false, 0, 1 << 20, 5 << 19},
    {"c16k-ext-backing-zstd", 16384, true, 16, 3, CompressionType::kZstd, true, 1 << 20,
     2 << 20, 2 << 20},
    {"c4k-std-backing-zlib", 4096, false, 16, 3, CompressionType::kZlib, true, 1 << 20, 3 << 19,
     2 << 20},
    {"c64k-ext-zstd", 65536, true, 16, 3, CompressionType::kZstd, true, 0, 2 << 20, 2 << 20},
    {"c1k-v2-backing", 1024, false, 16, 2, CompressionType::kZlib, true, 1 << 19, 1 << 20,
     1 << 20},
    {"c2k-std-rc8-grow", 2048, false, 8, 3, CompressionType::kZlib, true, 0, 1 << 20, 2 << 20},
    // One refcount table cluster of 64-bit refcounts covers 2 MiB of host
    // file with 512-byte clusters: the prefill outgrows it.
    {"c512-std-rc64-reftable", 512, false, 64, 3, CompressionType::kZlib, true, 0, 3 << 20,
     3 << 20, 3 << 20},
};
constexpr int kGeometryCount = sizeof(kGeometries) / sizeof(kGeometries[0]);
constexpr int kRequestsPerWorkload = 30;

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// THINDISK_CRASH_TRACE=1 prints every request as it completes.
void Trace(int thread, const char* what, uint64_t off, uint64_t len, const Status& s) {
  static const bool on = getenv("THINDISK_CRASH_TRACE") != nullptr;
  if (!on) return;
  fprintf(stderr, "[t%d] %s 0x%" PRIx64 " +0x%" PRIx64 ": %s\n", thread, what, off, len,
          s.ToString().c_str());
}

struct Stripe {
  uint64_t begin;
  uint64_t end;
};

// One thread's share of the requests, inside its own stripe of the disk
// (stripes need not be cluster aligned: threads then share clusters).
void RunThread(uint64_t seed, int thread, int requests, Stripe stripe, bool may_resize,
               qcow2::Image& image, ContentModel& model, const std::function<bool()>& stop) {
  const Geometry& g = GeometryFor(seed);
  const uint64_t cs = g.cluster_size;
  std::mt19937_64 rng(Mix(seed * 131 + uint64_t(thread)));
  std::vector<uint8_t> buf;
  bool resized = false;
  if (thread == 0) {
    for (uint64_t off = 0; off < std::min(g.prefill, stripe.end) && !stop(); off += 1 << 20) {
      uint64_t len = std::min<uint64_t>(1 << 20, stripe.end - off);
      uint32_t id = model.Begin(Fill::kPattern, off, len);
      buf.resize(len);
      FillBytes(Fill::kPattern, id, off, buf);
      Status s = image.Write(off, buf, {});
      model.End(id, s.ok());
      Trace(thread, "prefill", off, len, s);
    }
  }
  for (int i = 0; i < requests && !stop(); ++i) {
    uint64_t span = stripe.end - stripe.begin;
    // Offset: any byte, a sector, or a cluster boundary.
    uint64_t off = stripe.begin + rng() % span;
    switch (rng() % 3) {
      case 0: break;
      case 1: off = std::max(stripe.begin, off & ~uint64_t{511}); break;
      case 2: off = std::max(stripe.begin, off & ~(cs - 1)); break;
    }
    uint64_t room = stripe.end - off;
    uint64_t len;
    switch (rng() % 10) {
      case 0: len = 1 + rng() % (1 << 20); break;  // up to 1 MiB
      case 1:
      case 2: len = 1 + rng() % (64 << 10); break;
      case 3: len = cs * (1 + rng() % 4); break;
      default: len = 1 + rng() % (3 * cs); break;
    }
    len = std::max<uint64_t>(1, std::min(len, room));
    const int kind = int(rng() % 100);
    if (kind < 45 || (kind >= 85 && kind < 92 && !g.compress)) {
      bool fua = rng() % 16 == 0;
      uint32_t id = model.Begin(Fill::kPattern, off, len);
      buf.resize(len);
      FillBytes(Fill::kPattern, id, off, buf);
      // FUA: the request itself is durable when it returns, and so is
      // everything completed before it started (its flush starts later).
      uint64_t token = fua ? model.FlushBegin() : 0;
      Status s = image.Write(off, buf, {.fua = fua});
      model.End(id, s.ok());
      Trace(thread, fua ? "write+fua" : "write", off, len, s);
      if (fua) {
        model.FlushEnd(token, s.ok());
        if (s.ok()) model.MarkDurable(id);
      }
    } else if (kind < 58) {
      block::ZeroFlags flags;
      flags.may_unmap = rng() % 2 == 0;
      uint32_t id = model.Begin(Fill::kZero, off, len);
      Status s = image.WriteZeroes(off, len, flags);
      model.End(id, s.ok());
      Trace(thread, "zeroes", off, len, s);
    } else if (kind < 72) {
      uint32_t id = model.Begin(Fill::kZero, off, len);
      Status s = image.Discard(off, len);
      model.End(id, s.ok());
      Trace(thread, "discard", off, len, s);
    } else if (kind < 85) {
      uint64_t token = model.FlushBegin();
      Status s = image.Flush();
      model.FlushEnd(token, s.ok());
      Trace(thread, "flush", 0, 0, s);
    } else if (kind < 92) {
      // A whole cluster (or the image's tail), compressed.
      uint64_t c = (off + cs - 1) / cs * cs;
      uint64_t n = std::min(cs, image.size() - std::min(c, image.size()));
      if (n == 0 || c < stripe.begin || c + n > stripe.end) continue;
      uint32_t id = model.Begin(Fill::kCompressible, c, n);
      buf.resize(n);
      FillBytes(Fill::kCompressible, id, c, buf);
      Status s = image.WriteCompressed(c, buf);
      model.End(id, s.ok());
      Trace(thread, "compressed", c, n, s);
    } else if (may_resize && !resized && g.grown_size > image.size()) {
      resized = true;
      // New space reads as zeros, whatever the outcome; the model covers it
      // before the attempt, as a crash may keep the new size.
      model.Grow(g.grown_size);
      Status s = image.Resize(g.grown_size, false);
      Trace(thread, "resize", g.grown_size, 0, s);
      if (s.ok()) stripe.end = g.grown_size;
    } else {
      // Overwrite in place what is likely allocated already.
      uint32_t id = model.Begin(Fill::kPattern, off, std::min<uint64_t>(len, 4096));
      uint64_t n = std::min<uint64_t>(len, 4096);
      buf.resize(n);
      FillBytes(Fill::kPattern, id, off, buf);
      Status s = image.Write(off, std::span<const uint8_t>(buf.data(), n), {});
      model.End(id, s.ok());
      Trace(thread, "overwrite", off, n, s);
    }
  }
}

}  // namespace

const Geometry& GeometryFor(uint64_t workload_seed) {
  return kGeometries[workload_seed % kGeometryCount];
}

int ThreadsFor(uint64_t workload_seed) {
  // One workload in five is concurrent, with 2-4 threads.
  // THINDISK_CRASH_THREADS=n forces n threads (to tell races from ordering bugs).
  if (const char* t = getenv("THINDISK_CRASH_THREADS")) return std::max(1, atoi(t));
  uint64_t h = Mix(workload_seed ^ 0x5bd1e995);
  return h % 5 == 0 ? 2 + int(h / 5 % 3) : 1;
}

uint64_t CacheBytesFor(uint64_t workload_seed) {
  const Geometry& g = GeometryFor(workload_seed);
  return Mix(workload_seed) % 2 == 0 ? 8 * uint64_t(g.cluster_size) : 4ull << 20;
}

std::vector<BitmapSpec> BitmapsFor(uint64_t workload_seed) {
  const Geometry& g = GeometryFor(workload_seed);
  if (g.version < 3) return {};
  // None, one or two; the finest granularity qemu allows (512 bytes) and
  // a coarse one, so a change inside a granule and one across several are
  // both seen.
  const uint64_t h = Mix(workload_seed ^ 0xb17b17);
  switch (h % 3) {
    case 0: return {};
    case 1: return {{"bm0", 9 + uint32_t(h / 3 % 8)}};
    default: return {{"bm0", 9}, {"bm1", 16}};
  }
}

uint64_t MarkAheadFor(uint64_t workload_seed) {
  // Mostly one granule (every mark its own), sometimes 8 KiB, sometimes the
  // default (the whole small disk at once).
  switch (Mix(workload_seed ^ 0xa4ead) % 4) {
    case 0: return 8192;
    case 1: return 0;
    default: return 512;
  }
}

qcow2::CreateOptions CreateOptionsFor(const Geometry& g) {
  qcow2::CreateOptions o;
  o.size = g.size;
  o.cluster_size = g.cluster_size;
  o.extended_l2 = g.extended_l2;
  o.refcount_bits = g.refcount_bits;
  o.version = g.version;
  o.compression_type = g.compression;
  if (g.backing_size) {
    o.backing_file = "base";
    o.backing_format = "raw";
  }
  return o;
}

const std::vector<uint8_t>& BackingBytes(const Geometry& g) {
  static const auto* all = [] {
    auto* v = new std::vector<std::vector<uint8_t>>(kGeometryCount);
    for (int i = 0; i < kGeometryCount; ++i) {
      (*v)[i].resize(kGeometries[i].backing_size);
      FillBytes(Fill::kPattern, 0, 0, (*v)[i]);  // id 0: no request has it
    }
    return v;
  }();
  return (*all)[&g - kGeometries];
}

void RunWorkload(uint64_t seed, qcow2::Image& image, ContentModel& model,
                 const std::function<bool()>& stop) {
  const int threads = ThreadsFor(seed);
  const uint64_t size = image.size();
  if (threads == 1) {
    RunThread(seed, 0, kRequestsPerWorkload, {0, size}, true, image, model, stop);
    return;
  }
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    Stripe s{size * uint64_t(t) / uint64_t(threads), size * uint64_t(t + 1) / uint64_t(threads)};
    pool.emplace_back([&, t, s] {
      RunThread(seed, t, kRequestsPerWorkload / threads + 4, s, false, image, model, stop);
    });
  }
  for (auto& th : pool) th.join();
}

}  // namespace thindisk::crash
