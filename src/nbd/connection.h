// Connection: one NBD client session over a pair of file descriptors.
//
// A connection is just (in_fd, out_fd): a socket twice, stdin/stdout, or an
// accepted socket-activated socket; tests use a socketpair. Run() performs
// the handshake (negotiation.h) and then the transmission phase:
//
//  - the calling thread reads requests continuously, validates each once
//    (ValidateRequest) and answers invalid ones itself;
//  - valid requests run on the shared WorkerPool; each encodes its reply
//    and queues it as soon as it completes, so replies go out of order;
//  - one writer thread per connection sends queued replies (several per
//    writev when they pile up). Workers never block on a client's socket, so
//    a client that stops reading stalls only its own connection, not the
//    pool every connection shares. The queue's mutex is the connection's
//    write mutex: replies are never interleaved;
//  - at most max_inflight_bytes of READ/WRITE payload (and
//    max_inflight_requests requests) are in flight per connection, counted
//    from admission until the reply is written: the reader stops reading
//    until earlier requests finish, which bounds the memory one client can
//    pin (one request larger than the cap is admitted alone).
//
// Run() returns when the client disconnects (NBD_OPT_ABORT, NBD_CMD_DISC,
// EOF), the stream breaks (bad magic, oversize option, I/O error) or
// `cancel_fd` becomes readable (server shutdown), and only after every
// accepted request has been answered. It never closes the descriptors.
//
// Thread safety: Run() is called once, from one thread.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "nbd/export.h"
#include "nbd/negotiation.h"
#include "nbd/transmission_codec.h"
#include "nbd/worker_pool.h"

namespace thindisk::nbd {

struct ConnectionOptions {
  size_t max_inflight_bytes = 64u << 20;
  size_t max_inflight_requests = 128;
  // Receives one line per notable event (client gone, protocol violation).
  std::function<void(const std::string&)> log;
};

// An encoded reply waiting for the writer: small headers and, for READ,
// the data buffer, in wire order, so bulk data is never copied.
class OutgoingReply {
 public:
  void AddHead(std::span<const uint8_t> bytes);
  void SetData(std::vector<uint8_t> data) { data_ = std::move(data); }
  // A slice of the SetData buffer.
  void AddData(size_t offset, size_t length);
  // Appends iovecs that point into this reply (valid while it lives).
  void AppendIovecs(std::vector<iovec>* out) const;

 private:
  struct Piece {
    bool in_data;
    size_t offset;
    size_t length;
  };
  std::vector<uint8_t> head_;
  std::vector<uint8_t> data_;
  std::vector<Piece> pieces_;
};

class Connection {
 public:
  // `exports`, `pool` and `shutting_down` must outlive Run().
  Connection(int in_fd, int out_fd, const std::vector<Export>* exports, WorkerPool* pool,
             int cancel_fd, const std::atomic<bool>* shutting_down,
             ConnectionOptions options);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // OK when the client ended the session properly; otherwise why it ended.
  Status Run();

 private:
  Status Negotiate();
  Status Transmit();
  Status ReadInto(std::vector<uint8_t>* buf, size_t need);

  // Flow control.
  size_t Cost(const Request& r) const;
  void Admit(size_t cost);
  void Release(size_t cost);
  void WaitIdle();

  // Run on a worker: executes a valid request, returns its encoded reply.
  OutgoingReply Execute(const Request& r, std::vector<uint8_t> payload);
  OutgoingReply ExecuteRead(const Request& r);
  OutgoingReply ExecuteBlockStatus(const Request& r);
  Status ExecuteSimple(const Request& r, std::span<const uint8_t> payload);
  OutgoingReply OkReply(const Request& r) const;
  OutgoingReply ErrorReply(const Request& r, uint32_t error,
                           std::string_view message) const;

  // Reply queue and its writer thread.
  void Enqueue(OutgoingReply reply, size_t cost);
  void WriterLoop();
  void StopWriter();
  void Log(const std::string& line) const;

  const int in_fd_;
  const int out_fd_;
  const std::vector<Export>* exports_;
  WorkerPool* pool_;
  const int cancel_fd_;
  const std::atomic<bool>* shutting_down_;
  const ConnectionOptions options_;

  // Set by Negotiate(), read-only afterwards.
  const Export* export_ = nullptr;
  bool structured_ = false;
  MetaContexts contexts_;
  RequestContext request_context_;

  // The write mutex: guards the queue of replies waiting for the writer.
  std::mutex write_mu_;
  std::condition_variable write_cv_;
  std::deque<std::pair<OutgoingReply, size_t>>
      replies_;               // (reply, cost), guarded by write_mu_
  bool writer_stop_ = false;  // guarded by write_mu_
  std::thread writer_;
  bool write_failed_ = false;  // writer thread only

  std::mutex flow_mu_;
  std::condition_variable flow_cv_;
  size_t inflight_bytes_ = 0;     // guarded by flow_mu_
  size_t inflight_requests_ = 0;  // guarded by flow_mu_
};

}  // namespace thindisk::nbd
