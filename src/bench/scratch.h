// Scratch: where an in-process bench run makes its fresh images, opens
// them and removes them again. Two places:
//  - a local directory: a fresh "thindisk-bench-XXXXXX" directory under
//    the parent given (ScratchDir), images "KEY.qcow2" in it, opened with
//    the counting (and --latency) wrappers under every layer (OpenCounted);
//  - a RADOS pool, rados://POOL[?conf=PATH&id=CLIENT]: images
//    "td-bench-<pid>-KEY" in the pool, made as `thindisk create rados://`
//    makes them (io::CreateRados, then the qcow2 format through
//    io::OpenRados) and removed with io::RemoveRados. block::Open opens
//    rados:// layers itself (its open_file hook is for files only), so no
//    wrapper goes under them: host writes are the RadosStorage's own count
//    (the same bytes: WriteAt and ZeroRange), and a latency is refused
//    (kInvalidArgument: the pool's own latency is what is measured).
// Either way a workload reads host writes and allocated bytes from the top
// layer's storage (HostStorage), so it never needs to know which.
//
// Every image made and not yet removed is removed when the Scratch dies
// (error paths included) unless keep is set. An image must be closed
// before Remove or the destructor (a pool image's lock is its writer's).
//
// Thread safety: one Scratch per run, used from one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "bench/counting_storage.h"
#include "block/device.h"
#include "io/storage.h"
#include "qcow2/image.h"
#include "util/result.h"

namespace thindisk::bench {

class Scratch {
 public:
  virtual ~Scratch() = default;

  // The image's full name: a path, or rados://POOL/td-bench-PID-KEY?...
  virtual std::string Name(const std::string& key) const = 0;
  // What an overlay in this scratch records as its backing file to name
  // key's image: relative (the same directory, the same pool).
  virtual std::string BackingName(const std::string& key) const = 0;
  // Creates key's image (which must not exist) per `layout`, empty, closed.
  // Errors name the image.
  virtual Status CreateImage(const std::string& key,
                             const qcow2::CreateOptions& layout) = 0;
  // Opens key's image read-write as qcow2 through block::Open (with its
  // backing chain). `counters` is filled where the wrappers apply (local).
  virtual Result<std::unique_ptr<block::Device>> Open(
      const std::string& key, std::shared_ptr<HostCounters> counters,
      std::chrono::microseconds latency) = 0;
  // Removes key's image now, unless keep is set; best effort (space is what
  // matters, and the destructor tries again what failed here).
  virtual void Remove(const std::string& key) = 0;

  void set_keep(bool keep) { keep_ = keep; }
  bool keep() const { return keep_; }

 protected:
  bool keep_ = false;
};

// A Scratch in `where`: a rados:// pool name or a local parent directory.
// kInvalidArgument for an rbd: name (bench makes thindisk images, not RBD
// ones) and for a rados:// name that is not a pool's.
Result<std::unique_ptr<Scratch>> OpenScratch(const std::string& where);

// The two kinds, for callers (and tests) that know which they want.
Result<std::unique_ptr<Scratch>> NewScratchDir(const std::string& parent);
Result<std::unique_ptr<Scratch>> NewScratchPool(const std::string& pool_uri);

// The storage at the top of an image opened by Scratch::Open, whose
// bytes_written() and AllocatedBytes() are the host's figures for it.
// kInternal when `device` is not a qcow2 image.
Result<io::Storage*> HostStorage(block::Device& device);

}  // namespace thindisk::bench
