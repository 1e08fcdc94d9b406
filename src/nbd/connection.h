// Connection: one NBD client session over a pair of file descriptors.
//
// A connection is just (in_fd, out_fd): a socket twice, stdin/stdout, or an
// accepted socket-activated socket; tests use a socketpair. It reads and
// writes them through a Transport (transport.h): the descriptors as they
// are, or the TLS session NBD_OPT_STARTTLS starts on them (tls.h). Run()
// performs the handshake (negotiation.h) and then the transmission phase:
//
//  - the calling thread (the reader) reads requests through a read-ahead
//    buffer (one recv often brings several requests), validates each once
//    (ValidateRequest) and answers invalid ones itself;
//  - a valid request runs on the reader itself ("inline") when nothing of
//    this connection is running on the pool, no further request is waiting
//    in the read-ahead buffer, it is not a FLUSH and its length is at most
//    inline_max_bytes: no thread hand-off, which is what small requests at
//    low queue depth cost most. With inline_cached_writes, pipelined WRITEs
//    run on the reader too while writes stay fast (see the option).
//    Otherwise a READ the device can plan (block::Device::PlanRead) on
//    host files with plain descriptors goes to the connection's io_uring
//    ring (async_reads.h; ConnectionOptions::async_reads): the reader
//    submits the host reads of all pipelined READs before it waits for the
//    client again, and reaps their completions while it waits, sending the
//    replies itself. Anything else runs on the shared WorkerPool, so
//    pipelined requests still run in parallel. Replies go out in
//    completion order;
//  - whoever finishes a request sends its reply directly when the socket is
//    free, without blocking (MSG_DONTWAIT); a reply the socket does not take
//    whole, replies that find the socket busy, and every reply on a non-socket
//    out_fd go to a writer thread, which sends them (several per writev) with
//    blocking writes. So neither the pool nor the reader ever blocks on a
//    client's socket: a client that stops reading stalls only its own
//    connection. Only one thread writes to out_fd at a time (the `sending_`
//    token, taken under the write mutex): replies are never interleaved;
//  - at most max_inflight_bytes of READ/WRITE payload (and
//    max_inflight_requests requests) are in flight per connection, counted
//    from admission until the reply is written: the reader stops reading
//    until earlier requests finish, which bounds the memory one client can
//    pin (one request larger than the cap is admitted alone).
//
// Ordering: NBD lets replies go in any order; a FLUSH covers the writes
// whose replies were sent before it arrived, and those completed in the
// device before their reply, inline or not.
//
// Run() returns when the client disconnects (NBD_OPT_ABORT, NBD_CMD_DISC,
// EOF), the stream breaks (bad magic, oversize option, I/O error) or
// `cancel_fd` becomes readable (server shutdown), and only after every
// accepted request has been answered. It never closes the descriptors.
//
// Threads: while negotiating, a connection is its reader thread alone; the
// writer thread starts with transmission. An idle session (no request in
// flight) holds no WorkerPool thread: its reader waits in poll() and its
// writer on a condition variable.
//
// Thread safety: Run() is called once, from one thread.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "nbd/async_reads.h"
#include "nbd/busy_poll.h"
#include "nbd/export.h"
#include "nbd/negotiation.h"
#include "nbd/payload_buffer.h"
#include "nbd/tls.h"
#include "nbd/transmission_codec.h"
#include "nbd/transport.h"
#include "nbd/worker_pool.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace thindisk::nbd {

struct Segment;  // read_reply.h

// What became of a connection's prefetches (ConnectionOptions::prefetch_reads).
struct PrefetchCounters {
  std::atomic<uint64_t> started{0};    // host reads handed to the ring
  std::atomic<uint64_t> completed{0};  // their reads done
  std::atomic<uint64_t> used{0};       // answered the READ they were made for
  std::atomic<uint64_t> dropped{0};    // another request came, or the data changed
};

// Counts replies and the socket writes that carried them (tests).
struct ReplyCounters {
  std::atomic<uint64_t> replies{0};  // handed to Send, Answer or ReapRing
  std::atomic<uint64_t> writes{0};   // direct sends and the writer's batches
};

// Adds `n` to a counter of `counters`, when there are counters.
template <typename Counters>
void Count(const std::shared_ptr<Counters>& counters,
           std::atomic<uint64_t> Counters::*counter, uint64_t n = 1) {
  if (counters) (counters.get()->*counter).fetch_add(n, std::memory_order_relaxed);
}

struct ConnectionOptions {
  size_t max_inflight_bytes = 64u << 20;
  size_t max_inflight_requests = 128;
  // Largest READ/WRITE/WRITE_ZEROES/TRIM/BLOCK_STATUS length the reader runs
  // itself when the connection has nothing on the pool (0: never inline).
  size_t inline_max_bytes = 256u << 10;
  // Set when writes land in the host page cache (--cache=writeback or
  // unsafe): then a WRITE without FUA of at most inline_max_bytes also runs
  // on the reader when other requests are pipelined. The kernel serializes
  // buffered writers of one file on its inode lock, so running such writes
  // in parallel buys little, while handing each to the pool costs a wake-up
  // and two context switches (4 KiB writes at QD16: 0.5 context switches per
  // write fall to 0.03, and IOPS rise 10-30%; docs/performance.md).
  bool inline_cached_writes = false;
  // A write that took longer than this waited for something (a read from an
  // uncached backing file, dirty-page throttling): pipelined writes then go
  // to the pool, in parallel, until a write runs fast again.
  std::chrono::microseconds slow_write{200};
  // Receives one line per notable event (client gone, protocol violation).
  std::function<void(const std::string&)> log;
  // TLS (NBD_OPT_STARTTLS) when set: offered, or required (tls.h).
  std::shared_ptr<const TlsServer> tls;
  // READs that would go to the pool are planned (block::Device::PlanRead)
  // and read through an io_uring ring the reader submits and reaps
  // (async_reads.h), where the device can plan them, the transport is
  // plain and the kernel gives a ring; the rest still go to the pool.
  bool async_reads = true;
  // Before blocking for the client's next bytes, the reader spins this long
  // for them (busy_poll.h): at a low queue depth the CPU then stays awake
  // for a request that comes microseconds after the reply. 0: never. Not
  // under TLS or on a pipe.
  std::chrono::microseconds busy_poll{BusyPoll::kDefaultBudget};
  // How many readers of a server spin at once; nullptr: no limit.
  std::shared_ptr<BusyPoll::Slots> busy_poll_slots;
  // A lone client reading in order (READs of 256 KiB to 2 MiB, each where
  // the last ended) has its next range read through the ring while it
  // takes a reply, so the disk's time and the reply's overlap
  // (connection_prefetch.cc). Only with the ring.
  bool prefetch_reads = true;
  // Counts prefetches when set (tests).
  std::shared_ptr<PrefetchCounters> prefetch_counters;
  // Counts replies and writes when set (tests).
  std::shared_ptr<ReplyCounters> reply_counters;
};

// An encoded reply waiting to be sent: small headers and, for READ, the
// data buffer, in wire order, so bulk data is never copied.
class OutgoingReply {
 public:
  void AddHead(std::span<const uint8_t> bytes);
  void SetData(PayloadBuffer data) { data_ = std::move(data); }
  // A slice of the SetData buffer.
  void AddData(size_t offset, size_t length);
  // Appends iovecs that point into this reply (valid while it lives).
  void AppendIovecs(std::vector<iovec>* out) const;
  // Bytes on the wire.
  size_t size() const;

 private:
  struct Piece {
    bool in_data;
    size_t offset;
    size_t length;
  };
  std::vector<uint8_t> head_;
  PayloadBuffer data_;
  std::vector<Piece> pieces_;
};

class Connection {
 public:
  // Asked once negotiation has chosen an export, before the reply that
  // starts transmission is sent: true lets the session begin; false ends
  // it there, without that reply (the server dropped the connection while
  // it negotiated, or is shutting down). It may block (waiting for a
  // session slot). The server's seam for counting sessions (server.h).
  using EnterTransmission = std::function<bool()>;

  // `exports`, `pool` and `shutting_down` must outlive Run().
  // `enter_transmission` may be empty (always true).
  Connection(int in_fd, int out_fd, const std::vector<Export>* exports, WorkerPool* pool,
             int cancel_fd, const std::atomic<bool>* shutting_down,
             ConnectionOptions options, EnterTransmission enter_transmission = {});
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // OK when the client ended the session properly; otherwise why it ended.
  Status Run();

 private:
  Status Negotiate();
  Status Transmit();
  Status ReadInto(std::vector<uint8_t>* buf, size_t need);
  // Transmission-phase reads through the read-ahead buffer.
  Status Buffer(size_t need);
  Status TakeInto(std::span<uint8_t> out);
  Status Drop(uint64_t length);
  // Whether the reader runs `r` itself rather than the pool; counts
  // lone_requests_, so it is asked once per valid request.
  bool RunInline(const Request& r);

  // Flow control.
  size_t Cost(const Request& r) const;
  void Admit(size_t cost);
  void Release(size_t cost);
  void WaitIdle();

  // Reader only: runs a valid, admitted request here, from the prefetch,
  // on the ring or on the pool.
  void Dispatch(const Request& req, PayloadBuffer payload, size_t cost);
  // Run on a worker: executes a valid request, returns its encoded reply.
  OutgoingReply Execute(const Request& r, std::span<const uint8_t> payload);
  OutgoingReply ExecuteRead(const Request& r);
  // A READ's reply carrying `data` whole (simple, or one data chunk).
  OutgoingReply DataReply(const Request& r, PayloadBuffer data) const;
  // The reply to a READ whose host reads (into `data`) ended with `s`:
  // its error, its chunks (`chunked`: data and holes per `segments`), or
  // DataReply.
  OutgoingReply ReadDoneReply(const Request& r, const Status& s, bool chunked,
                              const std::vector<Segment>& segments, PayloadBuffer data);
  // Reader only: plans `r` and hands its host reads to the ring; false
  // when it cannot (the caller then runs it on the pool).
  bool ReadAsync(const Request& r, size_t cost);
  // Reader only: before blocking on the client, submits the ring's reads
  // and reaps their completions until the client's next bytes arrive.
  Status WaitForRequest();
  // Reader only: spins (busy_poll.h) until the client's next bytes are
  // there. Called for a lone client with nothing of it in flight.
  void SpinForRequest();
  // Reader only, on the way out: drops the prefetch and reaps every ring
  // read still out.
  void DrainAsync();
  // Prefetching (connection_prefetch.cc), reader only.
  struct Prefetch;
  // Before admitting `r`: drops the prefetch unless `r` is the READ it
  // was made for, or a request that leaves it (a FLUSH, BLOCK_STATUS or
  // CACHE).
  void KeepPrefetchFor(const Request& r);
  // Answers `r` (admitted with `cost`) from the prefetch: true, or false
  // when it cannot (the data changed since, or it is not `r`'s).
  bool AnswerFromPrefetch(const Request& r, size_t cost);
  // After the READ `r` is under way: for a lone client reading in order,
  // plans the range after it and hands its host reads to the ring.
  void PrefetchAfter(const Request& r);
  void DropPrefetch();
  // Sends the reply to the READ that claimed `p`, its reads done, and
  // gives the prefetch's room back.
  void AnswerPrefetched(Prefetch& p);
  // Admits a prefetch of `cost` bytes only when a READ as large could
  // still be admitted beside it; never waits.
  bool TryAdmitPrefetch(size_t cost);
  OutgoingReply ExecuteBlockStatus(const Request& r);
  Status ExecuteSimple(const Request& r, std::span<const uint8_t> payload);
  OutgoingReply OkReply(const Request& r) const;
  OutgoingReply ErrorReply(const Request& r, uint32_t error,
                           std::string_view message) const;
  // The reply to a request the device failed (not one the client got
  // wrong): logs the first such failure of the connection, so the operator
  // learns of a failing disk (EIO, ENOSPC, a fenced RADOS client) from the
  // server too; later ones only go to the client.
  OutgoingReply DeviceErrorReply(const Request& r, const Status& s);

  // Sending: directly when the socket is free, else through the writer.
  void Send(OutgoingReply reply, size_t cost);
  // Reader only: reaps the ring (AsyncReads::Reap) with the replies its
  // completions finish held, then sends them together in one write: a
  // client with several READs out then takes several replies per wake-up.
  void ReapRing(int wait_ms);
  // Reader only: a reply a ring completion finished; held while ReapRing
  // reaps, else sent.
  void Answer(OutgoingReply reply, size_t cost);
  void WriterLoop();
  void StopWriter();
  void Log(const std::string& line) const;

  const int in_fd_;
  const int out_fd_;
  // Plain until STARTTLS replaces it (negotiation, before the writer runs).
  std::unique_ptr<Transport> transport_;
  const std::vector<Export>* exports_;
  WorkerPool* pool_;
  const int cancel_fd_;
  const std::atomic<bool>* shutting_down_;
  const ConnectionOptions options_;
  const EnterTransmission enter_transmission_;

  // Set by Negotiate(), read-only afterwards.
  const Export* export_ = nullptr;
  bool structured_ = false;
  MetaContexts contexts_;
  RequestContext request_context_;

  bool tls_active_ = false;  // STARTTLS happened (Negotiate)
  // Ring reads (ReadAsync); reader thread only. Null without one.
  std::unique_ptr<AsyncReads> async_;
  // Spinning for requests (SpinForRequest); reader thread only. Set up in
  // Transmit: off under TLS and on anything but a socket.
  BusyPoll busy_poll_;
  bool spin_ = false;

  // The range read ahead for the next READ, and where the last READ
  // ended; reader only (connection_prefetch.cc).
  std::shared_ptr<Prefetch> prefetch_;
  uint64_t next_read_ = UINT64_MAX;
  size_t reads_in_order_ = 0;

  // Read-ahead of the transmission phase: bytes [rpos_, rend_) of rbuf_
  // are received but not consumed. Reader thread only.
  std::vector<uint8_t> rbuf_;
  size_t rpos_ = 0;
  size_t rend_ = 0;

  // Requests in a row that found nothing else of this connection in flight
  // or buffered (RunInline), up to kLoneRequests: at kLoneRequests the
  // client is taken to send one request at a time, and the reader spins for
  // its requests (WaitForRequest) and makes its flushes. Reader only.
  static constexpr size_t kLoneRequests = 8;
  size_t lone_requests_ = 0;

  // Requests of this connection queued or running on the pool.
  std::atomic<size_t> on_pool_{0};
  // The last timed write took longer than options_.slow_write.
  std::atomic<bool> writes_slow_{false};
  // A device failure was logged (DeviceErrorReply).
  std::atomic<bool> device_error_logged_{false};

  // The write mutex: guards the queue of replies waiting for the writer and
  // the right to write to out_fd_.
  util::Mutex write_mu_;
  util::CondVar write_cv_;
  struct Queued {
    OutgoingReply reply;
    size_t cost;
    size_t sent;  // bytes already written (a partial direct send)
  };
  std::deque<Queued> replies_ TD_GUARDED_BY(write_mu_);
  // Sends `batch` in order, in one write when the socket takes it all.
  void SendAll(std::vector<Queued> batch);
  // Replies held while ReapRing reaps; reader only.
  bool holding_ = false;
  std::vector<Queued> held_;
  bool sending_ TD_GUARDED_BY(write_mu_) = false;  // someone is writing to out_fd_
  bool writer_stop_ TD_GUARDED_BY(write_mu_) = false;
  bool write_failed_ TD_GUARDED_BY(write_mu_) = false;
  // Set with write_failed_: the reader stops taking requests whose replies
  // could never be sent (a vanished client's pipelined requests would
  // otherwise all still run, e.g. 2 GiB of reads behind 64 x 32 MiB).
  std::atomic<bool> replies_lost_{false};
  bool direct_ok_ TD_GUARDED_BY(write_mu_) = true;  // out_fd_ takes non-blocking sends
  std::thread writer_;

  util::Mutex flow_mu_;
  util::CondVar flow_cv_;
  size_t inflight_bytes_ TD_GUARDED_BY(flow_mu_) = 0;
  size_t inflight_requests_ TD_GUARDED_BY(flow_mu_) = 0;
};

}  // namespace thindisk::nbd
