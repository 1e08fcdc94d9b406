// WriteBack: small writes held in memory and written back in batches, for a
// storage whose cost is per request rather than per byte. On RADOS one
// compound operation carries every held write to an object, so 4 KiB
// writes scattered over an object cost the OSD one operation, not one each
// (io/rados_storage.h).
//
// Acknowledging a write before it is stored is what a page cache does, and
// the io::Storage contract still holds: Flush drains the buffer first
// (Drain), so every write that completed before a Flush is stored when the
// Flush returns. A crash loses held writes that no flush covered, which the
// contract allows (docs/write-ordering.md: any subset of the writes since
// the last sync).
//
// What is held: byte runs that do not overlap (a newer write replaces the
// bytes it covers), in `dirty_`; while a batch is being written back it
// moves to `writing_`, and reads see writing_ then dirty_ on top of what the
// storage returns. One batch is written at a time (wb_mu_).
//
// When it is written back: a thread of its own starts a batch once `start`
// bytes are held or the oldest held byte is `max_age` old, and Drain writes
// everything at once. A writer waits while `limit` bytes are held, so the
// buffer holds at most about 2 x limit (dirty_ and writing_) plus one
// request per concurrent writer. An idle buffer's thread sleeps.
//
// Errors: a batch that fails leaves its bytes unstored. That error is
// sticky: Add and Drain return it from then on (a later Flush must not
// report success for writes that were lost), until the buffer is gone.
//
// Thread safety: every method may be called concurrently. Writes to
// overlapping ranges land in the order Add was called; a read racing with
// an overlapping write sees either (the io::Storage contract).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "util/mutex.h"
#include "util/status.h"
#include "util/thread_annotations.h"

namespace thindisk::io {

class WriteBack {
 public:
  // Held runs by offset: none overlap, and none is empty.
  using Extents = std::map<uint64_t, std::vector<uint8_t>>;
  // Stores one batch (called by one thread at a time; the runs stay valid
  // until it returns).
  using BatchWriter = std::function<Status(const Extents&)>;
  // Copies of held bytes a read must see, by offset.
  using Held = std::vector<std::pair<uint64_t, std::vector<uint8_t>>>;

  struct Limits {
    uint64_t start = uint64_t(4) << 20;   // bytes held before a batch starts
    uint64_t limit = uint64_t(16) << 20;  // bytes held before writers wait
    std::chrono::milliseconds max_age{1000};
  };

  explicit WriteBack(BatchWriter writer) : WriteBack(std::move(writer), Limits{}) {}
  WriteBack(BatchWriter writer, Limits limits);
  // Stops the thread. Held bytes are dropped: the owner drains first.
  ~WriteBack();
  WriteBack(const WriteBack&) = delete;
  WriteBack& operator=(const WriteBack&) = delete;

  // Holds a copy of `data` for `offset` (replacing held bytes it covers);
  // waits while `limit` bytes are held. The sticky error, if any, instead.
  Status Add(uint64_t offset, std::span<const uint8_t> data);

  // The held bytes inside [offset, offset + length), copied: taken before
  // the storage is read and laid over the result after (Apply), so a batch
  // finishing in between changes nothing.
  Held Collect(uint64_t offset, uint64_t length) const;
  static void Apply(const Held& held, uint64_t offset, std::span<uint8_t> buf);

  // For a write that goes to the storage directly (or a punch, a zero, a
  // shrink) over [offset, offset + length): waits for a batch in progress
  // and drops held bytes there, so none lands later over the new bytes.
  void Forget(uint64_t offset, uint64_t length);

  // Writes back everything held (after a batch in progress), then returns
  // the sticky error, or Ok.
  Status Drain();

  uint64_t held_bytes() const;

 private:
  // Writes back what dirty_ holds as one batch.
  void WriteBatchLocked() TD_REQUIRES(wb_mu_);
  void Run();

  const BatchWriter writer_;
  const Limits limits_;

  util::Mutex wb_mu_;  // one batch at a time; taken before mu_
  mutable util::Mutex mu_;
  util::CondVar work_cv_;   // the thread: something to write back
  util::CondVar space_cv_;  // writers: dirty_ was taken
  Extents dirty_ TD_GUARDED_BY(mu_);
  // Changed only with wb_mu_ held too, so the batch that holds wb_mu_
  // reads it without mu_ (WriteBatchLocked).
  Extents writing_ TD_GUARDED_BY(mu_);
  uint64_t dirty_bytes_ TD_GUARDED_BY(mu_) = 0;
  uint64_t writing_bytes_ TD_GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point dirty_since_ TD_GUARDED_BY(mu_);
  Status error_ TD_GUARDED_BY(mu_);  // the first failed batch
  bool stopping_ TD_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace thindisk::io
