#include "nbd/server.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <set>

#include "nbd/fd_io.h"
#include "nbd/listener.h"

namespace thindisk::nbd {
namespace {

void Signal(int event_fd) {
  uint64_t one = 1;
  // Async-signal-safe; a full counter (impossible here) would still leave
  // the fd readable, which is all the pollers look at.
  ssize_t n = write(event_fd, &one, sizeof one);
  (void)n;
}

void Drain(int event_fd) {
  uint64_t count;
  ssize_t n = read(event_fd, &count, sizeof count);
  (void)n;
}

std::string Seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", double(ms.count()) / 1000);
  return buf;
}

}  // namespace

Result<std::unique_ptr<Server>> Server::Create(std::vector<Export> exports,
                                               ServerOptions options) {
  if (exports.empty()) return Status::InvalidArgument("no exports to serve");
  std::set<std::string> names;
  for (const Export& e : exports) {
    if (!e.device)
      return Status::InvalidArgument("export '" + e.name + "' has no device");
    if (e.name.size() > kMaxStringLength)
      return Status::InvalidArgument("export name longer than 4096 bytes");
    if (!names.insert(e.name).second)
      return Status::InvalidArgument("two exports named '" + e.name + "'");
  }
  int shutdown_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (shutdown_fd < 0 || wake_fd < 0) {
    int e = errno;
    if (shutdown_fd >= 0) close(shutdown_fd);
    if (wake_fd >= 0) close(wake_fd);
    return Status::FromErrno(e, "eventfd");
  }
  return std::unique_ptr<Server>(
      new Server(std::move(exports), std::move(options), shutdown_fd, wake_fd));
}

namespace {

// The server's connections share one limit on readers spinning at once.
ServerOptions WithSpinSlots(ServerOptions options) {
  if (!options.connection.busy_poll_slots)
    options.connection.busy_poll_slots =
        std::make_shared<BusyPoll::Slots>(BusyPoll::Slots::DefaultLimit());
  return options;
}

}  // namespace

Server::Server(std::vector<Export> exports, ServerOptions options, int shutdown_fd,
               int wake_fd)
    : exports_(std::move(exports)),
      options_(WithSpinSlots(std::move(options))),
      shutdown_fd_(shutdown_fd),
      wake_fd_(wake_fd),
      pool_(options_.threads) {}

Server::~Server() {
  RequestShutdown();
  {
    // Connections waiting for a session slot see shutting_down_ and end.
    util::MutexLock lock(mu_);
    slot_cv_.NotifyAll();
  }
  ReapFinished(/*all=*/true);
  util::MutexLock lock(mu_);
  for (const Listener& l : listeners_) {
    close(l.fd);
    if (!l.unix_path.empty()) unlink(l.unix_path.c_str());
  }
  close(shutdown_fd_);
  close(wake_fd_);
}

size_t Server::NegotiatingCap() const {
  if (options_.max_negotiating > 0) return options_.max_negotiating;
  if (options_.max_connections == 0) return 0;
  return std::max(kMinNegotiating, options_.max_connections);
}

Status Server::ListenUnix(const std::string& path) {
  TD_ASSIGN_OR_RETURN(int fd, nbd::ListenUnix(path));
  util::MutexLock lock(mu_);
  listeners_.push_back({fd, path});
  return Status::Ok();
}

Status Server::ListenTcp(const std::string& host, uint16_t port) {
  TD_ASSIGN_OR_RETURN(int fd, nbd::ListenTcp(host, port));
  Result<uint16_t> bound = BoundPort(fd);
  if (bound.has_value()) tcp_port_ = *bound;
  util::MutexLock lock(mu_);
  listeners_.push_back({fd, ""});
  return Status::Ok();
}

Status Server::AdoptListener(int fd) {
  if (fd < 0) return Status::InvalidArgument("bad listener fd");
  util::MutexLock lock(mu_);
  listeners_.push_back({fd, ""});
  return Status::Ok();
}

void Server::AddConnection(int in_fd, int out_fd, bool owns_fds) {
  std::string peer = DescribePeer(in_fd);  // syscalls: before taking mu_
  const bool cuttable = IsSocket(in_fd);
  std::vector<std::string> notes;
  {
    util::MutexLock lock(mu_);
    // 1. Make room: at the negotiating cap the oldest negotiator goes.
    //    Connections that cannot be cut (pipes) are passed over; if only
    //    they negotiate, the newcomer is admitted past the cap.
    const size_t cap = NegotiatingCap();
    if (cap > 0 && Count(Phase::kNegotiating) >= cap) {
      for (ConnectionThread& c : connections_) {
        if (c.phase != Phase::kNegotiating || !c.cuttable) continue;
        Cut(&c,
            "still negotiating when a new client arrived and " + std::to_string(cap) +
                " connections were negotiating",
            &notes);
        break;
      }
    }
    // 2. Start it.
    connections_.emplace_back();
    ConnectionThread* self = &connections_.back();  // std::list: stable address
    self->in_fd = in_fd;
    self->out_fd = out_fd;
    self->number = ++connections_started_;
    self->peer = std::move(peer);
    self->arrived = std::chrono::steady_clock::now();
    self->cuttable = cuttable;
    ++in_phase_[size_t(Phase::kNegotiating)];
    self->thread = std::thread([this, self, in_fd, out_fd, owns_fds] {
      {
        Connection conn(in_fd, out_fd, &exports_, &pool_, shutdown_fd_, &shutting_down_,
                        options_.connection,
                        [this, self] { return EnterTransmission(self); });
        (void)conn.Run();  // it logs why it ended
      }
      {
        // Closed under mu_ together with kDone, so Cut and DrainConnections
        // never shut down a descriptor number that has been reused.
        util::MutexLock l(mu_);
        if (owns_fds) {
          close(in_fd);
          if (out_fd != in_fd) close(out_fd);
        }
        if (self->phase == Phase::kEstablished) slot_cv_.NotifyAll();  // a slot freed
        SetPhase(self, Phase::kDone);
      }
      Signal(wake_fd_);
    });
  }
  Log(notes);
  Signal(wake_fd_);  // Run() recomputes its handshake deadline
}

bool Server::EnterTransmission(ConnectionThread* c) {
  util::MutexLock lock(mu_);
  // Finishing the handshake while every session slot is taken (several
  // clients were negotiating when the last slot went) waits for a slot.
  while (c->phase == Phase::kNegotiating && !shutting_down_.load() && SessionsFull())
    slot_cv_.Wait(mu_);
  if (c->phase != Phase::kNegotiating || shutting_down_.load()) return false;
  SetPhase(c, Phase::kEstablished);
  return true;
}

void Server::SetPhase(ConnectionThread* c, Phase phase) {
  --in_phase_[size_t(c->phase)];
  ++in_phase_[size_t(phase)];
  c->phase = phase;
}

bool Server::SessionsFull() const {
  return options_.max_connections > 0 &&
         Count(Phase::kEstablished) >= options_.max_connections;
}

void Server::Cut(ConnectionThread* c, const std::string& why,
                 std::vector<std::string>* notes) {
  // Not kDone, so the fds are still open (see the connection thread).
  (void)shutdown(c->in_fd, SHUT_RDWR);
  if (c->out_fd != c->in_fd) (void)shutdown(c->out_fd, SHUT_RDWR);
  SetPhase(c, Phase::kClosing);
  slot_cv_.NotifyAll();  // in case it waits for a session slot
  notes->push_back("nbd: connection " + std::to_string(c->number) + " from " + c->peer +
                   " dropped: " + why);
}

int Server::ExpireHandshakes(std::vector<std::string>* notes) {
  const std::chrono::milliseconds limit = options_.handshake_timeout;
  if (limit.count() <= 0) return -1;
  const auto now = std::chrono::steady_clock::now();
  int64_t next = -1;
  for (ConnectionThread& c : connections_) {
    if (c.phase != Phase::kNegotiating || !c.cuttable) continue;
    const auto due = c.arrived + limit;
    if (due <= now) {
      Cut(&c, "no NBD handshake within " + Seconds(limit), notes);
      continue;
    }
    // Rounded up, so the wake-up is never early.
    const int64_t ms = std::chrono::ceil<std::chrono::milliseconds>(due - now).count();
    next = next < 0 ? ms : std::min(next, ms);
  }
  return int(next);
}

void Server::Log(const std::vector<std::string>& notes) const {
  if (!options_.connection.log) return;
  for (const std::string& line : notes) options_.connection.log(line);
}

void Server::AcceptFrom(int listen_fd) {
  int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    // EAGAIN/ECONNABORTED: the client left already; EMFILE etc.: keep
    // serving the clients we have rather than exit.
    if (options_.connection.log && errno != EAGAIN && errno != ECONNABORTED)
      options_.connection.log("nbd: accept: " +
                              Status::FromErrno(errno, "accept").message());
    return;
  }
  AddConnection(fd, fd, /*owns_fds=*/true);
}

void Server::ReapFinished(bool all) {
  std::list<ConnectionThread> finished;
  {
    util::MutexLock lock(mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto next = std::next(it);
      if (all || it->phase == Phase::kDone)
        finished.splice(finished.end(), connections_, it);
      it = next;
    }
  }
  for (ConnectionThread& c : finished) c.thread.join();
  // Joined: each thread set kDone on its way out (under mu_).
  util::MutexLock lock(mu_);
  in_phase_[size_t(Phase::kDone)] -= finished.size();
}

Status Server::Run() {
  bool first_done = false;
  for (;;) {
    // 1. Decide whether to go on.
    std::vector<pollfd> fds = {{shutdown_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    int timeout_ms = -1;
    std::vector<std::string> notes;
    {
      util::MutexLock lock(mu_);
      const bool idle = connections_.empty();
      first_done = first_done || (connections_started_ > 0 && idle);
      if (shutting_down_.load()) break;
      if (listeners_.empty() && idle) break;
      if (options_.once && first_done) break;
      timeout_ms = ExpireHandshakes(&notes);
      // While every session slot is taken the listeners are not polled:
      // new clients wait in the backlog and a finished session (wake_fd_)
      // reopens them. Nor while as many cut connections are still ending
      // as may negotiate: that bounds the threads of connections that are
      // not sessions to twice the cap, and cut ones end within moments.
      const size_t cap = NegotiatingCap();
      const bool closing_full = cap > 0 && Count(Phase::kClosing) >= cap;
      if (!SessionsFull() && !closing_full)
        for (const Listener& l : listeners_) fds.push_back({l.fd, POLLIN, 0});
    }
    Log(notes);
    // 2. Wait for a client, a change in the connections, the next
    //    handshake deadline or shutdown.
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR)
      return Status::FromErrno(errno, "poll");
    if (fds[0].revents) break;
    if (fds[1].revents) {
      Drain(wake_fd_);
      ReapFinished(/*all=*/false);
      if (reload_requested_.exchange(false) && options_.reload) options_.reload();
    }
    for (size_t i = 2; i < fds.size(); ++i)
      if (fds[i].revents & POLLIN) AcceptFrom(fds[i].fd);
  }
  // 3. Shut down: stop accepting, make connections stop reading (they poll
  //    shutdown_fd_), wait for their in-flight requests, flush.
  RequestShutdown();
  {
    util::MutexLock lock(mu_);
    slot_cv_.NotifyAll();  // connections waiting for a session slot end
    for (const Listener& l : listeners_) {
      close(l.fd);
      if (!l.unix_path.empty()) unlink(l.unix_path.c_str());
    }
    listeners_.clear();
  }
  DrainConnections();
  ReapFinished(/*all=*/true);
  return FlushExports();
}

void Server::DrainConnections() {
  const auto deadline = std::chrono::steady_clock::now() + options_.drain_timeout;
  for (;;) {
    ReapFinished(/*all=*/false);
    const auto now = std::chrono::steady_clock::now();
    {
      util::MutexLock lock(mu_);
      if (connections_.empty()) return;
      if (now >= deadline) {
        for (const ConnectionThread& c : connections_) {
          if (c.phase == Phase::kDone) continue;
          (void)shutdown(c.in_fd, SHUT_RDWR);  // ENOTSOCK for pipes: nothing to cut
          (void)shutdown(c.out_fd, SHUT_RDWR);
        }
        return;
      }
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    pollfd p = {wake_fd_, POLLIN, 0};
    if (poll(&p, 1, int(std::min<int64_t>(left.count() + 1, 1000))) > 0) Drain(wake_fd_);
  }
}

void Server::RequestReload() {
  reload_requested_.store(true);
  Signal(wake_fd_);
}

void Server::RequestShutdown() {
  shutting_down_.store(true);
  Signal(shutdown_fd_);
}

Status Server::FlushExports() {
  Status first;
  std::set<const block::Device*> flushed;
  for (const Export& e : exports_) {
    if (!flushed.insert(e.device.get()).second) continue;
    Status s = e.device->Flush();
    if (!s.ok() && first.ok()) first = s.WithContext("flush export '" + e.name + "'");
  }
  return first;
}

// ---- RunServer ----

namespace {

std::atomic<Server*> g_signal_target{nullptr};

void OnShutdownSignal(int) {
  Server* s = g_signal_target.load();
  if (s) s->RequestShutdown();
}

void OnReloadSignal(int) {
  Server* s = g_signal_target.load();
  if (s) s->RequestReload();
}

// Installs the SIGINT/SIGTERM handlers (and SIGHUP's, with `reload`) and
// ignores SIGPIPE for its lifetime, restoring what was there before.
class SignalScope {
 public:
  SignalScope(Server* server, bool enabled, bool reload)
      : enabled_(enabled), reload_(enabled && reload) {
    if (!enabled_) return;
    g_signal_target.store(server);
    struct sigaction sa {};
    sa.sa_handler = OnShutdownSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
    if (reload_) {
      sa.sa_handler = OnReloadSignal;
      sigaction(SIGHUP, &sa, &old_hup_);
    }
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old_pipe_);
  }
  ~SignalScope() {
    if (!enabled_) return;
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGPIPE, &old_pipe_, nullptr);
    if (reload_) sigaction(SIGHUP, &old_hup_, nullptr);
    g_signal_target.store(nullptr);
  }

 private:
  bool enabled_;
  bool reload_;
  struct sigaction old_int_ {
  }, old_term_{}, old_pipe_{}, old_hup_{};
};

}  // namespace

Status RunServer(const ServeOptions& options, std::vector<Export> exports) {
  ServerOptions so;
  so.threads = options.threads;
  so.once = options.once;
  so.max_connections = options.max_connections;
  so.handshake_timeout = options.handshake_timeout;
  so.connection.max_inflight_bytes = options.max_inflight_bytes;
  so.connection.inline_cached_writes = options.inline_cached_writes;
  so.connection.async_reads = options.async_reads;
  so.connection.busy_poll = options.busy_poll;
  so.connection.prefetch_reads = options.prefetch_reads;
  so.connection.log = options.log;
  if (options.tls) {
    so.connection.tls = options.tls;
    so.reload = [tls = options.tls, log = options.log] {
      Status s = tls->Reload();
      if (!log) return;
      log(s.ok() ? "nbd: SIGHUP: TLS credentials reloaded"
                 : "nbd: SIGHUP: TLS credentials not reloaded, the old ones stay: " +
                       s.message());
    };
  }
  TD_ASSIGN_OR_RETURN(std::unique_ptr<Server> server,
                      Server::Create(std::move(exports), so));
  const bool any = !options.unix_socket.empty() || options.tcp || options.stdio ||
                   options.socket_activation;
  if (!options.unix_socket.empty())
    TD_RETURN_IF_ERROR(server->ListenUnix(options.unix_socket));
  if (options.tcp || !any)
    TD_RETURN_IF_ERROR(server->ListenTcp(options.tcp_host, options.tcp_port));
  if (options.socket_activation) {
    TD_ASSIGN_OR_RETURN(std::vector<int> fds, SocketActivationFds());
    if (fds.empty())
      return Status::InvalidArgument("socket activation: LISTEN_FDS is not set");
    for (int fd : fds) TD_RETURN_IF_ERROR(server->AdoptListener(fd));
  }
  SignalScope signals(server.get(), options.handle_signals, options.tls != nullptr);
  if (options.stdio)
    server->AddConnection(STDIN_FILENO, STDOUT_FILENO, /*owns_fds=*/false);
  if (options.on_ready) options.on_ready(*server);
  return server->Run();
}

}  // namespace thindisk::nbd
