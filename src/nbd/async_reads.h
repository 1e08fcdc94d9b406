// AsyncReads: one connection's READs carried out through an io_uring ring,
// many in flight from one thread.
//
// A pool thread per cold read costs a hand-off and a sleep and wake-up in
// the read itself; a ring lets the connection's reader thread submit the
// host reads of every pipelined READ in one system call (one storage
// notification for the batch) and reap their completions where it waits
// for the next request anyway. Measured by hand on this machine (4 KiB
// random reads of a cold 1 GiB file, 32 in flight): 14.5 us of CPU per
// read through 8 threads, 5 us through one ring (docs/performance.md).
//
// The reader thread does everything here: Add queues reads, Submit hands
// the queue to the kernel, Reap finishes what has completed and runs each
// READ's callback once all its reads are done. A short read (the host file
// ends early) and a read the ring gave back (EAGAIN, EINTR) are finished on
// the spot by the storage's own ReadAt, which reads the file's end as
// zeros; any other error fails that READ alone.
//
// Thread safety: one thread (the connection's reader) uses an instance.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "io/storage.h"
#include "util/status.h"

namespace thindisk::nbd {

class AsyncReads {
 public:
  // One host read: `dst.size()` bytes of `storage` at `offset`, through
  // its ReadFdFor() (a storage without one is read at once by ReadAt; a
  // direct read the kernel refuses is read again by ReadAt).
  struct HostRead {
    io::Storage* storage;
    uint64_t offset;
    std::span<uint8_t> dst;
  };
  // Called from Reap (or Add, when there is nothing to read) with the
  // first error of the READ's host reads, or OK.
  using Done = std::function<void(Status)>;

  // A ring of `entries` submission slots; nullptr where io_uring cannot be
  // set up (kernel, seccomp, memory): the caller then reads without it.
  static std::unique_ptr<AsyncReads> Create(unsigned entries = 256);
  virtual ~AsyncReads() = default;

  // Queues the reads of one READ; `done` runs once all have finished.
  // Submits early only when the queue is full.
  virtual void Add(std::span<const HostRead> reads, Done done) = 0;
  // Hands the queued reads to the kernel.
  virtual Status Submit() = 0;
  // Finishes the reads that have completed, running callbacks; with
  // `wait_ms` > 0 first waits that long at most for one to complete.
  virtual void Reap(int wait_ms) = 0;
  // Readable (poll) when completions wait to be reaped.
  virtual int fd() const = 0;
  // READs added and not yet done.
  virtual size_t pending() const = 0;
};

}  // namespace thindisk::nbd
