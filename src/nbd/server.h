// The NBD server: named exports served over listeners and fd pairs.
//
// Two ways in:
//
//  1. RunServer(options, exports) — what `thindisk serve` calls. It opens
//     the listeners ServeOptions names, turns SIGINT/SIGTERM into a
//     graceful shutdown, serves until then (or until the one stdio client,
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

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nbd/connection.h"
#include "nbd/export.h"
#include "nbd/worker_pool.h"
#include "util/result.h"

namespace thindisk::nbd {

struct ServerOptions {
  size_t threads = 0;  // worker threads; 0: one per CPU (at least 2)
  ConnectionOptions connection;
  bool once =
      false;  // stop after the first connection ends (qemu-nbd without --persistent)
  // At most this many clients at once (0: no limit). At the limit the server
  // stops accepting; further clients wait in the listen backlog until one
  // leaves, as with qemu-nbd --shared.
  size_t max_connections = 0;
  // How long shutdown waits for connections to finish their in-flight
  // requests before cutting their sockets (a client that stops reading
  // replies would otherwise hold shutdown forever).
  std::chrono::milliseconds drain_timeout{30000};
};

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
  // Serves an already-listening socket (socket activation); closes it at the end.
  Status AdoptListener(int fd);
  // Serves one client on (in_fd, out_fd) at once, on its own thread.
  // owns_fds: close them when the connection ends.
  void AddConnection(int in_fd, int out_fd, bool owns_fds);

  // Serves until RequestShutdown(); also returns when there are no
  // listeners and every connection has ended, and with `once` after the
  // first connection ends. Then drains and flushes (see above).
  Status Run();
  // Async-signal-safe.
  void RequestShutdown();

  uint16_t tcp_port() const { return tcp_port_.load(); }
  const std::vector<Export>& exports() const { return exports_; }

 private:
  struct Listener {
    int fd;
    std::string unix_path;  // unlinked at shutdown when set
  };
  struct ConnectionThread {
    std::thread thread;
    int in_fd = -1;
    int out_fd = -1;
    bool done = false;  // guarded by mu_; once set, the fds may be closed
  };

  Server(std::vector<Export> exports, ServerOptions options, int shutdown_fd,
         int reap_fd);
  void AcceptFrom(int listen_fd);
  void ReapFinished(bool all);
  // Waits up to drain_timeout for connections to end, then cuts the
  // sockets of those that have not.
  void DrainConnections();
  Status FlushExports();

  const std::vector<Export> exports_;
  const ServerOptions options_;
  const int shutdown_fd_;  // eventfd: readable once shutdown is requested (never drained)
  const int reap_fd_;      // eventfd: a connection thread has finished
  std::atomic<bool> shutting_down_{false};
  std::atomic<uint16_t> tcp_port_{0};
  WorkerPool pool_;

  std::mutex mu_;
  std::vector<Listener> listeners_;          // guarded by mu_
  std::list<ConnectionThread> connections_;  // guarded by mu_
  size_t connections_started_ = 0;           // guarded by mu_
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
  size_t threads = 0;              // worker threads; 0: one per CPU
  size_t max_connections = 0;      // clients at once; 0: no limit
  size_t max_inflight_bytes = 64u << 20;        // per connection
  bool inline_cached_writes = false;  // ConnectionOptions::inline_cached_writes
  std::function<void(const std::string&)> log;  // diagnostics; nullptr: silent
  // Called once the listeners are open, before serving (pid files, tests).
  std::function<void(Server&)> on_ready;
};

Status RunServer(const ServeOptions& options, std::vector<Export> exports);

}  // namespace thindisk::nbd
