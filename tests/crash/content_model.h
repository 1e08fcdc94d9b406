// ContentModel: what every guest byte of an image under a crash workload
// may legitimately read as, for the crash suite (tests/crash/).
//
// Every request is logged with the time it started and completed (one
// global sequence) and whether it succeeded. A Flush that succeeded makes
// every request that completed before the Flush started durable. After a
// crash, a byte may read as:
//  - the value of the last durable successful request covering it (or the
//    initial content: zeros or backing data, if there is none), and
//  - the value of any request covering it that is not durable (completed
//    after the last durable point, still in flight, or failed) and that
//    ended after that last durable one.
// Nothing else: rule (b) (flushed writes read back exactly) and rule (c)
// (no byte that nobody wrote) of DESIGN.md, checked together.
//
// Values are computed, not stored: a request's bytes are a function of its
// id and the guest offset (ValueOf), so the model costs O(size) memory.
//
// Thread safety: Begin/End/flush logging may be called concurrently;
// Verify must not run concurrently with them.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace thindisk::crash {

enum class Fill : uint8_t {
  kPattern,       // incompressible pattern of the request id
  kCompressible,  // compressible pattern of the request id
  kZero,          // write_zeroes / discard
};

// The byte a request `id` with `fill` puts at guest offset `off`.
uint8_t ValueOf(Fill fill, uint32_t id, uint64_t off);
// Fills `out` with the bytes of request `id` at guest offsets [off, ...).
void FillBytes(Fill fill, uint32_t id, uint64_t off, std::span<uint8_t> out);

class ContentModel {
 public:
  // `initial` is what every byte reads as before any request (zeros past
  // its end): the backing data.
  // `initial` must outlive the model.
  ContentModel(uint64_t size, const std::vector<uint8_t>& initial);

  // Logs the start of a request; returns its id (>= 1).
  uint32_t Begin(Fill fill, uint64_t offset, uint64_t length);
  void End(uint32_t id, bool ok);
  // A flush (or a successful close): returns a token for FlushEnd.
  uint64_t FlushBegin();
  void FlushEnd(uint64_t token, bool ok);
  // A FUA request that succeeded: it is durable itself. (What else its
  // flush made durable is not assumed: that flush may have started before
  // other requests completed.)
  void MarkDurable(uint32_t id);

  // Compares `actual` (the image read from offset 0; it may be shorter
  // than the model when a resize did not survive) against the candidates.
  // Returns "" when it fits, else a description of the first mismatches.
  std::string Verify(std::span<const uint8_t> actual) const;

  uint64_t size() const { return size_; }
  // Grows the guest size the model covers (after a successful resize).
  void Grow(uint64_t new_size);

 private:
  struct Op {
    Fill fill;
    uint64_t offset;
    uint64_t length;
    uint64_t begin_seq;
    uint64_t end_seq;  // UINT64_MAX while in flight
    bool ok;
    bool fua_durable;
  };
  uint8_t Initial(uint64_t off) const { return off < initial_.size() ? initial_[off] : 0; }


  uint64_t size_;
  const std::vector<uint8_t>& initial_;
  mutable std::mutex mu_;
  uint64_t seq_ = 0;                // guarded by mu_
  std::vector<Op> ops_;             // guarded by mu_; index = id - 1
  uint64_t durable_point_ = 0;      // guarded by mu_: start seq of the last good flush
};

}  // namespace thindisk::crash
