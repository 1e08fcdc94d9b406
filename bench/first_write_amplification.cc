// first_write_amplification: what a 4 KiB first write costs the host.
//
// DESIGN.md P1 / workload W2: 4 KiB random first writes (distinct, seeded)
// over the first `span` bytes (1 GiB) of a fresh `size` (4 GiB) image, then
// one Flush; with --flush-every N, also a Flush after every N writes (1: a
// database on a fresh disk, workload W8). For each configuration it prints
//   written/guest    = host bytes written (io::Storage::bytes_written, after
//                      creation) per guest byte written: write amplification
//   allocated/guest  = host bytes allocated (st_blocks, after creation) per
//                      guest byte written: what the thin disk really costs
// for thindisk's default qcow2 (128 KiB clusters, extended L2: 4 KiB
// subclusters), qemu's default qcow2 layout (64 KiB clusters, standard L2)
// and a raw file, the limit. The goal is written/guest <= 1.15 for the
// defaults (--max-amplification makes that an exit status).
//
// In-process through qcow2::Image on io::OpenFile storage, in a fresh
// directory under DIR (default /var/tmp: a real disk, not tmpfs).
//
// Usage: first_write_amplification [DIR] [--size BYTES] [--span BYTES]
//            [--writes N] [--seed N] [--flush-every N] [--max-amplification X]
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "io/storage.h"
#include "qcow2/image.h"
#include "util/result.h"
#include "util/status.h"

namespace thindisk::bench {
namespace {

constexpr uint64_t kBlock = 4096;

struct Options {
  std::string dir = "/var/tmp";
  uint64_t size = 4ull << 30;
  uint64_t span = 1ull << 30;
  uint64_t writes = 0;  // 0: one write per 64 KiB of span on average
  uint64_t seed = 1;
  uint64_t flush_every = 0;  // 0: one Flush after the last write only
  double max_amplification = 0;  // 0: report only
};

struct Config {
  const char* name;
  bool qcow2;
  uint32_t cluster_size;
  bool extended_l2;
};

struct Figures {
  uint64_t guest = 0;
  uint64_t written = 0;
  uint64_t allocated = 0;
};

// Distinct 4 KiB-aligned offsets in [0, span), in random order.
std::vector<uint64_t> FirstWriteOffsets(const Options& o) {
  uint64_t blocks = o.span / kBlock;
  uint64_t n = std::min<uint64_t>(o.writes ? o.writes : o.span / (64 << 10), blocks);
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<uint64_t> pick(0, blocks - 1);
  std::unordered_set<uint64_t> seen;
  std::vector<uint64_t> offsets;
  offsets.reserve(n);
  while (offsets.size() < n) {
    uint64_t b = pick(rng);
    if (seen.insert(b).second) offsets.push_back(b * kBlock);
  }
  return offsets;
}

Result<std::unique_ptr<io::Storage>> CreateFile(const std::string& path) {
  io::OpenOptions o;
  o.create = true;
  o.exclusive = true;
  return io::OpenFile(path, o);
}

// True after the writes after which --flush-every asks for a Flush.
bool FlushAfter(const Options& o, uint64_t writes_done) {
  return o.flush_every != 0 && writes_done % o.flush_every == 0;
}

Result<Figures> Run(const Config& c, const Options& o, const std::string& path,
                    const std::vector<uint64_t>& offsets) {
  std::vector<uint8_t> data(kBlock);
  TD_ASSIGN_OR_RETURN(std::unique_ptr<io::Storage> storage, CreateFile(path));
  Figures f;
  if (!c.qcow2) {
    TD_RETURN_IF_ERROR(storage->Resize(o.size));
    uint64_t written0 = storage->bytes_written();
    TD_ASSIGN_OR_RETURN(uint64_t allocated0, storage->AllocatedBytes());
    for (uint64_t off : offsets) {
      std::memset(data.data(), int(off / kBlock % 251 + 1), data.size());
      TD_RETURN_IF_ERROR(storage->WriteAt(off, data));
      f.guest += data.size();
      if (FlushAfter(o, f.guest / kBlock)) TD_RETURN_IF_ERROR(storage->Flush());
    }
    TD_RETURN_IF_ERROR(storage->Flush());
    f.written = storage->bytes_written() - written0;
    TD_ASSIGN_OR_RETURN(uint64_t allocated, storage->AllocatedBytes());
    f.allocated = allocated - allocated0;
    return f;
  }

  qcow2::CreateOptions co;
  co.size = o.size;
  co.cluster_size = c.cluster_size;
  co.extended_l2 = c.extended_l2;
  TD_RETURN_IF_ERROR(qcow2::Create(*storage, co));
  TD_RETURN_IF_ERROR(storage->Flush());
  uint64_t written0 = storage->bytes_written();
  TD_ASSIGN_OR_RETURN(uint64_t allocated0, storage->AllocatedBytes());
  TD_ASSIGN_OR_RETURN(std::unique_ptr<qcow2::Image> image,
                      qcow2::Image::Open(std::move(storage), qcow2::OpenOptions{}));
  for (uint64_t off : offsets) {
    std::memset(data.data(), int(off / kBlock % 251 + 1), data.size());
    TD_RETURN_IF_ERROR(image->Write(off, data));
    f.guest += data.size();
    if (FlushAfter(o, f.guest / kBlock)) TD_RETURN_IF_ERROR(image->Flush());
  }
  TD_RETURN_IF_ERROR(image->Flush());
  f.written = image->storage().bytes_written() - written0;
  TD_ASSIGN_OR_RETURN(uint64_t allocated, image->storage().AllocatedBytes());
  f.allocated = allocated - allocated0;
  TD_RETURN_IF_ERROR(image->Close());
  return f;
}

bool ParseU64(const char* text, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 0);
  if (errno || end == text) return false;
  uint64_t mult = 1;
  switch (*end) {
    case 'k': case 'K': mult = 1ull << 10; ++end; break;
    case 'm': case 'M': mult = 1ull << 20; ++end; break;
    case 'g': case 'G': mult = 1ull << 30; ++end; break;
    default: break;
  }
  if (*end) return false;
  *out = v * mult;
  return true;
}

int Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [DIR] [--size BYTES] [--span BYTES] [--writes N] [--seed N]\n"
               "          [--flush-every N] [--max-amplification X]   (sizes take k/M/G "
               "suffixes)\n",
               argv0);
  return 2;
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--size" || a == "--span" || a == "--writes" || a == "--seed" ||
        a == "--flush-every") {
      uint64_t* dst = a == "--size" ? &o.size : a == "--span" ? &o.span
                    : a == "--writes" ? &o.writes : a == "--seed" ? &o.seed : &o.flush_every;
      if (!(v = value()) || !ParseU64(v, dst)) return Usage(argv[0]);
    } else if (a == "--max-amplification") {
      if (!(v = value())) return Usage(argv[0]);
      o.max_amplification = std::strtod(v, nullptr);
    } else if (a.starts_with("-")) {
      return Usage(argv[0]);
    } else {
      o.dir = a;
    }
  }
  o.span = std::min(o.span, o.size) / kBlock * kBlock;
  if (o.span < kBlock) return Usage(argv[0]);

  std::string tmpl = o.dir + "/td-fwa-XXXXXX";
  if (!mkdtemp(tmpl.data())) {
    std::fprintf(stderr, "first_write_amplification: %s: %s\n", tmpl.c_str(), strerror(errno));
    return 1;
  }
  std::vector<uint64_t> offsets = FirstWriteOffsets(o);
  std::printf("%" PRIu64 " random 4 KiB first writes (seed %" PRIu64 ") over %" PRIu64
              " MiB of a %" PRIu64 " MiB image in %s, ",
              uint64_t(offsets.size()), o.seed, o.span >> 20, o.size >> 20, o.dir.c_str());
  if (o.flush_every == 0) {
    std::printf("one flush after the last\n");
  } else {
    std::printf("a flush after every %" PRIu64 " write%s\n", o.flush_every,
                o.flush_every == 1 ? "" : "s");
  }
  std::printf("%-38s %14s %14s %10s %14s %10s\n", "configuration", "guest bytes", "host written",
              "written/g", "host alloc", "alloc/g");

  const Config configs[] = {
      {"qcow2 128K clusters, extended L2", true, 128 << 10, true},
      {"qcow2 64K clusters (qemu's default)", true, 64 << 10, false},
      {"raw file (the limit)", false, 0, false},
  };
  int status = 0;
  for (const Config& c : configs) {
    std::string path = tmpl + "/image";
    Result<Figures> f = Run(c, o, path, offsets);
    std::filesystem::remove(path);
    if (!f) {
      std::fprintf(stderr, "first_write_amplification: %s: %s\n", c.name,
                   f.error().message().c_str());
      status = 1;
      continue;
    }
    double wa = double(f->written) / double(f->guest);
    double aa = double(f->allocated) / double(f->guest);
    std::printf("%-38s %14" PRIu64 " %14" PRIu64 " %10.3f %14" PRIu64 " %10.3f\n", c.name,
                f->guest, f->written, wa, f->allocated, aa);
    if (&c == &configs[0] && o.max_amplification > 0 && wa > o.max_amplification) {
      std::fprintf(stderr, "first_write_amplification: defaults write %.3f host bytes per guest "
                   "byte, over the limit %.3f\n", wa, o.max_amplification);
      status = 1;
    }
  }
  std::filesystem::remove_all(tmpl);
  return status;
}

}  // namespace
}  // namespace thindisk::bench

int main(int argc, char** argv) { return thindisk::bench::Main(argc, argv); }
