#include "nbdclient/connection.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace thindisk::nbdclient {

Code CodeForErrno(int e) {
  switch (e) {
    case ENOENT: return Code::kNotFound;
    case ENOSPC: case EDQUOT: case EFBIG: return Code::kNoSpace;
    case ENOTSUP: return Code::kNotSupported;
    case EROFS: case EPERM: case EACCES: return Code::kReadOnly;
    case EINVAL: return Code::kInvalidArgument;
    default: return Code::kIoError;
  }
}

Status LibnbdError(const std::string& what) {
  const char* msg = nbd_get_error();
  int e = nbd_get_errno();
  return Status(CodeForErrno(e), what + ": " + (msg != nullptr ? msg : "unknown libnbd error"), e);
}

// Keeps the Request alive until libnbd is done with the callback (its free
// function runs last, even when issuing failed), so a waiter that gave up
// on a dead connection leaves nothing dangling.
struct Connection::Holder {
  Connection* self;
  std::shared_ptr<Request> request;
};

Connection::Connection(std::string uri, std::mutex& mu) : uri_(std::move(uri)), mu_(mu) {}

Connection::~Connection() {
  if (loop_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    Wake();
    loop_.join();
  }
  if (h_ != nullptr) {
    if (nbd_aio_is_ready(h_) == 1) (void)nbd_shutdown(h_, 0);
    nbd_close(h_);  // retires whatever is still queued (FreeHolder)
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Status Connection::Prepare() {
  h_ = nbd_create();
  if (h_ == nullptr) return LibnbdError(uri_);
  if (nbd_supports_uri(h_) != 1) {
    return Status::NotSupported(uri_ + ": this libnbd was built without NBD URI support");
  }
  // Asked for before the handshake, for NextData/NextHole.
  if (nbd_add_meta_context(h_, LIBNBD_CONTEXT_BASE_ALLOCATION) == -1) return LibnbdError(uri_);
  // Read buffers are the caller's, and a failed read is an error: libnbd
  // need not zero them first (a memset of every byte read, 7% of a convert
  // off an export).
  if (nbd_set_pread_initialize(h_, false) == -1) return LibnbdError(uri_);
  // nbds:// URIs name their credentials as local files (tls-certificates=,
  // tls-psk-file=), which libnbd reads only when allowed; the URI is the
  // user's (or an image's backing name, which opens local files anyway).
  if (nbd_set_uri_allow_local_file(h_, true) == -1) return LibnbdError(uri_);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return Status::FromErrno(errno, uri_ + ": eventfd");
  return Status::Ok();
}

Status Connection::Connect() {
  TD_RETURN_IF_ERROR(Prepare());
  if (nbd_connect_uri(h_, uri_.c_str()) == -1) return LibnbdError(uri_);
  loop_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

Status Connection::ConnectInBackground(std::function<bool(Connection&)> on_ready) {
  TD_RETURN_IF_ERROR(Prepare());
  on_ready_ = std::move(on_ready);
  if (nbd_aio_connect_uri(h_, uri_.c_str()) == -1) return LibnbdError(uri_);
  loop_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

int Connection::OnComplete(void* user_data, int* error) {
  auto* holder = static_cast<Holder*>(user_data);
  std::lock_guard<std::mutex> lock(holder->self->mu_);
  Request& r = *holder->request;
  r.error = *error;
  r.done = true;
  holder->self->in_flight_.erase(&r);
  r.cv.notify_all();
  return 1;  // retire the command
}

void Connection::FreeHolder(void* user_data) {
  auto* holder = static_cast<Holder*>(user_data);
  {
    std::lock_guard<std::mutex> lock(holder->self->mu_);
    holder->self->in_flight_.erase(holder->request.get());
  }
  delete holder;
}

Result<std::shared_ptr<Request>> Connection::Issue(
    const std::function<int64_t(nbd_completion_callback, Request*)>& issue) {
  auto r = std::make_shared<Request>();
  r->conn = this;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!dead_.empty()) return Status(Code::kIoError, uri_ + ": " + dead_, ENOTCONN);
    in_flight_.insert(r.get());
  }
  nbd_completion_callback cb{&OnComplete, new Holder{this, r}, &FreeHolder};
  if (issue(cb, r.get()) == -1) {
    Status error = LibnbdError(uri_);
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.erase(r.get());
    return dead_.empty() ? error : Status(Code::kIoError, uri_ + ": " + dead_, ENOTCONN);
  }
  Wake();
  return r;
}

void Connection::Wake() {
  uint64_t one = 1;
  ssize_t n = ::write(wake_fd_, &one, sizeof one);
  (void)n;  // a full counter still wakes the loop
}

void Connection::Loop() {
  const int fd = nbd_aio_get_fd(h_);
  bool joined = !on_ready_;  // a foreground connection is ready already
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    if (!joined && nbd_aio_is_ready(h_) == 1) {
      joined = true;
      if (!on_ready_(*this)) return MarkDead("not used: it does not match the first connection");
    }
    unsigned dir = nbd_aio_get_direction(h_);
    pollfd fds[2] = {{fd, 0, 0}, {wake_fd_, POLLIN, 0}};
    if (dir & LIBNBD_AIO_DIRECTION_READ) fds[0].events |= POLLIN;
    if (dir & LIBNBD_AIO_DIRECTION_WRITE) fds[0].events |= POLLOUT;
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return MarkDead(std::string("poll: ") + std::strerror(errno));
    }
    if (fds[1].revents != 0) {
      uint64_t v;
      ssize_t n = ::read(wake_fd_, &v, sizeof v);
      (void)n;
    }
    const short ev = fds[0].revents;
    if (ev == 0) continue;
    dir = nbd_aio_get_direction(h_);
    int rc = 0;
    if ((dir & LIBNBD_AIO_DIRECTION_READ) && (ev & (POLLIN | POLLHUP | POLLERR))) {
      rc = nbd_aio_notify_read(h_);
    } else if ((dir & LIBNBD_AIO_DIRECTION_WRITE) && (ev & (POLLOUT | POLLHUP | POLLERR))) {
      rc = nbd_aio_notify_write(h_);
    } else if (ev & (POLLHUP | POLLERR | POLLNVAL)) {
      return MarkDead("the server closed the connection");
    }
    if (rc == -1) {
      const char* msg = nbd_get_error();
      return MarkDead(msg != nullptr ? msg : "the connection failed");
    }
    if (nbd_aio_is_dead(h_) == 1 || nbd_aio_is_closed(h_) == 1) {
      return MarkDead("the server closed the connection");
    }
  }
}

void Connection::MarkDead(std::string why) {
  std::lock_guard<std::mutex> lock(mu_);
  dead_ = std::move(why);
  died_.notify_all();
  for (Request* r : in_flight_) r->cv.notify_all();
}

}  // namespace thindisk::nbdclient
