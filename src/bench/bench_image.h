// Images for in-process runs: created fresh with a given qcow2 layout and
// opened through block::Open with a CountingStorage under every layer, so a
// workload can charge host writes to itself, and optionally a
// LatencyStorage under that (slow host storage, `bench --latency`).
//
// Thread safety: the functions are reentrant; the returned device follows
// block::Device.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "bench/counting_storage.h"
#include "block/device.h"
#include "qcow2/image.h"
#include "util/result.h"

namespace thindisk::bench {

// Creates `path` (which must not exist) as an empty qcow2 image per
// `options` and closes it. Errors name the path.
Status CreateQcow2(const std::string& path, const qcow2::CreateOptions& options);

// Opens the qcow2 image `path` read-write (with its backing chain), every
// layer's host file counted into `counters`. A non-zero `latency` makes
// every layer's host file slow: engine -> CountingStorage ->
// LatencyStorage -> file. The latency sits under the counter because it is
// a property of the host storage: the counter still sees exactly the
// requests the engine makes (the latency adds none and drops none), and
// counts a write only once the slow host has acknowledged it.
Result<std::unique_ptr<block::Device>> OpenCounted(const std::string& path,
                                                   std::shared_ptr<HostCounters> counters,
                                                   std::chrono::microseconds latency = {});

// Bytes the host has allocated for `path` (st_blocks * 512).
Result<uint64_t> AllocatedFileBytes(const std::string& path);

// A fresh directory "thindisk-bench-XXXXXX" under `parent`; removed with
// everything in it when the object dies (unless keep is set).
class ScratchDir {
 public:
  static Result<std::unique_ptr<ScratchDir>> Create(const std::string& parent);
  ~ScratchDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  void set_keep(bool keep) { keep_ = keep; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
  bool keep_ = false;
};

}  // namespace thindisk::bench
