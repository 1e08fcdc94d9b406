#include "io/rados_lock.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <random>

#include "io/rados_name.h"

namespace thindisk::io {
namespace {

// Enough attempts for a lock that changes hands while we look at it; each
// lost race means another client took the lock, which is then kBusy.
constexpr int kAcquireAttempts = 3;

std::string NewCookie() {
  char host[256] = "unknown";
  if (::gethostname(host, sizeof host - 1) != 0)
    std::snprintf(host, sizeof host, "unknown");
  std::random_device rd;
  const uint64_t r = (uint64_t(rd()) << 32) ^ rd();
  char buf[400];
  std::snprintf(buf, sizeof buf, "pid %d on host %s (%016llx)", int(::getpid()), host,
                static_cast<unsigned long long>(r));
  return buf;
}

// The global id of "client.4123", or -1.
int64_t ClientGid(const std::string& client) {
  constexpr std::string_view kPrefix = "client.";
  if (!client.starts_with(kPrefix)) return -1;
  char* end = nullptr;
  const long long gid = std::strtoll(client.c_str() + kPrefix.size(), &end, 10);
  return end && *end == '\0' ? gid : -1;
}

Result<std::vector<RadosLocker>> Lockers(librados::IoCtx& io, const std::string& uri,
                                         const std::string& oid) {
  int exclusive = 0;
  std::string tag;
  std::list<librados::locker_t> lockers;
  int ret = io.list_lockers(oid, kRadosLockName, &exclusive, &tag, &lockers);
  if (ret == -ENOENT) return std::vector<RadosLocker>{};
  if (ret < 0) return Status::FromErrno(-ret, uri + ": list the lockers of " + oid);
  std::list<obj_watch_t> watchers;
  ret = io.list_watchers(oid, &watchers);
  if (ret < 0 && ret != -ENOENT) {
    return Status::FromErrno(-ret, uri + ": list the watchers of " + oid);
  }
  std::vector<RadosLocker> out;
  for (const librados::locker_t& l : lockers) {
    RadosLocker r{l.client, l.cookie, l.address, false};
    const int64_t gid = ClientGid(l.client);
    for (const obj_watch_t& w : watchers) {
      if (w.watcher_id == gid) r.watching = true;
    }
    out.push_back(std::move(r));
  }
  return out;
}

// The payloads of a hand-over (Acquire with takeover).
constexpr std::string_view kReleaseRequest = "thindisk release-request 1";
constexpr std::string_view kReleaseAccepted = "accepted";

std::mutex handler_mu;
RadosReleaseHandler& Handler() {
  static auto* handler = new RadosReleaseHandler;
  return *handler;
}

std::string Text(librados::bufferlist& bl) {
  std::string s;
  if (bl.length() > 0) bl.begin().copy(bl.length(), s);
  return s;
}

// Asks `holder` to release the lock: a notify on the header that its watch
// answers (RadosLock::Watcher). OK when it accepted.
Status AskToRelease(librados::IoCtx& io, const std::string& uri, const std::string& oid,
                    const RadosLocker& holder) {
  librados::bufferlist request, reply;
  request.append(kReleaseRequest.data(), kReleaseRequest.size());
  const int ret = io.notify2(oid, request, 10000, &reply);
  if (ret < 0 && ret != -ETIMEDOUT) {
    return Status::FromErrno(-ret, uri + ": ask " + holder.ToString() + " to hand over");
  }
  std::vector<librados::notify_ack_t> acks;
  std::vector<librados::notify_timeout_t> timeouts;
  io.decode_notify_response(reply, &acks, &timeouts);
  for (librados::notify_ack_t& ack : acks) {
    if (int64_t(ack.notifier_id) != ClientGid(holder.client)) continue;
    if (Text(ack.payload_bl) == kReleaseAccepted) return Status::Ok();
    return Status(Code::kBusy,
                  uri + ": " + holder.ToString() +
                      " refused to hand the image over (only a thindisk serve whose one "
                      "export is this image can)",
                  EBUSY);
  }
  return Status(Code::kBusy,
                uri + ": " + holder.ToString() + " did not answer the hand-over request",
                EBUSY);
}

Status BusyError(const std::string& uri, const RadosLocker& holder) {
  return Status(Code::kBusy,
                uri + ": in use by " + holder.ToString() +
                    ": an image has one writer at a time (read-only opens are allowed; "
                    "thindisk lock ls shows the holder)",
                EBUSY);
}

// Blocklists `holder`, waits for the OSD map that says so, then breaks its
// lock: from then on no OSD accepts a request of the holder's client.
Status Fence(RadosCluster& cluster, librados::IoCtx& io, const std::string& uri,
             const std::string& oid, const RadosLocker& holder) {
  librados::Rados& rados = cluster.rados();
  int ret = rados.blocklist_add(holder.address, 0);  // 0: the cluster's default expiry
  if (ret < 0) {
    return Status::FromErrno(-ret, uri + ": fence (blocklist) " + holder.ToString());
  }
  ret = rados.wait_for_latest_osdmap();
  if (ret < 0)
    return Status::FromErrno(-ret, uri + ": wait for the OSD map after fencing");
  ret = io.break_lock(oid, kRadosLockName, holder.client, holder.cookie);
  if (ret < 0 && ret != -ENOENT) {
    return Status::FromErrno(-ret, uri + ": break the lock of " + holder.ToString());
  }
  return Status::Ok();
}

}  // namespace

// Answers notifies (so a notifier never waits for its timeout) and reports
// a failed watch to the lock's helper thread.
class RadosLock::Watcher final : public librados::WatchCtx2 {
 public:
  explicit Watcher(RadosLock* lock) : lock_(lock) {}
  void handle_notify(uint64_t notify_id, uint64_t cookie, uint64_t notifier_id,
                     librados::bufferlist& bl) override {
    librados::bufferlist reply;
    // A release request from another client (our own acquire's request
    // reaches our own watch too: not for us).
    if (Text(bl) == kReleaseRequest &&
        notifier_id != lock_->cluster_->rados().get_instance_id()) {
      bool accepted = false;
      {
        std::lock_guard<std::mutex> guard(handler_mu);
        if (Handler()) accepted = Handler()(lock_->uri_);
      }
      if (accepted) reply.append(kReleaseAccepted.data(), kReleaseAccepted.size());
    }
    lock_->io_.notify_ack(lock_->header_oid_, notify_id, cookie, reply);
  }
  void handle_error(uint64_t, int) override {
    std::lock_guard<std::mutex> guard(lock_->mu_);
    lock_->watch_failed_ = true;
    lock_->cv_.notify_all();
  }

 private:
  RadosLock* const lock_;
};

RadosLock::RadosLock(std::shared_ptr<RadosCluster> cluster, const librados::IoCtx& io,
                     std::string uri, std::string header_oid)
    : cluster_(std::move(cluster)),
      uri_(std::move(uri)),
      header_oid_(std::move(header_oid)),
      cookie_(NewCookie()),
      watcher_(std::make_unique<Watcher>(this)) {
  io_.dup(io);
  std::string timeout;
  if (cluster_->rados().conf_get("osd_client_watch_timeout", timeout) == 0) {
    const long t = std::strtol(timeout.c_str(), nullptr, 10);
    if (t > 0) watch_timeout_ = uint32_t(t);
  }
}

Status RadosLock::Watch() {
  uint64_t handle = 0;
  const int ret = io_.watch3(header_oid_, &handle, watcher_.get(), watch_timeout_);
  if (ret < 0) return Status::FromErrno(-ret, uri_ + ": watch " + header_oid_);
  std::lock_guard<std::mutex> guard(mu_);
  // watch_failed_ stays as it is: the new watch may already have failed.
  handle_ = handle;
  return Status::Ok();
}

void SetRadosReleaseHandler(RadosReleaseHandler handler) {
  std::lock_guard<std::mutex> guard(handler_mu);
  Handler() = std::move(handler);
}

Result<std::unique_ptr<RadosLock>> RadosLock::Acquire(
    std::shared_ptr<RadosCluster> cluster, const librados::IoCtx& io,
    const std::string& uri, const std::string& header_oid,
    std::optional<RadosLocker>* fenced, bool takeover) {
  std::unique_ptr<RadosLock> lock(new RadosLock(std::move(cluster), io, uri, header_oid));
  // 1. The watch first: whoever sees our lock also sees us alive.
  TD_RETURN_IF_ERROR(lock->Watch());
  auto fail = [&lock](Status s) {
    (void)lock->io_.unwatch2(lock->handle_);
    lock->handle_ = 0;
    return s;
  };
  // 2. The lock: fencing a gone holder first, or (takeover) waiting for a
  //    live one to hand over.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(kTakeoverWaitSeconds);
  bool asked = false;
  for (int attempt = 0;;) {
    const int ret = lock->io_.lock_exclusive(header_oid, kRadosLockName, lock->cookie_,
                                             "thindisk", nullptr, 0);
    if (ret == 0) break;
    if (ret != -EBUSY && ret != -EEXIST) {
      return fail(Status::FromErrno(-ret, uri + ": lock " + header_oid));
    }
    auto holders = Lockers(lock->io_, uri, header_oid);
    if (!holders) return fail(holders.error());
    if (holders->empty()) {
      if (++attempt < kAcquireAttempts) continue;  // released meanwhile: try again
      return fail(Status(Code::kBusy, uri + ": the lock keeps changing hands", EBUSY));
    }
    const RadosLocker& holder = holders->front();
    if (!holder.watching) {
      if (++attempt >= kAcquireAttempts) return fail(BusyError(uri, holder));
      Status fenced_ok = Fence(*lock->cluster_, lock->io_, uri, header_oid, holder);
      if (!fenced_ok.ok()) return fail(fenced_ok);
      if (fenced) *fenced = holder;
      continue;
    }
    if (!takeover) return fail(BusyError(uri, holder));
    if (!asked) {
      Status accepted = AskToRelease(lock->io_, uri, header_oid, holder);
      if (!accepted.ok()) return fail(accepted);
      asked = true;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return fail(Status(
          Code::kBusy,
          uri + ": " + holder.ToString() + " accepted to hand over but still " +
              "holds the image after " + std::to_string(kTakeoverWaitSeconds) + " s",
          EBUSY));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // 3. Keep the watch registered for as long as the lock is held.
  lock->rewatch_ = std::thread([raw = lock.get()] { raw->RewatchLoop(); });
  return lock;
}

bool RadosLock::Confirmed() {
  // mu_ is held across the check: the handle is librados' pointer to the
  // watch, and RewatchLoop unregisters a handle only after clearing it here.
  std::lock_guard<std::mutex> guard(mu_);
  if (watch_failed_ || handle_ == 0) return false;
  // Milliseconds since the OSD last confirmed the watch, or an error.
  const int age_ms = io_.watch_check(handle_);
  return age_ms >= 0 && uint64_t(age_ms) < uint64_t(watch_timeout_) * 1000 / 2;
}

void RadosLock::RewatchLoop() {
  std::unique_lock<std::mutex> guard(mu_);
  while (true) {
    cv_.wait(guard, [this] { return stopping_ || watch_failed_; });
    if (stopping_) return;
    // The failed watch is unregistered exactly once, here: handle_ no
    // longer names it, so the destructor cannot unregister it again.
    const uint64_t old = handle_;
    handle_ = 0;
    watch_failed_ = false;
    guard.unlock();
    if (old != 0) (void)io_.unwatch2(old);
    const Status s = Watch();
    guard.lock();
    if (s.ok()) continue;
    // The image was removed (RemoveRados): nothing left to watch.
    if (s.error_number() == ENOENT) return;
    // The cluster is out of reach: try again in a second, or stop.
    watch_failed_ = true;
    cv_.wait_for(guard, std::chrono::seconds(1), [this] { return stopping_; });
  }
}

RadosLock::~RadosLock() {
  {
    std::lock_guard<std::mutex> guard(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (rewatch_.joinable()) rewatch_.join();
  // Errors cannot be reported here. A lock left behind (the cluster out of
  // reach) belongs to a client that is gone once this process is: the next
  // writer fences and breaks it.
  (void)io_.unlock(header_oid_, kRadosLockName, cookie_);
  if (handle_ != 0) (void)io_.unwatch2(handle_);
  // No callback of ours may run after this: the watcher goes with us.
  (void)cluster_->rados().watch_flush();
}

namespace {

// An image's header object and the pool it is in: what ListRadosLockers
// and BreakRadosLock work on, from one connection.
struct Header {
  RadosName name;
  std::shared_ptr<RadosCluster> cluster;
  librados::IoCtx io;
  std::string oid;
};

// kNotFound when there is no such image.
Result<Header> OpenHeader(const std::string& name) {
  Header h;
  TD_ASSIGN_OR_RETURN(h.name, ParseRadosName(name));
  TD_ASSIGN_OR_RETURN(h.cluster, RadosCluster::Get(h.name));
  TD_ASSIGN_OR_RETURN(h.io, h.cluster->OpenPool(h.name));
  h.oid = h.name.image + ".header";
  uint64_t size = 0;
  time_t mtime = 0;
  const int ret = h.io.stat(h.oid, &size, &mtime);
  if (ret == -ENOENT)
    return Status::NotFound(h.name.ToString() + ": no such image", ENOENT);
  if (ret < 0) return Status::FromErrno(-ret, h.name.ToString() + ": stat " + h.oid);
  return h;
}

}  // namespace

Result<std::vector<RadosLocker>> ListRadosLockers(const std::string& name) {
  TD_ASSIGN_OR_RETURN(Header h, OpenHeader(name));
  return Lockers(h.io, h.name.ToString(), h.oid);
}

Result<std::vector<RadosLocker>> BreakRadosLock(const std::string& name, bool force) {
  TD_ASSIGN_OR_RETURN(Header header, OpenHeader(name));
  const std::string uri = header.name.ToString();
  TD_ASSIGN_OR_RETURN(std::vector<RadosLocker> holders,
                      Lockers(header.io, uri, header.oid));
  for (const RadosLocker& h : holders) {
    if (h.watching && !force) {
      return Status(Code::kBusy,
                    uri + ": " + h.ToString() +
                        " is alive (it watches the image); --force fences it, and its "
                        "guest sees write errors",
                    EBUSY);
    }
  }
  for (const RadosLocker& h : holders) {
    TD_RETURN_IF_ERROR(Fence(*header.cluster, header.io, uri, header.oid, h));
  }
  return holders;
}

}  // namespace thindisk::io
