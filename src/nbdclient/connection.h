// nbdclient::Connection: one libnbd handle and the thread that drives it.
//
// Commands are issued from any thread (nbd_aio_* calls; libnbd makes each
// atomic) and the issuer sleeps until its own Request completes; the
// connection's event-loop thread polls the socket in the direction libnbd
// wants (plus an eventfd written after every command issued elsewhere,
// which may have changed that direction) and feeds readiness to libnbd,
// whose completion callbacks wake exactly the waiter they complete. So many
// requests are in flight on one connection, and a completion wakes one
// thread, not all of them.
//
// Every Request and every connection's state are guarded by one mutex that
// the owner (NbdStorage) passes in, so a waiter can wait for requests on
// several connections in turn. When a connection dies (the server went
// away), its waiting requests wake and see why (dead()), and later issues
// on it fail.
//
// A connection is made either in the foreground (Connect: the first one,
// whose errors the user sees) or in the background (ConnectInBackground:
// the extra connections of a multi-conn export, which join when the server
// takes them, so a server that accepts fewer connections than it advertises
// never stalls an open).
#pragma once

#include <libnbd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "util/result.h"

namespace thindisk::nbdclient {

class Connection;

// One command in flight. Completed by the event loop, waited for by the
// issuing thread; both under the shared mutex.
struct Request {
  Connection* conn = nullptr;
  bool done = false;
  int error = 0;
  // BLOCK_STATUS replies: (length, NBD_STATE_* flags) from `extents_from`.
  uint64_t extents_from = 0;
  std::vector<std::pair<uint32_t, uint32_t>> extents;
  std::condition_variable cv;
};

// The calling thread's last libnbd error, as "what: message", with a Code
// from its errno.
Status LibnbdError(const std::string& what);
Code CodeForErrno(int e);

class Connection {
 public:
  // `uri` names the export (for errors too); `mu` guards every Request and
  // this connection's state, and outlives the connection.
  Connection(std::string uri, std::mutex& mu);
  ~Connection();  // stops the loop, disconnects, fails what is still queued
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Connects (with the base:allocation context requested) and waits for
  // the handshake, then starts the event loop.
  Status Connect();

  // Starts connecting and returns at once; once the handshake is done the
  // loop calls `on_ready(*this)` (mu not held), which says whether to keep
  // the connection (false: it is closed and marked dead).
  Status ConnectInBackground(std::function<bool(Connection&)> on_ready);

  nbd_handle* handle() const { return h_; }
  const std::string& uri() const { return uri_; }

  // Issues one command: `issue(callback, request)` calls an nbd_aio_*
  // function on handle() and returns its result. The request completes by
  // the callback, or not at all if the connection dies first.
  Result<std::shared_ptr<Request>> Issue(
      const std::function<int64_t(nbd_completion_callback, Request*)>& issue);

  // REQUIRES: mu held. Commands issued and not yet completed.
  size_t in_flight() const { return in_flight_.size(); }
  // REQUIRES: mu held. Why the connection died; "" while it lives.
  const std::string& dead() const { return dead_; }
  // REQUIRES: `lock` holds mu. Waits up to `timeout` for the connection to
  // die (libnbd fails the commands in flight before the loop learns why).
  void WaitDead(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout) {
    died_.wait_for(lock, timeout, [&] { return !dead_.empty(); });
  }

 private:
  struct Holder;  // a completion callback's user data
  static int OnComplete(void* user_data, int* error);
  static void FreeHolder(void* user_data);

  Status Prepare();  // the handle, its options and the eventfd
  void Wake();
  void Loop();
  void MarkDead(std::string why);

  std::string uri_;
  std::mutex& mu_;
  nbd_handle* h_ = nullptr;
  int wake_fd_ = -1;
  std::thread loop_;
  std::function<bool(Connection&)> on_ready_;  // background connects only
  bool stop_ = false;                          // guarded by mu_
  std::string dead_;                           // guarded by mu_
  std::condition_variable died_;               // notified with dead_ set
  std::unordered_set<Request*> in_flight_;     // guarded by mu_
};

}  // namespace thindisk::nbdclient
