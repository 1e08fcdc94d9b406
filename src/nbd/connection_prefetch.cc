// Prefetching for a client that reads in order, one request at a time.
//
// Such a client (a restore, a copy, a guest reading a file at QD1) waits
// for each reply before it asks for the next range, and a cold range read
// around the page cache (io/posix_storage.h) is not read ahead by the
// kernel: the disk's time and the reply's time then add up, where a file
// read through the page cache overlaps them (W7 at QD1: 0.8 GB/s against
// nbdkit's 1.5 GB/s on a host whose page cache is cheap). So once a lone
// client (Connection::lone_requests_) has read kReadsInOrder ranges each
// starting where the last ended, the reader plans the range after the
// READ it is serving, of the same length, and hands its host reads to the
// ring; the READ for it is answered from that buffer.
//
// The prefetch is good only if the data cannot have changed since before
// its host reads began: it is planned only when every change to the
// export that began has ended (DataChanges, counted by every connection
// around WRITE, WRITE_ZEROES and TRIM), and used only when no change has
// begun since. A READ of another range or a change from this connection
// drops it first (a FLUSH, BLOCK_STATUS or CACHE between leaves it).
//
// It counts in the connection's flow control as one request of its
// length, and is made only while a READ as large could still be admitted
// beside it, so a READ never waits for room the prefetch holds.
#include <algorithm>
#include <utility>

#include "nbd/connection.h"
#include "nbd/read_reply.h"

namespace thindisk::nbd {
namespace {

// A range is read ahead after this many READs in order, each of
// kMinPrefetch to kMaxPrefetch bytes (smaller ones are read through the
// page cache, which reads ahead itself; larger ones keep the disk busy on
// their own).
constexpr size_t kReadsInOrder = 2;
constexpr uint32_t kMinPrefetch = 256u << 10;
constexpr uint32_t kMaxPrefetch = 2u << 20;

}  // namespace

struct Connection::Prefetch {
  uint64_t offset = 0;
  uint32_t length = 0;
  bool chunked = false;        // answers a structured READ without DF
  uint64_t changes_begun = 0;  // the export's DataChanges::begun when planned
  std::shared_ptr<PayloadBuffer> data;
  std::vector<Segment> segments;
  // Set when its host reads are done.
  bool done = false;
  Status status;
  // The READ it answers, once it came (answered when the reads are done),
  // or dropped (its room given back when the reads are done).
  bool claimed = false;
  Request request{};
  size_t request_cost = 0;
  bool dropped = false;
};

void Connection::KeepPrefetchFor(const Request& r) {
  if (!prefetch_) return;
  if (r.type == kCmdRead && r.offset == prefetch_->offset &&
      r.length == prefetch_->length)
    return;
  // What changes no data and takes no payload room leaves it for the READ
  // after it (a reader that asks for block status or flushes between its
  // reads); the request slot it needs is there beside the prefetch's.
  if (r.type == kCmdFlush || r.type == kCmdBlockStatus || r.type == kCmdCache) return;
  DropPrefetch();
}

void Connection::DropPrefetch() {
  if (!prefetch_) return;
  std::shared_ptr<Prefetch> p = std::move(prefetch_);
  Count(options_.prefetch_counters, &PrefetchCounters::dropped);
  if (p->done) {
    Release(p->length);
  } else {
    p->dropped = true;  // its completion gives the room back
  }
}

bool Connection::AnswerFromPrefetch(const Request& r, size_t cost) {
  if (!prefetch_) return false;
  const bool chunked = structured_ && !(r.flags & kCmdFlagDf);
  Prefetch& p = *prefetch_;
  // A failed read is left to the READ's own path, which answers its error.
  if (r.offset != p.offset || r.length != p.length || chunked != p.chunked ||
      export_->changes->begun.load() != p.changes_begun || (p.done && !p.status.ok())) {
    DropPrefetch();
    return false;
  }
  std::shared_ptr<Prefetch> taken = std::move(prefetch_);
  Count(options_.prefetch_counters, &PrefetchCounters::used);
  taken->claimed = true;
  taken->request = r;
  taken->request_cost = cost;
  if (!taken->done) {
    // Out like a ring READ: the reader does not spin for the next request
    // before this reply is sent.
    on_pool_.fetch_add(1, std::memory_order_acq_rel);
    return true;  // answered by its completion
  }
  AnswerPrefetched(*taken);
  return true;
}

void Connection::AnswerPrefetched(Prefetch& p) {
  const Request& r = p.request;
  OutgoingReply reply =
      ReadDoneReply(r, p.status, p.chunked, p.segments, std::move(*p.data));
  Release(p.length);
  Answer(std::move(reply), p.request_cost);
}

void Connection::PrefetchAfter(const Request& r) {
  reads_in_order_ = r.offset == next_read_ ? reads_in_order_ + 1 : 0;
  next_read_ = r.offset + r.length;
  if (!async_ || !options_.prefetch_reads || prefetch_) return;
  if (reads_in_order_ < kReadsInOrder || lone_requests_ < kLoneRequests) return;
  if (r.length < kMinPrefetch || r.length > kMaxPrefetch) return;
  const uint64_t offset = next_read_;
  const uint32_t length = r.length;
  if (offset > request_context_.export_size - length) return;
  // Only with no change to the export running: a change that began before
  // the plan and ends during the host reads could be read half done.
  const DataChanges& changes = *export_->changes;
  const uint64_t begun = changes.begun.load();
  if (changes.ended.load() != begun) return;
  if (!TryAdmitPrefetch(length)) return;
  Result<block::ReadPlan> plan = export_->device->PlanRead(offset, length);
  if (!plan.has_value() || !RingCanRead(*plan)) {
    Release(length);
    return;
  }
  auto p = std::make_shared<Prefetch>();
  p->offset = offset;
  p->length = length;
  p->chunked = structured_ && !(r.flags & kCmdFlagDf);
  p->changes_begun = begun;
  p->segments = PlanSegments(offset, *plan);
  if (!AnyData(p->segments)) {  // holes are answered without reading
    Release(length);
    return;
  }
  p->data = std::make_shared<PayloadBuffer>(length);
  std::vector<AsyncReads::HostRead> reads = HostReads(*plan, p->data->span(), p->chunked);
  auto pins = std::make_shared<block::ReadPlan>(std::move(*plan));
  async_->Add(reads, [this, p, pins](Status s) mutable {
    pins.reset();  // the host ranges are read: the engine may free them
    p->done = true;
    p->status = std::move(s);
    Count(options_.prefetch_counters, &PrefetchCounters::completed);
    if (p->dropped) {
      Release(p->length);
    } else if (p->claimed) {
      on_pool_.fetch_sub(1, std::memory_order_acq_rel);
      AnswerPrefetched(*p);
    }
  });
  prefetch_ = std::move(p);
  Count(options_.prefetch_counters, &PrefetchCounters::started);
}

bool Connection::TryAdmitPrefetch(size_t cost) {
  util::MutexLock lock(flow_mu_);
  if (inflight_requests_ + 2 > options_.max_inflight_requests) return false;
  if (inflight_bytes_ + 2 * cost > options_.max_inflight_bytes) return false;
  inflight_bytes_ += cost;
  ++inflight_requests_;
  return true;
}

}  // namespace thindisk::nbd
