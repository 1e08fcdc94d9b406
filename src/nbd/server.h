// The NBD server: named exports served over listeners and fd pairs.
//
// Two ways in:
//
//  1. RunServer(options, exports) — what `thindisk serve` calls. It opens
//     the listeners ServeOptions names, turns SIGINT/SIGTERM into a
//     graceful shutdown (and, with TLS, SIGHUP into a reload of its
//     credentials), serves until then (or until the one stdio client,
//     or with `once` the first client, is done) and returns the first error
//     flushing an export. Errors: kInvalidArgument for bad options or
//     exports, the listener's error when one cannot be opened.
//
//  2. Server — the same machinery for callers that manage listeners and
//     connections themselves (tests, embedders):
//
//       TD_ASSIGN_OR_RETURN(auto server, Server::Create(exports, {}));
//       TD_RETURN_IF_ERROR(server->ListenUnix(path));
//       std::thread t([&] { (void)server->Run(); });
//       ... server->RequestShutdown(); t.join();
//
// Every connection is a pair of file descriptors (connection.h): a client
// accepted from a listener, stdin/stdout, or a test's socketpair all take
// the same path. Requests from all connections run on one WorkerPool sized
// to the machine.
//
// Admission (docs/serve-limits.md): a connection is first *negotiating*
// (the NBD handshake), then an *established* session (transmission). The
// two are counted apart, so clients that never finish the handshake cannot
// take the sessions' places:
//  - max_connections caps established sessions. While they are all taken
//    the listeners are not polled (newcomers wait in the listen backlog),
//    and a client that finishes negotiating waits for a place before its
//    final reply (still subject to the handshake timeout).
//  - NegotiatingCap() caps connections negotiating at once. A newcomer that
//    finds them all taken evicts the oldest: its socket is shut down, its
//    thread sees end of stream and ends. Silent clients so push out only
//    each other, while a real client, which negotiates in milliseconds,
//    gets through; the server keeps accepting (draining the backlog) as
//    long as such evictions free places.
//  - handshake_timeout: a connection still negotiating that long after it
//    arrived is cut the same way, with a log line naming it.
// Evicting and timing out work by shutdown(2) on the connection's socket,
// so a connection whose in_fd is no socket (--stdio on pipes: a parent
// process, not a stranger) is exempt from both.
//
// Shutdown: RequestShutdown() only writes to an eventfd (and sets an atomic
// flag), so it may be called from any thread or from a signal handler. Run()
// then stops accepting, makes every connection stop reading, waits for
// every in-flight request to be answered (at most drain_timeout; then the
// sockets of connections still busy are shut down), joins the connections
// and flushes every export.
//
// Thread safety: Listen*/AddConnection/RequestShutdown may be called from
// any thread, before or during Run(); Run() is called once.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nbd/connection.h"
#include "nbd/export.h"
#include "nbd/worker_pool.h"
#include "util/mutex.h"
#include "util/result.h"
#include "util/thread_annotations.h"

namespace thindisk::nbd {

struct ServerOptions {
  size_t threads = 0;  // worker threads; 0: WorkerPool::kDefaultThreads (8)
  ConnectionOptions connection;
  bool once =
      false;  // stop after the first connection ends (qemu-nbd without --persistent)
  // At most this many established sessions (clients past the handshake)
  // at once (0: no limit). At the limit the server stops accepting; further
  // clients wait in the listen backlog until one leaves, as with qemu-nbd
  // --shared.
  size_t max_connections = 0;
  // At most this many connections still negotiating at once, counted apart
  // from max_connections; a newcomer past it evicts the oldest (see
  // Admission above). 0: max(kMinNegotiating, max_connections), and no
  // limit when max_connections is 0 either.
  size_t max_negotiating = 0;
  // A connection that has not reached transmission this long after it
  // arrived is dropped (0: never).
  std::chrono::milliseconds handshake_timeout{10000};
  // How long shutdown waits for connections to finish their in-flight
  // requests before cutting their sockets (a client that stops reading
  // replies would otherwise hold shutdown forever).
  std::chrono::milliseconds drain_timeout{30000};
  // Run() calls it (on its own thread) after RequestReload(): RunServer
  // re-reads the TLS credentials on SIGHUP through it.
  std::function<void()> reload;
};

// The smallest default negotiating cap: room for a burst of real clients
// (a 16-connection nbdcopy) even when max_connections is small.
inline constexpr size_t kMinNegotiating = 16;

class Server {
 public:
  // Errors (kInvalidArgument): no exports, an export without a device, two
  // exports with the same name.
  static Result<std::unique_ptr<Server>> Create(std::vector<Export> exports,
                                                ServerOptions options);
  // REQUIRES: Run() has returned or was never called. Ends any connection
  // added without Run() (after draining it).
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  Status ListenUnix(const std::string& path);
  // port 0 picks a free port; tcp_port() tells which.
  Status ListenTcp(const std::string& host, uint16_t port);
  // Asks Run() to call options.reload once; async-signal-safe, as
  // RequestShutdown().
  void RequestReload();
  // Serves an already-listening socket (socket activation); closes it at the end.
  Status AdoptListener(int fd);
  // Serves one client on (in_fd, out_fd) at once, on its own thread; it is
  // admitted like an accepted client (it may evict the oldest negotiating
  // connection). owns_fds: close them when the connection ends.
  void AddConnection(int in_fd, int out_fd, bool owns_fds);

  // Serves until RequestShutdown(); also returns when there are no
  // listeners and every connection has ended, and with `once` after the
  // first connection ends. Then drains and flushes (see above).
  Status Run();
  // Async-signal-safe.
  void RequestShutdown();

  uint16_t tcp_port() const { return tcp_port_.load(); }
  // The negotiating cap in force (0: none); see ServerOptions::max_negotiating.
  size_t NegotiatingCap() const;
  const std::vector<Export>& exports() const { return exports_; }

 private:
  struct Listener {
    int fd;
    std::string unix_path;  // unlinked at shutdown when set
  };
  // Where a connection is: negotiating -> established -> done, or
  // negotiating -> closing (cut by eviction or the handshake timeout; its
  // thread is ending) -> done.
  enum class Phase { kNegotiating, kEstablished, kClosing, kDone };
  struct ConnectionThread {
    std::thread thread;
    int in_fd = -1;
    int out_fd = -1;
    uint64_t number = 0;  // 1, 2, ... in order of arrival (log lines)
    std::string peer;     // DescribePeer(in_fd)
    std::chrono::steady_clock::time_point arrived;
    bool cuttable = false;  // in_fd is a socket: shutdown(2) wakes its reader
    // Guarded by mu_; changed only by SetPhase. Once kDone, the fds may be
    // closed.
    Phase phase = Phase::kNegotiating;
  };

  Server(std::vector<Export> exports, ServerOptions options, int shutdown_fd,
         int wake_fd);
  void AcceptFrom(int listen_fd);
  void ReapFinished(bool all);
  // The connection's EnterTransmission (connection.h): waits for a session
  // slot; false when the connection was cut meanwhile or shutdown began.
  bool EnterTransmission(ConnectionThread* c);
  void SetPhase(ConnectionThread* c, Phase phase) TD_REQUIRES(mu_);
  size_t Count(Phase phase) const TD_REQUIRES(mu_) { return in_phase_[size_t(phase)]; }
  bool SessionsFull() const TD_REQUIRES(mu_);
  // Shuts c's socket down and marks it closing; the line for the log goes
  // to *notes (logged once mu_ is released).
  void Cut(ConnectionThread* c, const std::string& why, std::vector<std::string>* notes)
      TD_REQUIRES(mu_);
  // Cuts every negotiating connection past handshake_timeout; returns the
  // milliseconds until the next one is due (-1: none).
  int ExpireHandshakes(std::vector<std::string>* notes) TD_REQUIRES(mu_);
  void Log(const std::vector<std::string>& notes) const;
  // Waits up to drain_timeout for connections to end, then cuts the
  // sockets of those that have not.
  void DrainConnections();
  Status FlushExports();

  const std::vector<Export> exports_;
  const ServerOptions options_;
  const int shutdown_fd_;  // eventfd: readable once shutdown is requested (never drained)
  // eventfd: the connections changed (one finished, one was added); Run()
  // reaps and recomputes what it polls and how long.
  const int wake_fd_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> reload_requested_{false};
  std::atomic<uint16_t> tcp_port_{0};
  WorkerPool pool_;

  util::Mutex mu_;
  std::vector<Listener> listeners_ TD_GUARDED_BY(mu_);
  std::list<ConnectionThread> connections_ TD_GUARDED_BY(mu_);  // in order of arrival
  size_t connections_started_ TD_GUARDED_BY(mu_) = 0;
  std::array<size_t, 4> in_phase_ TD_GUARDED_BY(mu_){};  // connections_ per Phase
  // Notified (under mu_) when a session slot frees, a connection is cut or
  // shutdown begins: what EnterTransmission waits for.
  util::CondVar slot_cv_;
};

// What `thindisk serve` asks for. With none of unix_socket, tcp, stdio and
// socket_activation set, the server listens on TCP tcp_host:tcp_port.
struct ServeOptions {
  std::string unix_socket;  // listen on this Unix socket path
  bool tcp = false;         // listen on TCP
  std::string tcp_host = "127.0.0.1";
  uint16_t tcp_port = 10809;       // the IANA NBD port
  bool stdio = false;              // serve one client on stdin/stdout, then return
  bool socket_activation = false;  // serve the LISTEN_FDS sockets (systemd)
  bool once = false;               // return after the first client disconnects
  bool handle_signals = true;      // SIGINT/SIGTERM shut down gracefully; SIGPIPE ignored
  size_t threads = 0;              // worker threads; 0: WorkerPool::kDefaultThreads (8)
  size_t max_connections = 0;      // established sessions at once; 0: no limit
  std::chrono::milliseconds handshake_timeout{10000};  // ServerOptions'; 0: none
  size_t max_inflight_bytes = 64u << 20;        // per connection
  bool inline_cached_writes = false;  // ConnectionOptions::inline_cached_writes
  bool async_reads = true;            // ConnectionOptions::async_reads
  std::chrono::microseconds busy_poll{BusyPoll::kDefaultBudget};  // ConnectionOptions'
  bool prefetch_reads = true;                   // ConnectionOptions::prefetch_reads
  std::function<void(const std::string&)> log;  // diagnostics; nullptr: silent
  // TLS: offered or required on every connection; SIGHUP re-reads its
  // credentials (logged through `log`).
  std::shared_ptr<TlsServer> tls;
  // Called once the listeners are open, before serving (pid files, tests).
  std::function<void(Server&)> on_ready;
};

Status RunServer(const ServeOptions& options, std::vector<Export> exports);

}  // namespace thindisk::nbd
