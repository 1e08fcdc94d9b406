// The pieces of a READ's reply that the reader's paths share (the pool's,
// the ring's and the prefetch's): a structured READ's data and hole runs,
// and the chunks that carry them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "block/device.h"
#include "nbd/async_reads.h"
#include "nbd/connection.h"
#include "nbd/transmission_codec.h"

namespace thindisk::nbd {

// One piece of a structured READ reply.
struct Segment {
  uint64_t offset;
  uint32_t length;
  bool hole;  // reads as zeros: sent as OFFSET_HOLE
};

// The data and zero runs of a read plan for [offset, offset + length):
// its zero pieces are holes; neighbours of one kind are merged.
std::vector<Segment> PlanSegments(uint64_t offset, const block::ReadPlan& plan);

bool AnyData(const std::vector<Segment>& segments);

// Whether the ring can read every data piece of `plan` (each names a host
// file with a plain descriptor).
bool RingCanRead(const block::ReadPlan& plan);

// The ring's reads of `plan` into `data`, the READ's buffer. Its zero
// pieces are zeroed in `data`, unless `chunked` (a chunked reply sends
// them as holes, never their bytes).
std::vector<AsyncReads::HostRead> HostReads(const block::ReadPlan& plan,
                                            std::span<uint8_t> data, bool chunked);

// A structured READ's reply: an OFFSET_HOLE chunk per hole, an OFFSET_DATA
// chunk per data run (its bytes in `data` at their offset in the request),
// DONE on the last.
OutgoingReply ChunkedReply(const Request& r, const std::vector<Segment>& segments,
                           PayloadBuffer data);

}  // namespace thindisk::nbd
