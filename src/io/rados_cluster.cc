#include "io/rados_cluster.h"

#include <map>
#include <mutex>
#include <utility>

namespace thindisk::io {
namespace {

std::mutex registry_mu;
// (conf, id) -> the live connection, if any. Weak: see the header.
std::map<std::pair<std::string, std::string>, std::weak_ptr<RadosCluster>>& Registry() {
  static auto* registry =
      new std::map<std::pair<std::string, std::string>, std::weak_ptr<RadosCluster>>;
  return *registry;
}

// librados' built-in client_mount_timeout, as conf_get prints it.
constexpr const char* kLibradosMountTimeout = "300";

std::string ConfShown(const std::string& conf) {
  return conf.empty() ? std::string("$CEPH_CONF or /etc/ceph/ceph.conf") : conf;
}

}  // namespace

RadosCluster::~RadosCluster() {
  // shutdown() also frees a Rados that init()ed but never connected.
  rados_.shutdown();
}

Result<std::shared_ptr<RadosCluster>> RadosCluster::Get(const RadosName& name) {
  return Get(name.conf, name.id, name.ToString());
}

Result<std::shared_ptr<RadosCluster>> RadosCluster::Get(const std::string& conf,
                                                        const std::string& id,
                                                        const std::string& what) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto key = std::make_pair(conf, id);
  if (auto live = Registry()[key].lock()) return live;

  std::string timeout_shown = std::to_string(kMountTimeoutSeconds);
  std::shared_ptr<RadosCluster> cluster(new RadosCluster);
  librados::Rados& r = cluster->rados_;
  int ret = r.init(id.empty() ? nullptr : id.c_str());
  if (ret < 0) return Status::FromErrno(-ret, what + ": librados init");
  // 1. The conf file: the one named, else librados' search ($CEPH_CONF,
  //    /etc/ceph/ceph.conf, ~/.ceph/config, ./ceph.conf).
  ret = r.conf_read_file(conf.empty() ? nullptr : conf.c_str());
  if (ret < 0) {
    return Status::FromErrno(-ret, what + ": read ceph.conf (" + ConfShown(conf) +
                                       "; set CEPH_CONF or add ?conf=PATH)");
  }
  ret = r.conf_parse_env(nullptr);  // CEPH_ARGS
  if (ret < 0) return Status::FromErrno(-ret, what + ": parse CEPH_ARGS");
  // 2. A bounded connect: librados' own default waits 300 s. conf_set
  //    outranks the file and CEPH_ARGS, so it is used only where neither
  //    changed the default (they still can: measured on pacific).
  std::string timeout;
  if (r.conf_get("client_mount_timeout", timeout) == 0 &&
      timeout == kLibradosMountTimeout) {
    ret =
        r.conf_set("client_mount_timeout", std::to_string(kMountTimeoutSeconds).c_str());
    if (ret < 0) return Status::FromErrno(-ret, what + ": set client_mount_timeout");
  } else {
    timeout_shown = timeout;
  }
  // 3. Connect (monitors, then the OSD map).
  ret = r.connect();
  if (ret < 0) {
    return Status::FromErrno(
        -ret, what + ": connect to the cluster of " + ConfShown(conf) +
                  " (waited up to client_mount_timeout, " + timeout_shown + " s)");
  }
  Registry()[key] = cluster;
  return cluster;
}

Result<librados::IoCtx> RadosCluster::OpenPool(const RadosName& name) {
  return OpenPool(name.pool, name.ToString());
}

Result<librados::IoCtx> RadosCluster::OpenPool(const std::string& pool,
                                               const std::string& what) {
  librados::IoCtx io;
  const int ret = rados_.ioctx_create(pool.c_str(), io);
  if (ret == -ENOENT) {
    return Status::NotFound(what + ": pool '" + pool + "' does not exist", ENOENT);
  }
  if (ret < 0) return Status::FromErrno(-ret, what + ": open pool '" + pool + "'");
  return io;
}

}  // namespace thindisk::io
