#include "nbd/connection.h"

#include <poll.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>

#include "io/storage.h"
#include "nbd/fd_io.h"
#include "nbd/read_reply.h"
#include "util/endian.h"

namespace thindisk::nbd {
namespace {

// Bounds on the work one READ or BLOCK_STATUS request may cause: how many
// extents we ask the device for, and how many descriptors we send. Past
// them a READ sends the rest as data and BLOCK_STATUS answers a prefix
// (the spec allows both).
constexpr size_t kMaxExtentLookups = 4096;
constexpr size_t kMaxDescriptors = 1024;
// Read-ahead of the transmission phase: a client at queue depth 16 sends
// 16 small requests back to back, and one recv takes them all. Payloads
// larger than half of it are read straight into their own buffer.
constexpr size_t kReadAhead = 128u << 10;

// Splits [offset, offset + length) into data and zero runs, merging
// neighbours of one kind. On a GetStatus error the rest is data, which is
// always correct (the read then decides).
std::vector<Segment> MapSegments(block::Device& dev, uint64_t offset, uint32_t length) {
  std::vector<Segment> out;
  const uint64_t end = offset + length;
  uint64_t pos = offset;
  for (size_t lookups = 0; pos < end; ++lookups) {
    uint64_t len = end - pos;
    bool hole = false;
    if (lookups < kMaxExtentLookups) {
      Result<block::Extent> e = dev.GetStatus(pos, end - pos);
      if (e.has_value() && e->length > 0) {
        len = std::min(e->length, end - pos);
        hole = e->zero;
      }
    }
    if (!out.empty() && out.back().hole == hole) {
      out.back().length += uint32_t(len);
    } else {
      out.push_back({pos, uint32_t(len), hole});
    }
    pos += len;
  }
  return out;
}

uint32_t ContextFlags(uint32_t context_id, const block::Extent& e) {
  if (context_id == kBaseAllocationContextId)
    return (e.data ? 0 : kStateHole) | (e.zero ? kStateZero : 0);
  // qemu:allocation-depth: 0 unallocated, else the layer's depth + 1.
  return e.present ? e.depth + 1 : 0;
}

// One extent of context `id` at `pos`: its flags and length.
struct ContextExtent {
  uint32_t flags;
  uint64_t length;
};
Result<ContextExtent> LookupContext(const Export& exp, uint32_t id, uint64_t pos,
                                    uint64_t max_length) {
  if (id >= kFirstBitmapContextId) {
    TD_ASSIGN_OR_RETURN(block::DirtyBitmap::Run run,
                        exp.bitmaps[id - kFirstBitmapContextId]->RunAt(pos, max_length));
    return ContextExtent{run.dirty ? kStateDirty : 0, run.length};
  }
  TD_ASSIGN_OR_RETURN(block::Extent e, exp.device->GetStatus(pos, max_length));
  return ContextExtent{ContextFlags(id, e), e.length};
}

}  // namespace

Connection::Connection(int in_fd, int out_fd, const std::vector<Export>* exports,
                       WorkerPool* pool, int cancel_fd,
                       const std::atomic<bool>* shutting_down, ConnectionOptions options,
                       EnterTransmission enter_transmission)
    : in_fd_(in_fd),
      out_fd_(out_fd),
      transport_(std::make_unique<FdTransport>(in_fd, out_fd, cancel_fd)),
      exports_(exports),
      pool_(pool),
      cancel_fd_(cancel_fd),
      shutting_down_(shutting_down),
      options_(std::move(options)),
      enter_transmission_(std::move(enter_transmission)),
      busy_poll_(options_.busy_poll, options_.busy_poll_slots.get()) {}

Status Connection::Run() {
  Status s = Negotiate();
  if (s.ok() && export_) {
    writer_ = std::thread([this] { WriterLoop(); });
    // The ring only under a plain transport: the reader waits for the
    // client's bytes in poll() beside it (WaitForRequest), which a TLS
    // session holding decrypted bytes of its own would defeat.
    if (options_.async_reads && !tls_active_) async_ = AsyncReads::Create();
    s = Transmit();
    DrainAsync();
  }
  WaitIdle();
  StopWriter();
  // Cut by the server's shutdown (its requests drained first): the server's
  // own doing, no error to warn about. A client that hung up just before
  // the signal ends here too when the cancel wins the race with its end of
  // stream (serve.nbdinfo saw it on a loaded machine).
  const bool cut_at_shutdown =
      s.code() == Code::kBusy && shutting_down_ != nullptr && shutting_down_->load();
  if (!s.ok() && s.code() != Code::kNotFound && !cut_at_shutdown)
    Log("nbd: connection ended: " + s.message());
  return s.code() == Code::kNotFound ? Status::Ok() : s;
}

void Connection::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

Status Connection::ReadInto(std::vector<uint8_t>* buf, size_t need) {
  const size_t have = buf->size();
  if (need <= have) return Status::Ok();
  buf->resize(need);
  return transport_->ReadExact(std::span<uint8_t>(*buf).subspan(have));
}

Status Connection::Negotiate() {
  // 1. Greeting and client flags.
  TD_RETURN_IF_ERROR(transport_->WriteAll(EncodeGreeting()));
  std::vector<uint8_t> buf;
  TD_RETURN_IF_ERROR(ReadInto(&buf, kClientFlagsSize));
  TD_ASSIGN_OR_RETURN(Decoded<ClientFlags> flags, DecodeClientFlags(buf));
  TlsPolicy tls;
  tls.offered = options_.tls != nullptr;
  tls.required = tls.offered && options_.tls->mode() == TlsMode::kRequire;
  Negotiator negotiator(exports_, *flags.message, shutting_down_, tls);
  // 2. Options until one ends the haggling. The decoder says how many bytes
  //    it needs; an oversize length is refused on the header alone.
  for (;;) {
    buf.clear();
    Decoded<Option> d;
    for (;;) {
      Result<Decoded<Option>> r = DecodeOption(buf);
      if (!r.has_value()) {
        if (r.error().code() == Code::kOutOfRange && buf.size() >= kOptionHeaderSize) {
          // Tell the client why, then hang up: skipping up to 4 GiB of
          // option data for a client behaving like this is not worth it.
          (void)transport_->WriteAll(EncodeOptionError(LoadBe32(buf.data() + 8),
                                                    kRepErrTooBig, r.error().message()));
        }
        return r.error();
      }
      if (r->complete()) {
        d = std::move(*r);
        break;
      }
      TD_RETURN_IF_ERROR(ReadInto(&buf, r->need));
    }
    Negotiator::Step step = negotiator.Handle(*d.message);
    // The server counts sessions from here: ask before the reply that
    // starts transmission, so a refused client never sees it.
    if (step.next == Negotiator::Next::kTransmission && enter_transmission_ &&
        !enter_transmission_())
      return Status::Busy("dropped before transmission");
    Status wrote = step.reply.empty() ? Status::Ok() : transport_->WriteAll(step.reply);
    // After NBD_OPT_ABORT a client need not wait for the ack (proto.md):
    // one that hung up already (libnbd's nbdinfo --list does) ended the
    // session as it meant to, which is no error to log.
    if (step.next == Negotiator::Next::kClose)
      return Status::NotFound("client ended negotiation");
    TD_RETURN_IF_ERROR(wrote);
    if (step.next == Negotiator::Next::kTransmission) break;
    if (step.next == Negotiator::Next::kStartTls) {
      // Nothing read ahead survives: bytes the client sent after STARTTLS
      // are the TLS handshake's, or garbage to it, never plaintext options.
      TD_ASSIGN_OR_RETURN(transport_, options_.tls->Handshake(in_fd_, out_fd_, cancel_fd_));
      // A new negotiation inside TLS: nothing chosen before it survives.
      tls.active = true;
      tls_active_ = true;
      negotiator = Negotiator(exports_, *flags.message, shutting_down_, tls);
    }
  }
  // 3. Fix what transmission needs.
  export_ = &negotiator.chosen_export();
  structured_ = negotiator.structured_replies();
  contexts_ = negotiator.meta_contexts();
  request_context_.export_size = export_->device->size();
  request_context_.read_only = export_->effective_read_only();
  request_context_.transmission_flags = negotiator.transmission_flags();
  request_context_.structured_replies = structured_;
  request_context_.has_meta_contexts = contexts_.any();
  return Status::Ok();
}

bool Connection::RunInline(const Request& r) {
  // Nothing of ours is on the pool and no further request is buffered (a
  // low queue depth): nothing waits behind this request, and a hand-off
  // would only add two context switches.
  const bool alone = rpos_ == rend_ && on_pool_.load(std::memory_order_acquire) == 0;
  lone_requests_ = alone ? std::min(lone_requests_ + 1, kLoneRequests) : 0;
  // A flush may take long (a disk's sync, a remote store), and a request
  // the client pipelines behind one run here would wait for it. So only a
  // client that has sent its last requests one at a time, waiting for each
  // reply (a database's write and flush at QD1), gets its flushes run here:
  // for it the hand-off costs two wake-ups per flush (the worker's, then
  // this reader's for the next request) and nothing runs in parallel.
  if (r.type == kCmdFlush) return alone && lone_requests_ >= kLoneRequests;
  if (r.length > options_.inline_max_bytes) return false;
  if (alone) return true;
  // Pipelined: a cached write is cheaper here than on the pool (see
  // ConnectionOptions::inline_cached_writes); everything else runs in
  // parallel on the pool.
  return options_.inline_cached_writes && r.type == kCmdWrite && !(r.flags & kCmdFlagFua) &&
         !writes_slow_.load(std::memory_order_relaxed);
}

Status Connection::Transmit() {
  rbuf_.resize(kReadAhead);
  // Spinning looks at the socket itself, so not through a TLS session
  // (which may hold decrypted bytes already) nor on a pipe (--stdio).
  spin_ = options_.busy_poll.count() > 0 && !tls_active_ && IsSocket(in_fd_);
  for (;;) {
    // Reads may not poll cancel_fd_ while requests keep arriving.
    if (shutting_down_ != nullptr && shutting_down_->load()) return Status::Busy("cancelled");
    if (replies_lost_.load(std::memory_order_relaxed))
      return Status(Code::kIoError, "client stopped taking replies");
    // 1. Header: decoded, then validated once, here.
    TD_RETURN_IF_ERROR(Buffer(kRequestHeaderSize));
    Result<Decoded<Request>> d =
        DecodeRequest(std::span<const uint8_t>(rbuf_.data() + rpos_, kRequestHeaderSize));
    if (!d.has_value()) return d.error();  // bad magic: the stream is lost
    rpos_ += kRequestHeaderSize;
    const Request req = *d->message;
    if (req.type == kCmdDisc) return Status::NotFound("client disconnected");
    Verdict v = ValidateRequest(req, request_context_);
    const uint32_t wire_payload = WirePayloadLength(req);
    if (!v.ok()) {
      // 2a. Invalid: skip its payload to stay in sync, answer, go on.
      TD_RETURN_IF_ERROR(Drop(wire_payload));
      Admit(0);
      Send(ErrorReply(req, v.error, v.message), 0);
      continue;
    }
    // 2b. Valid: wait for room, read the payload, run it here or on a worker.
    const size_t cost = Cost(req);
    KeepPrefetchFor(req);
    Admit(cost);
    PayloadBuffer payload(wire_payload);
    Status s = TakeInto(payload.span());
    if (!s.ok()) {
      Release(cost);
      return s.code() == Code::kNotFound
                 ? Status(Code::kIoError, "client vanished mid-request")
                 : s;
    }
    Dispatch(req, std::move(payload), cost);
    if (req.type == kCmdRead) PrefetchAfter(req);
  }
}

void Connection::Dispatch(const Request& req, PayloadBuffer payload, size_t cost) {
  const bool run_inline = RunInline(req);
  if (req.type == kCmdRead && AnswerFromPrefetch(req, cost)) return;
  if (run_inline) {
    Send(Execute(req, payload.span()), cost);
    return;
  }
  if (req.type == kCmdRead && ReadAsync(req, cost)) return;
  on_pool_.fetch_add(1, std::memory_order_acq_rel);
  // std::function needs a copyable task: the buffer travels in a shared_ptr.
  pool_->Submit(
      [this, req, cost, p = std::make_shared<PayloadBuffer>(std::move(payload))] {
        OutgoingReply reply = Execute(req, p->span());
        on_pool_.fetch_sub(1, std::memory_order_acq_rel);
        Send(std::move(reply), cost);
      });
}

size_t Connection::Cost(const Request& r) const {
  return (r.type == kCmdRead || r.type == kCmdWrite) ? r.length : 0;
}

void Connection::Admit(size_t cost) {
  util::UniqueLock lock(flow_mu_);
  auto room = [&]() TD_REQUIRES(flow_mu_) {
    if (inflight_requests_ >= options_.max_inflight_requests) return false;
    return inflight_bytes_ == 0 || inflight_bytes_ + cost <= options_.max_inflight_bytes;
  };
  // Ring reads hold room that only this thread can give back (by reaping
  // them): wait on the ring while any are out, else on the workers.
  while (!room() && async_ && async_->pending() > 0) {
    lock.Unlock();
    (void)async_->Submit();
    ReapRing(/*wait_ms=*/10);
    lock.Lock();
  }
  while (!room()) flow_cv_.Wait(flow_mu_);
  inflight_bytes_ += cost;
  ++inflight_requests_;
}

void Connection::Release(size_t cost) {
  util::MutexLock lock(flow_mu_);  // notify under it, as in Enqueue
  inflight_bytes_ -= cost;
  --inflight_requests_;
  flow_cv_.NotifyAll();
}

void Connection::WaitIdle() {
  util::MutexLock lock(flow_mu_);
  while (inflight_requests_ != 0) flow_cv_.Wait(flow_mu_);
}

OutgoingReply Connection::Execute(const Request& r, std::span<const uint8_t> payload) {
  if (r.type == kCmdRead) return ExecuteRead(r);
  if (r.type == kCmdBlockStatus) return ExecuteBlockStatus(r);
  // Counted for prefetches (export.h): from before the data may change
  // until after it has.
  DataChanges& changes = *export_->changes;
  const bool changing =
      r.type == kCmdWrite || r.type == kCmdTrim || r.type == kCmdWriteZeroes;
  if (changing) changes.begun.fetch_add(1);
  Status s = ExecuteSimple(r, payload);
  if (changing) changes.ended.fetch_add(1);
  return s.ok() ? OkReply(r) : DeviceErrorReply(r, s);
}

Status Connection::ExecuteSimple(const Request& r, std::span<const uint8_t> payload) {
  block::Device& dev = *export_->device;
  const bool fua = r.flags & kCmdFlagFua;
  switch (r.type) {
    case kCmdWrite: {
      if (!options_.inline_cached_writes || fua)
        return dev.Write(r.offset, payload, block::WriteFlags{fua});
      const auto start = std::chrono::steady_clock::now();
      Status s = dev.Write(r.offset, payload, block::WriteFlags{fua});
      writes_slow_.store(std::chrono::steady_clock::now() - start > options_.slow_write,
                         std::memory_order_relaxed);
      return s;
    }
    case kCmdFlush:
      return dev.Flush();
    case kCmdTrim:
      TD_RETURN_IF_ERROR(dev.Discard(r.offset, r.length));
      return fua ? dev.Flush() : Status::Ok();
    case kCmdWriteZeroes: {
      block::ZeroFlags zf;
      zf.may_unmap = !(r.flags & kCmdFlagNoHole);
      zf.fast_only = r.flags & kCmdFlagFastZero;
      zf.fua = fua;
      return dev.WriteZeroes(r.offset, r.length, zf);
    }
    case kCmdCache:
      return Status::Ok();  // a hint; the device caches what it needs
    default:
      return Status::Internal("unexpected command after validation");
  }
}

OutgoingReply Connection::ExecuteRead(const Request& r) {
  block::Device& dev = *export_->device;
  // Simple replies, or DF: one piece of data, holes included as zeros.
  if (!structured_ || (r.flags & kCmdFlagDf)) {
    PayloadBuffer data(r.length);
    Status s = dev.Read(r.offset, data.span());
    if (!s.ok()) return DeviceErrorReply(r, s);
    return DataReply(r, std::move(data));
  }
  // Structured: zero runs become OFFSET_HOLE chunks. All data is read before
  // anything is queued, so the reply is all-or-error and the last chunk can
  // carry DONE.
  std::vector<Segment> segments = MapSegments(dev, r.offset, r.length);
  // Hole bytes of `data` stay unset: they are never sent.
  PayloadBuffer data(AnyData(segments) ? r.length : 0);  // all holes: nothing to buffer
  for (const Segment& seg : segments) {
    if (seg.hole) continue;
    Status s = dev.Read(seg.offset, data.span().subspan(seg.offset - r.offset, seg.length));
    if (!s.ok()) return DeviceErrorReply(r, s);
  }
  return ChunkedReply(r, segments, std::move(data));
}

OutgoingReply Connection::DataReply(const Request& r, PayloadBuffer data) const {
  OutgoingReply reply;
  if (structured_) {
    reply.AddHead(EncodeOffsetDataHeader(kReplyFlagDone, r.handle, r.offset, r.length));
  } else {
    reply.AddHead(EncodeSimpleReply(r.handle, 0));
  }
  reply.AddData(0, r.length);
  reply.SetData(std::move(data));
  return reply;
}

OutgoingReply Connection::ReadDoneReply(const Request& r, const Status& s, bool chunked,
                                        const std::vector<Segment>& segments,
                                        PayloadBuffer data) {
  if (!s.ok()) return DeviceErrorReply(r, s);
  if (chunked) return ChunkedReply(r, segments, std::move(data));
  return DataReply(r, std::move(data));
}

bool Connection::ReadAsync(const Request& r, size_t cost) {
  if (!async_) return false;
  // Whatever cannot be planned (compressed clusters, a table not in memory,
  // a device without plans, an error: ExecuteRead meets it again and
  // answers) goes to the pool.
  Result<block::ReadPlan> plan = export_->device->PlanRead(r.offset, r.length);
  if (!plan.has_value()) return false;
  if (!RingCanRead(*plan)) return false;
  // A structured READ without DF answers its zero pieces with hole chunks,
  // as ExecuteRead does; one that is all holes is answered here.
  const bool chunked = structured_ && !(r.flags & kCmdFlagDf);
  std::vector<Segment> segments;
  if (chunked) {
    segments = PlanSegments(r.offset, *plan);
    if (!AnyData(segments)) {
      Send(ChunkedReply(r, segments, PayloadBuffer(0)), cost);
      return true;
    }
  }
  auto data = std::make_shared<PayloadBuffer>(r.length);
  std::vector<AsyncReads::HostRead> reads = HostReads(*plan, data->span(), chunked);
  on_pool_.fetch_add(1, std::memory_order_acq_rel);
  auto pins = std::make_shared<block::ReadPlan>(std::move(*plan));
  async_->Add(reads, [this, r, cost, chunked, data, pins,
                      segments = std::move(segments)](Status s) mutable {
    pins.reset();  // the host ranges are read: the engine may free them
    OutgoingReply reply = ReadDoneReply(r, s, chunked, segments, std::move(*data));
    on_pool_.fetch_sub(1, std::memory_order_acq_rel);
    Answer(std::move(reply), cost);
  });
  return true;
}

OutgoingReply Connection::ExecuteBlockStatus(const Request& r) {
  const size_t max_descriptors = (r.flags & kCmdFlagReqOne) ? 1 : kMaxDescriptors;
  std::vector<uint32_t> ids;
  if (contexts_.base_allocation) ids.push_back(kBaseAllocationContextId);
  if (contexts_.allocation_depth) ids.push_back(kAllocationDepthContextId);
  for (size_t i : contexts_.bitmaps) ids.push_back(kFirstBitmapContextId + uint32_t(i));
  OutgoingReply reply;
  for (size_t c = 0; c < ids.size(); ++c) {
    std::vector<BlockDescriptor> descriptors;
    const uint64_t end = r.offset + r.length;
    uint64_t pos = r.offset;
    for (size_t lookups = 0; pos < end && lookups < kMaxExtentLookups; ++lookups) {
      Result<ContextExtent> e = LookupContext(*export_, ids[c], pos, end - pos);
      if (!e.has_value() || e->length == 0) {
        if (descriptors.empty()) {
          Status s = e.has_value() ? Status::Internal("empty extent") : e.error();
          return DeviceErrorReply(r, s);
        }
        break;  // answer the prefix we have
      }
      const uint32_t len = uint32_t(std::min(e->length, end - pos));
      const uint32_t flags = e->flags;
      if (!descriptors.empty() && descriptors.back().status == flags) {
        descriptors.back().length += len;
      } else if (descriptors.size() < max_descriptors) {
        descriptors.push_back({len, flags});
      } else {
        break;
      }
      pos += len;
    }
    const uint16_t done = c + 1 == ids.size() ? kReplyFlagDone : 0;
    reply.AddHead(EncodeBlockStatus(done, r.handle, ids[c], descriptors));
  }
  return reply;
}

OutgoingReply Connection::OkReply(const Request& r) const {
  OutgoingReply reply;
  reply.AddHead(EncodeSimpleReply(r.handle, 0));
  return reply;
}

OutgoingReply Connection::ErrorReply(const Request& r, uint32_t error,
                                     std::string_view message) const {
  OutgoingReply reply;
  // With structured replies, errors go in an error chunk with a message for
  // humans (and a READ must never get a simple reply).
  if (structured_) {
    reply.AddHead(EncodeErrorChunk(kReplyFlagDone, r.handle, error, message));
  } else {
    reply.AddHead(EncodeSimpleReply(r.handle, error));
  }
  return reply;
}

OutgoingReply Connection::DeviceErrorReply(const Request& r, const Status& s) {
  if (!device_error_logged_.exchange(true, std::memory_order_relaxed)) {
    Log("nbd: " + std::string(CommandName(r.type)) + " of " + std::to_string(r.length) +
        " bytes at " + std::to_string(r.offset) + " failed: " + s.message() +
        " (later failures on this connection go to the client only)");
  }
  return ErrorReply(r, NbdErrorFromStatus(s), s.message());
}

}  // namespace thindisk::nbd
