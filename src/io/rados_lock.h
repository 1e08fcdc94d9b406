// RadosLock: one writer per RADOS image across hosts (io/rados_storage.h).
//
// The lock is Ceph's cls lock "thindisk" on the image's header object:
// exclusive, with a fresh cookie per open that says who opened it ("pid 77
// on host vm1 (a1b2c3d4e5f60718)"); the lock records the holder's client
// name and address with it. A holder proves
// it is alive with a watch on the same object, registered before the lock
// is taken and kept until after it is released. A watch stays registered
// while its client pings the OSD; a client that stops (killed, its host
// down or cut off) loses it after the watch timeout: the cluster's
// osd_client_watch_timeout (30 s unless ceph.conf says otherwise).
//
// Taking the lock:
//  - free: taken.
//  - held by a client that still watches: kBusy naming the holder ("in use
//    by client.4123 at 127.0.0.1:0/2718 (pid 77 on host vm1 (a1b2...))").
//  - held by a client with no watch: the holder is gone, so it is fenced
//    before its lock is broken: its address is added to the OSD blocklist,
//    the new OSD map awaited (every OSD then refuses the holder's requests,
//    so a holder that was only paused cannot land late writes), and only
//    then is its lock broken and ours taken. `fenced` says who it was.
//
// Hand-over (takeover = true, serve --takeover: the live-migration step):
// instead of kBusy for a live holder, notify it on the header object with a
// release request. A process that can let go (a thindisk serve whose only
// export is this image: SetRadosReleaseHandler) answers yes, drains,
// flushes, marks the image clean, releases the lock and drops its clients;
// Acquire waits for the release (at most kTakeoverWaitSeconds) and takes
// the lock. A holder that answers no, or not at all, leaves kBusy saying so.
//
// Read-only opens take no lock: a reader never changes an image, and
// readers beside a writer see what the writer has written (RBD's rule too).
//
// While held: when the watch fails (the client lost the OSD for longer than
// the timeout) it is registered again from a helper thread; if another
// client fenced this one meanwhile, every later write fails with
// "fenced (blocklisted)", never lands.
//
// Thread safety: Acquire, the destructor and the free functions may be
// called from any thread; a RadosLock is used by the storage that owns it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <rados/librados.hpp>
#include <string>
#include <thread>
#include <vector>

#include "io/ceph_module.h"
#include "io/rados_cluster.h"
#include "util/result.h"

namespace thindisk::io {

inline constexpr const char* kRadosLockName = "thindisk";

// RadosLocker and RadosReleaseHandler: io/ceph_module.h.
void SetRadosReleaseHandler(RadosReleaseHandler handler);

class RadosLock {
 public:
  static constexpr int kTakeoverWaitSeconds = 60;

  // Takes the lock of the image whose header object is `header_oid` in
  // `io`'s pool (`uri` names it in messages), fencing a gone holder as
  // above; `fenced` (may be null) gets the holder that was fenced, if any.
  // With `takeover`, a live holder is asked to hand over (above) instead.
  static Result<std::unique_ptr<RadosLock>> Acquire(
      std::shared_ptr<RadosCluster> cluster, const librados::IoCtx& io,
      const std::string& uri, const std::string& header_oid,
      std::optional<RadosLocker>* fenced = nullptr, bool takeover = false);
  // Releases the lock, then the watch.
  ~RadosLock();
  RadosLock(const RadosLock&) = delete;
  RadosLock& operator=(const RadosLock&) = delete;

  const std::string& cookie() const { return cookie_; }

  // Whether the OSD confirmed this holder's watch within the last half
  // watch timeout. While it did, no other client can have found the holder
  // gone and fenced it (that takes the watch missing for a whole timeout),
  // so a write acknowledged now from memory (io/write_back.h) is still this
  // holder's to store; only `lock break --force` or a takeover can end the
  // lock sooner. False while the watch is failed or being registered
  // again. librados pings a watch every objecter_tick_interval (5 s), so
  // with the 30 s default timeout the answer is true whenever the cluster
  // answers.
  bool Confirmed();

 private:
  class Watcher;

  RadosLock(std::shared_ptr<RadosCluster> cluster, const librados::IoCtx& io,
            std::string uri, std::string header_oid);
  Status Watch();
  void RewatchLoop();

  const std::shared_ptr<RadosCluster> cluster_;
  librados::IoCtx io_;
  const std::string uri_;
  const std::string header_oid_;
  const std::string cookie_;
  std::unique_ptr<Watcher> watcher_;
  uint32_t watch_timeout_ = 30;

  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t handle_ = 0;        // the current watch; guarded by mu_
  bool watch_failed_ = false;  // guarded by mu_
  bool stopping_ = false;      // guarded by mu_
  std::thread rewatch_;
};

// The holders of image `name`'s lock (none when it is free). kNotFound when
// there is no such image.
Result<std::vector<RadosLocker>> ListRadosLockers(const std::string& name);

// Breaks image `name`'s lock after fencing its holder, as Acquire does for a
// gone holder. A holder that still watches is refused (kBusy) unless
// `force`: breaking a live writer's lock fences it, and its guest sees
// write errors. Returns who was fenced (empty when the lock was free).
Result<std::vector<RadosLocker>> BreakRadosLock(const std::string& name, bool force);

}  // namespace thindisk::io
