// RadosCluster: one librados connection (librados::Rados), shared by every
// RadosStorage of the process that names the same ceph.conf and client.
//
// Why shared: a connection is a session with the monitors plus a messenger
// with its own threads; opening a backing chain or many images should not
// pay that (tens of ms, a dozen threads) per image. Why per (conf, id): two
// names may point at two clusters, or at one cluster as two clients.
//
// Lifetime: Get() hands out shared_ptrs; the registry keeps only weak_ptrs,
// so the connection shuts down (Rados::shutdown joins librados' threads)
// when the last storage using it is destroyed. No thread outlives the last
// image, which is what the leak checker of the ASan pass sees at exit.
//
// Connecting is bounded: client_mount_timeout becomes kMountTimeoutSeconds
// unless ceph.conf or $CEPH_ARGS set it (librados' own default is 300 s);
// an unreachable cluster fails with one line naming the conf and the wait.
//
// Thread safety: Get() may be called from any thread. The Rados object is
// itself safe for concurrent use; IoCtx copies are per caller.
#pragma once

#include <memory>
#include <rados/librados.hpp>
#include <string>

#include "io/rados_name.h"
#include "util/result.h"

namespace thindisk::io {

class RadosCluster {
 public:
  static constexpr int kMountTimeoutSeconds = 10;

  // The connection for `name`'s conf and id: an existing one, or a new one.
  // Errors name the image URI ("rados://p/i: connect (conf /x/ceph.conf): ...").
  static Result<std::shared_ptr<RadosCluster>> Get(const RadosName& name);
  // The same for a connection named by its parts; `what` names the image in
  // errors (an rbd: image, io/rbd_storage.h).
  static Result<std::shared_ptr<RadosCluster>> Get(const std::string& conf,
                                                   const std::string& id,
                                                   const std::string& what);

  ~RadosCluster();
  RadosCluster(const RadosCluster&) = delete;
  RadosCluster& operator=(const RadosCluster&) = delete;

  // An I/O context on `name.pool`. kNotFound when the pool does not exist.
  Result<librados::IoCtx> OpenPool(const RadosName& name);
  Result<librados::IoCtx> OpenPool(const std::string& pool, const std::string& what);

  // The connection itself, for cluster-wide calls (the lock's blocklist).
  librados::Rados& rados() { return rados_; }

 private:
  RadosCluster() = default;

  librados::Rados rados_;
};

}  // namespace thindisk::io
