// The seeded workloads of the crash suite: image geometries and the
// requests run on them (tests/crash/crash_case.h runs them under faults).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "crash/content_model.h"
#include "qcow2/image.h"

namespace thindisk::crash {

struct Geometry {
  const char* name;
  uint32_t cluster_size;
  bool extended_l2;
  uint32_t refcount_bits;
  uint32_t version;
  qcow2::CompressionType compression;
  bool compress;          // issue WriteCompressed requests
  uint64_t backing_size;  // 0: no backing file
  uint64_t size;          // virtual size at creation
  uint64_t grown_size;    // a resize grows it to this (== size: never)
  uint64_t prefill = 0;   // written first, in 1 MiB requests (to outgrow the refcount table)
};

// The geometry a workload seed runs on, and how many threads it uses.
const Geometry& GeometryFor(uint64_t workload_seed);
int ThreadsFor(uint64_t workload_seed);
// The OpenOptions::cache_bytes for a seed: tiny caches make evictions
// (and the ordered flush they trigger) happen mid-request.
uint64_t CacheBytesFor(uint64_t workload_seed);

// The persistent bitmaps a workload's image has from the start (none on
// version 2 images): each enabled, with its granularity, and the
// mark-ahead the image is opened with (qcow2::OpenOptions::bitmap_mark_ahead),
// small for most seeds so a bitmap that misses a change is caught.
struct BitmapSpec {
  std::string name;
  uint32_t granularity_bits;
};
std::vector<BitmapSpec> BitmapsFor(uint64_t workload_seed);
uint64_t MarkAheadFor(uint64_t workload_seed);

// Create options for `g` (backing file "base", raw).
qcow2::CreateOptions CreateOptionsFor(const Geometry& g);
// The backing file's bytes (empty without backing); computed once, shared.
const std::vector<uint8_t>& BackingBytes(const Geometry& g);

// Runs the workload of `seed` on `image`, logging every request in
// `model`. Stops early once `stop()` returns true (a dead disk).
// Requests may fail (faults); their failures are logged, not returned.
void RunWorkload(uint64_t seed, qcow2::Image& image, ContentModel& model,
                 const std::function<bool()>& stop);

}  // namespace thindisk::crash
